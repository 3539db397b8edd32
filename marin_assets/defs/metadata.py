"""Small helpers that turn stage counters into Dagster metadata (no computation)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq

from marin_assets.core.runtime import storage
from marin_assets.core.specs import POOL, TOKEN_COUNTS


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


# What each column of the stages' Parquet outputs holds, for the UI's Columns panel; a
# ("stage", "column") entry overrides the plain column's.
COLUMNS: dict[str | tuple[str, str], str] = {
    "id": "document id: xxh3-128 of the normalized text, 32 hex characters (equal texts, equal ids)",
    "text": "the document's text as normalized (NFC, trimmed, capped at 1,048,576 code units)",
    "source": "catalog source the document comes from",
    "source_id": "the document's id at the provider",
    "url": "the document's URL, carried from the provider's record",
    "repo": "repository field of the provider's record, carried as is",
    "path": "path field of the provider's record, carried as is",
    "metadata": "metadata field of the provider's record, carried as is",
    "buckets": "the 26 LSH band hashes (11 rows each of a 286-permutation MinHash)",
    "chars": "characters of the document's text",
    "embedding": "the encoder's unit-length embedding of the document",
    "topic": "topic (0-39): the topic of the nearest fine cluster",
    "fine_cluster": "the nearest of topic_model's fine clusters",
    "distance": "squared L2 distance to that fine cluster's centroid",
    "raw_score": "quality_model's regression output before calibration",
    "score": "calibrated quality score in [0, 1]",
    "contaminated": "flagged by the configured rule (its 13-gram overlap with an eval item is at or over the threshold)",
    "contaminated_marin": "flagged by Marin's rule (13-gram overlap, boilerplate n-grams left out)",
    "contaminated_coverage": "flagged by the coverage rule (share of an eval item's 13-grams found in the document)",
    "max_overlap": "the configured rule's largest overlap with one eval item",
    "matched_evals": "eval sets whose items the configured rule matched",
    "matched_rows": "eval items the configured rule matched",
    "contaminated_semantic": "flagged by the semantic tier (the kept embedding, or a window of the document, within the calibrated similarity of an eval item); dropped from the pool only under MARIN_SEMANTIC_POLICY=drop",
    "semantic_row": "the eval set and row the semantic tier matched (empty when none)",
    "semantic_similarity": "the semantic tier's best cosine similarity to an eval item",
    (TOKEN_COUNTS.name, "tokens"): "tokens of the document's text by the pinned tokenizer (its name@commit in the file's metadata), special tokens not counted",
    (POOL.name, "group"): "sampling group c<topic>q<band> the documents are filed under",
    (POOL.name, "file"): "pool file holding them, relative to the pool's data folder",
    (POOL.name, "documents"): "documents of the source in that group file",
    (POOL.name, "tokens"): "tokens of those documents by the pinned tokenizer",
}


def column_description(stage: str, column: str) -> str | None:
    return COLUMNS.get((stage, column)) or COLUMNS.get(column)


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
    stage = str(manifest.get("stage", ""))
    return dg.TableSchema(columns=[dg.TableColumn(field.name, str(field.type), description=column_description(stage, field.name)) for field in schema])


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
    decided: Any = None,
    **extra: Any,
) -> dg.MaterializeResult:
    """The result of a stage run: its metadata, and its fingerprint as the Dagster data version.

    ``decided``: for a global step, what it decided (its per-source digests); the data version
    is then a digest of that, so a rebuild that decides the same changes nothing downstream.
    A ``summary`` (the lines the demo prints) is shown as a preformatted block in the UI.
    """
    if isinstance(extra.get("summary"), str):
        extra["summary"] = dg.MetadataValue.md(f"```\n{extra['summary']}\n```")
    schema = column_schema(manifest)
    if schema is not None and "dagster/column_schema" not in extra:
        extra["dagster/column_schema"] = schema
    version = manifest["fingerprint"] if decided is None else storage.fingerprint("decided", decided)
    if "per_source_digest" in extra:  # a global step's per-source decisions: each source's slice is recorded
        from marin_assets.defs.slices import record_slices

        record_slices(getattr(extra["per_source_digest"], "data", extra["per_source_digest"]), version)
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
        data_version=dg.DataVersion(version),
    )
