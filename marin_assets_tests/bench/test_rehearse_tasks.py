"""The rehearsal's per-stage request counting: a task's requests against the counting store do not
grow with the corpus, and a stage whose tasks do grow is reported as a MISS."""

from __future__ import annotations

from bench import rehearse_tasks as rt
from bench import slow_store
from marin_assets.core.dedup import minhash
from marin_assets.core.runtime import storage


def minhash_counts(tmp_path, scale: int) -> rt.Counts:
    root = f"{slow_store.PROTOCOL}://{tmp_path}/{scale}x"
    counts = rt.Counts()
    for source, shards in rt.write_sources(root, scale).items():
        rt.per_shard(counts, minhash.minhash_shard, [(s,) for s in shards], storage.join(root, "buckets", source), minhash.MinHashParams())
    return counts


def test_minhash_requests_per_task_do_not_grow_with_the_corpus(tmp_path) -> None:
    one, two = minhash_counts(tmp_path, 1), minhash_counts(tmp_path, 2)
    assert len(two.requests["minhash_shard"]) == 2 * len(one.requests["minhash_shard"]) == 2 * len(rt.SOURCES) * rt.SHARDS_1X
    assert min(one.requests["minhash_shard"]) >= 2  # at least a read of the shard and a write of its buckets
    assert max(two.requests["minhash_shard"]) <= max(one.requests["minhash_shard"])
    assert all(0 < c <= r for c, r in zip(two.chains["minhash_shard"], two.requests["minhash_shard"]))
    assert two.cpu > 0


def test_a_phase_whose_tasks_grow_is_a_miss(capsys) -> None:
    def run(scale: int, reads: int) -> rt.Run:
        phases = {"exact_map": [10] * scale, "exact_reduce": [reads] * scale}
        return rt.Run({"exact_duplicates": rt.Counts(requests=phases, chains=phases, cpu=1.0, shards=4 * scale)}, 64 * scale, 0.1 * scale, 3, 12.0)

    assert rt.stage_row("exact_duplicates", {1: run(1, 10), 4: run(4, 12)})
    assert not rt.stage_row("exact_duplicates", {1: run(1, 10), 4: run(4, 34)})
    out = capsys.readouterr().out.splitlines()
    assert "ratio 4x/1x=1.20 PASS (phase exact_reduce)" in out[0] and "ratio 4x/1x=3.40 MISS (phase exact_reduce)" in out[2]
    assert "(projected: 11.0 requests per shard)" in out[2]  # 4 tasks x (10 + 34) requests over 16 shards
