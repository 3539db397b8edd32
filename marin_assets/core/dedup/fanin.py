"""Bounded fan-in: no shuffle task reads more than a configured number of files.

A step whose tasks each read a key range of every file the step before wrote reads, with M
writers, M files per task (at production counts tens of thousands). Where M is above the
bound, merge tasks combine the files in groups of at most the bound into one file each, cut
like the files they merge, until at most the bound remain (one level per factor of the bound:
~25,000 map files are one level at 1,024). A merge task holds one span of blocks of its group
at a time (about ``budget_bytes``), reads the group's files concurrently, each opened once for
the task (its spans, in key order, from one read-ahead of ``budget_bytes`` / inputs), and writes
its file through a local spool. The last level's files (read by the step's tasks) get an
offsets index (:mod:`.block_index`): a reader then fetches each merged file's blocks in one
request. Readers read the merged files with the same functions as the originals.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from marin_assets.core.dedup import block_index, shuffle
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.runner import ShardResult, ShardTask

MAX_INPUTS = 1024  # files one task reads, at most (the default of the fuzzy task sizes)
BUDGET_BYTES = 1 << 30  # a merge task's rows held at once (one span of blocks of its group; fewer spans, fewer requests)


@dataclasses.dataclass(frozen=True)
class MergeFilesParams:
    """How the merged file is cut: ``cuts`` (stored cuts every input shares), ``ranks`` (one
    block per source rank, :func:`shuffle.write_sorted_by_rank`: this many ranks), else
    ``blocks`` equal key ranges (inputs: keyed block files of any equal cut, or sorted Parquet)."""

    blocks: int = 1
    cuts: str = ""
    ranks: int = 0
    budget_bytes: int = BUDGET_BYTES


def _output_cuts(params: MergeFilesParams) -> np.ndarray:
    if params.cuts:
        return shuffle.read_cuts(params.cuts)
    if params.ranks:
        return np.asarray([*range(params.ranks), shuffle.KEY_SPACE], np.uint64)
    return shuffle.partition_cuts(params.blocks)


def _input_cuts(params: MergeFilesParams, count: int, cuts: np.ndarray) -> np.ndarray:
    """An input file's cuts from its block count (stored cuts: the output's, ``cuts``, read once
    per task: not a read of the cuts file per input and span)."""
    if params.cuts:
        return cuts
    if params.ranks:
        return np.asarray([*range(count), shuffle.KEY_SPACE], np.uint64)
    return shuffle.partition_cuts(count)


class _Input:
    """One input of a merge task, open for the task's life: a block file's offsets (``count + 1``;
    a sorted Parquet file: its size as one block) read once, its spans then read in key order
    through the handle's read-ahead (``read_ahead`` bytes): a request per ``read_ahead`` bytes of
    the file, not an open and a fetch per span."""

    def __init__(self, uri: str, read_ahead: int, blocks: int | None) -> None:
        self.uri = uri
        self.handle = shuffle.open_reads(uri, read_ahead)
        if uri.endswith(shuffle.BLOCK_SUFFIX):
            self.parquet = None
            self.offsets = shuffle.block_offsets(self.handle, blocks)
        else:
            self.parquet = pq.ParquetFile(self.handle)
            self.offsets = np.asarray([0, self.handle.seek(0, 2)], np.int64)

    def rows(self, params: MergeFilesParams, cuts: np.ndarray, lo: int, hi: int) -> pa.Table | None:
        """This input's rows with ``lo <= key < hi``."""
        if self.parquet is not None:
            return self._parquet_rows(lo, hi)
        spans, exact = shuffle.covering_spans(_input_cuts(params, self.offsets.size - 1, cuts), [(lo, hi)])
        spans = [(b0, b1) for b0, b1 in spans if self.offsets[b1] > self.offsets[b0]]
        pieces = shuffle.read_open_spans(self.handle, self.uri, self.offsets, spans) if spans else []
        if not pieces:
            return None
        table = pa.concat_tables(pieces)
        return table if exact else shuffle.keep_ranges(table, [(lo, hi)])

    def _parquet_rows(self, lo: int, hi: int) -> pa.Table | None:
        groups = shuffle.overlapping_groups(self.parquet, [(lo, hi)])
        if not groups:
            return None
        table = shuffle.keep_ranges(self.parquet.read_row_groups(groups, use_threads=False), [(lo, hi)])
        return table if table.num_rows else None


def _spans(params: MergeFilesParams, cuts: np.ndarray, footers: Sequence[np.ndarray]) -> list[tuple[int, int]]:
    """Consecutive output blocks ``[b0, b1)`` whose rows (estimated from the inputs' block
    sizes, spread evenly over each input block's key range) stay within the budget."""
    weight = np.zeros(cuts.size - 1)
    for offsets in footers:
        own = _input_cuts(params, offsets.size - 1, cuts).astype(np.float64)
        # the bytes below each output cut, the bytes of each input block spread evenly over its key range
        weight += np.diff(np.interp(cuts.astype(np.float64), own, (offsets - offsets[0]).astype(np.float64)))
    spans, start, held = [], 0, 0.0
    for b in range(weight.size):
        if b > start and held + weight[b] > params.budget_bytes:
            spans.append((start, b))
            start, held = b, 0.0
        held += weight[b]
    spans.append((start, weight.size))
    return spans


@shuffle.measured
def merge_files(inputs: list[str], output: str, params: MergeFilesParams) -> dict[str, Any]:
    """One file of the rows of ``inputs`` (in input order within a key), cut as ``params`` says."""
    cuts = _output_cuts(params)
    threads = shuffle.read_threads(inputs)
    rows = 0
    # one open file per input for the task's life, their read-aheads sharing the task's budget
    read_ahead = params.budget_bytes // max(1, len(inputs))
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory(prefix="dedup-merge-") as tmp:
        blocks = cuts.size - 1 if params.cuts else None  # inputs cut at stored cuts hold as many blocks as the output
        files = shuffle.concurrently(lambda uri: _Input(uri, read_ahead, blocks), inputs, threads)
        for file in files:
            stack.callback(file.handle.close)
        spans = _spans(params, cuts, [f.offsets for f in files])
        local = os.path.join(tmp, "merged" + shuffle.BLOCK_SUFFIX)
        with open(local, "wb") as handle:
            writer = shuffle.BlockWriter(handle, cuts, output)
            for b0, b1 in spans:
                lo, hi = int(cuts[b0]), int(cuts[b1])
                parts = [t for t in shuffle.concurrently(lambda f: f.rows(params, cuts, lo, hi), files, threads) if t is not None]
                if parts:
                    table = pa.concat_tables(parts, promote_options="default")
                    writer.add(table, b1)
                    rows += table.num_rows
            writer.finish()
        storage.put_file(local, output)
    return {"rows": rows, "files": len(inputs), "spans": len(spans)}


def bounded(run: Callable[[list[ShardTask]], list[ShardResult]], files: Sequence[str], folder: str, limit: int, params: MergeFilesParams) -> list[str]:
    """``files`` merged (levels of :func:`merge_files` tasks under ``folder``) until at most
    ``limit`` remain; ``files`` themselves when they are few enough."""
    files = list(files)
    limit = max(2, int(limit))
    level = 0
    while len(files) > limit:
        groups = -(-len(files) // limit)
        size = -(-len(files) // groups)
        final = groups <= limit  # its files are read by the step's readers: they get an offsets index
        merged = storage.join(folder, f"{block_index.MERGED_PREFIX if final else 'level-'}{level}")
        tasks = [ShardTask(merge_files, tuple(files[g * size : (g + 1) * size]), storage.join(merged, shuffle.block_name(g, groups)), params) for g in range(groups)]
        files = [r.output for r in run(tasks)]
        if final:
            run([ShardTask(index_files, tuple(files), storage.join(merged, block_index.INDEX_NAME), None)])
        level += 1
    return files


@shuffle.measured
def index_files(inputs: list[str], output: str, params: None) -> dict[str, Any]:
    """The offsets index of a final merge level's files (:mod:`.block_index`)."""
    return {"files": len(inputs), "blocks": block_index.write_index(inputs, output)}


@dataclasses.dataclass(frozen=True)
class MergeSortedParams:
    """A sorted merge's sort keys and its row groups' size (what a reader's slice reads)."""

    keys: tuple[str, ...] = ("key", "pos")
    group_bytes: int = 1 << 20


@shuffle.measured
def merge_sorted_files(inputs: list[str], output: str, params: MergeSortedParams) -> dict[str, Any]:
    """One Parquet file of the rows of ``inputs`` (files sorted by ``params.keys``, e.g. big
    clusters' streamed texts by cluster and place), sorted by those keys, in row groups of about
    ``group_bytes``: a slice of one cluster then lies in one or two groups, whatever number of
    files were merged (concatenated, each group of each file might overlap it). Holds about two
    row groups of each input (one decoded, one in its file's read buffer)."""
    with tempfile.TemporaryDirectory(prefix="dedup-groups-") as tmp:
        local = os.path.join(tmp, "merged.parquet")
        merged = shuffle.merge_sorted([shuffle.parquet_row_groups(uri) for uri in inputs], list(params.keys))
        groups = shuffle.write_row_groups(merged, local, params.group_bytes)
        if groups:
            storage.put_file(local, output)
        rows = pq.read_metadata(local).num_rows if groups else 0
    return {"rows": rows, "row_groups": groups, "files": len(inputs)}
