"""Where the fuzzy steps' files live, their schemas and the task sizes (every step reads these)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from marin_assets.core.dedup import shuffle
from marin_assets.core.dedup.components import LABEL_SCHEMA
from marin_assets.core.dedup.decisions import (
    VERIFY_BATCH_CHARS,
)
from marin_assets.core.dedup.fanin import BUDGET_BYTES, MAX_INPUTS
from marin_assets.core.runtime import storage

RANK_SHIFT = 40
STATE_FILE = "_fuzzy_state.json"
RELABEL_FILES = 16  # previous label files per relabel task (the members step reads one touched-rows file per task)
LAYOUT = 4  # the state's layout: nodes kept across changes, label files kept for the next run, map and verify outputs in blocks, retained members (and big clusters' texts of them) in the cluster records

RECORD_SCHEMA = pa.schema([("key", pa.int64()), ("node", pa.int64())])
NODE_SCHEMA = pa.schema([("id", pa.string()), ("chars", pa.int64()), ("node", pa.int64()), ("digest", pa.uint64())])
# ``added``: incremental, the member was not in the previous run's cluster of its label (a full
# run: false everywhere)
MEMBER_SCHEMA = pa.schema(
    [("key", pa.int64()), ("label", pa.int64()), ("node", pa.int64()), ("rank", pa.int32()), ("id", pa.string()), ("chars", pa.int64()), ("added", pa.bool_())]
)
DELTA_SCHEMA = LABEL_SCHEMA.append(pa.field("added", pa.bool_()))  # the touched clusters' rows, as the members step reads them
REMAP_SCHEMA = pa.schema([("key", pa.int64()), ("node", pa.int64()), ("label", pa.int64()), ("fresh", pa.bool_())])
# ``big``: the cluster is verified batch by batch (its texts go to the streamed file, not the blocks)
REQUEST_SCHEMA = pa.schema([("key", pa.int64()), ("lkey", pa.int64()), ("pos", pa.int64()), ("big", pa.bool_())])
# Gathered texts: one block per verify partition, but a big cluster's texts, which are stored
# sorted by (cluster key, place in processing order) in row groups of about VERIFY_BATCH_CHARS,
# so they can be read batch by batch.
TEXT_SCHEMA = pa.schema([("key", pa.int64()), ("pos", pa.int64()), ("node", pa.int64()), ("text", pa.large_string())])
VERDICT_SCHEMA = pa.schema(
    [
        ("key", pa.int64()),
        ("rank", pa.int32()),
        ("id", pa.string()),
        ("label", pa.int64()),
        ("cluster_id", pa.string()),
        ("representative_id", pa.string()),
        ("representative_source", pa.string()),
        ("containment", pa.float64()),
        ("jaccard", pa.float64()),
        ("chars", pa.int64()),
    ]
)
# A cluster's record: its size, a digest of its members and the member keys (source rank, id) of
# those it retained; with its removal rows that is every member, and a later run replays the
# retained ones against the members it gained. A big cluster that retained few members (at most
# one in HEAD_TEXT_SHARE, and at most ``verify_batch_chars`` of text) also keeps their texts
# (``texts``, parallel to ``retained``; else nulls): that replay then reads no shard but the
# added members' (the texts are a small share of the cluster's).
CLUSTER_SCHEMA = pa.schema(
    [("label", pa.int64()), ("size", pa.int64()), ("members", pa.string()), ("retained", pa.list_(pa.string())), ("texts", pa.list_(pa.large_string()))]
)
HEAD_TEXT_SHARE = 16
# A replayed cluster whose replay reads at least one in REPLAY_READ_SHARE of its members (and
# whose text is not streamed) has every member's text gathered with it: when an added member is
# retained, its verify task verifies it in full at once rather than in a second pass.
REPLAY_READ_SHARE = 16


@dataclasses.dataclass(frozen=True)
class FuzzyScale:
    """Task sizes: each bounds one task's memory (records, edges or members per task) or its
    reads. Map files group ``shards_per_map`` shards; a task that would read more than
    ``max_inputs_per_task`` files of the step before reads merged files instead
    (:mod:`marin_assets.core.dedup.fanin`)."""

    records_per_task: int = 16_000_000
    edges_per_task: int = 16_000_000
    union_find_max_edges: int = 20_000_000
    merge_max_edges: int = 20_000_000  # incremental: the added documents' edges merged in one task (above: components over every edge)
    members_per_task: int = 1_000_000
    member_chars_per_task: int = 1 << 30  # verify holds its range's requested texts (but for big clusters)
    cluster_chars_in_memory: int = 1 << 26  # a cluster with more member text is verified batch by batch, read from storage
    verify_batch_chars: int = VERIFY_BATCH_CHARS  # texts turned into n-grams at a time (and gathered row groups)
    verify_index_bytes: int = 1 << 30  # a cluster's retained members' n-grams held in memory; past it, spilled to memory-mapped files
    shards_per_map: int = 16  # a map task reads this many shards of one source into one records file
    scan_records_per_task: int = 64_000_000  # incremental: map file records one task scans (a row group at a time) for the added documents' buckets
    sources_per_publish: int = 16  # one publish task writes this many sources' removal files, reading each removal part once
    max_inputs_per_task: int = MAX_INPUTS  # files one task reads, at most (more: merge tasks combine them first)
    merge_bytes: int = BUDGET_BYTES  # a merge task's rows held at once

    def __post_init__(self) -> None:
        # a gather task reads two files per shard of its group and at least two merged plan files
        if self.max_inputs_per_task < 2 * self.shards_per_map + 2:
            raise ValueError(
                f"FuzzyScale: max_inputs_per_task={self.max_inputs_per_task} is under 2 x shards_per_map + 2 = {2 * self.shards_per_map + 2} "
                "(MARIN_FUZZY_MAX_INPUTS_PER_TASK, MARIN_FUZZY_SHARDS_PER_MAP); raise the one or lower the other"
            )


def nodes_uri(map_output: str, k: int) -> str:
    """The node table (``id``, ``chars``, ``node``, bucket ``digest`` per row) of shard ``k`` of a map group."""
    return _stem(map_output) + f".nodes-{k:05d}.parquet"


def clusters_uri(verify_output: str) -> str:
    return _stem(verify_output) + ".clusters.parquet"


def _stem(uri: str) -> str:
    return uri.removesuffix(".parquet").removesuffix(shuffle.BLOCK_SUFFIX)


MAX_NODE_RUNS = 16


def node_runs(nodes: np.ndarray, limit: int = MAX_NODE_RUNS) -> list[list[int]]:
    """At most ``limit`` node ranges ``[lo, hi)`` covering ``nodes`` (the smallest gaps closed):
    a shard's labels and requests are read by these ranges, then matched node by node."""
    if nodes.size == 0:
        return []
    ordered = np.unique(nodes)
    breaks = np.flatnonzero(np.diff(ordered) > 1)
    if breaks.size >= limit:
        gaps = ordered[breaks + 1] - ordered[breaks]
        breaks = np.sort(breaks[np.argsort(-gaps, kind="stable")[: limit - 1]])
    lo = np.r_[ordered[0], ordered[breaks + 1]]
    hi = np.r_[ordered[breaks], ordered[-1]] + 1
    return [[int(x), int(y)] for x, y in zip(lo, hi)]


def rows_of(nodes: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Row index of each ``wanted`` node in a shard's ``nodes`` (every one must be there)."""
    order = np.argsort(nodes, kind="stable")
    pos = np.searchsorted(nodes, wanted, sorter=order)
    return order[np.minimum(pos, max(0, nodes.size - 1))]


def added_uri(map_output: str) -> str:
    """A changed map group's records of its added documents (the buckets an incremental run joins)."""
    return _stem(map_output) + ".added.parquet"


def gone_uri(map_output: str) -> str:
    """The previous run's nodes of a changed map group's documents that are gone (or changed)."""
    return _stem(map_output) + ".gone.parquet"


def shard_runs(first_node: int, rows: int, runs: Sequence[Sequence[int]] | None) -> tuple[tuple[int, int], ...]:
    """The node ranges a shard's rows are read by (its map task's runs, else its first rows;
    None: its map task returned its first rows)."""
    return tuple((int(a), int(b)) for a, b in runs or ()) or ((first_node, first_node + rows),)


def streamed_uri(gather_output: str) -> str:
    """A gather task's texts of big clusters (sorted by cluster and place, read batch by batch)."""
    return gather_output.removesuffix(".blocks") + ".streamed.parquet"


def section_uri(gather_output: str, k: int) -> str:
    """A gather task's ``k``-th further block file of texts (written when it held ``hold_chars``)."""
    return gather_output.removesuffix(".blocks") + f".s{k:03d}.blocks"


def merge_runs(runs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, disjoint ranges covering ``runs``."""
    out: list[list[int]] = []
    for lo, hi in sorted(runs):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi) for lo, hi in out]


def keep_cuts(cuts: Sequence[str], folder: str) -> list[str]:
    """Copies of the label files' stored cuts in this run's labels folder (the next run reads
    them; the previous run's folder may go)."""
    copies: dict[str, str] = {}
    for uri in dict.fromkeys(c for c in cuts if c):
        copies[uri] = storage.join(folder, f"cuts-{len(copies):04d}.bin")
        if uri != copies[uri]:
            shuffle.copy_file(uri, copies[uri])
    return [copies.get(c, "") for c in cuts]
