"""Normalize a source's provider files into canonical Parquet shards.

Canonical rows: ``id`` (xxh3-128 of the UTF-8 text, 32 hex chars), ``text``, ``source_id``
(the provider's id, as a string) and the provider's other columns unless the recipe is bare.

Two phases keep memory bounded by the shard size, not the source size nor the largest input
file, and let a killed run resume without redoing finished work:

1. *scatter*: each input file is read in batches of bounded bytes, passed through the source's
   transform (if any), cleaned, hashed, and its rows are routed by ``id`` to one of N shards.
   Routed rows are buffered up to ``scatter_buffer_bytes`` and then written out as one Arrow
   IPC file (uncompressed: it is read back once) of exactly one record batch per *slot*, so a
   1 GB file never sits in memory, the number of files does not grow with the number of shards,
   and where a shard's rows are is arithmetic (nothing records runs). A slot is a shard, or, for
   a source of more flushes than a task may read (``gather_fan_in``, F), a bucket of adjacent
   shards that middle levels (*regroup*) split further, F files at a time, until a bucket is a
   shard (``GatherTree``: ceil(log_F flushes) - 1 levels, none for at most F flushes).
2. *gather*: each shard reads only its own record batch of every flush (or of its bucket's files
   of the last middle level), sorts by ``id`` (stable, so the first copy in input order wins), keeps
   the first row of every ``id`` and sets later copies aside under ``dups/``.

N = ceil(uncompressed input bytes / target shard bytes), estimated before reading from file
metadata (Parquet row groups, gzip and zstd headers), so a shard holds about the target in
*uncompressed* bytes whatever the compression, and the same inputs always give the same N.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from marin_assets.core.ingest import formats
from marin_assets.core.runtime import kernels, storage
from marin_assets.core.runtime.integrity import text_ids
from marin_assets.errors import BadInput
from marin_assets.core.runtime.runner import FREED_AT_ONCE_ENV, ShardRunner, ShardTask, TaskResources

log = logging.getLogger(__name__)

CODE_VERSION = "2"  # 2: shards planned from uncompressed bytes, pieces streamed
ZSTD_SIZING = "content"  # zstd files sized by their recorded or sampled content size (was 5x the compressed size)
SCATTER_DIR = "_scatter"
SCATTER_LAYOUT = "slots-{}"  # scatter files with one record batch per slot, by slot count (older layouts are not reused)
DUPS_DIR = "dups"
SUPPORTED_FORMATS = formats.SUPPORTED_FORMATS


class NormalizeError(BadInput, RuntimeError):
    """Input that cannot be normalized; the message names the source, the file and the fix."""


@dataclasses.dataclass(frozen=True)
class NormalizeParams:
    """How one source is normalized (the defaults are the reference values)."""

    text_field: str = "text"
    id_field: str | None = "id"
    target_shard_bytes: int = 256 * 1024 * 1024
    max_whitespace_run: int = 128
    exact_dedup: bool = True
    bare: bool = False
    batch_rows: int = 50_000
    batch_bytes: int = 64 * 1024 * 1024
    scatter_buffer_bytes: int = 128 * 1024 * 1024
    # Most files one task reads: a source with more flushes gets middle levels (see ``GatherTree``).
    gather_fan_in: int = 1024

    def fingerprint_params(self) -> dict[str, Any]:
        """Parameters that change the output (batch and buffer sizes and the fan-in only change memory and tasks)."""
        memory_only = ("batch_rows", "batch_bytes", "scatter_buffer_bytes", "gather_fan_in")
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in memory_only}


# A batch transform turns provider rows into rows with ``text`` and ``source_id`` columns and
# returns counters of rows it filtered or could not render (reason -> count).
BatchTransform = Callable[[pl.DataFrame], tuple[pl.DataFrame, Mapping[str, int]]]


# --------------------------------------------------------------------------- reading


input_format_of = formats.format_of_name
read_batches = formats.read_batches


GZIP_RATIO_GUESS = 4
ZSTD_SAMPLE_BYTES = 4 << 20  # compressed bytes of a .zst file decompressed to size it
ZSTD_SAMPLE_OUT = 256 << 20  # at most this much of their output (a file of extreme ratio stops early)


def uncompressed_bytes(uri: str, fmt: str | None) -> int:
    """The bytes a file holds once decompressed (what a shard's memory follows), from metadata.

    Parquet: the row groups' uncompressed sizes. gzip: the trailer's size (mod 2^32, so never
    less than the file). zstd: :func:`zstd_content_bytes`. Plain JSON: the file size. Guesses
    err on the large side: more, smaller shards, never bigger ones.
    """
    size = storage.size(uri)
    fmt = fmt or input_format_of(uri)
    try:
        if fmt == "parquet":
            fs, path = storage.filesystem(uri)
            with fs.open(path, "rb") as handle:
                meta = pq.ParquetFile(handle).metadata
                return max(size, sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)))
        if fmt is not None and fmt.endswith(".gz"):
            fs, path = storage.filesystem(uri)
            with fs.open(path, "rb") as handle:
                handle.seek(max(size - 4, 0))
                trailer = int.from_bytes(handle.read(4), "little")
            return max(trailer, size * GZIP_RATIO_GUESS)
        if fmt is not None and fmt.endswith(".zst"):
            fs, path = storage.filesystem(uri)
            with fs.open(path, "rb") as handle:
                head = handle.read(min(size, ZSTD_SAMPLE_BYTES))
            return zstd_content_bytes(head, size)
    except Exception:  # noqa: BLE001 - an unreadable header is reported when the file is read
        return size
    return size


def plan_inputs(files: list[str]) -> dict[str, str]:
    """What the shard plan of ``files`` depends on beyond the parameters: the zstd sizing rule,
    for sources with ``.zst`` files only, so a change of that rule re-plans exactly those sources
    (the others' outputs, and everything built on them, stay current)."""
    return {"zstd_sizing": ZSTD_SIZING} if any(f.endswith(".zst") for f in files) else {}


def zstd_content_bytes(head: bytes, size: int) -> int:
    """A zstd file's decompressed bytes from its first bytes ``head`` and its ``size``.

    A file read whole in ``head``: the content size its one frame records (the decoder holds the
    file to it when it is read), else its output. A larger file: the sample's ratio extrapolated to
    the file, unless the first frame records its content size and is the file's only frame (what
    ``zstd`` writes for a file): then that size. A frame that ends inside the sample, or whose size
    is under half the extrapolation, is one of several: its size is not the file's.
    """
    import zstandard  # noqa: PLC0415

    content = zstandard.get_frame_parameters(head).content_size
    recorded = content not in (zstandard.CONTENTSIZE_UNKNOWN, zstandard.CONTENTSIZE_ERROR)
    if recorded and len(head) == size and content <= ZSTD_SAMPLE_OUT and formats.zstd_frames(head) == 1:
        return max(content, size)  # a small file: decoding it here would double its reading's CPU
    read, out, first_frame_ends = formats.zstd_sample(head, ZSTD_SAMPLE_OUT)
    if read == size:
        return max(out, size)
    extrapolated = max(size, -(-out * size // max(read, 1)))
    if recorded and not first_frame_ends and 2 * content >= extrapolated:
        return max(content, size)
    return extrapolated


def batch_rows_for(uri: str, fmt: str | None, params: NormalizeParams) -> int:
    """Rows per read batch so that one batch holds about ``batch_bytes`` (Parquet rows vary a lot)."""
    if fmt != "parquet":
        return params.batch_rows
    try:
        fs, path = storage.filesystem(uri)
        with fs.open(path, "rb") as handle:
            meta = pq.ParquetFile(handle).metadata
            rows = meta.num_rows
            raw = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    except Exception:  # noqa: BLE001 - the reader reports a broken file
        return params.batch_rows
    if rows <= 0 or raw <= 0:
        return params.batch_rows
    return int(max(1, min(params.batch_rows, params.batch_bytes * rows // raw)))


# --------------------------------------------------------------------------- row cleaning


# Every byte a whitespace character (``\s``: Unicode White_Space) can hold: ASCII 9-13 and 32,
# and the bytes of U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000.
_WHITESPACE_BYTE = np.zeros(256, bool)
_WHITESPACE_BYTE[[9, 10, 11, 12, 13, 32, 0x85, 0x9A, 0x9F, 0xA0, 0xA8, 0xA9, 0xAF, 0xC2, 0xE1, 0xE2, 0xE3]] = True
_WHITESPACE_BYTE[0x80:0x8B] = True


def _maybe_run_rows(data: np.ndarray, offsets: np.ndarray, need: int) -> np.ndarray:
    """Rows that may hold ``need`` whitespace characters in a row: those holding ``need``
    consecutive bytes that can be part of one (a necessary condition, checked in numpy).

    Such a stretch holds one of every ``need``-th byte (the probes); only the probes that can be
    whitespace are widened, byte by byte, while their stretch lasts (a step or two in prose: the
    candidates thin out at once), so the scan costs a few numpy passes over 1/``need`` of the bytes.
    """
    probes = np.flatnonzero(_WHITESPACE_BYTE[data[need - 1 :: need]]) * need + need - 1
    reach = np.zeros(probes.size, np.int64)
    for side in (1, -1):
        alive = np.arange(probes.size)
        for step in range(1, need):
            at = probes[alive] + side * step
            inside = (at >= 0) & (at < data.size)
            alive, at = alive[inside], at[inside]
            alive = alive[_WHITESPACE_BYTE[data[at]]]
            if not alive.size:
                break
            reach[alive] += 1
    hits = probes[reach + 1 >= need]
    return np.unique(np.searchsorted(offsets, hits, side="right") - 1)


def whitespace_runs(texts: pa.Array | pa.ChunkedArray, longer_than: int) -> np.ndarray:
    """Per text: does it hold more than ``longer_than`` whitespace characters in a row (the regex
    ``\\s{longer_than+1}``)? The regex runs only on the few texts a byte scan cannot rule out."""
    data, offsets, _ = kernels.string_buffers(texts)
    out = np.zeros(offsets.size - 1, bool)
    rows = _maybe_run_rows(data, offsets, longer_than + 1)
    if rows.size:
        maybe = pl.Series(pc.take(texts, pa.array(rows)))
        out[rows] = maybe.str.contains(rf"\s{{{longer_than + 1}}}").fill_null(False).to_numpy()
    return out


def _cast_error(frame: pl.DataFrame, columns: list[str | None], source: str, file: str, err: Exception) -> NormalizeError:
    """What a failed cast to text means: which column, how many rows, and what to do about it."""
    for column in (c for c in columns if c and c in frame.columns):
        try:
            frame.select(pl.col(column).cast(pl.Utf8))
            continue
        except (pl.exceptions.ComputeError, pl.exceptions.InvalidOperationError):
            pass
        what = "values that cannot be read as text"
        if frame.schema[column] == pl.Binary:
            bad = sum(1 for value in frame[column] if value is not None and not _is_utf8(value))
            what = f"bytes that are not valid UTF-8 ({bad} of {frame.height} rows of a batch)"
        return NormalizeError(
            f"source '{source}': file '{file}', column '{column}' ({frame.schema[column]}): {what}; "
            f"make the recipe's transform decode the column (invalid bytes replaced), exclude the file with "
            f"the entry's globs, or fetch it again if it is corrupt"
        )
    return NormalizeError(f"source '{source}': file '{file}': its rows cannot be read as text ({type(err).__name__}: "
                          f"{str(err)[:300]}); check the catalog entry's text_field and id_field against the file's columns")  # fmt: skip


def _is_utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def canonical_rows(frame: pl.DataFrame, params: NormalizeParams, *, source: str, file: str) -> tuple[pl.DataFrame, dict[str, int]]:
    """Rename fields, compact whitespace, drop empty texts and add ``id``."""
    counters: dict[str, int] = {}
    if params.text_field not in frame.columns:
        raise NormalizeError(
            f"source '{source}': file '{file}' has no text field '{params.text_field}' "
            f"(columns: {', '.join(frame.columns) or 'none'}); fix the catalog entry's text_field "
            f"or its transform"
        )
    renames: dict[str, str] = {}
    if "id" in frame.columns and params.id_field != "id":
        renames["id"] = "provider_id"
    if "source_id" in frame.columns and params.id_field != "source_id":
        renames["source_id"] = "provider_source_id"
    frame = frame.rename(renames)
    text = pl.col(params.text_field).cast(pl.Utf8)
    if params.id_field and params.id_field in frame.columns:
        source_id = pl.col(params.id_field).cast(pl.Utf8)
    else:
        source_id = pl.lit(None, dtype=pl.Utf8)
    keep = [] if params.bare else [c for c in frame.columns if c not in (params.text_field, params.id_field)]
    try:
        frame = frame.select(text.alias("text"), source_id.alias("source_id"), *keep)
    except (pl.exceptions.ComputeError, pl.exceptions.InvalidOperationError) as err:
        raise _cast_error(frame, [params.text_field, params.id_field], source, file, err) from err

    rows_in = frame.height
    frame = frame.filter(pl.col("text").str.contains(r"\S").fill_null(False))
    counters["empty_dropped"] = rows_in - frame.height

    run = params.max_whitespace_run
    texts = frame["text"].to_arrow()
    long_ws = whitespace_runs(texts, run)
    compacted = int(long_ws.sum())
    if compacted:
        frame = frame.with_columns(
            pl.when(pl.Series(long_ws)).then(pl.col("text").str.replace_all(rf"(\s{{{run}}})\s+", "${1}")).otherwise(pl.col("text")).alias("text")
        )
        texts = frame["text"].to_arrow()
    counters["whitespace_compacted"] = compacted
    frame = frame.with_columns(pl.Series("id", text_ids(texts), dtype=pl.Utf8))
    ordered = ["id", "text", "source_id"] + [c for c in frame.columns if c not in ("id", "text", "source_id")]
    return frame.select(ordered), counters


def shard_of(ids: pl.Series, shards: int) -> pl.Series:
    """Route ids to shards by range: shard k holds the k-th of N equal slices of the id space.

    Ids are uniform hashes, so shards come out even; and because a shard is one contiguous id
    range, a sorted id list (a removal list) can be read for that range only.
    """
    prefix = ids.str.slice(0, 8).str.to_integer(base=16).cast(pl.UInt64)
    return ((prefix * shards) // (1 << 32)).cast(pl.Int32)


# --------------------------------------------------------------------------- phases


def plan_shards(input_sizes: Sequence[int], target_shard_bytes: int) -> int:
    """Shards for inputs of these uncompressed sizes: each holds at most about the target."""
    return max(1, -(-sum(input_sizes) // target_shard_bytes))


def flush_bytes(params: NormalizeParams) -> int:
    """Rows a scatter task buffers before it writes them out (one flush file)."""
    return min(params.scatter_buffer_bytes, params.target_shard_bytes)


def planned_flushes(input_sizes: Sequence[int], params: NormalizeParams) -> int:
    """Flush files the scatter will write, estimated from the inputs' uncompressed sizes before it
    runs: they size the buckets of the tree (``GatherTree``), so the scatter knows its slots."""
    return sum(max(1, -(-size // flush_bytes(params))) for size in input_sizes)


def chunk_flushes(flushes: Sequence[int], chunks: int) -> list[tuple[tuple[int, int, int], ...]]:
    """The flushes of the scatter tasks (task i wrote ``flushes[i]``) cut into ``chunks`` consecutive
    runs of about equal count, each as ``(task, first flush, flushes)`` spans."""
    total = sum(flushes)
    size = -(-total // max(1, chunks))
    out: list[tuple[tuple[int, int, int], ...]] = []
    current: list[tuple[int, int, int]] = []
    room = size
    for task, count in enumerate(flushes):
        first = 0
        while count - first > 0:
            take = min(room, count - first)
            current.append((task, first, take))
            first, room = first + take, room - take
            if room == 0:
                out.append(tuple(current))
                current, room = [], size
    if current:
        out.append(tuple(current))
    return out


def _levels_for(flushes: int, fan_in: int) -> int:
    """Middle levels a tree of radix ``fan_in`` needs over ``flushes`` files: ceil(log_F(flushes)) - 1."""
    levels, reach = 0, fan_in
    while reach < flushes:
        levels, reach = levels + 1, reach * fan_in
    return levels


@dataclasses.dataclass(frozen=True)
class GatherTree:
    """How a source's rows travel from the scatter's flushes to its shards: a tree of radix F
    (``gather_fan_in``), all arithmetic (nobody records where a shard's rows are).

    A source of M flushes has L = ceil(log_F M) - 1 middle levels (none when M <= F: each gather
    reads its batch of every flush). Level l's *buckets* are ranges of ``per_bucket(l)`` adjacent
    shards (level 0: the scatter's slots; level L: single shards), each level splitting its
    parent's buckets into ~F. A level-l task reads one level-(l-1) bucket's record batch of at most
    F of that bucket's files and writes them as one file split into the bucket's sub-buckets, so
    each bucket has ceil(M / F^l) files after level l, every task (gathers too) reads at most F
    files, and a middle task holds about one shard of rows (buckets of ~M / F^(l+1) shards).
    """

    shards: int
    planned: int  # flushes estimated before the scatter: they size the buckets (the scatter's slots follow them)
    flushes: int  # flushes the scatter wrote: they set the levels and cut each level's chunks
    fan_in: int

    @property
    def levels(self) -> int:
        """Middle levels for the flushes written; at least one where the scatter's slots hold several shards."""
        return max(_levels_for(self.flushes, self.fan_in), min(1, _levels_for(self.planned, self.fan_in)))

    def per_bucket(self, level: int) -> int:
        """Shards per bucket of ``level``: ~planned / F^(level+1), a multiple of the next level's (so
        buckets nest) and not past the shards; 1 from the last level on (where the scatter wrote
        fewer flushes than planned, the last level splits its buckets into shards in one go)."""
        if level >= self.levels:
            return 1
        per = 1
        for deeper in range(_levels_for(self.planned, self.fan_in) - 1, level - 1, -1):
            target = -(-self.planned // self.fan_in ** (deeper + 1))
            per *= min(-(-target // per), -(-self.shards // per))
        return per

    def buckets(self, level: int) -> int:
        return -(-self.shards // self.per_bucket(level))

    def split(self, level: int) -> int:
        """Record batches in one file of ``level`` (>= 1): the sub-buckets of one bucket of the level above."""
        return self.per_bucket(level - 1) // self.per_bucket(level)

    def files(self, level: int) -> int:
        """Files per bucket after ``level`` (0: the flushes; ``levels + 1``, the gathers: one shard each)."""
        return -(-self.flushes // self.fan_in**level)

    def chunk(self, level: int) -> int:
        """Inputs of one task of ``level`` (``levels + 1``: a gather): a bucket's files cut in ``files(level)`` chunks."""
        return -(-self.files(level - 1) // self.files(level))


@dataclasses.dataclass(frozen=True)
class ScatterParams:
    """Record batches per flush file: slot k holds shards ``k * per_slot ..`` (``GatherTree.per_bucket(0)``);
    every flush has the same batches, so a reader finds a shard's rows by arithmetic."""

    normalize: NormalizeParams
    shards: int
    source: str
    fmt: str | None
    transform: BatchTransform | None = None
    per_slot: int = 1

    @property
    def slots(self) -> int:
        return -(-self.shards // self.per_slot)

    @property
    def layout(self) -> str:
        """The scatter files' folder, named by their slots (files of another layout are not reused)."""
        return SCATTER_LAYOUT.format(self.slots) + (f"-of-{self.per_slot}" if self.per_slot > 1 else "")

    def task_resources(self, default: TaskResources) -> TaskResources:
        """A scatter reads its file batch after batch: on Ray its worker's dataframe allocator
        returns freed pages at once, so a large file peaks as one batch does."""
        return dataclasses.replace(default, env_vars=(*default.env_vars, *FREED_AT_ONCE_ENV))


def _file_rows(uri: str, params: ScatterParams, counters: dict[str, int]) -> Iterator[pl.DataFrame]:
    """Canonical rows of one input file, batch by batch; counts go into ``counters``."""
    fmt = params.fmt or input_format_of(uri)
    if fmt not in SUPPORTED_FORMATS:
        raise NormalizeError(
            f"source '{params.source}': file '{uri}' has unsupported format '{fmt}'; "
            f"supported: {', '.join(SUPPORTED_FORMATS)} (set input_format in the catalog entry)"
        )
    counters["bytes_in"] = counters.get("bytes_in", 0) + storage.size(uri)
    bad_rows: dict[str, int] = {}
    # A transform may bring its own reader (whole files, repaired encodings, smaller batches).
    formats.check_bytes(uri, fmt, params.source)
    reader = getattr(params.transform, "read_file", None) or read_batches
    for batch in formats.reading(reader(uri, fmt, batch_rows_for(uri, fmt, params.normalize), bad_rows, batch_bytes=params.normalize.batch_bytes), uri, fmt, params.source):
        counters["rows_in"] = counters.get("rows_in", 0) + batch.height
        if params.transform is not None:
            batch, transform_counts = params.transform(batch)
            for reason, n in transform_counts.items():
                bad_rows[reason] = bad_rows.get(reason, 0) + int(n)
        rows, row_counts = canonical_rows(batch, params.normalize, source=params.source, file=uri)
        for key, n in row_counts.items():
            counters[key] = counters.get(key, 0) + n
        counters["rows_out"] = counters.get("rows_out", 0) + rows.height
        if rows.height:
            yield rows
    for reason, n in bad_rows.items():
        counters[f"bad_rows.{reason}"] = counters.get(f"bad_rows.{reason}", 0) + n


def _slot_order_columns(frames: list[pl.DataFrame]) -> list[str]:
    """The columns (no ``_slot``) in first-appearance order over the rows taken slot by slot,
    batch by batch: the order a flush has always written when batches differ in their columns."""
    columns = [c for c in frames[0].columns if c != "_slot"]
    if all(f.columns == frames[0].columns for f in frames[1:]):
        return columns
    slots_of = [set(f["_slot"].unique().to_list()) for f in frames]
    seen: dict[str, None] = {}
    for slot in sorted(set().union(*slots_of)):
        for frame, slots in zip(frames, slots_of, strict=True):
            if slot in slots:
                seen.update((c, None) for c in frame.columns if c != "_slot")
    return list(seen)


def flush_name(sequence: int) -> str:
    return f"flush-{sequence:05d}.arrow"


def _one_batch(table: pa.Table) -> pa.RecordBatch:
    """A table's rows as exactly one record batch (an empty one when it has no rows)."""
    batches = table.combine_chunks().to_batches()  # one chunk per column: one batch, none when empty
    if not batches:
        return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in table.schema], schema=table.schema)
    (batch,) = batches
    return batch


def _write_slots(frames: list[pl.DataFrame], slots: int, names: list[str], source: str, uri: str) -> None:
    """Rows tagged with ``_slot`` as one Arrow IPC file of exactly ``slots`` record batches, batch k
    holding slot k's rows in input order (empty batches for empty slots)."""
    # One concat and one stable sort by slot per file (not one frame per batch and slot:
    # with many slots that per-piece overhead grew the CPU per row with the corpus).
    columns = _slot_order_columns(frames)
    frame = formats.concat_rows(frames, names, source, rechunk=False).sort("_slot", maintain_order=True)
    frames.clear()
    heights = np.bincount(frame["_slot"].to_numpy(), minlength=slots)
    frame = frame.select(columns)
    # converted slot by slot: the flush is held once (as rows), not also as one Arrow copy
    with storage.open_atomic(uri) as handle:
        with pa.ipc.new_file(handle, frame.head(0).to_arrow().schema) as writer:
            offset = 0
            for height in heights.tolist():
                writer.write_batch(_one_batch(frame.slice(offset, height).to_arrow()))
                offset += height


def scatter_file(input_uris: list[str], output_uri: str, params: ScatterParams) -> dict[str, Any]:
    """Phase 1 for one input file: write its rows routed to shards under ``output_uri``.

    Rows are buffered until ``scatter_buffer_bytes`` (at most the shard target), then written as
    one Arrow IPC file of one record batch per slot (``ScatterParams``). One file per flush, not one
    per shard: the number of files stays linear in the input whatever the number of shards, and
    a shard reads its own record batch only (a memory map locally, range reads on object stores).
    ``flushes`` in the counters is how many files it wrote. A flush is written by a second thread
    while the next rows are read and hashed (the writer releases the interpreter lock), at most
    one at a time: one more buffer of memory.
    """
    from concurrent.futures import Future, ThreadPoolExecutor  # noqa: PLC0415

    (uri,) = input_uris
    counters: dict[str, Any] = {"rows_in": 0, "rows_out": 0}
    buffered: list[pl.DataFrame] = []  # read batches with their ``_slot`` column, in input order
    flushes = 0
    held = 0
    slots = params.slots
    writing: Future | None = None

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="scatter-flush") as writer:  # exit waits for a write

        def flush() -> None:
            nonlocal flushes, writing
            if not buffered:
                return
            if writing is not None:
                writing.result()
            frames = list(buffered)
            buffered.clear()
            target = storage.join(output_uri, flush_name(flushes))
            writing = writer.submit(_write_slots, frames, slots, [uri] * len(frames), params.source, target)
            flushes += 1

        for rows in _file_rows(uri, params, counters):
            slot = shard_of(rows["id"], params.shards) // params.per_slot
            rows = rows.with_columns(slot.alias("_slot"))
            buffered.append(rows)
            held += int(rows.estimated_size())
            del rows
            if held >= flush_bytes(params.normalize):
                flush()
                held = 0
        flush()
        if writing is not None:
            writing.result()
    counters["flushes"] = flushes
    storage.write_json(storage.join(output_uri, "_done.json"), counters)
    return counters


def single_shard(input_uris: list[str], output_uri: str, params: ScatterParams) -> dict[str, Any]:
    """A source that makes one shard: read every file and write the shard, no scatter round trip.

    The shard is held in memory either way, so skipping the pieces costs no memory.
    """
    counters: dict[str, int] = {"rows_in": 0, "rows_out": 0}
    frames, names = [], []
    for uri in input_uris:
        for rows in _file_rows(uri, params, counters):
            frames.append(rows)
            names.append(uri)
    _require_rows(params.source, len(input_uris), counters)
    return counters | _write_shard(frames, output_uri, params.normalize.exact_dedup, names, params.source)


def _sum_ints(stats: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for shard in stats:
        for key, value in shard.items():
            if isinstance(value, int) and not isinstance(value, bool):
                totals[key] = totals.get(key, 0) + value
    return totals


def _require_rows(source: str, files: int, counters: Mapping[str, int]) -> None:
    if counters.get("rows_out", 0) == 0:
        raise NormalizeError(
            f"source '{source}': every row was empty or filtered ({counters.get('rows_in', 0)} rows read from "
            f"{files} files); check the text field and the transform in the catalog entry"
        )


FOOTER_READ_BYTES = 64 * 1024  # a footer: 24 bytes per record batch (at most ~1,024 slots) plus the schema


def _read_batch(uri: str, index: int) -> pa.Table:
    """Record batch ``index`` of an Arrow IPC file as a table (only its bytes and the footer are read)."""
    path = storage.local_path(uri)
    if path is not None:
        reader = pa.ipc.open_file(pa.memory_map(path))
        return pa.Table.from_batches([reader.get_batch(index)], reader.schema)
    fs, remote = storage.filesystem(uri)
    with fs.open(remote, "rb", cache_type="bytes") as handle:
        # One ranged read of the file's tail holds the footer and its length: the reader's two
        # reads of them are served from it (else a request each on an object store).
        handle.seek(max(0, handle.size - FOOTER_READ_BYTES))
        handle.read(FOOTER_READ_BYTES)
        handle.seek(0)
        reader = pa.ipc.open_file(handle)
        return pa.Table.from_batches([reader.get_batch(index)], reader.schema)


@dataclasses.dataclass(frozen=True)
class NumberedFiles(Sequence[str]):
    """Files named by numbers, ``root/template.format(group, k)`` for each ``(group, first, count)``
    span, in order: a task's input list in a few numbers (its spec stays small whatever the fan-in)."""

    root: str
    template: str
    spans: tuple[tuple[int, int, int], ...]

    def __len__(self) -> int:
        return sum(count for _, _, count in self.spans)

    def __iter__(self) -> Iterator[str]:
        for group, first, count in self.spans:
            for k in range(first, first + count):
                yield storage.join(self.root, self.template.format(group, k))

    def __getitem__(self, index: Any) -> Any:
        items = list(self)
        return items[index]


SCATTER_TASK = "file-{0:05d}"  # a scatter task's folder, under the layout's folder
SCATTERED = SCATTER_TASK + "/flush-{1:05d}.arrow"  # its flushes (``flush_name``)
REGROUPED = "bucket-{0:05d}-chunk-{1:05d}.arrow"  # a regroup task's output, under its folder


def _read_slot(input_uris: Iterable[str], slot: int) -> tuple[list[pl.DataFrame], list[str]]:
    """Slot ``slot`` of each file, in input order, empty ones left out; runs of one schema become one frame.
    From an object store the files are read ``storage.READ_THREADS`` at a time (a middle task reads up
    to the fan-in of small batches: waiting for them one by one would be its whole run time)."""
    # Pieces with one schema (usually all of them) become one frame: a frame per piece costs a
    # fixed overhead per piece.
    frames: list[pl.DataFrame] = []
    names: list[str] = []
    run: list[Any] = []
    uris = list(input_uris)
    for uri, table in zip(uris, storage.concurrently(lambda uri: _read_batch(uri, slot), uris, storage.read_threads(uris))):
        if not table.num_rows:
            continue
        if run and not table.schema.equals(run[0].schema):
            frames.append(pl.from_arrow(pa.concat_tables(run)))  # type: ignore[arg-type]
            run = []
        if not run:
            names.append(f"pieces of input {uri.rsplit('/', 2)[-2]}")
        run.append(table)
    if run:
        frames.append(pl.from_arrow(pa.concat_tables(run)))  # type: ignore[arg-type]
    return frames, names


@dataclasses.dataclass(frozen=True)
class RegroupParams:
    """One task of middle level ``level``: bucket ``bucket`` of the level above (``per_bucket`` shards
    from ``bucket * per_bucket``; record batch ``slot`` of each input) split into sub-buckets of ``per_sub`` shards."""

    level: int
    bucket: int
    slot: int
    per_bucket: int
    per_sub: int
    shards: int
    source: str


def regroup_chunk(input_uris: list[str], output_uri: str, params: RegroupParams) -> dict[str, Any]:
    """A middle level of a large source: one bucket's rows from a chunk of the level above's files,
    written as one file with a record batch per sub-bucket (in input order within each)."""
    frames, names = _read_slot(input_uris, params.slot)
    first = params.bucket * params.per_bucket
    frames = [f.with_columns(((shard_of(f["id"], params.shards) - first) // params.per_sub).alias("_slot")) for f in frames]
    rows = sum(f.height for f in frames)
    if not frames:
        frames, names = [pl.DataFrame({"id": [], "_slot": []}, schema={"id": pl.Utf8, "_slot": pl.Int32})], [""]
    _write_slots(frames, params.per_bucket // params.per_sub, names, params.source, output_uri)
    return {"rows": rows}


@dataclasses.dataclass(frozen=True)
class GatherParams:
    shard: int
    exact_dedup: bool
    slot: int = -1  # the record batch of every input that holds the shard's rows (-1: the shard's number)


def gather_shard(input_uris: list[str], output_uri: str, params: GatherParams) -> dict[str, Any]:
    """Phase 2 for one shard: read its record batch of every input (in input order), sort by id, split off duplicates."""
    frames, names = _read_slot(input_uris, params.shard if params.slot < 0 else params.slot)
    return _write_shard(frames, output_uri, params.exact_dedup, names)


def _write_shard(frames: list[pl.DataFrame], output_uri: str, exact_dedup: bool, names: list[str] | None = None,
                 source: str = "") -> dict[str, Any]:  # fmt: skip
    """Sort a shard's rows by id (stable: the first copy in input order wins) and write it."""
    frame = formats.concat_rows(frames, names or [""] * len(frames), source or output_uri, rechunk=False) if frames else pl.DataFrame(schema={"id": pl.Utf8, "text": pl.Utf8, "source_id": pl.Utf8})
    frames.clear()  # keep one copy of the shard alive while sorting, not two
    frame = frame.sort("id", maintain_order=True)
    duplicates = 0
    if exact_dedup and frame.height:
        first = frame["id"].is_first_distinct()
        duplicates = frame.height - int(first.sum())
        if duplicates:  # no copy of the shard when every id is distinct (the usual case)
            dups = frame.filter(~first)
            frame = frame.filter(first)
            parent, base = output_uri.rsplit("/", 1)
            storage.write_parquet(dups, storage.join(parent, DUPS_DIR, base))
    storage.write_parquet(frame, output_uri)
    return {"rows": frame.height, "duplicates": duplicates, "bytes_out": storage.size(output_uri)}


# --------------------------------------------------------------------------- one source


SIZES_IN_DRIVER = 16  # at most this many files are sized by the step itself; more by tasks
FILES_PER_SIZING_TASK = 256


@dataclasses.dataclass(frozen=True)
class SizingParams:
    fmt: str | None


def measure_files(input_uris: list[str], output_uri: str, params: SizingParams) -> dict[str, Any]:
    """The uncompressed sizes of a batch of input files (their footers and headers), as a task."""
    return {"sizes": [uncompressed_bytes(u, params.fmt) for u in input_uris]}


def input_sizes(input_uris: Sequence[str], fmt: str | None, work_uri: str, runner: ShardRunner) -> list[int]:
    """Each input's uncompressed bytes, which plan the shards. A few files are sized here; a source
    of many files by tasks of ``FILES_PER_SIZING_TASK`` each, so the step reads no file per input
    (a source of 10^4 files would cost the step 10^4 footer reads one after another)."""
    if len(input_uris) <= SIZES_IN_DRIVER:
        return [uncompressed_bytes(u, fmt) for u in input_uris]
    step = FILES_PER_SIZING_TASK
    tasks = [ShardTask(measure_files, tuple(input_uris[i:i + step]), storage.join(work_uri, f"files-{i:07d}"), SizingParams(fmt))
             for i in range(0, len(input_uris), step)]  # fmt: skip
    return [size for result in runner.map(tasks) for size in result.stats["sizes"]]


def _level_root(layout_root: str, tree: GatherTree, level: int) -> str:
    return storage.join(layout_root, f"level-{level}-of-{tree.per_bucket(level)}-files-{tree.files(level)}")


def _bucket_files(tree: GatherTree, level: int, bucket: int, layout_root: str,
                  flush_chunks: Sequence[tuple[tuple[int, int, int], ...]]) -> tuple[int, list[NumberedFiles]]:  # fmt: skip
    """Where bucket ``bucket`` of level ``level - 1`` lies, for the tasks of ``level`` (the gathers: ``levels + 1``):
    the record batch to read, and its files in ``tree.files(level)`` chunks of at most the fan-in."""
    if level == 1:  # the scatter's flushes: every one holds every bucket
        return bucket, [NumberedFiles(layout_root, SCATTERED, spans) for spans in flush_chunks]
    split, files, size = tree.split(level - 1), tree.files(level - 1), tree.chunk(level)
    root = _level_root(layout_root, tree, level - 1)
    chunks = [NumberedFiles(root, REGROUPED, ((bucket // split, first, min(size, files - first)),)) for first in range(0, files, size)]
    return bucket % split, chunks


def _middle_tasks(tree: GatherTree, level: int, layout_root: str, flush_chunks: Sequence[tuple[tuple[int, int, int], ...]],
                  source: str) -> list[ShardTask]:  # fmt: skip
    """Level ``level``: one task per bucket of the level above and chunk of its files."""
    out_root = _level_root(layout_root, tree, level)
    tasks = []
    for bucket in range(tree.buckets(level - 1)):
        slot, chunks = _bucket_files(tree, level, bucket, layout_root, flush_chunks)
        params = RegroupParams(level, bucket, slot, tree.per_bucket(level - 1), tree.per_bucket(level), tree.shards, source)
        tasks.extend(ShardTask(regroup_chunk, files, storage.join(out_root, REGROUPED.format(bucket, c)), params)
                     for c, files in enumerate(chunks))  # fmt: skip
    return tasks


def _run_middle_levels(tree: GatherTree, layout_root: str, flush_chunks: Sequence[tuple[tuple[int, int, int], ...]],
                       source: str, runner: ShardRunner, say: Callable[[str], None]) -> None:  # fmt: skip
    """Each middle level in turn (none for a source of at most the fan-in of flushes)."""
    for level in range(1, tree.levels + 1):
        tasks = _middle_tasks(tree, level, layout_root, flush_chunks, source)
        runner.map(tasks, on_done=lambda r, level=level: say(f"{source}: level {level} regrouped {storage.basename(r.output)} rows={r.stats['rows']}"))
        del tasks


def _gather_tasks(tree: GatherTree, layout_root: str, flush_chunks: Sequence[tuple[tuple[int, int, int], ...]], out_dir: str,
                  exact_dedup: bool) -> list[ShardTask]:  # fmt: skip
    """One task per shard, reading its record batch of every flush (no middle level) or of its
    bucket's files of the last middle level."""
    gathers = []
    for shard in range(tree.shards):
        slot, (files,) = _bucket_files(tree, tree.levels + 1, shard, layout_root, flush_chunks)
        output = storage.join(out_dir, storage.shard_name(shard, tree.shards))
        gathers.append(ShardTask(gather_shard, files, output, GatherParams(shard, exact_dedup, slot)))
    return gathers


def normalize_source(
    source: str,
    input_uris: Sequence[str],
    out_dir: str,
    params: NormalizeParams,
    *,
    fmt: str | None = None,
    transform: BatchTransform | None = None,
    runner: ShardRunner | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Normalize ``input_uris`` into ``out_dir``; returns the body of its manifest (counters, shards).

    Resumes an interrupted run shard by shard; the stage runner (``stages.run_stage``) reuses a
    complete output and writes the manifest.
    """
    if not input_uris:
        raise NormalizeError(f"source '{source}': no input files to normalize; check the catalog entry's file selection")
    runner = runner or ShardRunner()
    say = progress or log.info
    scatter_root = storage.join(out_dir, SCATTER_DIR)
    sizes = input_sizes(input_uris, fmt, storage.join(scatter_root, "sizes"), runner)
    shards = plan_shards(sizes, params.target_shard_bytes)
    planned = planned_flushes(sizes, params)
    tree = GatherTree(shards, planned, planned, params.gather_fan_in)
    scatter_params = ScatterParams(params, shards, source, fmt, transform, tree.per_bucket(0))
    wrote = lambda r: say(f"{source}: wrote {storage.basename(r.output)} rows={r.stats['rows']}")  # noqa: E731
    if shards == 1:
        single = ShardTask(single_shard, tuple(input_uris), storage.join(out_dir, storage.shard_name(0, 1)), scatter_params)
        scattered = gathered = runner.map([single], on_done=wrote)
    else:
        layout_root = storage.join(scatter_root, scatter_params.layout)
        scatter_tasks = [
            ShardTask(scatter_file, (uri,), storage.join(layout_root, SCATTER_TASK.format(i)), scatter_params)
            for i, uri in enumerate(input_uris)
        ]
        scattered = runner.map(scatter_tasks, on_done=lambda r: say(f"{source}: read {storage.basename(r.output)} rows={r.stats.get('rows_in')}"))
        _require_rows(source, len(input_uris), _sum_ints(r.stats for r in scattered))
        flushes = [int(r.stats["flushes"]) for r in scattered]
        tree = dataclasses.replace(tree, flushes=sum(flushes))
        flush_chunks = chunk_flushes(flushes, tree.files(1))
        _run_middle_levels(tree, layout_root, flush_chunks, source, runner, say)
        gathered = runner.map(_gather_tasks(tree, layout_root, flush_chunks, out_dir, params.exact_dedup), on_done=wrote)
    totals = _sum_ints(r.stats for r in scattered)
    rows = sum(r.stats["rows"] for r in gathered)
    duplicates = sum(r.stats["duplicates"] for r in gathered)
    manifest = {
        "source": source,
        "code_version": CODE_VERSION,
        "params": params.fingerprint_params(),
        "inputs": list(input_uris),
        "shards": [storage.basename(r.output) for r in gathered],
        "rows": rows,
        "counters": {
            "files": len(input_uris),
            "rows_in": totals.get("rows_in", 0),
            "empty_dropped": totals.get("empty_dropped", 0),
            "whitespace_compacted": totals.get("whitespace_compacted", 0),
            "duplicates": duplicates,
            "rows_out": rows,
            "bytes_in": totals.get("bytes_in", 0),
            "bytes_out": sum(r.stats["bytes_out"] for r in gathered),
        },
        "bad_rows": {k.removeprefix("bad_rows."): v for k, v in totals.items() if k.startswith("bad_rows.")},
        "resumed_tasks": sum(r.reused for r in scattered) + (0 if gathered is scattered else sum(r.reused for r in gathered)),
    }
    storage.remove(scatter_root, recursive=True)  # every shard is stored: the pieces are not needed again
    return manifest


def read_normalized(out_dir: str, columns: Sequence[str] | None = None) -> pl.DataFrame:
    """All rows of a normalized source (small sources and tests only)."""
    shards = storage.list_shards(out_dir)
    return pl.concat([pl.from_arrow(storage.read_parquet(u, columns)) for u in shards], how="diagonal_relaxed")  # type: ignore[misc]
