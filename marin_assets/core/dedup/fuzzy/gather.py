"""Step 6, gather: the requested rows' texts of a group of normalized shards, keyed by cluster."""

from __future__ import annotations

import bisect

import dataclasses
import os
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from marin_assets.core.dedup import shuffle
from marin_assets.core.dedup.decisions import (
    VERIFY_BATCH_CHARS,
    DedupError,
)
from marin_assets.core.dedup.fuzzy.layout import REQUEST_SCHEMA, TEXT_SCHEMA, merge_runs, rows_of, section_uri, shard_runs, streamed_uri
from marin_assets.core.dedup.fuzzy.state import FuzzyRun, Mapped
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.integrity import check_text_ids
from marin_assets.core.runtime.runner import ShardResult, ShardTask


@dataclasses.dataclass(frozen=True, slots=True)  # one per shard in a step's tasks: no dict each
class GatherParams:
    source: str
    first_node: int
    rows: int
    max_chars: int
    batch_chars: int = VERIFY_BATCH_CHARS
    runs: tuple[tuple[int, int], ...] | None = ()  # None: its first rows (as its map task returned them)


@dataclasses.dataclass(frozen=True)
class GatherGroupParams:
    shards: tuple[GatherParams, ...]
    request_cuts: str  # the plan files are block files cut at these stored node cuts
    text_blocks: int  # verify partitions: one block of gathered texts each
    hold_chars: int = 1 << 30  # texts of small clusters held before they are written (a further block file, :func:`section_uri`)


@shuffle.measured
def fuzzy_gather_group(inputs: list[str], output: str, params: GatherGroupParams) -> dict[str, Any]:
    """The requested rows' text of a group of normalized shards (the inputs: normalized shard and
    node table per shard, then the plan files, whose blocks of the group's node ranges are read
    once for the whole group). The texts go to one block per verify partition, but those of big
    clusters, which go to :func:`streamed_uri` sorted by cluster and place across the group's
    shards (each shard's rows to a local run file, the runs then merged), so that a verify
    batch reads one or two row groups of the file. Memory holds one shard and about
    ``hold_chars`` of small clusters' texts: past that, the texts held so far go to a further
    block file (:func:`section_uri`)."""
    k = len(params.shards)
    plan_files = inputs[2 * k :]
    runs = [shard_runs(p.first_node, p.rows, p.runs) for p in params.shards]
    merged = merge_runs([r for rs in runs for r in rs])
    requests = shuffle.read_ranges_blocks(plan_files, shuffle.read_cuts(params.request_cuts), merged, REQUEST_SCHEMA)
    keys = requests.column("key").to_numpy()
    gathered = shards = streamed = held = 0
    streamed_parts: set[int] = set()  # the verify partitions whose big clusters' texts this task streamed
    small: list[pa.Table] = []
    sections: list[str] = []
    with tempfile.TemporaryDirectory(prefix="dedup-gather-") as tmp:
        sorted_runs: list[str] = []  # per shard with big clusters' rows: a local file of them, sorted by (key, pos)
        for j, shard in enumerate(params.shards):
            bounds = np.asarray(runs[j], np.int64).ravel()
            mine = requests.filter(pa.array((np.searchsorted(bounds, keys, side="right") % 2) == 1)) if keys.size else requests
            out = _gather_shard(inputs[2 * j], inputs[2 * j + 1], mine, shard)
            pa.default_memory_pool().release_unused()  # the shard's decoded pages: the next shard's are not added to them
            if out is None:
                continue
            table, big = out[0].drop_columns(["big"]), out[0].column("big")
            gathered += table.num_rows
            shards += 1
            small.append(table.filter(pc.invert(big)))
            held += int(pc.sum(pc.binary_length(small[-1].column("text"))).as_py() or 0)
            if held > params.hold_chars and j < k - 1:
                sections.append(section_uri(output, len(sections)))
                shuffle.write_blocks(pa.concat_tables(small), sections[-1], cuts=shuffle.partition_cuts(params.text_blocks))
                small, held = [], 0
            if pc.any(big).as_py():
                sorted_runs.append(os.path.join(tmp, f"run-{j:05d}.parquet"))
                storage.write_parquet(table.filter(big), sorted_runs[-1], row_group_size=out[1])
                streamed += int(pc.sum(big.cast(pa.int64())).as_py())
                lkeys = table.filter(big).column("key").to_numpy().astype(np.uint64)
                streamed_parts.update((np.searchsorted(shuffle.partition_cuts(params.text_blocks), lkeys, side="right") - 1).tolist())
        if sorted_runs:  # one file sorted by (key, pos): a batch of a cluster then lies in one or two row groups
            local = os.path.join(tmp, "texts.parquet")
            merged_rows = shuffle.merge_sorted([shuffle.parquet_row_groups(r) for r in sorted_runs], ["key", "pos"])
            shuffle.write_row_groups(merged_rows, local, params.shards[0].batch_chars)
            storage.put_file(local, streamed_uri(output))
    texts = pa.concat_tables(small) if small else TEXT_SCHEMA.empty_table()
    shuffle.write_blocks(texts, output, cuts=shuffle.partition_cuts(params.text_blocks))
    return {"gathered": gathered, "shard_read": shards, "streamed": streamed, "streamed_parts": sorted(streamed_parts), "sections": sections}


def _gather_shard(normalized_uri: str, nodes_file: str, requests: pa.Table, params: GatherParams) -> tuple[pa.Table, int] | None:
    """Texts of one shard's requested rows, sorted by (cluster key, place), with their ``big``
    flag, and a row group size of about ``batch_chars``; None when the shard has no requested
    row (it is not read)."""
    nodes_table = None
    if requests.num_rows and params.runs != ():  # None: its first rows, still mapped by its node table
        nodes_table = storage.read_parquet_object(nodes_file, columns=["id", "node"])
        requests = requests.filter(pa.array(np.isin(requests.column("key").to_numpy(), nodes_table.column("node").to_numpy())))
    if requests.num_rows == 0:
        return None
    node = requests.column("key").to_numpy()
    if nodes_table is not None:
        take = pa.array(rows_of(nodes_table.column("node").to_numpy(), node))
    else:
        nodes_table = storage.read_parquet_object(nodes_file, columns=["id"])
        take = pa.array(node - params.first_node)
    ids, texts = _requested_rows(normalized_uri, take.to_numpy(), params.max_chars)
    expected = nodes_table.column("id").take(take).combine_chunks().cast(pa.string())
    if not ids.equals(expected):
        raise DedupError(f"source {params.source!r}: row order of its minhash buckets differs from {normalized_uri}; rematerialize minhash_buckets for {params.source!r}")
    out = pa.table([requests.column("lkey"), requests.column("pos"), pa.array(node), texts, requests.column("big")], schema=TEXT_SCHEMA.append(pa.field("big", pa.bool_())))
    out = out.take(pc.sort_indices(out, sort_keys=[("key", "ascending"), ("pos", "ascending")]))
    mean_chars = max(1, int(pc.sum(pc.utf8_length(texts)).as_py() or 0) // max(1, out.num_rows))
    return out, min(shuffle.ROW_GROUP_ROWS, max(16, params.batch_chars // mean_chars))


READ_ROWS = 1024  # rows of a normalized shard decoded at a time
READ_BUFFER = 8 << 20  # bytes of the shard read at a time


def _requested_rows(normalized_uri: str, take: np.ndarray, max_chars: int) -> tuple[pa.Array, pa.Array]:
    """``id`` and ``text`` (cut to ``max_chars``) of rows ``take`` of a normalized shard, in
    ``take``'s order, decoded ``READ_ROWS`` at a time up to the last requested row: the task
    holds the requested texts, not the whole shard's (which grows with the shard's size)."""
    order = np.argsort(take, kind="stable")
    wanted = take[order]
    ids: list[pa.Array] = []
    texts: list[pa.Array] = []
    fs, path = storage.filesystem(normalized_uri)
    with storage.reading_parquet(normalized_uri), fs.open(path, "rb", block_size=READ_BUFFER, cache_type="readahead") as handle:
        start = 0
        for batch in storage.parquet_file(handle, buffer_size=READ_BUFFER, pre_buffer=False).iter_batches(READ_ROWS, columns=["id", "text"], use_threads=False):
            lo, hi = np.searchsorted(wanted, [start, start + batch.num_rows])
            if hi > lo:
                rows = pa.array(wanted[lo:hi] - start)
                ids.append(batch.column("id").take(rows).cast(pa.string()))
                text = batch.column("text").take(rows)
                check_text_ids(normalized_uri, ids[-1], text)
                texts.append(pc.utf8_slice_codeunits(pc.fill_null(text.cast(pa.large_string()), ""), 0, max_chars))
            start += batch.num_rows
            if hi == wanted.size:
                break
    back = pa.array(np.argsort(order, kind="stable"))  # from row order back to ``take``'s
    return pa.chunked_array(ids, pa.string()).combine_chunks().take(back), pa.chunked_array(texts, pa.large_string()).combine_chunks().take(back)


# --------------------------------------------------------------------------- scheduling


def requested_ranges(plans: Sequence[ShardResult]) -> tuple[list[int], list[int]]:
    """The union of the plan tasks' requested node ranges, as sorted starts and ends of disjoint
    ranges (16,384 plan tasks of up to 64 ranges each, not a million tuples)."""
    every = [[0, shuffle.KEY_SPACE]]
    runs = np.concatenate([np.asarray(r.stats.get("requested_runs", every), np.uint64).reshape(-1, 2) for r in plans] or [np.zeros((0, 2), np.uint64)])
    runs = runs[np.argsort(runs[:, 0], kind="stable")]
    if not len(runs):
        return [], []
    reach = np.maximum.accumulate(runs[:, 1])
    first = np.flatnonzero(np.r_[True, runs[1:, 0] > reach[:-1]])
    return runs[first, 0].tolist(), np.maximum.reduceat(runs[:, 1], first).tolist()


def _gather_groups(run: FuzzyRun, mapped: Mapped, plans: Sequence[ShardResult], incremental: bool) -> list[list[int]]:
    """The shards that hold a requested row, in groups: incremental (few rows requested), one
    task per ``shards_per_map`` of them; full, one per members group (it reads exactly its blocks)."""
    starts, ends = requested_ranges(plans)

    def requested(first: int, rows: int, runs: Sequence[tuple[int, int]]) -> bool:
        for a, b in runs or ((first, first + rows),):
            i = bisect.bisect_right(ends, a)  # the first requested range ending past a
            if i < len(ends) and starts[i] < b:
                return True
        return False

    shards = mapped.shards
    wanted = np.fromiter((requested(int(shards.first[i]), int(shards.rows[i]), shards.runs_of(i)) for i in range(len(shards))), bool, count=len(shards))
    if incremental:
        chosen, per = np.flatnonzero(wanted).tolist(), run.scale.shards_per_map
        return [chosen[g : g + per] for g in range(0, len(chosen), per)]
    return [idx for idx in ([i for i in group if wanted[i]] for group in mapped.groups) if idx]


def run_gather(run: FuzzyRun, mapped: Mapped, plans: Sequence[ShardResult], incremental: bool, verify_parts: int, prefix: str) -> list[ShardResult]:
    """Gather tasks over the shards with requested rows; each reads its shards and the plan files' blocks of their node ranges."""
    scale = run.scale

    def shard(i: int) -> GatherParams:
        source, _, _, first, rows, runs = mapped.shards[i]
        return GatherParams(source, first, rows, run.rule.max_chars_per_doc, scale.verify_batch_chars, runs)

    # a gather task reads its shards' normalized files and node tables, and every plan file
    plan_files = tuple(run.merged([r.output for r in plans], storage.join(run.work, "gather", prefix + "plans"), scale.max_inputs_per_task - 2 * scale.shards_per_map, cuts=mapped.node_cuts))
    return run.run(
        [
            ShardTask(
                fuzzy_gather_group,
                (*(u for i in idx for u in mapped.shards[i][1:3]), *plan_files),
                storage.join(run.work, "gather", f"{prefix}g{g:06d}.blocks"),
                GatherGroupParams(tuple(shard(i) for i in idx), mapped.node_cuts, verify_parts, scale.member_chars_per_task),
            )
            for g, idx in enumerate(_gather_groups(run, mapped, plans, incremental))
        ]
    )
