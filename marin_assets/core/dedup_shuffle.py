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
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from marin_assets.core import storage

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


def partitions_for(records: int, per_partition: int) -> int:
    """Reduce tasks for ``records`` rows at about ``per_partition`` each (no upper cap)."""
    return max(1, -(-int(records) // max(1, int(per_partition))))


def write_sorted(table: pa.Table, uri: str) -> int:
    """Write ``table`` sorted by ``key`` (then by its other sort columns already applied)."""
    if table.num_rows:
        table = table.take(pc.sort_indices(table, sort_keys=[("key", "ascending")]))
    storage.write_parquet(table, uri, row_group_size=ROW_GROUP_ROWS)
    return table.num_rows


_BLOCK_OPTIONS = pa.ipc.IpcWriteOptions(compression="lz4")  # fast; scratch a little larger than zstd Parquet


def write_blocks(table: pa.Table, uri: str, bounds: Sequence[tuple[int, int]]) -> int:
    """Write ``table`` as one block per destination key range (``bounds``: contiguous, covering
    the key space), each block an Arrow IPC stream of its rows sorted by ``key``, followed by the
    blocks' byte offsets and their count.

    A shuffle step whose P tasks each read one range from every file of the step before reads,
    from sorted Parquet, at least a row group per file: about P times the rows it needs once a
    file holds fewer than P row groups. From a block file a reader fetches its block exactly
    (:func:`read_blocks`): two small reads and its own rows, never another range's rows and
    never an index of them all.
    """
    keys = table.column("key").to_numpy()
    order = np.argsort(keys, kind="stable")
    table, keys = table.take(pa.array(order)), keys[order]
    cuts = np.searchsorted(keys, [lo for lo, _ in bounds] + [bounds[-1][1]]).tolist()
    offsets = [0]
    with storage.open_atomic(uri) as handle:
        for p in range(len(bounds)):
            if cuts[p + 1] > cuts[p]:
                sink = pa.BufferOutputStream()
                with pa.ipc.new_stream(sink, table.schema, options=_BLOCK_OPTIONS) as writer:
                    writer.write_table(table.slice(cuts[p], cuts[p + 1] - cuts[p]))
                block = sink.getvalue()
                handle.write(block)
                offsets.append(offsets[-1] + block.size)
            else:
                offsets.append(offsets[-1])
        handle.write(np.asarray([*offsets, len(bounds)], dtype="<u8").tobytes())
    return table.num_rows


def read_blocks(uris: Iterable[str], block: int, schema: pa.Schema) -> pa.Table:
    """Block ``block`` of each of the :func:`write_blocks` files ``uris``, as one table."""
    pieces: list[pa.Table] = []
    for uri in uris:
        fs, path = storage.filesystem(uri)
        with fs.open(path, "rb") as handle:
            handle.seek(-8, 2)
            count = int(np.frombuffer(handle.read(8), "<u8")[0])
            if not 0 <= block < count:
                raise ValueError(f"{uri} holds {count} blocks, not block {block}")
            handle.seek(-8 * (count + 2) + 8 * block, 2)
            start, end = (int(x) for x in np.frombuffer(handle.read(16), "<u8"))
            if end > start:
                handle.seek(start)
                pieces.append(pa.ipc.open_stream(handle.read(end - start)).read_all())
    return pa.concat_tables(pieces) if pieces else schema.empty_table()


def write_sorted_by_rank(table: pa.Table, uri: str) -> int:
    """Write a removal part already sorted by (``rank``, ``id``), in row groups a source can
    prune: one source's rows never share a row group with another's, so each source's publish
    task reads its own rows only."""
    if table.num_rows == 0:
        storage.write_parquet(table, uri, row_group_size=ROW_GROUP_ROWS)
        return 0
    rank = table.column("rank").to_numpy()
    cuts = [0, *(np.flatnonzero(rank[1:] != rank[:-1]) + 1).tolist(), table.num_rows]
    with storage.open_atomic(uri) as handle:
        writer = pq.ParquetWriter(handle, table.schema, compression=storage.PARQUET_COMPRESSION)
        try:
            for a, b in zip(cuts[:-1], cuts[1:]):
                writer.write_table(table.slice(a, b - a), row_group_size=ROW_GROUP_ROWS)
        finally:
            writer.close()
    return table.num_rows


def read_range(uris: Iterable[str], lo: int, hi: int, columns: Sequence[str] | None = None, schema: pa.Schema | None = None) -> pa.Table:
    """Rows with ``lo <= key < hi`` from key-sorted files, reading only overlapping row groups."""
    return read_ranges(uris, [(lo, hi)], columns, schema)


def read_ranges(uris: Iterable[str], ranges: Sequence[tuple[int, int]], columns: Sequence[str] | None = None, schema: pa.Schema | None = None) -> pa.Table:
    """Rows whose ``key`` lies in any of the disjoint ``[lo, hi)`` ``ranges``, from key-sorted
    files: each file is opened once and each overlapping row group read once (not once per range)."""
    spans = sorted((int(lo), int(hi)) for lo, hi in ranges if lo < hi)
    pieces: list[pa.Table] = []
    if not spans:
        uris = ()
    for uri in uris:
        fs, path = storage.filesystem(uri)
        with fs.open(path, "rb") as handle:
            reader = pq.ParquetFile(handle)
            meta = reader.metadata
            key_col = reader.schema_arrow.get_field_index("key")
            groups = []
            for g in range(meta.num_row_groups):
                stats = meta.row_group(g).column(key_col).statistics
                if meta.row_group(g).num_rows == 0:
                    continue
                if stats is None or not stats.has_min_max or any(stats.max >= lo and stats.min < hi for lo, hi in spans):
                    groups.append(g)
            if not groups:
                continue
            cols = None if columns is None else list(dict.fromkeys(["key", *columns]))
            table = reader.read_row_groups(groups, columns=cols, use_threads=False)
        keys = table.column("key").to_numpy()
        if len(spans) == 1:
            lo, hi = spans[0]
            mask = keys >= lo
            if hi < KEY_SPACE:
                mask &= keys < hi
        else:
            bounds = np.asarray(spans, np.int64).ravel()  # sorted, disjoint: odd positions are inside a range
            mask = (np.searchsorted(bounds, keys, side="right") % 2) == 1
        table = table.filter(pa.array(mask))
        if table.num_rows:
            pieces.append(table)
    if pieces:
        return pa.concat_tables(pieces, promote_options="default")
    if schema is not None:
        return schema.empty_table() if columns is None else pa.schema([schema.field(c) for c in dict.fromkeys(["key", *columns])]).empty_table()
    return pa.table({"key": pa.array([], pa.int64())})


def copy_file(source_uri: str, target_uri: str) -> None:
    """Byte copy of a file, streamed, written atomically."""
    fs, path = storage.filesystem(source_uri)
    with fs.open(path, "rb") as src, storage.open_atomic(target_uri) as dst:
        while chunk := src.read(8 << 20):
            dst.write(chunk)


def read_slice(uris: Iterable[str], key: int, column: str, lo: int, hi: int, columns: Sequence[str]) -> pa.Table:
    """Rows with ``key == key`` and ``lo <= column < hi`` from files sorted by (``key``,
    ``column``), reading only the row groups whose statistics overlap both."""
    pieces: list[pa.Table] = []
    for uri in uris:
        fs, path = storage.filesystem(uri)
        with fs.open(path, "rb") as handle:
            reader = pq.ParquetFile(handle)
            meta = reader.metadata
            k_col, c_col = reader.schema_arrow.get_field_index("key"), reader.schema_arrow.get_field_index(column)
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
            if not groups:
                continue
            table = reader.read_row_groups(groups, columns=list(dict.fromkeys(["key", column, *columns])))
        k, c = table.column("key").to_numpy(), table.column(column).to_numpy()
        table = table.filter(pa.array((k == key) & (c >= lo) & (c < hi)))
        if table.num_rows:
            pieces.append(table)
    if pieces:
        return pa.concat_tables(pieces)
    return pa.table({name: pa.array([], pa.large_string() if name == "text" else pa.int64()) for name in dict.fromkeys(["key", column, *columns])})


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
        stats = dict(fn(inputs, output, params))
        stats["cpu_s"] = time.process_time() - warmed
        stats["warmup_cpu_s"] = warmed - start
        stats["rss_kb"] = vm_hwm_kb()
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
        self.writer = pq.ParquetWriter(local, schema, compression=storage.PARQUET_COMPRESSION)
        self.pending = schema.empty_table()
        self.digest = hashlib.sha256()
        self.count = 0

    def add(self, table: pa.Table) -> None:
        for value in table.column("id").to_pylist():
            self.digest.update(value.encode("utf-8"))
            self.digest.update(b"\n")
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
    """Rows of some sources from a part file sorted by (``rank``, ``id``), pruning row groups."""
    wanted = np.asarray(sorted(set(ranks)), np.int64)
    fs, path = storage.filesystem(uri)
    with fs.open(path, "rb") as handle:
        reader = pq.ParquetFile(handle)
        meta = reader.metadata
        col = reader.schema_arrow.get_field_index("rank")
        groups = []
        for g in range(meta.num_row_groups):
            stats = meta.row_group(g).column(col).statistics
            if meta.row_group(g).num_rows and (stats is None or not stats.has_min_max or np.searchsorted(wanted, stats.min) < np.searchsorted(wanted, stats.max, side="right")):
                groups.append(g)
        table = reader.read_row_groups(groups) if groups else reader.schema_arrow.empty_table()
    return table.filter(pc.is_in(table.column("rank"), pa.array(wanted, table.schema.field("rank").type)))
