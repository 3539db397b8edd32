"""Where the output of a materialized partition lives, as its materialization recorded it."""

from __future__ import annotations

import dagster as dg
import pyarrow as pa

from marin_assets.core.runtime import integrity, storage
from marin_assets.errors import BadInput


class NoOutput(BadInput):
    """The asset partition has no materialization with an output URI."""


def output_uri(context: dg.AssetCheckExecutionContext, asset: str) -> str:
    """The ``uri`` metadata of the latest materialization of ``asset`` (this check's partition)."""
    key = dg.AssetKey(asset)
    partition = context.partition_key if context.has_partition_key else None
    records = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition] if partition else None), limit=1
    ).records
    materialization = records[0].asset_materialization if records else None
    value = materialization.metadata.get("uri") if materialization else None
    if value is None:
        where = f" partition '{partition}'" if partition else ""
        raise NoOutput(f"{asset}{where} has no materialization with an output uri; materialize it first")
    return str(getattr(value, "path", None) or getattr(value, "value", value))


def parquet_schema(uri: str) -> pa.Schema:
    fs, path = storage.filesystem(uri)
    with storage.reading_parquet(uri), fs.open(path, "rb") as handle:
        return storage.parquet_file(handle).schema_arrow


def damaged(uri: str, manifest: dict) -> list[str]:
    """Files of the output whose size differs from what its manifest records, or that are gone
    (one listing; ``marin-assets verify`` also compares digests)."""
    found = integrity.damaged(uri, manifest.get("files") or {}, digests=False)
    return [f"{storage.join(uri, name)}: {why}; {storage.repair_hint(uri)}" for name, why in found.items()]


def missing_output(asset: str, err: Exception) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.ERROR, description=str(err), metadata={"asset": asset})
