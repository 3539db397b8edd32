"""Bounded fan-in: no fuzzy task reads more files than the bound, and the removals stay the same."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from marin_assets.core.dedup import decisions as dedup
from marin_assets.core.dedup.fuzzy import find_fuzzy_duplicates
from marin_assets.core.runtime import storage
from marin_assets_tests.core.dedup.corpora import InputCountingRunner, SMALL_TASKS, big_cluster_corpus, outputs
from marin_assets_tests.core.dedup.reference import reference_fuzzy_removals


@pytest.mark.system
def test_no_task_reads_more_files_than_the_bound_and_the_removals_stay_the_same(tmp_path: Path) -> None:
    """Twelve map files, star rounds over many partitions, a bound of six files per task: merge
    tasks combine each step's files first, and the removals are the unbounded run's, byte for byte."""
    normalized, buckets = big_cluster_corpus(tmp_path, shards=4)
    # the big cluster's texts streamed by each of the 12 gather tasks: their files merged too
    free = dataclasses.replace(SMALL_TASKS, shards_per_map=1, edges_per_task=400, cluster_chars_in_memory=50_000, verify_batch_chars=20_000)
    bound = dataclasses.replace(free, max_inputs_per_task=6, merge_bytes=4096)
    with pytest.raises(ValueError, match="MARIN_FUZZY_MAX_INPUTS_PER_TASK"):  # a gather task reads two files per shard
        dataclasses.replace(free, max_inputs_per_task=3)
    runner = InputCountingRunner()
    out = str(tmp_path / "bounded")
    stats = find_fuzzy_duplicates(buckets, normalized, {"gamma"}, out, scale=bound, runner=runner)
    assert max(runner.widest.values()) <= 6 and stats["max_task_inputs"] == max(runner.widest.values()), runner.widest
    assert runner.widest["merge_files"] == 6 and stats["steps"]["merge"]["tasks"] >= 3 and stats["streamed_clusters"] == 1
    assert 2 <= runner.widest["merge_sorted_files"] <= 6
    assert stats["cc_method"] == "star_rounds" and stats["steps"]["map"]["tasks"] == 12
    unbounded = str(tmp_path / "free")
    find_fuzzy_duplicates(buckets, normalized, {"gamma"}, unbounded, scale=free, runner=(free_runner := InputCountingRunner()))
    assert free_runner.widest["fuzzy_edges"] == 12  # what the bound replaced
    for source in buckets:
        assert storage.read_bytes(dedup.removed_uri(out, source)) == storage.read_bytes(dedup.removed_uri(unbounded, source))
    assert outputs(out, buckets) == reference_fuzzy_removals(buckets, normalized, {"gamma"})

