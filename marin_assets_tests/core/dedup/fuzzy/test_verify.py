"""The verify step: label ranges finer than the member blocks."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

from marin_assets.core.dedup.fuzzy import find_fuzzy_duplicates
from marin_assets.core.dedup.fuzzy import state as fuzzy_state
from marin_assets_tests.core.dedup.corpora import SMALL_TASKS, big_cluster_corpus, outputs
from marin_assets_tests.core.dedup.reference import reference_fuzzy_removals


@pytest.mark.system
def test_verify_ranges_finer_than_the_member_blocks_read_their_covering_block(tmp_path: Path) -> None:
    """Member files are cut before their readers' count is known (from the clustered documents
    at the corpus' mean length); when the members' text is longer, verify uses more, finer key
    ranges, each reading its covering block and keeping its own rows: the same removals. The
    gather task, holding more text than a verify range, writes it to further block files."""
    rng = random.Random(5)
    words = [f"w{k}" for k in range(5000)]
    short = [" ".join(rng.choice(words) for _ in range(8)) for _ in range(1500)]  # unclustered, short: a low mean length
    normalized, buckets = big_cluster_corpus(tmp_path, extra={"beta": short})
    scale = dataclasses.replace(SMALL_TASKS, members_per_task=10**6, member_chars_per_task=40_000)
    out = str(tmp_path / "out")
    stats = find_fuzzy_duplicates(buckets, normalized, {"gamma"}, out, scale=scale)
    mean = sum(stats["chars_per_source"].values()) // stats["docs"]
    blocks = fuzzy_state.verify_partitions(stats["docs_in_clusters"], stats["docs_in_clusters"] * mean, scale)
    assert stats["verify_partitions"] >= 4 * blocks  # each verify range is a quarter (or less) of a member block
    assert outputs(out, buckets) == reference_fuzzy_removals(buckets, normalized, {"gamma"})

