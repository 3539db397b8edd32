"""Provider file encoders for fixtures: Parquet, JSON lines (plain, gzip, zstd), raw lines."""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from marin_assets.core.ingest.normalize import NormalizeParams

# normalize's cap on a whitespace run (`NormalizeParams.max_whitespace_run`): fixtures plant runs against it.
RUN = NormalizeParams().max_whitespace_run

# A JSON-lines row may be a dict (encoded here) or raw bytes (written verbatim: invalid UTF-8,
# broken JSON), so fixtures can hold the lines providers really ship.
Line = Mapping[str, Any] | bytes


def json_lines(rows: Iterable[Line]) -> bytes:
    out = bytearray()
    for row in rows:
        out += row if isinstance(row, bytes) else json.dumps(row, ensure_ascii=False).encode("utf-8")
        out += b"\n"
    return bytes(out)


def parquet(rows: Sequence[Mapping[str, Any]], schema: pa.Schema | None = None) -> bytes:
    """Rows as a Parquet file (Arrow infers nested types unless ``schema`` is given)."""
    table = pa.Table.from_pylist(list(rows), schema=schema)
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def encode(fmt: str, rows: Sequence[Line]) -> bytes:
    """Rows in a catalog ``input_format`` (raw-byte lines only for the JSON formats)."""
    if fmt == "parquet":
        return parquet([r for r in rows if not isinstance(r, bytes)])  # type: ignore[misc]
    data = json_lines(rows)
    if fmt == "jsonl":
        return data
    if fmt in ("jsonl.gz", "json.gz"):
        return gzip.compress(data, mtime=0)
    if fmt == "jsonl.zst":
        return zstandard.ZstdCompressor().compress(data)
    raise ValueError(f"no fixture encoder for format {fmt!r}")


def is_json(fmt: str) -> bool:
    return fmt != "parquet"

