"""Incremental components: a run over changed sources merges the previous labels and equals a full
rebuild."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pyarrow as pa
import pytest

from marin_assets.core.dedup import decisions as dedup
from marin_assets.core.dedup.fuzzy import find_fuzzy_duplicates
from marin_assets.core.dedup.fuzzy import layout as fuzzy_layout
from marin_assets.core.runtime import storage
from marin_assets.testing.dedup_corpus import doc_id, near_copies
from marin_assets_tests.core.dedup.corpora import InputCountingRunner, SMALL_TASKS, big_cluster_corpus, read_removed, write_source
from marin_assets_tests.core.dedup.corpora import stdlib_documents


@pytest.mark.system
def test_incremental_rebuild_of_one_changed_source_equals_a_full_rebuild(tmp_path: Path) -> None:
    # delta has a cluster of its own and no member in any cluster beta has one in
    delta = near_copies(4, seed=300, max_edits=1) + stdlib_documents(3, seed=301)
    normalized, buckets = big_cluster_corpus(tmp_path / "v1", extra={"delta": delta})
    cache = str(tmp_path / "cache")
    first = str(tmp_path / "first")
    full_stats = find_fuzzy_duplicates(buckets, normalized, {"gamma"}, first, scale=SMALL_TASKS, cache_uri=cache)
    # beta changes: new near copies of the big cluster and of a small one, one more unrelated doc
    more = near_copies(620, seed=11)[600:] + near_copies(9, seed=104, words=80)[-1:] + stdlib_documents(1, seed=77)
    normalized2, buckets2 = big_cluster_corpus(tmp_path / "v2", extra={"beta": more, "delta": delta})
    for source in ("alpha", "gamma", "delta"):  # unchanged sources keep their files (and fingerprints)
        normalized2[source], buckets2[source] = normalized[source], buckets[source]
    inc = str(tmp_path / "incremental")
    # verify ranges differ from the first run's; the added documents' buckets are found by
    # several key ranges, each scanning the map files in several tasks
    other_counts = dataclasses.replace(SMALL_TASKS, members_per_task=60, records_per_task=200, scan_records_per_task=3000)
    inc_stats = find_fuzzy_duplicates(buckets2, normalized2, {"gamma"}, inc, scale=other_counts, cache_uri=cache, previous_uri=first)
    full = str(tmp_path / "full")
    full2_stats = find_fuzzy_duplicates(buckets2, normalized2, {"gamma"}, full, scale=SMALL_TASKS)
    assert inc_stats["changed_sources"] == ["beta"] and inc_stats["verify_partitions"] != full_stats["verify_partitions"]
    assert inc_stats["cc_method"] == "incremental" and inc_stats["steps"]["edges"]["tasks"] > 4
    for source in buckets2:
        assert storage.read_bytes(dedup.removed_uri(inc, source)) == storage.read_bytes(dedup.removed_uri(full, source))
    assert inc_stats["removed_ids_digest"] == full2_stats["removed_ids_digest"]
    assert inc_stats["removed_ids_digest"]["gamma"] == full_stats["removed_ids_digest"]["gamma"]
    assert inc_stats["removed_ids_digest"]["beta"] != full_stats["removed_ids_digest"]["beta"]
    assert full_stats["removed_per_source"]["delta"] >= 1
    # beta's new copies are all removed by the clusters' previous survivors: those clusters replay
    # their previous decisions, and only beta, whose removals grew, is published again
    assert inc_stats["replayed_clusters"] >= 2 and inc_stats["sources_republished"] == 1 and full2_stats["sources_republished"] == 4
    assert inc_stats["reused_clusters"] > 0 and inc_stats["verified_clusters"] < full2_stats["verified_clusters"]
    assert inc_stats["shards_read_for_text"] < full2_stats["shards_read_for_text"] or inc_stats["verified_members"] < full2_stats["verified_members"]
    # a second change on top of the incremental run (its scratch already collected) still equals a full rebuild
    normalized3, buckets3 = big_cluster_corpus(tmp_path / "v3", extra={"beta": more, "delta": delta[:-1]})
    for source in ("alpha", "beta", "gamma"):
        normalized3[source], buckets3[source] = normalized2[source], buckets2[source]
    again = str(tmp_path / "again")
    again_stats = find_fuzzy_duplicates(buckets3, normalized3, {"gamma"}, again, scale=SMALL_TASKS, cache_uri=cache, previous_uri=inc)
    full3 = str(tmp_path / "full3")
    full3_stats = find_fuzzy_duplicates(buckets3, normalized3, {"gamma"}, full3, scale=SMALL_TASKS)
    # delta lost an unclustered document: its nodes, clusters and removals stay, nothing is republished
    assert again_stats["changed_sources"] == ["delta"] and again_stats["cc_method"] == "incremental" and again_stats["sources_republished"] == 0
    # no cluster touched: one plan task covers every label range
    assert again_stats["steps"]["plan"]["tasks"] == 1 < again_stats["verify_partitions"] == again_stats["steps"]["verify"]["tasks"]
    for source in buckets3:
        assert storage.read_bytes(dedup.removed_uri(again, source)) == storage.read_bytes(dedup.removed_uri(full3, source))
    assert again_stats["removed_ids_digest"] == full3_stats["removed_ids_digest"]


@pytest.mark.system
def test_the_incremental_merge_reads_only_the_label_blocks_of_the_added_edges_endpoints(tmp_path: Path) -> None:
    """One more near copy of a small cluster: the merge reads the blocks holding that cluster's
    nodes (label files are cut at the shard groups' node ranges), not every previous label."""
    scale = dataclasses.replace(SMALL_TASKS, shards_per_map=1)
    normalized, buckets = big_cluster_corpus(tmp_path / "v1", shards=4)
    cache, first = str(tmp_path / "cache"), str(tmp_path / "first")
    before = find_fuzzy_duplicates(buckets, normalized, {"gamma"}, first, scale=scale, cache_uri=cache)
    normalized2, buckets2 = big_cluster_corpus(tmp_path / "v2", extra={"gamma": near_copies(9, seed=104, words=80)[-1:]}, shards=4)
    for source in ("alpha", "beta"):
        normalized2[source], buckets2[source] = normalized[source], buckets[source]
    inc, full = str(tmp_path / "inc"), str(tmp_path / "full")
    stats = find_fuzzy_duplicates(buckets2, normalized2, {"gamma"}, inc, scale=scale, cache_uri=cache, previous_uri=first)
    find_fuzzy_duplicates(buckets2, normalized2, {"gamma"}, full, scale=scale)
    assert stats["cc_method"] == "incremental" and stats["changed_sources"] == ["gamma"]
    assert 0 < stats["label_rows_read"] < before["docs_in_clusters"] // 2
    # at a bound of 6 files per task, lookup tasks keep the needed rows of each few label files first
    runner, bounded = InputCountingRunner(), str(tmp_path / "bounded")
    bounded_stats = find_fuzzy_duplicates(buckets2, normalized2, {"gamma"}, bounded, scale=dataclasses.replace(scale, max_inputs_per_task=6), cache_uri=cache, previous_uri=first, runner=runner)
    assert bounded_stats["cc_method"] == "incremental" and len(storage.read_json(storage.join(first, fuzzy_layout.STATE_FILE))["label_files"]) > 6
    assert runner.widest["fuzzy_label_lookup"] <= 6 and max(runner.widest.values()) <= 6, str(runner.widest)
    assert bounded_stats["label_rows_read"] == stats["label_rows_read"]
    for source in buckets2:
        assert storage.read_bytes(dedup.removed_uri(inc, source)) == storage.read_bytes(dedup.removed_uri(full, source))
        assert storage.read_bytes(dedup.removed_uri(bounded, source)) == storage.read_bytes(dedup.removed_uri(full, source))


@pytest.mark.system
def test_incremental_components_follow_added_and_removed_documents_like_a_full_rebuild(tmp_path: Path) -> None:
    """beta changes three ways: it gains near copies (the previous clusters merge over the added
    documents' edges), it loses an unclustered document (still incremental), and it loses a
    clustered one (its cluster may fall apart: the components are recomputed over every edge)."""
    normalized, buckets = big_cluster_corpus(tmp_path / "v1")
    cache, first = str(tmp_path / "cache"), str(tmp_path / "first")
    first_stats = find_fuzzy_duplicates(buckets, normalized, {"gamma"}, first, scale=SMALL_TASKS, cache_uri=cache)
    state = storage.read_json(str(Path(first) / "_fuzzy_state.json"))
    retained = {k.split("\x00", 1)[1] for f in state["verify_files"] for keys in storage.read_parquet(fuzzy_layout.clusters_uri(f)).column("retained").to_pylist() for k in keys}
    in_clusters = retained | {r["id"] for s in buckets for r in read_removed(first, s)}
    lonely = next(t for t in stdlib_documents(30, per_doc=4, seed=5)[10:20] if doc_id(t) not in in_clusters)
    clustered = near_copies(600, seed=11)[300]  # in the big cluster
    more = near_copies(630, seed=11)[600:] + near_copies(9, seed=104, words=80)[-2:]
    cases = {
        "grown": (more, set(), "incremental"),
        "grown_and_shrunk": (more, {lonely}, "incremental"),
        "lost_a_member": (more[:5], {clustered}, "star_rounds"),
    }
    for name, (extra, drop, method) in cases.items():
        root = tmp_path / name
        v2, b2 = big_cluster_corpus(root, extra={"beta": extra})
        texts = [t for t in storage.read_parquet(v2["beta"][0]).column("text").to_pylist() + storage.read_parquet(v2["beta"][1]).column("text").to_pylist() if t not in drop]
        v2["beta"], b2["beta"] = write_source(root / "beta2", "beta", texts, 2)
        for source in ("alpha", "gamma"):
            v2[source], b2[source] = normalized[source], buckets[source]
        run_cache = str(root / "cache")
        shutil.copytree(cache, run_cache)
        inc, full = str(root / "incremental"), str(root / "full")
        inc_stats = find_fuzzy_duplicates(b2, v2, {"gamma"}, inc, scale=SMALL_TASKS, cache_uri=run_cache, previous_uri=first)
        full_stats = find_fuzzy_duplicates(b2, v2, {"gamma"}, full, scale=SMALL_TASKS)
        assert inc_stats["changed_sources"] == ["beta"] and inc_stats["cc_method"] == method, name
        for source in b2:
            assert storage.read_bytes(dedup.removed_uri(inc, source)) == storage.read_bytes(dedup.removed_uri(full, source)), (name, source)
        assert inc_stats["removed_ids_digest"] == full_stats["removed_ids_digest"]
        assert inc_stats["docs_in_clusters"] == full_stats["docs_in_clusters"] and inc_stats["cluster_size_histogram"] == full_stats["cluster_size_histogram"]
        if method == "incremental":
            # only the added documents' buckets give edges, and most clusters are carried over untouched
            assert inc_stats["candidate_edges"] < full_stats["candidate_edges"] / 10
            assert inc_stats["reused_clusters"] > inc_stats["verified_clusters"] + inc_stats["replayed_clusters"]
            assert inc_stats["removed_ids_digest"]["alpha"] == first_stats["removed_ids_digest"]["alpha"]
        else:
            assert doc_id(clustered) not in {r["id"] for r in read_removed(inc, "beta")}


def test_an_added_document_that_bridges_two_clusters_merges_them_like_a_full_rebuild(tmp_path: Path) -> None:
    """An added document whose buckets are half one cluster's and half another's: the previous
    clusters merge under the smaller label, as the full rebuild's components do."""
    one, two = near_copies(4, seed=401, max_edits=1), near_copies(4, seed=402, max_edits=1)
    normalized, buckets = {}, {}
    normalized["alpha"], buckets["alpha"] = write_source(tmp_path / "v1", "alpha", one + two, 1)
    normalized["beta"], buckets["beta"] = write_source(tmp_path / "v1", "beta", stdlib_documents(3, seed=403), 1)
    cache, first = str(tmp_path / "cache"), str(tmp_path / "first")
    first_stats = find_fuzzy_duplicates(buckets, normalized, set(), first, cache_uri=cache)
    assert first_stats["clusters"] == 2 and first_stats["largest_cluster"] == 4
    # beta gains a copy of the first cluster's text whose buckets are half of each cluster's
    bridge = one[0] + " bridge"
    v2, b2 = dict(normalized), dict(buckets)
    v2["beta"], b2["beta"] = write_source(tmp_path / "v2", "beta", stdlib_documents(3, seed=403) + [bridge], 1)
    alpha = storage.read_parquet(buckets["alpha"][0]).to_pylist()
    of = {r["id"]: r["buckets"] for r in alpha}
    a, b = of[doc_id(one[1])], of[doc_id(two[1])]
    rows = storage.read_parquet(b2["beta"][0]).to_pylist()
    for r in rows:
        if r["id"] == doc_id(bridge):
            r["buckets"] = a[: len(a) // 2] + b[len(b) // 2 :]
    storage.write_parquet(pa.Table.from_pylist(rows, schema=storage.read_parquet(b2["beta"][0]).schema), b2["beta"][0])
    inc, full = str(tmp_path / "incremental"), str(tmp_path / "full")
    inc_stats = find_fuzzy_duplicates(b2, v2, set(), inc, cache_uri=cache, previous_uri=first)
    full_stats = find_fuzzy_duplicates(b2, v2, set(), full)
    assert inc_stats["cc_method"] == "incremental" and inc_stats["clusters"] == full_stats["clusters"] == 1
    assert inc_stats["largest_cluster"] == full_stats["largest_cluster"] == 9
    for source in b2:
        assert storage.read_bytes(dedup.removed_uri(inc, source)) == storage.read_bytes(dedup.removed_uri(full, source))
    # the merged labels are the next run's labels: a further change still equals a full rebuild
    v3, b3 = dict(v2), dict(b2)
    v3["alpha"], b3["alpha"] = write_source(tmp_path / "v3", "alpha", one + two + [two[0] + " tail"], 1)
    again, full3 = str(tmp_path / "again"), str(tmp_path / "full3")
    again_stats = find_fuzzy_duplicates(b3, v3, set(), again, cache_uri=cache, previous_uri=inc)
    full3_stats = find_fuzzy_duplicates(b3, v3, set(), full3)
    assert again_stats["cc_method"] == "incremental" and again_stats["largest_cluster"] == full3_stats["largest_cluster"] == 10
    # the second run's fresh labels joined the first's small file: no label file per run
    label_files = [storage.read_json(str(Path(d) / "_fuzzy_state.json"))["label_files"] for d in (first, inc, again)]
    assert len(label_files[1]) == len(label_files[0]) + 1 and len(label_files[2]) == len(label_files[1])
    assert all(storage.exists(f) for f in label_files[2]) and not storage.exists(str(Path(again) / "_work" / "labels" / "fresh.parquet"))
    # and a further change, merging over the compacted labels, still equals a full rebuild
    v4, b4 = dict(v3), dict(b3)
    v4["alpha"], b4["alpha"] = write_source(tmp_path / "v4", "alpha", one + two + [two[0] + " tail", one[2] + " more"], 1)
    fourth, full4 = str(tmp_path / "fourth"), str(tmp_path / "full4")
    fourth_stats = find_fuzzy_duplicates(b4, v4, set(), fourth, cache_uri=cache, previous_uri=again)
    full4_stats = find_fuzzy_duplicates(b4, v4, set(), full4)
    assert fourth_stats["cc_method"] == "incremental" and fourth_stats["largest_cluster"] == full4_stats["largest_cluster"] == 11
    for source in b4:
        assert storage.read_bytes(dedup.removed_uri(fourth, source)) == storage.read_bytes(dedup.removed_uri(full4, source))
    for source in b3:
        assert storage.read_bytes(dedup.removed_uri(again, source)) == storage.read_bytes(dedup.removed_uri(full3, source))

