"""Shuffles through storage for the dedup steps: key-sorted Parquet files read by key range.

A map task writes one Parquet file sorted by an int64 ``key`` (in ``[0, 2**63)``) with small
row groups; a reduce task for the key range ``[lo, hi)`` reads, from every map file, only the
row groups whose ``key`` statistics overlap its range. So no file is written per (map, reduce)
pair, and the number of reduce tasks is chosen after the maps ran, from the data they wrote.

Two key families: :func:`hash_keys` spreads arbitrary uint64 values uniformly;
:func:`prefix_keys` keeps the byte order of strings (the first 8 bytes), so reduce ranges over
ids are id ranges and concatenating reduce outputs in range order gives a file sorted by id.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Self

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from marin_assets.core.dedup import block_index, manifest
from marin_assets.core.dedup.block_index import index_of
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.runner import release_free_memory
from marin_assets.core.runtime.storage import READ_THREADS, concurrently, read_threads  # noqa: F401  (fanin and star rounds use them from here)

KEY_SPACE = 1 << 63
ROW_GROUP_ROWS = 32_768  # a range read touches at most two row groups beyond its own rows


def fmix64(x: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finalizer (a bijection on uint64)."""
    h = np.asarray(x, dtype=np.uint64).copy()
    with np.errstate(over="ignore"):
        h ^= h >> np.uint64(33)
        h *= np.uint64(0xFF51AFD7ED558CCD)
        h ^= h >> np.uint64(33)
        h *= np.uint64(0xC4CEB93FE53A9C4B)
        h ^= h >> np.uint64(33)
    return h


def hash_keys(values: np.ndarray) -> np.ndarray:
    """Uniform int64 keys in [0, 2**63) for uint64/int64 values."""
    return (fmix64(np.asarray(values).astype(np.uint64, copy=False)) >> np.uint64(1)).astype(np.int64)


def prefix_keys(strings: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Order-preserving int64 keys: the first 8 bytes of each string, big-endian, halved.

    ``a <= b`` (bytewise, which is Python's ``str`` order for UTF-8) implies
    ``key(a) <= key(b)``; equal keys are ordered by the full string inside a partition.
    """
    if isinstance(strings, pa.ChunkedArray):
        strings = strings.combine_chunks() if strings.num_chunks else pa.array([], pa.string())
    binary = pc.fill_null(strings.cast(pa.large_binary()), b"")
    n = len(binary)
    if n == 0:
        return np.zeros(0, np.int64)
    offsets = np.frombuffer(binary.buffers()[1], np.int64)[binary.offset : binary.offset + n + 1]
    data_buf = binary.buffers()[2]
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None and data_buf.size else np.zeros(1, np.uint8)
    lengths = np.diff(offsets)
    key = np.zeros(n, np.uint64)
    for j in range(8):
        has = lengths > j
        byte = np.where(has, data[np.minimum(offsets[:-1] + j, data.size - 1)], 0).astype(np.uint64)
        key |= byte << np.uint64(56 - 8 * j)
    return (key >> np.uint64(1)).astype(np.int64)


def partition_bounds(partitions: int) -> list[tuple[int, int]]:
    """``partitions`` equal key ranges covering [0, 2**63)."""
    edges = [p * KEY_SPACE // partitions for p in range(partitions)] + [KEY_SPACE]
    return list(zip(edges[:-1], edges[1:]))


def tasks_for(records: int, per_task: int) -> int:
    """Reduce tasks for ``records`` rows at about ``per_task`` each (no upper cap)."""
    return max(1, -(-int(records) // max(1, int(per_task))))


def pow2_partitions(records: int, per_partition: int) -> int:
    """:func:`tasks_for` rounded up to a power of two: equal key ranges that a writer's
    power-of-two blocks (:func:`equal_blocks`) cut exactly."""
    return 1 << (tasks_for(records, per_partition) - 1).bit_length()


def write_sorted(table: pa.Table, uri: str) -> int:
    """Write ``table`` sorted by ``key`` (then by its other sort columns already applied)."""
    if table.num_rows:
        table = table.take(pc.sort_indices(table, sort_keys=[("key", "ascending")]))
    storage.write_parquet(table, uri, row_group_size=ROW_GROUP_ROWS)
    return table.num_rows


_BLOCK_OPTIONS = pa.ipc.IpcWriteOptions(compression="lz4")  # fast; scratch a little larger than zstd Parquet
BLOCK_SUFFIX = ".blocks"
MIN_BLOCK_ROWS = 256  # a block's stream header (~0.4 KB) stays small beside its rows


def write_blocks(table: pa.Table, uri: str, bounds: Sequence[tuple[int, int]] | None = None, *, cuts: Sequence[int] | np.ndarray | None = None) -> int:
    """Write ``table`` as one block per destination key range (``bounds``: contiguous, covering
    the key space; or ``cuts``: their sorted edges, ``cuts[b] <= key < cuts[b + 1]`` in block
    ``b``), each block an Arrow IPC stream of its rows sorted by ``key``, followed by the
    blocks' byte offsets and their count.

    A shuffle step whose P tasks each read one range from every file of the step before reads,
    from sorted Parquet, at least a row group per file: about P times the rows it needs once a
    file holds fewer than P row groups. From a block file a reader fetches its blocks exactly
    (:func:`read_blocks`, :func:`read_block_spans`): a small read of their offsets and its own
    rows, never another range's rows and never an index of them all.
    """
    if cuts is None:
        assert bounds is not None
        cuts = [lo for lo, _ in bounds] + [bounds[-1][1]]
    with storage.open_atomic(uri) as handle:
        writer = BlockWriter(handle, cuts, uri)
        writer.add(table, writer.blocks)
        writer.finish()
    return table.num_rows


class BlockWriter:
    """A :func:`write_blocks` file written in pieces, in key order: :meth:`add` writes the next
    blocks up to a given one from rows whose keys lie in them, :meth:`finish` the rest (empty)
    and the offsets. One piece at a time is held, so a merge of many files holds one span."""

    def __init__(self, handle: Any, cuts: Sequence[int] | np.ndarray, uri: str = "") -> None:
        self.handle, self.cuts, self.uri = handle, _as_cuts(cuts), uri
        self.blocks = len(self.cuts) - 1
        self.offsets = np.zeros(self.blocks + 1, np.uint64)
        self.next = self.written = 0

    def add(self, table: pa.Table, upto: int) -> None:
        """Blocks ``next .. upto - 1`` from ``table`` (its keys must lie in them)."""
        keys = table.column("key").to_numpy()
        order = np.argsort(keys, kind="stable")
        table, keys = table.take(pa.array(order)), keys[order].astype(np.uint64)
        if keys.size and (keys[0] < self.cuts[self.next] or keys[-1] >= self.cuts[upto]):
            raise ValueError(f"{self.uri}: keys outside the blocks' range [{self.cuts[self.next]}, {self.cuts[upto]})")
        at = np.searchsorted(keys, self.cuts[self.next : upto + 1]).tolist()
        for p in range(self.next, upto):
            a, b = at[p - self.next], at[p - self.next + 1]
            if b > a:
                sink = pa.BufferOutputStream()
                with pa.ipc.new_stream(sink, table.schema, options=_BLOCK_OPTIONS) as stream:
                    stream.write_table(table.slice(a, b - a))
                block = sink.getvalue()
                self.handle.write(block)
                self.written += block.size
            self.offsets[p + 1] = self.written
        self.next = upto

    def finish(self) -> None:
        self.offsets[self.next + 1 :] = self.written
        self.handle.write(np.append(self.offsets, np.uint64(self.blocks)).astype("<u8").tobytes())


def read_blocks(uris: Iterable[str], block: int, schema: pa.Schema, blocks: int | None = None) -> pa.Table:
    """Block ``block`` of each of the :func:`write_blocks` files ``uris`` (of ``blocks`` blocks
    each, where known), as one table."""
    return read_block_spans(uris, [(block, block + 1)], schema, blocks)


def read_block_spans(uris: Iterable[str], spans: Sequence[tuple[int, int]], schema: pa.Schema, blocks: int | None = None) -> pa.Table:
    """Blocks ``b0 <= b < b1`` of each span ``(b0, b1)`` (sorted, disjoint) of each of the
    :func:`write_blocks` files ``uris``, as one table: per file one read of its tail (the block
    count and offsets) and one of each span's bytes. ``blocks``: how many blocks every file must
    hold (a file cut otherwise, e.g. left by a run with other task sizes, is an error, not wrong rows)."""
    spans = [(int(a), int(b)) for a, b in spans if b > a]

    def read(uri: str) -> list[pa.Table]:
        return file_blocks(uri, lambda count: spans, blocks)

    files = list(uris) if spans else []
    pieces = [piece for part in _by_file(files, read, lambda count: spans, blocks) for piece in part]
    return pa.concat_tables(pieces) if pieces else schema.empty_table()


def _by_file(files: Sequence[str], read: Any, spans_of: Any, blocks: int | None = None) -> list[list[pa.Table]]:
    """Per file of ``files``, in order, its blocks of ``spans_of(block count)``: files of a final
    merge level through their offsets index (:mod:`.block_index`: one request for the index's
    rows, one per file), others by ``read(uri)`` (their tail, then their blocks)."""
    groups, rest = block_index.group_indexed(files)
    got = dict(zip(rest, concurrently(read, rest, read_threads(rest))))
    for (index, files_count, count), members in groups.items():
        got.update(block_index.read_indexed(index, members, files_count, count, spans_of, blocks))
    return [got[uri] for uri in files]


def file_blocks(uri: str, spans_of: Any, blocks: int | None = None) -> list[pa.Table]:
    """The non-empty blocks of ``spans_of(block count)`` (sorted, disjoint spans) of one block
    file: one ranged read of its end (its offsets, :func:`.block_index.read_tail`; a small file
    whole), then one of each run of nearby spans not in it (:func:`.storage.fetch_ranges`).
    ``blocks``: how many blocks the file must hold (a file cut otherwise, e.g. left by a run with
    other task sizes, is an error, not wrong rows)."""
    offsets, tail, tail_at = block_index.read_tail(uri, blocks)
    count = offsets.size - 1
    if blocks is not None and count != blocks:
        raise ValueError(f"{uri} holds {count} blocks where its readers expect {blocks}: it was written at other cuts; remove the run's _work folder and rerun")
    spans = [(int(b0), int(b1)) for b0, b1 in spans_of(count) if b1 > b0]
    for b0, b1 in spans:
        if not 0 <= b0 < b1 <= count:
            raise ValueError(f"{uri} holds {count} blocks, not blocks {b0}..{b1 - 1}")
    fs, path = storage.filesystem(uri)
    datas = storage.fetch_ranges(fs, path, [(int(offsets[b0]), int(offsets[b1])) for b0, b1 in spans], tail, tail_at)
    return [piece for (b0, b1), data in zip(spans, datas) for piece in _block_tables(data, offsets[b0 : b1 + 1] - offsets[b0])]


def _block_tables(data: bytes, rel: np.ndarray) -> list[pa.Table]:
    """The non-empty blocks in ``data`` (consecutive blocks starting at ``rel``, relative offsets)."""
    buffer = pa.py_buffer(data)
    return [pa.ipc.open_stream(buffer.slice(int(rel[k]), int(rel[k + 1] - rel[k]))).read_all() for k in np.flatnonzero(np.diff(rel) > 0).tolist()]


def _read_counted(uri: str, schema: pa.Schema, spans_of: Any) -> pa.Table:
    """Blocks of one block file whose spans follow from its block count (``spans_of(count)``,
    :func:`file_blocks`), as one table."""
    pieces = file_blocks(uri, spans_of)
    return pa.concat_tables(pieces) if pieces else schema.empty_table()


def read_all_blocks(uri: str, schema: pa.Schema) -> pa.Table:
    """Every block of one :func:`write_blocks` file (a whole-file reader, e.g. of kept labels)."""
    return _read_counted(uri, schema, lambda count: [(0, count)])


def read_whole(uri: str, schema: pa.Schema) -> pa.Table:
    """All rows of a key-sorted Parquet file or of a block file (``.blocks``), as ``schema``."""
    table = read_all_blocks(uri, schema) if uri.endswith(BLOCK_SUFFIX) else storage.read_parquet(uri)
    return table.select(schema.names).cast(schema)


def partition_cuts(partitions: int) -> np.ndarray:
    """The edges of :func:`partition_bounds` (``partitions + 1`` keys, 0 to ``KEY_SPACE``)."""
    return np.asarray([p * KEY_SPACE // partitions for p in range(max(1, partitions))] + [KEY_SPACE], np.uint64)


def equal_blocks(rows: int, readers: int) -> int:
    """How many equal key ranges a writer cuts its rows into when its readers' ranges are not
    known yet (their count follows totals counted by the step itself): a power of two, one per
    expected reader (readers of :func:`pow2_partitions` ranges then read one block each; a
    reader of a finer range reads its covering block), but no block under ~MIN_BLOCK_ROWS rows
    (each block costs a stream header and ~0.1 ms to open)."""
    want = max(1, min(max(1, int(readers)), int(rows) // MIN_BLOCK_ROWS))
    return 1 << (want - 1).bit_length()


def block_name(partition: int, partitions: int) -> str:
    """``part-00003-of-00008.blocks``: a block file's name for partition ``partition``."""
    return storage.shard_name(partition, partitions).removesuffix(".parquet") + BLOCK_SUFFIX


def write_keyed(table: pa.Table, uri: str, readers: int) -> int:
    """Write ``table`` as a block file (``uri`` ends in ``.blocks``) of :func:`equal_blocks`
    equal key ranges; :func:`read_range` and :func:`read_ranges` read it like a sorted file,
    fetching only the blocks that cover their ranges."""
    if not uri.endswith(BLOCK_SUFFIX):
        raise ValueError(f"{uri}: a block file's name ends in {BLOCK_SUFFIX}")
    return write_blocks(table, uri, cuts=partition_cuts(equal_blocks(table.num_rows, readers)))


SCAN_BYTES = 64 << 20  # a block scan reads at most this many bytes of consecutive blocks at a time


def scan_blocks(uri: str, keys: np.ndarray, max_bytes: int = SCAN_BYTES) -> Iterable[pa.Table]:
    """The rows of the blocks of a :func:`write_keyed` file that hold any of the sorted
    ``keys`` (others unread), a run of consecutive such blocks (up to ``max_bytes``) per read
    and per table: a whole-file scan holds one run."""
    offsets, tail, tail_at = block_index.read_tail(uri)
    fs, path = storage.filesystem(uri)
    count = offsets.size - 1
    blocks = np.unique(np.searchsorted(partition_cuts(count), np.asarray(keys).astype(np.uint64), side="right") - 1)
    blocks = blocks[(blocks >= 0) & (blocks < count)]
    blocks = blocks[offsets[blocks + 1] > offsets[blocks]].tolist()
    runs: list[tuple[int, int]] = []  # consecutive blocks, read at once while they fit max_bytes
    for b in blocks:
        if runs and runs[-1][1] == b and offsets[b + 1] - offsets[runs[-1][0]] <= max_bytes:
            runs[-1] = (runs[-1][0], b + 1)
        else:
            runs.append((b, b + 1))
    for b0, b1 in runs:  # one run read and held at a time
        (data,) = storage.fetch_ranges(fs, path, [(int(offsets[b0]), int(offsets[b1]))], tail, tail_at)
        yield pa.concat_tables(_block_tables(data, offsets[b0 : b1 + 1] - offsets[b0]))


def _read_keyed(uri: str, spans: Sequence[tuple[int, int]], schema: pa.Schema | None, columns: Sequence[str] | None) -> pa.Table:
    """Rows of a :func:`write_keyed` file whose key lies in the sorted, disjoint ``spans``
    (its cuts follow from its block count)."""
    return _keyed_rows(file_blocks(uri, lambda count: covering_spans(partition_cuts(count), spans)[0]), spans, schema, columns)


def _keyed_rows(pieces: Sequence[pa.Table], spans: Sequence[tuple[int, int]], schema: pa.Schema | None, columns: Sequence[str] | None) -> pa.Table:
    """The rows of blocks ``pieces`` whose key lies in ``spans``, as :func:`read_ranges` returns them."""
    table = pa.concat_tables(pieces) if pieces else (schema if schema is not None else pa.schema([("key", pa.int64())])).empty_table()
    table = keep_ranges(table, spans)
    return table if columns is None else table.select(list(dict.fromkeys(["key", *columns])))


def _as_cuts(cuts: Sequence[int] | np.ndarray) -> np.ndarray:
    """Cuts as uint64 (the last one may be ``KEY_SPACE``, past int64)."""
    return np.asarray([int(c) for c in cuts], np.uint64) if not isinstance(cuts, np.ndarray) else cuts.astype(np.uint64, copy=False)


def covering_spans(cuts: np.ndarray, ranges: Sequence[tuple[int, int]]) -> tuple[list[tuple[int, int]], bool]:
    """The block spans (merged, sorted) of the blocks cut at ``cuts`` that cover the key
    ``ranges``, and whether the blocks hold keys outside the ranges (a range edge is no cut)."""
    cuts = _as_cuts(cuts)
    spans: list[list[int]] = []
    exact = True
    for lo, hi in _merged(ranges):
        lo, hi = max(lo, int(cuts[0])), min(hi, int(cuts[-1]))
        if lo >= hi:
            continue
        b0 = int(np.searchsorted(cuts, np.uint64(lo), side="right")) - 1
        b1 = int(np.searchsorted(cuts, np.uint64(hi), side="left"))
        exact &= int(cuts[b0]) == lo and int(cuts[b1]) == hi
        if spans and b0 <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], b1)
        else:
            spans.append([b0, b1])
    return [(a, b) for a, b in spans if b > a], exact


def read_ranges_blocks(uris: Iterable[str], cuts: np.ndarray, ranges: Sequence[tuple[int, int]], schema: pa.Schema) -> pa.Table:
    """Rows whose ``key`` lies in any of the disjoint ``ranges``, from :func:`write_blocks` files
    cut at ``cuts``: the blocks covering the ranges, filtered by key only where a range is finer
    than its blocks (the same rows as :func:`read_ranges` of the same rows in sorted files)."""
    spans, exact = covering_spans(cuts, ranges)
    table = read_block_spans(uris, spans, schema, len(cuts) - 1)
    return table if exact else keep_ranges(table, ranges)


def keep_ranges(table: pa.Table, ranges: Sequence[tuple[int, int]]) -> pa.Table:
    """The rows of ``table`` whose ``key`` lies in any of ``ranges``."""
    if table.num_rows == 0:
        return table
    keys = table.column("key").to_numpy().astype(np.uint64)
    edges = np.asarray(_merged(ranges), np.uint64).ravel()
    return table.filter(pa.array((np.searchsorted(edges, keys, side="right") % 2) == 1))


def _merged(ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for lo, hi in sorted((int(lo), int(hi)) for lo, hi in ranges if lo < hi):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi) for lo, hi in out]


def write_cuts(uri: str, cuts: Sequence[int] | np.ndarray) -> None:
    """Store block cuts that a step's writers share (little-endian int64)."""
    storage.write_bytes(uri, _as_cuts(cuts).astype("<u8").tobytes())


def read_cuts(uri: str) -> np.ndarray:
    return np.frombuffer(storage.read_bytes(uri), "<u8").astype(np.uint64)


def write_sorted_by_rank(table: pa.Table, uri: str) -> int:
    """Write a removal part already sorted by (``rank``, ``id``) as a block file with one block per
    source rank (block ``r``: rank ``r``, in id order), so each publish task reads its own
    sources' rows only (:func:`publish_removals`)."""
    rank = table.column("rank").to_numpy().astype(np.int64)
    top = int(rank.max()) + 1 if rank.size else 1
    return write_blocks(table.append_column("key", pa.array(rank)), uri, cuts=[*range(top), KEY_SPACE])


def read_range(uris: Iterable[str], lo: int, hi: int, columns: Sequence[str] | None = None, schema: pa.Schema | None = None) -> pa.Table:
    """Rows with ``lo <= key < hi`` from key-sorted files, reading only overlapping row groups."""
    return read_ranges(uris, [(lo, hi)], columns, schema)


def read_ranges(uris: Iterable[str], ranges: Sequence[tuple[int, int]], columns: Sequence[str] | None = None, schema: pa.Schema | None = None) -> pa.Table:
    """Rows whose ``key`` lies in any of the disjoint ``[lo, hi)`` ``ranges``, from key-sorted
    files: each file is opened once and each overlapping row group read once (not once per range)."""
    spans = sorted((int(lo), int(hi)) for lo, hi in ranges if lo < hi)
    files = list(uris) if spans else []
    blocks = _by_file(files, lambda uri: [_read_file_ranges(uri, spans, columns, schema)], lambda count: covering_spans(partition_cuts(count), spans)[0])
    tables = [part[0] if index_of(uri) is None else _keyed_rows(part, spans, schema, columns) for uri, part in zip(files, blocks)]
    pieces = [table for table in tables if table is not None and table.num_rows]
    if pieces:
        return pa.concat_tables(pieces, promote_options="default")
    if schema is not None:
        return schema.empty_table() if columns is None else pa.schema([schema.field(c) for c in dict.fromkeys(["key", *columns])]).empty_table()
    return pa.table({"key": pa.array([], pa.int64())})


def overlapping_groups(reader: pq.ParquetFile, spans: Sequence[tuple[int, int]]) -> list[int]:
    """The row groups (with rows) of a Parquet file sorted by ``key`` whose key statistics may
    overlap one of ``spans`` (every group without statistics)."""
    meta = reader.metadata
    key_col = reader.schema_arrow.get_field_index("key")
    groups = []
    for g in range(meta.num_row_groups):
        if meta.row_group(g).num_rows == 0:
            continue
        stats = meta.row_group(g).column(key_col).statistics
        if stats is None or not stats.has_min_max or any(stats.max >= lo and stats.min < hi for lo, hi in spans):
            groups.append(g)
    return groups


def _read_file_ranges(uri: str, spans: Sequence[tuple[int, int]], columns: Sequence[str] | None, schema: pa.Schema | None) -> pa.Table | None:
    """One file's rows of :func:`read_ranges` (None: no row group overlaps)."""
    if uri.endswith(BLOCK_SUFFIX):  # equal-range blocks (write_keyed): the blocks covering the spans
        return _read_keyed(uri, spans, schema, columns)
    fs, path = storage.filesystem(uri)
    with storage.reading_parquet(uri), fs.open(path, "rb") as handle:
        reader = storage.parquet_file(handle)
        groups = overlapping_groups(reader, spans)
        if not groups:
            return None
        cols = None if columns is None else list(dict.fromkeys(["key", *columns]))
        table = reader.read_row_groups(groups, columns=cols, use_threads=False)
    keys = table.column("key").to_numpy()
    if len(spans) == 1:
        lo, hi = spans[0]
        mask = keys >= lo
        if hi < KEY_SPACE:
            mask &= keys < hi
    else:
        bounds = np.asarray(spans, np.uint64).ravel()  # sorted, disjoint: odd positions are inside a range (KEY_SPACE fits unsigned)
        mask = (np.searchsorted(bounds, keys.astype(np.uint64), side="right") % 2) == 1
    return table.filter(pa.array(mask))


def copy_file(source_uri: str, target_uri: str) -> None:
    """Byte copy of a file, streamed, written atomically."""
    fs, path = storage.filesystem(source_uri)
    with fs.open(path, "rb") as src, storage.open_atomic(target_uri) as dst:
        while chunk := src.read(8 << 20):
            dst.write(chunk)


def open_reads(uri: str, read_ahead: int) -> Any:
    """``uri`` opened for reading by one task for its life: its reads in file order are served
    by one read-ahead of ``read_ahead`` bytes (a request per ``read_ahead`` bytes read, not one
    open, size and fetch per read); the caller keeps ``read_ahead`` x its open files inside its
    memory budget."""
    fs, path = storage.filesystem(uri)
    return fs.open(path, "rb", block_size=max(MIN_READ_AHEAD, int(read_ahead)), cache_type="readahead")


MIN_READ_AHEAD = 64 << 10  # a read-ahead under this saves little memory and costs a request per few row groups


class SliceReader:
    """Slices of files sorted by (``key``, ``column``), read many times by one task (a streamed
    cluster, batch by batch): each file is opened once, when the reader is made, its footer read
    then (concurrently), and kept open until :meth:`close`; a slice reads, concurrently, only the
    row groups of the files whose statistics overlap it, through their open handles. A cluster's
    batches lie in file order, so the handles' read-ahead (``budget_bytes`` shared by the files)
    serves most of them: requests follow the bytes read, not the batches."""

    def __init__(self, uris: Iterable[str], column: str, columns: Sequence[str], budget_bytes: int = 64 << 20) -> None:
        self.uris = list(uris)
        self.column = column
        self.columns = list(dict.fromkeys(["key", column, *columns]))
        self.threads = read_threads(self.uris)
        self.read_ahead = int(budget_bytes) // max(1, len(self.uris))
        self.handles: list[Any] = []
        self.footers = concurrently(self._footer, self.uris, self.threads)

    def _footer(self, uri: str) -> tuple[Any, int, int, Any]:
        handle = open_reads(uri, self.read_ahead)
        self.handles.append(handle)
        reader = storage.parquet_file(handle)
        return reader.metadata, reader.schema_arrow.get_field_index("key"), reader.schema_arrow.get_field_index(self.column), reader

    def close(self) -> None:
        for handle in self.handles:
            handle.close()
        self.handles = []

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _groups(self, footer: tuple[Any, int, int, Any], key: int, lo: int, hi: int) -> list[int]:
        meta, k_col, c_col, _ = footer
        groups = []
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            if group.num_rows == 0:
                continue
            ks, cs = group.column(k_col).statistics, group.column(c_col).statistics
            if ks is not None and ks.has_min_max and not (ks.min <= key <= ks.max):
                continue
            if cs is not None and cs.has_min_max and (cs.max < lo or cs.min >= hi):
                continue
            groups.append(g)
        return groups

    def _read(self, footer: tuple[Any, int, int, Any], groups: list[int], key: int, lo: int, hi: int) -> pa.Table:
        """The slice's rows of ``groups``, one group decoded at a time (a slice may start or end
        inside a group: what is held beyond the slice is one group per file)."""
        pieces = []
        for g in groups:
            table = footer[3].read_row_group(g, columns=self.columns, use_threads=False)
            k, c = table.column("key").to_numpy(), table.column(self.column).to_numpy()
            pieces.append(table.filter(pa.array((k == key) & (c >= lo) & (c < hi))))
        return pa.concat_tables(pieces)

    def read(self, key: int, lo: int, hi: int) -> pa.Table:
        """Rows with ``key == key`` and ``lo <= column < hi``, in file order."""
        wanted = [(footer, groups) for footer in self.footers if (groups := self._groups(footer, key, lo, hi))]
        pieces = [t for t in concurrently(lambda item: self._read(*item, key, lo, hi), wanted, self.threads) if t.num_rows]
        if pieces:
            return pa.concat_tables(pieces)
        return pa.table({name: pa.array([], pa.large_string() if name == "text" else pa.int64()) for name in self.columns})


def _at_most(table: pa.Table, keys: Sequence[str], bound: Sequence[int]) -> int:
    """Rows of ``table`` (sorted by ``keys``) whose keys are lexicographically <= ``bound``: a
    prefix, found by bisection key by key within the rows equal so far."""
    lo, hi = 0, table.num_rows
    for name, value in zip(keys, bound):
        column = table.column(name).slice(lo, hi - lo).to_numpy()
        lo, hi = lo + int(np.searchsorted(column, value, "left")), lo + int(np.searchsorted(column, value, "right"))
    return hi


def merge_sorted(runs: Sequence[Iterator[pa.Table]], keys: Sequence[str]) -> Iterator[pa.Table]:
    """The rows of ``runs`` (each a stream of tables sorted by ``keys``) in one sorted stream,
    holding about one table of each run. Each round emits, from every run, its rows up to the
    smallest last row among the runs that have more to come: those rows are the smallest left,
    and one run's table is emptied each round."""
    held: list[pa.Table | None] = [None] * len(runs)
    live = list(range(len(runs)))
    while live:
        for i in list(live):
            while held[i] is None or held[i].num_rows == 0:
                held[i] = next(runs[i], None)
                if held[i] is None:
                    live.remove(i)
                    break
        pending = [i for i in live if held[i] is not None]
        if not pending:
            return
        ends = [tuple(held[i].column(k)[-1].as_py() for k in keys) for i in pending]
        bound = min(ends)
        out = []
        for i in pending:
            count = _at_most(held[i], keys, bound)
            out.append(held[i].slice(0, count))
            held[i] = held[i].slice(count)
        table = pa.concat_tables(out)
        yield table.take(pc.sort_indices(table, sort_keys=[(k, "ascending") for k in keys]))


def parquet_row_groups(uri: str, columns: Sequence[str] | None = None) -> Iterator[pa.Table]:
    """A Parquet file's row groups, one at a time (the file opened for the stream's life)."""
    fs, path = storage.filesystem(uri)
    with storage.reading_parquet(uri), fs.open(path, "rb") as handle:
        reader = storage.parquet_file(handle)
        for g in range(reader.metadata.num_row_groups):
            yield reader.read_row_group(g, columns=columns, use_threads=False)


def write_row_groups(tables: Iterable[pa.Table], local: str, group_bytes: int) -> int:
    """``tables`` into the Parquet file ``local`` (written only where a row arrives), in row
    groups of about ``group_bytes``; returns the groups written."""
    groups = size = 0
    pending: list[pa.Table] = []
    writer = None

    def write(whole: pa.Table, rows: int) -> int:
        nonlocal writer
        writer = writer or pq.ParquetWriter(local, whole.schema, **storage.PARQUET_WRITE_OPTIONS)
        writer.write_table(whole, row_group_size=rows)
        return -(-whole.num_rows // rows)

    try:
        for table in tables:
            if table.num_rows:
                pending.append(table)
                size += table.nbytes
            if size >= group_bytes:
                whole = pa.concat_tables(pending)
                groups += write(whole, max(1, whole.num_rows * group_bytes // max(1, whole.nbytes)))
                pending, size = [], 0
        if pending:
            whole = pa.concat_tables(pending)
            groups += write(whole, whole.num_rows)
    finally:
        if writer is not None:
            writer.close()
    return groups


def warm_libraries() -> None:
    """Load what the dedup tasks' libraries load lazily on first use in a process: pyarrow's
    pandas shim (on the first ``pa.array``), Parquet, polars' query engine."""
    import io  # noqa: PLC0415

    import polars as pl  # noqa: PLC0415

    table = pa.table({"key": pa.array(np.arange(4, dtype=np.int64)), "s": pa.array(["b", "a", "b", "c"])})
    buffer = io.BytesIO()
    pq.write_table(table.take(pc.sort_indices(table, sort_keys=[("key", "ascending")])), buffer)
    table = pq.read_table(io.BytesIO(buffer.getvalue())).filter(pa.array(np.ones(4, bool)))
    frame = pl.from_arrow(table)
    frame.sort(["s", "key"]).group_by("s", maintain_order=True).agg(pl.len(), pl.col("key").first()).join(frame, on="s", how="anti")


_WARMED: set[Any] = set()


def measured(fn: Any = None, *, warm: Sequence[Any] = ()) -> Any:
    """Add the task's own CPU seconds and its process's peak RSS to a task function's counters.

    A process's one-time library loads (:func:`warm_libraries`, then ``warm``) run before the
    clock starts and are counted apart as ``warmup_cpu_s`` (nonzero on the first task of a
    worker process only): a long-lived worker pays them once, so they are no cost of the work.
    """
    import functools  # noqa: PLC0415
    import time  # noqa: PLC0415

    if fn is None:
        return functools.partial(measured, warm=warm)

    @functools.wraps(fn)
    def task(inputs: list[str], output: str, params: Any) -> dict[str, Any]:
        start = time.process_time()
        for step in (warm_libraries, *warm):
            if step not in _WARMED:
                step()
                _WARMED.add(step)
        warmed = time.process_time()
        stats = dict(fn(manifest.expand(inputs), output, params))
        stats["cpu_s"] = time.process_time() - warmed
        stats["warmup_cpu_s"] = warmed - start
        stats["rss_kb"] = vm_hwm_kb()
        release_free_memory()  # in process, the next task starts at the driver's size, not with this one's freed pages
        return stats

    return task


def vm_hwm_kb() -> int:
    """This process's peak resident set (VmHWM) in KiB; 0 where /proc is not available."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


# --------------------------------------------------------------------------- per-source removal files


PUBLISH_ROW_GROUP = 1 << 17


class _RemovalFile:
    """One source's removal file being written: rows arrive sorted by id, part after part, and
    go out in row groups of exactly PUBLISH_ROW_GROUP rows (the bytes do not depend on the
    partitioning); the sha256 of the ids is kept as they pass."""

    def __init__(self, local: str, schema: pa.Schema) -> None:
        self.writer = pq.ParquetWriter(local, schema, **storage.PARQUET_WRITE_OPTIONS)
        self.pending = schema.empty_table()
        self.digest = hashlib.sha256()
        self.count = 0

    def add(self, table: pa.Table) -> None:
        if table.num_rows:  # each id followed by a newline, as one update
            self.digest.update(("\n".join(table.column("id").to_pylist()) + "\n").encode("utf-8"))
        self.count += table.num_rows
        self.pending = pa.concat_tables([self.pending, table])
        full = self.pending.num_rows // PUBLISH_ROW_GROUP * PUBLISH_ROW_GROUP
        if full:
            self.writer.write_table(self.pending.slice(0, full), row_group_size=PUBLISH_ROW_GROUP)
            self.pending = self.pending.slice(full)

    def close(self) -> dict[str, Any]:
        try:
            if self.pending.num_rows or self.count == 0:
                self.writer.write_table(self.pending.combine_chunks(), row_group_size=PUBLISH_ROW_GROUP)
        finally:
            self.writer.close()
        return {"removed": self.count, "digest": self.digest.hexdigest()[:16]}


def publish_removals(parts: Sequence[str], ranks: Sequence[int], output_uris: Sequence[str], schema: pa.Schema, convert: Any) -> list[dict[str, Any]]:
    """One Parquet file sorted by id per source of ``ranks`` (written to ``output_uris``) from
    id-range part files sorted by (``rank``, ``id``), reading each part once for all of them and
    holding one part's rows of these sources at a time; per source, the removal count and the
    sha256 digest of the sorted ids (the same as ``dedup.removed_ids_digest``)."""
    with tempfile.TemporaryDirectory(prefix="dedup-publish-") as tmp:
        files = [_RemovalFile(os.path.join(tmp, f"{k}.parquet"), schema) for k in range(len(ranks))]
        try:
            for part in parts:
                table = _rows_of_ranks(part, ranks)
                if not table.num_rows:
                    continue
                rank = table.column("rank").to_numpy()
                for file, r in zip(files, ranks):
                    mine = table.filter(pa.array(rank == r))
                    if mine.num_rows:
                        file.add(convert(mine))
        finally:
            stats = [file.close() for file in files]
        for k, uri in enumerate(output_uris):
            storage.put_file(os.path.join(tmp, f"{k}.parquet"), uri)
    return stats


def _rows_of_ranks(uri: str, ranks: Sequence[int]) -> pa.Table:
    """Rows of some sources from a :func:`write_sorted_by_rank` part: their blocks only."""
    table = _read_counted(uri, pa.schema([("rank", pa.int32()), ("key", pa.int64())]), lambda count: _merged([(r, r + 1) for r in set(ranks) if 0 <= r < count]))
    return table.drop_columns(["key"])
