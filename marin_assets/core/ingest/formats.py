"""The one table of provider file formats: names, suffixes, magic bytes and readers.

``FORMATS`` maps each format the catalog may name to how its files are recognised by name
(``suffixes``), what their bytes start with (``container``: Parquet's ``PAR1``, gzip, zstd or
plain JSON text) and how they are read. ``format_of_name`` picks a file's format by its name,
``sniff`` says what its bytes are, and ``check_bytes`` refuses a file whose bytes are not what
its format says (a Parquet file read as JSON lines would otherwise lose rows as "bad JSON").

Readers yield provider rows in bounded batches and count rows they cannot read (bad JSON, rows
nested too deeply, values that are not objects) by reason, logging the file and line of the
first few. ``reading`` wraps any reader so that every error names the source, the file, where
in it (line or row group) and what to do.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import polars as pl
import pyarrow.parquet as pq

from marin_assets.core.runtime import storage
from marin_assets.errors import BadInput

log = logging.getLogger(__name__)

# Reasons a reader drops a row because it cannot read it (as opposed to a recipe's filters).
UNREADABLE = ("bad_json", "too_deep", "too_long")
# A source whose unreadable rows exceed this share of its rows fails its blocking check.
MAX_BAD_ROW_SHARE = 0.01
_LOGGED_PER_FILE = 5

# ``reader(uri, fmt, batch_rows, counters, batch_bytes=...)``: rows cap Parquet batches, bytes cap text chunks
Reader = Callable[..., Iterator[pl.DataFrame]]
BATCH_BYTES = 32 << 20  # text read per chunk when the caller gives no size
# The longest line (row) or JSON document a reader holds: a longer line is counted as ``too_long``
# and skipped unread, a longer document fails its file. Well under a task's memory, far over any real row.
MAX_ROW_BYTES = 64 << 20


class FormatError(BadInput, RuntimeError):
    """A file that cannot be read as its format says; the message names source, file and fix."""


# --------------------------------------------------------------------------- magic bytes

_MAGIC = (
    (b"PAR1", "parquet"),
    (b"\x1f\x8b", "gzip"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"PK\x03\x04", "zip"),
)


def sniff_bytes(head: bytes) -> str | None:
    """``parquet``, ``gzip``, ``zstd``, ``zip``, ``json`` (text starting with ``{`` or ``[``) or None."""
    for magic, kind in _MAGIC:
        if head.startswith(magic):
            return kind
    text = head.removeprefix(b"\xef\xbb\xbf").lstrip()
    if text[:1] in (b"{", b"["):
        return "json"
    return None


def sniff(uri: str, size: int = 64) -> str | None:
    fs, path = storage.filesystem(uri)
    with fs.open(path, "rb") as handle:
        return sniff_bytes(handle.read(size))


# --------------------------------------------------------------------------- readers


def _zstd_blocks(raw: Any, piece_bytes: int = 1 << 20) -> Iterator[bytes]:
    """Decompressed blocks of at most ``piece_bytes`` of a (multi-frame) zstd stream, for any compression ratio.

    The library's stream reader bounds each block but ends quietly where a file is cut inside a frame,
    which would lose the rest of the file unseen: ``_ZstdFrames`` follows the frame and block headers of
    the bytes it reads and raises ``EOFError`` when the stream does not end at a frame's end.
    """
    import zstandard  # noqa: PLC0415

    frames = _ZstdFrames(raw)
    reader = zstandard.ZstdDecompressor().stream_reader(frames, read_size=piece_bytes, read_across_frames=True, closefd=False)
    while block := reader.read(piece_bytes):
        yield block
    frames.check_complete()


def zstd_sample(head: bytes, max_out: int) -> tuple[int, int, bool]:
    """Decompress the first bytes of a zstd file (at most ``max_out`` of output): the compressed bytes
    of its whole blocks read, the bytes they decompress to, and whether the first frame ends inside
    ``head`` (a file of several frames: the first frame's content size is not the file's)."""
    import zstandard  # noqa: PLC0415

    frames = _ZstdFrames(io.BytesIO(head))
    reader = zstandard.ZstdDecompressor().stream_reader(frames, read_size=1 << 16, read_across_frames=True, closefd=False)
    out = 0
    while out < max_out and (block := reader.read(min(1 << 20, max_out - out))):
        out += len(block)
    return frames.blocks_end, out, frames.frames_ended > 0


def zstd_frames(data: bytes) -> int:
    """The zstd frames ``data`` holds whole, from their headers (nothing decoded); -1 where it ends inside one."""
    frames = _ZstdFrames(io.BytesIO(data))
    frames.read()
    try:
        frames.check_complete()
    except EOFError:
        return -1
    return frames.frames_ended


class _ZstdFrames:
    """A file object that walks the zstd frame format (RFC 8878) over the bytes read through it, without decoding."""

    def __init__(self, raw: Any):
        self.raw, self.held, self.skip, self.step = raw, bytearray(), 0, self._magic
        self.need, self.checksum = 4, False
        self.frames_ended = 0  # frames whose last block header has been read
        self.offset = self.blocks_end = 0  # bytes walked; where the last whole block ended

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        view = memoryview(data)
        while view:
            if self.skip:
                n = min(self.skip, len(view))
                self.skip -= n
                view = view[n:]
                self.offset += n
                if not self.skip and self.step in (self._block, self._magic):
                    self.blocks_end = self.offset
                continue
            n = min(self.need - len(self.held), len(view))
            self.held += view[:n]
            view = view[n:]
            self.offset += n
            if len(self.held) == self.need:
                header, self.held = bytes(self.held), bytearray()
                self.step(header)
        return data

    def _magic(self, head: bytes) -> None:
        magic = int.from_bytes(head, "little")
        if magic & 0xFFFFFFF0 == 0x184D2A50:  # a skippable frame: its size, then that many bytes
            self.step, self.need = self._skippable, 4
        elif magic == 0xFD2FB528:
            self.step, self.need = self._descriptor, 1
        else:
            raise OSError(f"not a zstd frame (magic {head.hex()})")

    def _skippable(self, head: bytes) -> None:
        self.skip, self.step, self.need = int.from_bytes(head, "little"), self._magic, 4

    def _descriptor(self, head: bytes) -> None:
        fhd = head[0]
        single = bool(fhd & 0x20)
        fcs = (1 if single else 0, 2, 4, 8)[fhd >> 6]
        self.checksum = bool(fhd & 0x04)
        rest = (0 if single else 1) + (0, 1, 2, 4)[fhd & 0x03] + fcs
        self.step, self.need = self._block, 3
        if rest:
            self.skip = rest

    def _block(self, head: bytes) -> None:
        value = int.from_bytes(head, "little")
        last, kind, size = value & 1, (value >> 1) & 3, value >> 3
        self.skip = 1 if kind == 1 else size  # an RLE block stores one byte
        if last:
            self.skip += 4 if self.checksum else 0
            self.step, self.need = self._magic, 4
            self.frames_ended += 1

    def check_complete(self) -> None:
        if self.skip or self.held or self.step != self._magic:
            raise EOFError("zstd stream ended inside a frame (the file is truncated)")

    def close(self) -> None:
        pass


def _blocks(raw: Any, compression: str | None, chunk_bytes: int) -> Iterator[bytes]:
    """Decompressed blocks of at most ``chunk_bytes``, whatever the compression ratio."""
    if compression == "zstd":
        yield from _zstd_blocks(raw, max(4096, min(1 << 20, chunk_bytes)))
        return
    stream: Any = gzip.GzipFile(fileobj=raw) if compression == "gzip" else raw
    while block := stream.read(chunk_bytes):
        yield block


def _iter_json_lines(uri: str, compression: str | None, chunk_bytes: int = BATCH_BYTES, max_row_bytes: int | None = None,
                     counters: dict[str, int] | None = None) -> Iterator[tuple[int, bytes]]:  # fmt: skip
    """Yield ``(first line number, chunk of whole JSON lines)`` of about ``chunk_bytes``, decompressing on the fly.

    A line longer than ``max_row_bytes`` is never held: it is skipped to its end and counted as
    ``too_long`` with its line and byte offset, so memory stays within ``chunk_bytes + max_row_bytes``
    plus one block for any compression ratio.
    """
    counters = {} if counters is None else counters
    max_row_bytes = max_row_bytes or MAX_ROW_BYTES
    fs, path = storage.filesystem(uri)
    raw = fs.open(path, "rb")
    held = bytearray()  # whole lines not yet yielded, then the start of the next line
    line, offset = 1, 0  # of held[0]: its line number and its offset in the decompressed stream
    skipping: tuple[int, int] | None = None  # (line, offset) of an over-long line being skipped
    try:
        for block in _blocks(raw, compression, min(chunk_bytes, max_row_bytes)):
            if skipping is not None:
                end = block.find(b"\n")
                if end < 0:
                    offset += len(block)
                    continue
                _bad(counters, "too_long", uri, skipping[0], f"a line of {offset + end - skipping[1]} bytes at byte {skipping[1]}, "
                     f"over the {max_row_bytes}-byte limit a row may have")  # fmt: skip
                offset, line, block, skipping = offset + end + 1, line + 1, block[end + 1 :], None
            held += block
            while len(held) >= chunk_bytes or len(held) > max_row_bytes:
                cut = held.rfind(b"\n", 0, chunk_bytes)
                if cut < 0:  # the first held line is longer than a chunk: up to its end, if within the limit
                    cut = held.find(b"\n", 0, max_row_bytes + 1)
                if cut >= 0:
                    with memoryview(held) as view:  # one copy, not a bytearray slice and then its bytes
                        chunk = bytes(view[: cut + 1])
                    del held[: cut + 1]
                    yield line, chunk
                    line, offset = line + chunk.count(b"\n"), offset + len(chunk)
                    continue
                if len(held) > max_row_bytes:
                    skipping = (line, offset)
                    offset += len(held)
                    held.clear()
                break
        if skipping is not None:
            _bad(counters, "too_long", uri, skipping[0], f"a last line of {offset - skipping[1]} bytes at byte {skipping[1]}, "
                 f"over the {max_row_bytes}-byte limit a row may have")  # fmt: skip
        elif held and not held.isspace():  # (not ``held.strip()``: a copy of the held bytes)
            yield line, bytes(held)
    finally:
        raw.close()


def _bad(counters: dict[str, int], reason: str, uri: str, line: int, why: str) -> None:
    counters[reason] = counters.get(reason, 0) + 1
    seen = counters.get("_logged", 0)
    if seen < _LOGGED_PER_FILE:
        counters["_logged"] = seen + 1
        log.warning("file '%s' line %d: %s; the row is dropped and counted as %s", uri, line, why, reason)


def parse_json_chunk(chunk: bytes, counters: dict[str, int], uri: str = "", first_line: int = 1) -> pl.DataFrame:
    """Parse JSON lines; repair invalid UTF-8 and count (not crash on) unreadable lines.

    Valid chunks (nearly all) are parsed from the bytes as they are: a decoded copy and a
    re-encoded one would each hold another chunk's worth of memory.
    """
    try:
        return pl.read_ndjson(chunk, infer_schema_length=None)
    except Exception:  # noqa: BLE001 - invalid UTF-8 or a bad line: repaired or isolated below
        pass
    try:
        text = chunk.decode("utf-8")
    except UnicodeDecodeError:
        text = chunk.decode("utf-8", errors="replace")
        counters["invalid_utf8_repaired"] = counters.get("invalid_utf8_repaired", 0) + sum(
            1 for line in chunk.split(b"\n") if line and _not_utf8(line)
        )
        try:
            return pl.read_ndjson(text.encode("utf-8"), infer_schema_length=None)
        except Exception:  # noqa: BLE001 - a bad line as well
            pass
    # line by line, to isolate the bad rows
    records = []
    for offset, line in enumerate(text.split("\n")):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            _bad(counters, "bad_json", uri, first_line + offset, f"not JSON ({err.msg})")
            continue
        except RecursionError:
            _bad(counters, "too_deep", uri, first_line + offset, "JSON nested too deeply to read")
            continue
        if isinstance(value, dict):
            records.append(value)
        else:
            _bad(counters, "bad_json", uri, first_line + offset, f"a JSON {type(value).__name__}, not an object")
    try:
        return pl.from_dicts(records, infer_schema_length=None) if records else pl.DataFrame()
    except RecursionError:
        raise FormatError(f"file '{uri}' lines {first_line}+: rows nested too deeply to hold in a table") from None


def _not_utf8(line: bytes) -> bool:
    try:
        line.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def read_parquet(uri: str, fmt: str, batch_rows: int, counters: dict[str, int], batch_bytes: int = BATCH_BYTES,
                 max_row_bytes: int | None = None) -> Iterator[pl.DataFrame]:  # fmt: skip
    """A Parquet file's rows in batches. A row group holding a page longer than ``max_row_bytes``
    (a cell over the limit: a page holds whole values) is not read: its rows are counted as
    ``too_long`` with the file, row group, column and page size; a row whose text cells add up
    to more than the limit is dropped and counted the same way."""
    limit = max_row_bytes or MAX_ROW_BYTES
    fs, path = storage.filesystem(uri)
    with fs.open(path, "rb") as handle:
        parquet = pq.ParquetFile(handle)
        try:
            over = pages_over(handle, parquet.metadata, limit)
        except FormatError as err:
            raise FormatError(f"file '{uri}': {err}; fetch the file again, or exclude it with the entry's globs") from None
        for group, why in over.items():
            rows = parquet.metadata.row_group(group).num_rows
            counters["too_long"] = counters.get("too_long", 0) + rows - 1
            _bad(counters, "too_long", uri, group, f"row group {group} ({rows} rows): {why}, over the {limit}-byte limit a row may have")
        local = storage.local_path(uri)
        if local is not None and not over:  # native streaming reader: parallel decoding, bounded batches
            frames: Iterator[pl.DataFrame] = pl.scan_parquet(local).collect_batches(chunk_size=batch_rows)
        else:
            groups = [g for g in range(parquet.metadata.num_row_groups) if g not in over]
            frames = (pl.from_arrow(b) for b in parquet.iter_batches(batch_size=batch_rows, row_groups=groups)) if groups else iter(())  # type: ignore[misc]
        for frame in frames:
            yield _within(frame, limit, counters, uri)


def _within(frame: pl.DataFrame, limit: int, counters: dict[str, int], uri: str) -> pl.DataFrame:
    """``frame`` less its rows whose string and binary cells add up to more than ``limit`` bytes (counted)."""
    sizes = [pl.col(n).str.len_bytes() if t == pl.String else pl.col(n).bin.size() for n, t in frame.schema.items() if t in (pl.String, pl.Binary)]
    if not sizes or frame.height == 0:
        return frame
    keep = frame.select(pl.sum_horizontal([s.fill_null(0).cast(pl.Int64) for s in sizes]) <= limit).to_series()
    if keep.all():
        return frame
    dropped = frame.height - int(keep.sum())
    counters["too_long"] = counters.get("too_long", 0) + dropped - 1
    _bad(counters, "too_long", uri, 0, f"{dropped} rows whose text is over the {limit}-byte limit a row may have")
    return frame.filter(keep)


PAGE_HEADER_BYTES = 64 << 10  # a page header is read within this; a longer one fails its file


def pages_over(handle: Any, meta: Any, limit: int) -> dict[int, str]:
    """Row groups that hold a page longer than ``limit`` uncompressed: ``{row group: what}``.

    Only column chunks over ``limit`` in all are looked into, one page header at a time (the
    pages' bytes are skipped): a normal file costs a footer, a file with large row groups a read
    per page header."""
    found: dict[int, str] = {}
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            chunk = group.column(c)
            if chunk.total_uncompressed_size <= limit:
                continue
            at = chunk.dictionary_page_offset if chunk.has_dictionary_page and chunk.dictionary_page_offset else chunk.data_page_offset
            end = at + chunk.total_compressed_size
            while at < end:
                handle.seek(at)
                uncompressed, compressed, length = page_sizes(handle.read(PAGE_HEADER_BYTES))
                if uncompressed > limit:
                    found[g] = f"column {chunk.path_in_schema} has a page of {uncompressed} bytes at byte {at}"
                    break
                at += length + compressed
            if g in found:
                break
    return found


def page_sizes(header: bytes) -> tuple[int, int, int]:
    """(uncompressed size, compressed size, header length) of the Parquet page header at the
    start of ``header`` (Thrift's compact encoding: fields 2 and 3 of ``PageHeader``)."""
    reader = _Compact(header)
    fields = reader.struct(want=(2, 3))
    return fields.get(2, 0), fields.get(3, 0), reader.at


class _Compact:
    """Just enough of Thrift's compact protocol to read a few integer fields of a struct and skip the rest."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def byte(self) -> int:
        if self.at >= len(self.data):
            raise FormatError(f"a Parquet page header longer than {len(self.data)} bytes (or cut off): the file is corrupt or hostile")
        self.at += 1
        return self.data[self.at - 1]

    def varint(self) -> int:
        shift = value = 0
        while True:
            b = self.byte()
            value |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return value

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def skip(self, kind: int, depth: int = 0) -> None:
        if depth > 32:
            raise FormatError("a Parquet page header nested too deeply: the file is corrupt or hostile")
        if kind in (1, 2):
            return
        if kind == 3:
            self.byte()
        elif kind in (4, 5, 6):
            self.varint()
        elif kind == 7:
            self.at += 8
        elif kind == 8:
            self.at += self.varint()
        elif kind in (9, 10):
            head = self.byte()
            size = head >> 4 if head >> 4 != 15 else self.varint()
            for _ in range(size):
                self.byte() if head & 0x0F in (1, 2) else self.skip(head & 0x0F, depth + 1)
        elif kind == 11:
            size = self.varint()
            types = self.byte() if size else 0
            for _ in range(size):
                self.skip(types >> 4, depth + 1)
                self.skip(types & 0x0F, depth + 1)
        elif kind == 12:
            self.struct(depth=depth + 1)
        else:
            raise FormatError(f"a Parquet page header with an unknown field type {kind}: the file is corrupt or hostile")

    def struct(self, want: tuple[int, ...] = (), depth: int = 0) -> dict[int, int]:
        found: dict[int, int] = {}
        field = 0
        while (head := self.byte()) != 0:
            delta, kind = head >> 4, head & 0x0F
            field = field + delta if delta else self.zigzag()
            if field in want and kind in (4, 5, 6):
                found[field] = self.zigzag()
            else:
                self.skip(kind, depth)
        return found


def read_json_document(uri: str, fmt: str, batch_rows: int, counters: dict[str, int], batch_bytes: int = BATCH_BYTES,
                       max_row_bytes: int | None = None) -> Iterator[pl.DataFrame]:  # fmt: skip
    """A whole JSON document (an object or an array of them); one larger than ``max_row_bytes`` fails the file unread."""
    max_row_bytes = max_row_bytes or MAX_ROW_BYTES
    if (size := storage.size(uri)) > max_row_bytes:
        raise FormatError(f"file '{uri}': a JSON document of {size} bytes, over the {max_row_bytes}-byte limit one document "
                          f"may have (it is read whole); convert it to JSON lines, or exclude the file with the entry's globs")
    try:
        value = json.loads(storage.read_bytes(uri))
    except RecursionError:
        raise FormatError(f"file '{uri}': a JSON document nested too deeply to read") from None
    rows = value if isinstance(value, list) else [value]
    yield pl.from_dicts(rows, infer_schema_length=None)


def _json_lines_reader(compression: str | None) -> Reader:
    def read(uri: str, fmt: str, batch_rows: int, counters: dict[str, int], batch_bytes: int = BATCH_BYTES,
             max_row_bytes: int | None = None) -> Iterator[pl.DataFrame]:  # fmt: skip
        for first_line, chunk in _iter_json_lines(uri, compression, batch_bytes, max_row_bytes, counters):
            frame = parse_json_chunk(chunk, counters, uri, first_line)
            if frame.height:
                yield frame

    return read


@dataclasses.dataclass(frozen=True)
class Format:
    """One file format: how a file is recognised (name, bytes) and read."""

    name: str
    suffixes: tuple[str, ...]
    container: str  # what the bytes start with: parquet | gzip | zstd | json
    read: Reader
    what: str


FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format("parquet", (".parquet",), "parquet", read_parquet, "Parquet"),
        Format("jsonl", (".jsonl",), "json", _json_lines_reader(None), "JSON lines"),
        Format("jsonl.zst", (".jsonl.zst", ".json.zst"), "zstd", _json_lines_reader("zstd"), "zstd-compressed JSON lines"),
        Format("jsonl.gz", (".jsonl.gz",), "gzip", _json_lines_reader("gzip"), "gzip-compressed JSON lines"),
        Format("json.gz", (".json.gz",), "gzip", _json_lines_reader("gzip"), "gzip-compressed JSON lines"),
        Format("json", (".json",), "json", read_json_document, "a JSON document"),
    )
}
SUPPORTED_FORMATS = tuple(FORMATS)
# Formats a catalog entry may name that its provider unpacks before normalize reads them.
PROVIDER_FORMATS = ("tar.gz", "zip", "txt")
CATALOG_FORMATS = SUPPORTED_FORMATS + PROVIDER_FORMATS
_BY_SUFFIX = sorted(((s, f.name) for f in FORMATS.values() for s in f.suffixes), key=lambda p: -len(p[0]))
_CONTAINER_WHAT = {"parquet": "Parquet", "gzip": "gzip-compressed", "zstd": "zstd-compressed", "zip": "a zip archive",
                   "json": "JSON text"}  # fmt: skip


def format_of_name(uri: str) -> str | None:
    """The format of a provider file from its name (None for files normalize ignores)."""
    name = storage.basename(uri).lower()
    for suffix, fmt in _BY_SUFFIX:
        if name.endswith(suffix):
            return fmt
    return None


def formats_of_container(container: str) -> list[str]:
    return [f.name for f in FORMATS.values() if f.container == container]


def check_bytes(uri: str, fmt: str, source: str) -> None:
    """Refuse a file whose bytes are not what ``fmt`` says (an empty file passes)."""
    spec = FORMATS[fmt]
    if storage.size(uri) == 0:
        return
    found = sniff(uri)
    if found == spec.container or (found is None and spec.container == "json"):
        return  # text that is not JSON at all is read, and its lines counted as bad JSON
    shown = _CONTAINER_WHAT.get(found or "", "neither Parquet, gzip, zstd nor JSON")
    fits = formats_of_container(found) if found else []
    fix = (f"set the catalog entry's input_format to {' or '.join(repr(f) for f in fits)}, or exclude the file "
           f"with the entry's allow/exclude globs" if fits else
           "the file is corrupt or not a data file: fetch it again (delete the raw copy) or exclude it with the "
           "entry's allow/exclude globs")  # fmt: skip
    raise FormatError(f"source '{source}': file '{uri}' is read as '{fmt}' ({spec.what}) but its bytes are {shown}; {fix}")


def read_batches(uri: str, fmt: str, batch_rows: int, counters: dict[str, int], batch_bytes: int = BATCH_BYTES) -> Iterator[pl.DataFrame]:
    """Provider rows of one file, in bounded batches (errors as the libraries raise them)."""
    try:
        spec = FORMATS[fmt]
    except KeyError:
        raise FormatError(f"file '{uri}': unknown format {fmt!r} (known: {', '.join(FORMATS)})") from None
    try:
        yield from spec.read(uri, fmt, batch_rows, counters, batch_bytes)
    finally:
        counters.pop("_logged", None)


def _where(uri: str, fmt: str, rows_before: int) -> str:
    if fmt != "parquet":
        return f"after row {rows_before}" if fmt == "json" else f"near line {rows_before + 1}"
    try:
        fs, path = storage.filesystem(uri)
        with fs.open(path, "rb") as handle:
            meta = pq.ParquetFile(handle).metadata
        seen = 0
        for group in range(meta.num_row_groups):
            seen += meta.row_group(group).num_rows
            if rows_before < seen:
                return f"row group {group} of {meta.num_row_groups}"
    except Exception:  # noqa: BLE001 - the footer itself is unreadable
        return "footer (not a readable Parquet file)"
    return f"after row {rows_before}"


def _fix(fmt: str, error: BaseException) -> str:
    if isinstance(error, (EOFError,)) or "truncat" in str(error).lower() or "end-of-stream" in str(error).lower():
        return "the file is truncated: delete the source's raw copy so that it is fetched again, or exclude the file"
    if fmt == "parquet":
        return "the file is corrupt or not Parquet: fetch it again (delete the raw copy) or exclude it with the entry's globs"
    return "fetch the file again (delete the raw copy), fix input_format in the catalog entry, or exclude the file"


def reading(batches: Iterator[pl.DataFrame], uri: str, fmt: str, source: str) -> Iterator[pl.DataFrame]:
    """``batches`` with every reader error turned into a ``FormatError`` naming source, file, place and fix."""
    rows = 0
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (FormatError, BadInput) as err:
            if f"source '{source}'" in str(err):
                raise
            raise FormatError(f"source '{source}': {err}") from err
        except Exception as err:  # noqa: BLE001 - library errors of every kind name no file
            raise FormatError(
                f"source '{source}': file '{uri}' ({fmt}), {_where(uri, fmt, rows)}: cannot be read "
                f"({type(err).__name__}: {str(err)[:300]}); {_fix(fmt, err)}"
            ) from err
        rows += batch.height
        yield batch


def concat_rows(frames: list[pl.DataFrame], names: list[str], source: str, **kwargs: Any) -> pl.DataFrame:
    """``pl.concat`` of rows read from ``names`` (one per frame); a type conflict names the files and column."""
    try:
        return pl.concat(frames, how="diagonal_relaxed", **kwargs)
    except (pl.exceptions.SchemaError, pl.exceptions.ComputeError, pl.exceptions.InvalidOperationError) as err:
        types: dict[str, dict[str, str]] = {}
        for frame, name in zip(frames, names, strict=False):
            for column, dtype in frame.schema.items():
                types.setdefault(column, {}).setdefault(str(dtype), name)
        conflicts = {c: seen for c, seen in types.items() if len(seen) > 1}
        shown = "; ".join(
            f"column '{c}' is " + " in ".join(f"{t} in '{n}'" for t, n in list(seen.items())[:1])
            + "".join(f", {t} in '{n}'" for t, n in list(seen.items())[1:3])
            for c, seen in list(conflicts.items())[:3]
        ) or str(err)[:300]
        raise FormatError(
            f"source '{source}': files disagree on column types ({shown}); make the recipe's transform cast the "
            f"column, exclude the odd files with the entry's globs, or set bare = true to drop provider columns"
        ) from err
