"""Small helpers that turn stage counters into Dagster metadata (no computation)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dagster as dg


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
            meta[key if key not in meta else f"{key}_count"] = value
    for key, value in extra.items():
        if value is not None:
            meta[key] = value
    return meta


def markdown_table(rows: list[Mapping[str, Any]], columns: list[str] | None = None) -> dg.MetadataValue:
    if not rows:
        return dg.MetadataValue.md("_none_")
    columns = columns or list(rows[0].keys())
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = [str(row.get(c, "")).replace("|", "\\|").replace("\n", " ") for c in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return dg.MetadataValue.md("\n".join(lines))


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
