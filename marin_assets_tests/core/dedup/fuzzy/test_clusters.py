"""Which clusters an incremental run reuses, replays or verifies in full, and the row sums per source."""

from __future__ import annotations

import dataclasses
import random
import shutil
from pathlib import Path

import pyarrow as pa
import pytest

from marin_assets.core.dedup import decisions as dedup
from marin_assets.core.dedup.fuzzy import clusters as fuzzy_clusters
from marin_assets.core.dedup.fuzzy import find_fuzzy_duplicates
from marin_assets.core.dedup.fuzzy import layout as fuzzy_layout
from marin_assets.core.runtime import storage
from marin_assets.testing.dedup_corpus import doc_id, near_copies
from marin_assets_tests.core.dedup.corpora import SMALL_TASKS, big_cluster_corpus, read_removed


@pytest.mark.system
def test_a_big_cluster_replays_from_its_record_reading_only_the_changed_sources_shards(tmp_path: Path) -> None:
    """A big cluster that retained few members keeps their texts in its record. When a source
    that holds none of them gains copies the head removes, the replay gathers only the added
    copies' text: no shard of the sources the head lives in is read. Label files whose labels did
    not move are carried as the same bytes."""
    normalized, buckets = big_cluster_corpus(tmp_path / "v1")
    cache, first = str(tmp_path / "cache"), str(tmp_path / "first")
    find_fuzzy_duplicates(buckets, normalized, set(), first, scale=SMALL_TASKS, cache_uri=cache)
    state = storage.read_json(str(Path(first) / "_fuzzy_state.json"))
    records = pa.concat_tables([storage.read_parquet(fuzzy_layout.clusters_uri(f)) for f in state["verify_files"]]).to_pylist()
    big = max(records, key=lambda r: r["size"])
    assert big["size"] >= 550 and len(big["texts"]) == len(big["retained"]) and 16 * len(big["retained"]) <= big["size"]
    assert [doc_id(t) for t in big["texts"]] == [k.split("\x00", 1)[1] for k in big["retained"]]  # each text is its member's
    for r in records:  # small clusters, or many retained members: no texts kept
        assert r["texts"] is None or all(t is None for t in r["texts"]) or 16 * len(r["retained"]) <= r["size"]
    sources = list(buckets)
    changed = next(s for k, s in enumerate(sources) if all(int(key.split("\x00")[0]) != k for key in big["retained"]))
    head = next(t for t in near_copies(600, seed=11) if doc_id(t) == big["retained"][0].split("\x00", 1)[1])
    more = [t for t in near_copies(640, seed=11)[600:] if len(t) < len(head)][:8]
    v2, b2 = big_cluster_corpus(tmp_path / "v2", extra={changed: more})
    for source in set(sources) - {changed}:
        v2[source], b2[source] = normalized[source], buckets[source]
    inc, full = str(tmp_path / "incremental"), str(tmp_path / "full")
    inc_stats = find_fuzzy_duplicates(b2, v2, set(), inc, scale=SMALL_TASKS, cache_uri=cache, previous_uri=first)
    find_fuzzy_duplicates(b2, v2, set(), full, scale=SMALL_TASKS)
    for source in b2:
        assert storage.read_bytes(dedup.removed_uri(inc, source)) == storage.read_bytes(dedup.removed_uri(full, source))
    assert inc_stats["cc_method"] == "incremental" and inc_stats["replayed_clusters"] == 1 and inc_stats["verify_passes"] == 1
    assert inc_stats["verified_clusters"] == 0 and 0 < inc_stats["shards_read_for_text"] <= len(v2[changed])
    labels = storage.read_json(str(Path(inc) / "_fuzzy_state.json"))["label_files"]
    assert [storage.read_bytes(f) for f in labels[: len(state["label_files"])]] == [storage.read_bytes(f) for f in state["label_files"]]


@pytest.mark.system
def test_a_cluster_whose_added_member_is_retained_is_verified_in_full(tmp_path: Path) -> None:
    normalized, buckets = big_cluster_corpus(tmp_path / "v1")
    cache, first = str(tmp_path / "cache"), str(tmp_path / "first")
    find_fuzzy_duplicates(buckets, normalized, {"gamma"}, first, scale=SMALL_TASKS, cache_uri=cache)
    survivors = {r["cluster_id"] for s in buckets for r in read_removed(first, s)}
    head = next(t for t in near_copies(600, seed=11) if doc_id(t) in survivors)  # the big cluster's first (kept) member
    shorter = next(t for t in near_copies(620, seed=11)[600:] if len(t) < len(head))
    cases = {
        # gamma (exempt) keeps a new shorter copy: the replay of the big cluster fails, a second pass verifies it
        "gamma": ([shorter], 2),
        # a longer copy of the head is retained and now represents the others: verified in full at once
        "beta": ([head + " appendix footer note", near_copies(620, seed=11)[610]], 1),
    }
    for changed, (more, passes) in cases.items():
        normalized2, buckets2 = big_cluster_corpus(tmp_path / changed, extra={changed: more})
        for source in set(buckets) - {changed}:
            normalized2[source], buckets2[source] = normalized[source], buckets[source]
        inc, full = str(tmp_path / changed / "incremental"), str(tmp_path / changed / "full")
        run_cache = str(tmp_path / changed / "cache")
        shutil.copytree(cache, run_cache)
        # the big cluster's texts are read batch by batch from the gathered groups' files
        streamed = dataclasses.replace(SMALL_TASKS, cluster_chars_in_memory=20_000, verify_batch_chars=8_000)
        inc_stats = find_fuzzy_duplicates(buckets2, normalized2, {"gamma"}, inc, scale=streamed, cache_uri=run_cache, previous_uri=first)
        find_fuzzy_duplicates(buckets2, normalized2, {"gamma"}, full, scale=SMALL_TASKS)
        for source in buckets2:
            assert storage.read_bytes(dedup.removed_uri(inc, source)) == storage.read_bytes(dedup.removed_uri(full, source))
        assert inc_stats["changed_sources"] == [changed] and inc_stats["verify_passes"] == passes
        assert inc_stats["verified_members"] >= 500 and inc_stats["streamed_clusters"] >= 1  # the big cluster, in full
        # the first pass's verdicts are gone once the second pass holds them all
        assert len(storage.read_json(str(Path(inc) / "_fuzzy_state.json"))["verify_files"]) == inc_stats["verify_partitions"]
        assert sorted(n for n in map(storage.basename, storage.listdir(str(Path(inc) / "_work" / "verify"))) if n.endswith((".parquet", ".blocks"))) == sorted(
            n for f in storage.read_json(str(Path(inc) / "_fuzzy_state.json"))["verify_files"] for n in (storage.basename(f), storage.basename(fuzzy_layout.clusters_uri(f)))
        )
    assert any(r["representative_id"] == doc_id(head + " appendix footer note") for s in buckets for r in read_removed(str(tmp_path / "beta" / "incremental"), s))


@pytest.mark.system
def test_a_small_cluster_whose_replay_fails_is_verified_in_full_in_the_same_pass(tmp_path: Path) -> None:
    """A replay that reads one in 16 of its cluster's members or more had every member's text
    gathered with it: when its added member is retained (here an exempt one, after the head), the
    verify task verifies the cluster in full at once, no second pass."""
    normalized, buckets = big_cluster_corpus(tmp_path / "v1")
    cache, first = str(tmp_path / "cache"), str(tmp_path / "first")
    find_fuzzy_duplicates(buckets, normalized, {"gamma"}, first, scale=SMALL_TASKS, cache_uri=cache)
    small = {doc_id(t): t for k in range(6) for t in near_copies(k + 2, seed=100 + k, words=80)}  # the small clusters' texts
    removed = next(r for s in ("alpha", "beta") for r in read_removed(first, s) if r["id"] in small)
    added = small[removed["id"]].rsplit(" ", 1)[0]  # shorter than a removed member: after its cluster's head
    normalized2, buckets2 = big_cluster_corpus(tmp_path / "v2", extra={"gamma": [added]})
    for source in ("alpha", "beta"):
        normalized2[source], buckets2[source] = normalized[source], buckets[source]
    inc, full = str(tmp_path / "incremental"), str(tmp_path / "full")
    inc_stats = find_fuzzy_duplicates(buckets2, normalized2, {"gamma"}, inc, scale=SMALL_TASKS, cache_uri=cache, previous_uri=first)
    find_fuzzy_duplicates(buckets2, normalized2, {"gamma"}, full, scale=SMALL_TASKS)
    for source in buckets2:
        assert storage.read_bytes(dedup.removed_uri(inc, source)) == storage.read_bytes(dedup.removed_uri(full, source))
    assert inc_stats["cc_method"] == "incremental" and inc_stats["changed_sources"] == ["gamma"]
    assert inc_stats["replays_verified_at_once"] == 1 and inc_stats["verify_passes"] == 1 and inc_stats["exempt_kept"] >= 1


def test_row_sums_follow_a_sources_rows_not_their_partitioning() -> None:
    """An incremental run keeps a source's removal file when the sums of its rows' hashes over
    every label range did not move: the sums must not depend on how rows are split into ranges
    or ordered, and a change in any published field of one row must move its source's sum only."""
    rng = random.Random(5)
    rows = [
        (0, rank, f"doc{i}", rng.randrange(50), f"c{i % 7}", f"r{i % 5}", f"source_{rank + 1}", rng.random(), rng.random(), rng.randrange(1000))
        for i in range(400)
        for rank in [rng.randrange(4)]
    ]

    def table(part: list[tuple]) -> pa.Table:
        return pa.table([pa.array(list(c), type=f.type) for c, f in zip(zip(*part), fuzzy_layout.VERDICT_SCHEMA)], schema=fuzzy_layout.VERDICT_SCHEMA)

    whole = fuzzy_clusters.row_sums(table(rows))
    assert sorted(whole) == [0, 1, 2, 3]
    shuffled = rows[:]
    rng.shuffle(shuffled)
    parts = [fuzzy_clusters.row_sums(table(shuffled[a : a + 90])) for a in range(0, len(shuffled), 90)]
    assert {r: sum(p.get(r, 0) for p in parts) % (1 << 128) for r in whole} == whole
    # the label and length are not published: a row that only moved cluster label keeps its sum
    relabelled = [(*r[:3], r[3] + 1000, *r[4:]) for r in rows]
    assert fuzzy_clusters.row_sums(table(relabelled)) == whole
    for field in range(4, 9):  # cluster id, representative id and source, containment, jaccard
        changed = rows[:]
        old = changed[17]
        changed[17] = (*old[:field], old[field] + (0.5 if isinstance(old[field], float) else "x"), *old[field + 1 :])
        moved = fuzzy_clusters.row_sums(table(changed))
        assert {r for r in whole if moved[r] != whole[r]} == {old[1]}, field

