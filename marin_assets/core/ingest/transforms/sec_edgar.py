"""SEC-EDGAR filings: a tolerant Parquet reader and the ``content`` -> ``text`` recipe.

Some upstream shards carry per-page min/max statistics of multi-megabyte filings inside their
data page headers. Arrow's Parquet reader refuses page headers that large ("Couldn't
deserialize thrift"), so those shards cannot be read as published. Rather than adding a
second Parquet engine, the reader repairs such a file on the fly: it copies the file to a
local temporary file with the statistics dropped from every page header (the page bodies are
copied byte for byte, and footer offsets are rewritten to match), then reads the copy with
Arrow. Statistics only serve predicate pushdown, so dropping them changes no value.

The repair speaks the Thrift compact protocol directly (about a hundred lines below): it
decodes the footer and each page header into a neutral tree, edits it and encodes it back,
keeping every field it does not touch.
"""

from __future__ import annotations

import io
import logging
import os
import shutil
import struct
import tempfile
from collections.abc import Callable, Iterator, Mapping
from typing import Any, BinaryIO

import polars as pl
import pyarrow.parquet as pq

from marin_assets.core.ingest import formats, normalize
from marin_assets.core.ingest.transforms import register
from marin_assets.core.ingest.transforms.rendering import reads_with, string_column
from marin_assets.core.runtime import storage
from marin_assets.errors import BadInput

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------- thrift compact

STOP, TRUE, FALSE, BYTE, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT = range(13)

# A decoded struct is a list of [field_id, type, value]; containers keep their element types.
Field = list  # [int, int, Any]


class ThriftError(BadInput, ValueError):
    """Bytes that are not a Thrift compact-protocol structure we can re-encode."""


class _Reader:
    def __init__(self, stream: BinaryIO):
        self.stream = stream

    def byte(self) -> int:
        b = self.stream.read(1)
        if not b:
            raise ThriftError("unexpected end of data inside a Thrift structure")
        return b[0]

    def varint(self) -> int:
        shift = result = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7
            if shift > 70:
                raise ThriftError("varint too long")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def exact(self, n: int) -> bytes:
        data = self.stream.read(n)
        if len(data) != n:
            raise ThriftError("unexpected end of data inside a Thrift binary field")
        return data

    def value(self, ttype: int) -> Any:
        if ttype in (TRUE, FALSE):  # only reached inside containers: one byte per element
            return self.byte() == TRUE
        if ttype == BYTE:
            return struct.unpack("b", self.exact(1))[0]
        if ttype in (I16, I32, I64):
            return self.zigzag()
        if ttype == DOUBLE:
            return self.exact(8)
        if ttype == BINARY:
            return self.exact(self.varint())
        if ttype in (LIST, SET):
            header = self.byte()
            size, etype = header >> 4, header & 0x0F
            if size == 15:
                size = self.varint()
            return (etype, [self.value(etype) for _ in range(size)])
        if ttype == MAP:
            size = self.varint()
            if not size:
                return (0, 0, [])
            kinds = self.byte()
            ktype, vtype = kinds >> 4, kinds & 0x0F
            return (ktype, vtype, [(self.value(ktype), self.value(vtype)) for _ in range(size)])
        if ttype == STRUCT:
            return self.struct()
        raise ThriftError(f"unknown Thrift compact type {ttype}")

    def struct(self) -> list[Field]:
        fields: list[Field] = []
        last = 0
        while True:
            header = self.byte()
            ttype = header & 0x0F
            if ttype == STOP:
                return fields
            delta = header >> 4
            fid = last + delta if delta else self.zigzag()
            if ttype in (TRUE, FALSE):
                value: Any = ttype == TRUE
            else:
                value = self.value(ttype)
            fields.append([fid, ttype, value])
            last = fid


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        if n < 0x80:
            out.append(n)
            return bytes(out)
        out.append((n & 0x7F) | 0x80)
        n >>= 7


def _zigzag(n: int) -> bytes:
    return _varint((n << 1) ^ (n >> 63))


def _encode_value(ttype: int, value: Any) -> bytes:
    if ttype in (TRUE, FALSE):
        return bytes([TRUE if value else FALSE])
    if ttype == BYTE:
        return struct.pack("b", value)
    if ttype in (I16, I32, I64):
        return _zigzag(value)
    if ttype == DOUBLE:
        return bytes(value)
    if ttype == BINARY:
        return _varint(len(value)) + bytes(value)
    if ttype in (LIST, SET):
        etype, items = value
        head = bytes([(len(items) << 4) | etype]) if len(items) < 15 else bytes([0xF0 | etype]) + _varint(len(items))
        return head + b"".join(_encode_value(etype, v) for v in items)
    if ttype == MAP:
        ktype, vtype, pairs = value
        if not pairs:
            return b"\x00"
        body = b"".join(_encode_value(ktype, k) + _encode_value(vtype, v) for k, v in pairs)
        return _varint(len(pairs)) + bytes([(ktype << 4) | vtype]) + body
    if ttype == STRUCT:
        return encode_struct(value)
    raise ThriftError(f"unknown Thrift compact type {ttype}")


def encode_struct(fields: list[Field]) -> bytes:
    """Encode a decoded struct back to compact-protocol bytes (fields in ascending id order)."""
    out = bytearray()
    last = 0
    for fid, ttype, value in sorted(fields, key=lambda f: f[0]):
        wire_type = (TRUE if value else FALSE) if ttype in (TRUE, FALSE) else ttype
        delta = fid - last
        if 0 < delta <= 15:
            out.append((delta << 4) | wire_type)
        else:
            out.append(wire_type)
            out += _zigzag(fid)
        if ttype not in (TRUE, FALSE):
            out += _encode_value(ttype, value)
        last = fid
    out.append(STOP)
    return bytes(out)


def decode_struct(data: bytes | BinaryIO) -> list[Field]:
    stream = io.BytesIO(data) if isinstance(data, (bytes, bytearray)) else data
    return _Reader(stream).struct()


def get_field(fields: list[Field], fid: int) -> Any:
    for f in fields:
        if f[0] == fid:
            return f[2]
    return None


def set_field(fields: list[Field], fid: int, ttype: int, value: Any) -> None:
    for f in fields:
        if f[0] == fid:
            f[1], f[2] = ttype, value
            return
    fields.append([fid, ttype, value])


def drop_fields(fields: list[Field], *fids: int) -> None:
    fields[:] = [f for f in fields if f[0] not in fids]


# --------------------------------------------------------------------------- parquet rewrite

MAGIC = b"PAR1"
# Field ids of the Parquet format's Thrift definitions that the rewrite touches.
PAGE_COMPRESSED_SIZE, PAGE_UNCOMPRESSED_SIZE = 3, 2
PAGE_DATA_V1, PAGE_DICTIONARY, PAGE_DATA_V2 = 5, 7, 8
V1_STATISTICS, V2_STATISTICS = 5, 8
FILE_ROW_GROUPS, FILE_ENCRYPTION = 4, 8
RG_COLUMNS, RG_TOTAL_BYTE_SIZE, RG_FILE_OFFSET, RG_TOTAL_COMPRESSED = 1, 2, 5, 6
CC_FILE_PATH, CC_FILE_OFFSET, CC_META, CC_CRYPTO = 1, 2, 3, 8
CC_PAGE_INDEX = (4, 5, 6, 7)
CM_TOTAL_UNCOMPRESSED, CM_TOTAL_COMPRESSED = 6, 7
CM_DATA_PAGE_OFFSET, CM_INDEX_PAGE_OFFSET, CM_DICT_PAGE_OFFSET, CM_STATISTICS = 9, 10, 11, 12
CM_BLOOM = (14, 15)

HeaderEdit = Callable[[list[Field]], list[Field]]


def strip_page_statistics(header: list[Field]) -> list[Field]:
    """A page header without the min/max statistics of its data page (v1 or v2)."""
    for page_field, stats_field in ((PAGE_DATA_V1, V1_STATISTICS), (PAGE_DATA_V2, V2_STATISTICS)):
        sub = get_field(header, page_field)
        if sub is not None:
            drop_fields(sub, stats_field)
    return header


def read_footer(src: BinaryIO) -> list[Field]:
    src.seek(0, os.SEEK_END)
    size = src.tell()
    if size < 12:
        raise ThriftError("file too short to be Parquet")
    src.seek(size - 8)
    tail = src.read(8)
    if tail[4:] != MAGIC:
        raise ThriftError("no Parquet magic at the end of the file (encrypted or not Parquet)")
    (length,) = struct.unpack("<i", tail[:4])
    src.seek(size - 8 - length)
    return decode_struct(src.read(length))


def rewrite_page_headers(src: BinaryIO, dst: BinaryIO, edit: HeaderEdit, chunk_bytes: int = 8 << 20) -> dict[str, int]:
    """Copy a Parquet file, passing every page header through ``edit``; returns counters.

    Page bodies are copied unchanged; column-chunk offsets and sizes in the footer are
    recomputed. Page indexes and bloom filters are not carried over (their offsets would be
    stale), nor are footer column statistics.
    """
    meta = read_footer(src)
    if get_field(meta, FILE_ENCRYPTION) is not None:
        raise ThriftError("encrypted Parquet files cannot be rewritten")
    dst.write(MAGIC)
    pages = 0
    for row_group in (get_field(meta, FILE_ROW_GROUPS) or (STRUCT, []))[1]:
        group_start = dst.tell()
        group_delta = 0
        for chunk in get_field(row_group, RG_COLUMNS)[1]:
            if get_field(chunk, CC_FILE_PATH) is not None or get_field(chunk, CC_CRYPTO) is not None:
                raise ThriftError("column chunks in other files or encrypted chunks cannot be rewritten")
            col = get_field(chunk, CC_META)
            data_offset = get_field(col, CM_DATA_PAGE_OFFSET)
            dict_offset = get_field(col, CM_DICT_PAGE_OFFSET)
            start = dict_offset if dict_offset is not None and 0 < dict_offset < data_offset else data_offset
            total = get_field(col, CM_TOTAL_COMPRESSED)
            new_start = dst.tell()
            src.seek(start)
            position = start
            new_positions: dict[int, int] = {}
            while position < start + total:
                new_positions[position] = dst.tell()
                header = decode_struct(src)
                body = get_field(header, PAGE_COMPRESSED_SIZE)
                after_header = src.tell()
                encoded = encode_struct(edit(header))
                dst.write(encoded)
                remaining = body
                while remaining:
                    block = src.read(min(chunk_bytes, remaining))
                    if not block:
                        raise ThriftError("page body runs past the end of the file")
                    dst.write(block)
                    remaining -= len(block)
                position = after_header + body
                pages += 1
            new_total = dst.tell() - new_start
            delta = new_total - total
            group_delta += delta
            set_field(col, CM_TOTAL_COMPRESSED, I64, new_total)
            set_field(col, CM_TOTAL_UNCOMPRESSED, I64, get_field(col, CM_TOTAL_UNCOMPRESSED) + delta)
            set_field(col, CM_DATA_PAGE_OFFSET, I64, new_positions.get(data_offset, new_start))
            if dict_offset is not None:
                if dict_offset in new_positions:
                    set_field(col, CM_DICT_PAGE_OFFSET, I64, new_positions[dict_offset])
                else:
                    drop_fields(col, CM_DICT_PAGE_OFFSET)
            drop_fields(col, CM_INDEX_PAGE_OFFSET, CM_STATISTICS, *CM_BLOOM)
            drop_fields(chunk, *CC_PAGE_INDEX)
            set_field(chunk, CC_FILE_OFFSET, I64, new_start)
        if get_field(row_group, RG_FILE_OFFSET) is not None:
            set_field(row_group, RG_FILE_OFFSET, I64, group_start)
        if get_field(row_group, RG_TOTAL_COMPRESSED) is not None:
            set_field(row_group, RG_TOTAL_COMPRESSED, I64, dst.tell() - group_start)
        set_field(row_group, RG_TOTAL_BYTE_SIZE, I64, get_field(row_group, RG_TOTAL_BYTE_SIZE) + group_delta)
    footer = encode_struct(meta)
    dst.write(footer)
    dst.write(struct.pack("<i", len(footer)))
    dst.write(MAGIC)
    return {"pages_rewritten": pages}


# --------------------------------------------------------------------------- reading


def _unreadable_by_arrow(error: Exception) -> bool:
    text = str(error).lower()
    return "thrift" in text or "page header" in text


def read_parquet_tolerant(uri: str, fmt: str, batch_rows: int, counters: dict[str, int], batch_bytes: int = formats.BATCH_BYTES) -> Iterator[pl.DataFrame]:
    """Batches of a Parquet file, repairing oversized page headers when Arrow cannot read them.

    Other formats go to the normal reader. The repaired copy lives in a local temporary
    directory for the duration of the read (a warning names each file that needed it).
    """
    if fmt != "parquet":
        yield from normalize.read_batches(uri, fmt, batch_rows, counters, batch_bytes)
        return
    try:
        frames = normalize.read_batches(uri, fmt, batch_rows, counters, batch_bytes)
        first = next(frames, None)
    except OSError as error:
        if not _unreadable_by_arrow(error):
            raise
        first, frames = None, None
    if frames is not None:
        # The first batch decoded; a later page can still hold an oversized header.
        try:
            if first is not None:
                yield first
            emitted = 1 if first is not None else 0
            for frame in frames:
                yield frame
                emitted += 1
            return
        except OSError as error:
            if not _unreadable_by_arrow(error):
                raise
            skip = emitted
    else:
        skip = 0
    log.warning("%s: page headers too large for the Arrow reader; reading a copy without page statistics", uri)
    workdir = tempfile.mkdtemp(prefix="marin-parquet-repair-")
    try:
        local = os.path.join(workdir, "repaired.parquet")
        fs, path = storage.filesystem(uri)
        with fs.open(path, "rb") as src, open(local, "wb") as dst:
            rewrite_page_headers(src, dst, strip_page_statistics)
        parquet = pq.ParquetFile(local)
        for index, batch in enumerate(parquet.iter_batches(batch_size=batch_rows)):
            if index >= skip:
                yield pl.from_arrow(batch)  # type: ignore[misc]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


# --------------------------------------------------------------------------- recipe


@register("sec_edgar_reencode")
@reads_with(read_parquet_tolerant)
def sec_edgar_reencode(frame: pl.DataFrame) -> tuple[pl.DataFrame, Mapping[str, int]]:
    """Filings: ``content`` becomes ``text``, ``id`` the ``source_id``; filing metadata is kept.

    Rows without string content are counted as ``missing_content``. The shards are read with
    ``read_parquet_tolerant`` (see the module docstring).
    """
    counts: dict[str, int] = {}
    if "content" not in frame.columns:
        if frame.height:
            counts["missing_content"] = frame.height
        return pl.DataFrame(schema={"text": pl.Utf8, "source_id": pl.Utf8}), counts
    content = frame["content"]
    if content.dtype == pl.Binary:
        content = content.cast(pl.Utf8, strict=False)
    elif content.dtype != pl.Utf8:
        content = pl.Series("content", [None] * frame.height, dtype=pl.Utf8)
    ids = string_column(frame, "id")
    keep = [c for c in frame.columns if c not in ("content", "id", "text", "source_id")]
    out = pl.DataFrame([content.alias("text"), ids.alias("source_id")]).hstack(frame.select(keep))
    missing = int(out["text"].is_null().sum())
    if missing:
        counts["missing_content"] = missing
        out = out.filter(pl.col("text").is_not_null())
    return out, counts
