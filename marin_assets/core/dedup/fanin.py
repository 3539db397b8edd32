"""Bounded fan-in: no shuffle task reads more than a configured number of files.

A step whose tasks each read a key range of every file the step before wrote reads, with M
writers, M files per task (at production counts tens of thousands). Where M is above the
bound, merge tasks combine the files in groups of at most the bound into one file each, cut
like the files they merge, until at most the bound remain (one level per factor of the bound:
~25,000 map files are one level at 1,024). A merge task reads each file of its group in one
request, front to back as it arrives (all of them at once, in key order), holds about
``budget_bytes`` of their rows at a time, and writes its file through a local spool: its
requests follow its inputs, not their bytes. The last level's files (read by the step's tasks) get an
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
BUDGET_BYTES = 1 << 30  # a merge task's rows held at once (shared by its inputs' decoded, waiting rows)


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


_IPC_CONTINUATION = b"\xff\xff\xff\xff"  # how every block (an Arrow IPC stream) starts; a block file's offsets start with 0


class _Stream:
    """A streamed object (:func:`storage.open_stream`) that can look at its next bytes: Arrow
    reads each block through :meth:`read`, and a look at the next four bytes tells a block from
    the offsets that end the file."""

    def __init__(self, raw: Any) -> None:
        self.raw, self.head, self.position, self.closed = raw, b"", 0, False

    def peek(self, n: int) -> bytes:
        if len(self.head) < n:
            self.head += self.raw.read(n - len(self.head))
        return self.head[:n]

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            out = self.head + self.raw.read()
        else:
            out = self.head[:n] + (self.raw.read(n - len(self.head)) if n > len(self.head) else b"")
        self.head = self.head[n:] if n is not None and 0 <= n < len(self.head) else b""
        self.position += len(out)
        return out

    def tell(self) -> int:
        return self.position

    def close(self) -> None:
        self.raw.close()
        self.closed = True


class _Input:
    """One input of a merge task, read front to back in key order: a block file's blocks in one
    request (:func:`storage.open_stream`), a sorted Parquet file's row groups through a
    read-ahead. Rows decoded and not yet merged wait in ``pending``; every row with a key below
    ``frontier`` has been decoded."""

    def __init__(self, uri: str, read_ahead: int, blocks: int | None) -> None:
        """``read_ahead``: the input's share of the task's budget (decoded rows, its read buffer)."""
        self.uri, self.blocks = uri, blocks
        self.pending: list[pa.Table] = []
        self.held = 0  # bytes of ``pending``
        self.frontier = 0
        if uri.endswith(shuffle.BLOCK_SUFFIX):
            self.stream: Any = _Stream(storage.open_stream(uri, min(storage.STREAM_BUFFER, max(shuffle.MIN_READ_AHEAD, read_ahead // 4))))
            self.parquet = None
        else:
            self.stream = shuffle.open_reads(uri, read_ahead)
            self.parquet = storage.parquet_file(self.stream)
            self.group = 0

    def close(self) -> None:
        self.stream.close()

    def fill(self, share: int, floor: int) -> None:
        """Decode blocks until ``share`` bytes wait and every row below ``floor`` is decoded."""
        while self.frontier < shuffle.KEY_SPACE and (self.held < share or self.frontier < floor):
            table = self._next()
            if table is None:
                self.frontier = shuffle.KEY_SPACE
            elif table.num_rows:
                self.pending.append(table)
                self.held += table.nbytes
                last = int(table.column("key")[-1].as_py())
                # a key lies in one block of a block file; row groups of a Parquet file may split a key's rows
                self.frontier = last + 1 if self.parquet is None else last

    def take_below(self, hi: int) -> pa.Table | None:
        """The waiting rows with ``key < hi``, in order (they are all decoded)."""
        out = []
        while self.pending:
            table = self.pending[0]
            cut = int(np.searchsorted(table.column("key").to_numpy().astype(np.uint64), np.uint64(hi), side="left"))
            if cut:
                out.append(table.slice(0, cut))
            if cut < table.num_rows:
                self.pending[0] = table.slice(cut)
                break
            self.pending.pop(0)
        self.held = sum(t.nbytes for t in self.pending)
        return pa.concat_tables(out) if out else None

    def _next(self) -> pa.Table | None:
        """The next block (None: the input is read to its end)."""
        if self.parquet is not None:
            if self.group >= self.parquet.metadata.num_row_groups:
                return None
            self.group += 1
            return self.parquet.read_row_group(self.group - 1, use_threads=False)
        if self.stream.peek(4) == _IPC_CONTINUATION:
            return pa.ipc.open_stream(self.stream).read_all()
        self._check_offsets()
        return None

    def _check_offsets(self) -> None:
        """The block offsets that end the file: their count, and their last one where the blocks ended."""
        data_end = self.stream.tell()
        tail = self.stream.read()
        count = int(np.frombuffer(tail[-8:], "<u8")[0]) if len(tail) >= 16 else -1
        last = int(np.frombuffer(tail[-16:-8], "<u8")[0]) if count >= 0 else -1
        if count < 0 or len(tail) != 8 * (count + 2) or last != data_end:
            raise ValueError(f"{self.uri} is no whole block file (its blocks end at byte {data_end}, followed by {len(tail)} bytes that are not their offsets); remove the run's _work folder and rerun")
        if self.blocks is not None and count != self.blocks:
            raise ValueError(f"{self.uri} holds {count} blocks where its merge expects {self.blocks}: it was written at other cuts; remove the run's _work folder and rerun")


@shuffle.measured
def merge_files(inputs: list[str], output: str, params: MergeFilesParams) -> dict[str, Any]:
    """One file of the rows of ``inputs`` (in input order within a key), cut as ``params`` says.

    Each input is one request, read front to back as it arrives: about ``budget_bytes`` /
    inputs of its decoded rows wait at a time, behind a read buffer of a quarter of that (64 KiB
    to 1 MiB; from Cloud Storage each connection also buffers up to ~128 KiB). Each span of
    output blocks is what every input has decoded (at least one block), so the task holds about
    1.25 x the budget (~1.4 x at 1,024 inputs from Cloud Storage) plus one block."""
    cuts = _output_cuts(params)
    threads = shuffle.read_threads(inputs)
    share = params.budget_bytes // max(1, len(inputs))
    rows = spans = 0
    blocks = cuts.size - 1
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory(prefix="dedup-merge-") as tmp:
        expected = blocks if params.cuts else None  # inputs cut at stored cuts hold as many blocks as the output
        files = shuffle.concurrently(lambda uri: _Input(uri, share, expected), inputs, threads)
        for file in files:
            stack.callback(file.close)
        local = os.path.join(tmp, "merged" + shuffle.BLOCK_SUFFIX)
        with open(local, "wb") as handle:
            writer = shuffle.BlockWriter(handle, cuts, output)
            b0 = 0
            while b0 < blocks:
                floor = int(cuts[b0 + 1])
                shuffle.concurrently(lambda f: f.fill(share, floor), files, threads)
                bound = min(f.frontier for f in files)
                b1 = min(blocks, max(b0 + 1, int(np.searchsorted(cuts, np.uint64(bound), side="right")) - 1))
                parts = [t for t in (f.take_below(int(cuts[b1])) for f in files) if t is not None]
                if parts:
                    table = pa.concat_tables(parts, promote_options="default")
                    writer.add(table, b1)
                    rows += table.num_rows
                spans += 1
                b0 = b1
            writer.finish()
        storage.put_file(local, output)
    return {"rows": rows, "files": len(inputs), "spans": spans}


def bounded(run: Callable[[list[ShardTask]], list[ShardResult]], files: Sequence[str], folder: str, limit: int, params: MergeFilesParams) -> list[str]:
    """``files`` merged (levels of :func:`merge_files` tasks under ``folder``) until at most
    ``limit`` remain; ``files`` themselves when they are few enough."""
    files = list(files)
    limit = max(2, int(limit))
    level = 0
    blocks = _output_cuts(params).size - 1 if len(files) > limit else 0
    while len(files) > limit:
        groups = -(-len(files) // limit)
        size = -(-len(files) // groups)
        final = groups <= limit  # its files are read by the step's readers: they get an offsets index
        merged = storage.join(folder, block_index.merged_folder(level, blocks) if final else f"level-{level}")
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
