"""The run's state: shard pairing from the map counters, and the streamed files each verify
partition reads."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa

from marin_assets.core.dedup.decisions import FuzzyDedupParams
from marin_assets.core.dedup.fuzzy import FuzzyScale
from marin_assets.core.dedup.fuzzy import layout as fuzzy_layout
from marin_assets.core.dedup.fuzzy import state as fuzzy_state
from marin_assets.core.dedup.fuzzy.state import CompactResults, RankCounts
from marin_assets.core.runtime.runner import ShardResult, ShardRunner


def test_pair_shards_takes_rows_from_the_map_counters_and_reads_footers_only_without_them(tmp_path, monkeypatch):
    from marin_assets.core.dedup.fuzzy import state as fuzzy_state
    from marin_assets.core.runtime import storage

    buckets, normalized = {}, {}
    for source, sizes in (("a", (3, 1)), ("b", (2,))):
        buckets[source], normalized[source] = [], []
        for i, n in enumerate(sizes):
            for folder, table in (("buckets", pa.table({"id": [f"{source}{i}-{k}" for k in range(n)]})), ("normalized", pa.table({"id": ["x"] * n}))):
                uri = str(tmp_path / folder / source / f"part-{i}-of-{len(sizes)}.parquet")
                storage.write_parquet(table, uri)
                (buckets if folder == "buckets" else normalized)[source].append(uri)
    footers = fuzzy_state.pair_shards(buckets, normalized)
    assert [rows for _, _, rows in footers["a"]] == [3, 1] and [rows for _, _, rows in footers["b"]] == [2]

    read = []
    real = storage.parquet_num_rows
    monkeypatch.setattr(storage, "parquet_num_rows", lambda uri: read.append(uri) or real(uri))
    counted = fuzzy_state.pair_shards(buckets, normalized, {"a": [3, 1], "b": [5, 6]})  # b's counters do not match its shards
    assert counted["a"] == footers["a"] and counted["b"] == footers["b"]
    assert read == buckets["b"]  # only the source without usable counters was read


def test_each_verify_partition_reads_the_streamed_files_of_the_gather_tasks_that_streamed_for_it(tmp_path: Path) -> None:
    """Per verify partition, the streamed files of exactly the gather tasks that streamed for it,
    in gather order; past the limit, merged into fewer files that keep every row, sorted by
    (key, pos) across the files merged."""
    import pyarrow.parquet as pq  # noqa: PLC0415

    from marin_assets.core.dedup.fuzzy import verify as fuzzy_verify  # noqa: PLC0415
    from marin_assets.core.runtime.runner import ShardResult  # noqa: PLC0415

    streamed = {0: [0, 2], 1: [2], 2: [], 3: [0, 2], 4: [2]}
    gathered = []
    for g, parts in streamed.items():
        output = str(tmp_path / "gather" / f"g{g:06d}.blocks")
        if parts:
            Path(fuzzy_layout.streamed_uri(output)).parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.table({"key": list(range(g + 1)), "pos": [10 - g] * (g + 1)}), fuzzy_layout.streamed_uri(output), row_group_size=1)
        gathered.append(ShardResult(output, {"streamed_parts": parts}, reused=False))
    run = fuzzy_state.FuzzyRun({}, {}, (), str(tmp_path / "out"), str(tmp_path / "cache"), FuzzyDedupParams(), FuzzyScale(), ShardRunner(), 5, 240, None)
    names = {g: fuzzy_layout.streamed_uri(gathered[g].output) for g in streamed}

    files = fuzzy_verify._bounded_streamed(run, gathered, 4, 8, "")
    assert files == [(names[0], names[3]), (), (names[0], names[1], names[3], names[4]), ()]

    merged = fuzzy_verify._bounded_streamed(run, gathered, 4, 2, "")
    assert merged[0] == (names[0], names[3]) and merged[1] == merged[3] == ()
    assert len(merged[2]) == 2 and not set(merged[2]) & set(names.values())
    assert sorted(k for f in merged[2] for k in pq.read_table(f).column("key").to_pylist()) == sorted([0, 0, 1, 0, 1, 2, 3, 0, 1, 2, 3, 4])
    for f in merged[2]:
        rows = list(zip(*(pq.read_table(f).column(c).to_pylist() for c in ("key", "pos"))))
        assert rows == sorted(rows) and len(rows) > len(set(k for k, _ in rows))  # runs of two files interleaved


def test_rank_counts_read_like_the_dict_they_replace() -> None:
    counts = {"0": 5, "17": 2, "145": 9}
    compact = RankCounts(counts)
    assert dict(compact) == counts and dict(compact.items()) == counts
    assert compact["17"] == 2 and len(compact) == 3
    assert "3" not in compact and dict(RankCounts({})) == {}


def test_each_step_keeps_exactly_its_best_examples_and_every_count() -> None:
    rng = random.Random(7)
    keys = rng.sample(range(10_000), 400)
    results = []
    compact = CompactResults(5)
    for t in range(80):  # 80 tasks of 5 examples each, arriving in any order
        examples = [{"_key": [k, 0], "excerpt": "x" * 240} for k in keys[5 * t : 5 * t + 5]]
        result = ShardResult(f"verify/{t}", {"removed_by_rank": {str(t % 7): t}, "examples": examples}, False)
        compact(result)
        results.append(result)
    kept = [e["_key"][0] for r in results for e in r.stats["examples"] if e]
    assert sorted(kept) == sorted(keys)[:5]
    assert sum(n for r in results for _, n in r.stats["removed_by_rank"].items()) == sum(range(80))
    assert all(isinstance(r.stats["removed_by_rank"], RankCounts) for r in results)
