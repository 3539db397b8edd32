"""Small helpers that turn stage counters into Dagster metadata (no computation)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq

from marin_assets.core.runtime import storage


def stage_metadata(
    *, uri: str, fingerprint: str, reused: bool, rows: int | None, counters: Mapping[str, Any] | None = None, **extra: Any
) -> dict[str, Any]:
    """The metadata every asset reports: row count, output URI, fingerprint, reuse, counters."""
    meta: dict[str, Any] = {
        "uri": dg.MetadataValue.path(uri),
        "fingerprint": fingerprint,
        "reused": reused,
    }
    if rows is not None:
        meta["dagster/row_count"] = int(rows)
    for key, value in (counters or {}).items():
        if isinstance(value, (int, float, str, bool)):
            meta[key if key not in meta else f"{key}_count"] = round(value, 4) if isinstance(value, float) else value
    for key, value in extra.items():
        if value is not None:
            meta[key] = round(value, 4) if isinstance(value, float) else value
    return meta


def column_schema(manifest: Mapping[str, Any]) -> dg.TableSchema | None:
    """The columns of a stage's Parquet output (its first shard's schema), for the UI's
    Columns view; ``None`` when the output is not Parquet shards or cannot be read."""
    shards = [str(s) for s in manifest.get("shards") or [] if str(s).endswith(".parquet")]
    if not shards or not manifest.get("uri"):
        return None
    first = shards[0] if "://" in shards[0] or shards[0].startswith("/") else storage.join(str(manifest["uri"]), shards[0])
    try:
        fs, path = storage.filesystem(first)
        with fs.open(path, "rb") as handle:
            schema = pq.read_schema(handle)
    except (OSError, pa.ArrowException):
        return None
    return dg.TableSchema(columns=[dg.TableColumn(field.name, str(field.type)) for field in schema])


def _cell(value: Any) -> str | int | float | bool | None:
    if isinstance(value, float):
        return round(value, 4)
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)


def table(rows: list[Mapping[str, Any]], columns: list[str] | None = None) -> dg.MetadataValue:
    """Rows as a Dagster table (sortable, sized to its content in the UI); floats rounded."""
    if not rows:
        return dg.MetadataValue.md("_none_")
    columns = columns or list(rows[0].keys())
    cells = [{c: _cell(row.get(c)) for c in columns} for row in rows]
    kinds = {}
    for c in columns:
        seen = {type(r[c]) for r in cells if r[c] is not None}
        kinds[c] = {frozenset({int}): "int", frozenset({float}): "float", frozenset({int, float}): "float", frozenset({bool}): "bool"}.get(frozenset(seen), "string")
        if kinds[c] == "string":
            for r in cells:
                r[c] = None if r[c] is None else str(r[c])
        elif kinds[c] == "float":
            for r in cells:
                r[c] = None if r[c] is None else float(r[c])
    return dg.MetadataValue.table(
        records=[dg.TableRecord(r) for r in cells],
        schema=dg.TableSchema(columns=[dg.TableColumn(c, kinds[c]) for c in columns]),
    )


markdown_table = table  # the name callers used when tables were Markdown


def materialized(
    manifest: Mapping[str, Any],
    *,
    rows: int | None = None,
    counters: Mapping[str, Any] | None = None,
    check_results: list[dg.AssetCheckResult] | None = None,
    uri: str | None = None,
    **extra: Any,
) -> dg.MaterializeResult:
    """The result of a stage run: its metadata, and its fingerprint as the Dagster data version.

    A ``summary`` (the lines the demo prints) is shown as a preformatted block in the UI.
    """
    if isinstance(extra.get("summary"), str):
        extra["summary"] = dg.MetadataValue.md(f"```\n{extra['summary']}\n```")
    schema = column_schema(manifest)
    if schema is not None and "dagster/column_schema" not in extra:
        extra["dagster/column_schema"] = schema
    return dg.MaterializeResult(
        metadata=stage_metadata(
            uri=uri or manifest["uri"],
            fingerprint=manifest["fingerprint"],
            reused=manifest["reused"],
            rows=rows,
            counters=counters,
            **extra,
        ),
        check_results=check_results,
        data_version=dg.DataVersion(manifest["fingerprint"]),
    )
