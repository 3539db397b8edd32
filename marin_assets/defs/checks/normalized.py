"""Blocking checks on ``normalized``: every later stage joins on these shards by ``id``."""

import re

import dagster as dg
import pyarrow as pa

from marin_assets.core.ingest import formats
from marin_assets.core.runtime import storage
from marin_assets.errors import CorruptOutput
from marin_assets.core.specs import NORMALIZED
from marin_assets.defs.checks.output import NoOutput, damaged, missing_output, output_uri, parquet_schema
from marin_assets.defs.partitions import source_partitions

ASSET = NORMALIZED.name
LEADING_COLUMNS = ("id", "text", "source_id")
_ID = re.compile(r"^[0-9a-f]{32}$")


def _is_string(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or getattr(pa.types, "is_string_view", lambda _t: False)(t)


@dg.asset_check(asset=ASSET, name="rows", blocking=True, partitions_def=source_partitions,
                description="The source has documents, and its shards hold exactly the rows its manifest counts.")  # fmt: skip
def normalized_rows(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
    try:
        uri = output_uri(context, ASSET)
    except NoOutput as err:
        return missing_output(ASSET, err)
    manifest = storage.read_manifest(uri) or {}
    problems = damaged(uri, manifest)
    per_shard: dict[str, int] = {}
    for shard in storage.list_shards(uri):
        try:
            per_shard[storage.basename(shard)] = storage.parquet_num_rows(shard)
        except CorruptOutput as err:
            problems.append(str(err))
    rows = sum(per_shard.values())
    listed = manifest.get("shards", [])
    if rows == 0:
        problems.append("no documents: check the recipe's text field and file selection (bad rows are counted in the metadata of normalized)")
    if manifest.get("rows") != rows:
        problems.append(f"the manifest counts {manifest.get('rows')} rows but the shards hold {rows}")
    if not problems and sorted(listed) != sorted(per_shard):
        problems.append(f"the manifest lists {len(listed)} shards but {len(per_shard)} are present")
    return dg.AssetCheckResult(
        passed=not problems,
        severity=dg.AssetCheckSeverity.ERROR,
        description="; ".join(problems) or f"{rows} rows in {len(per_shard)} shards, as the manifest says",
        metadata={"rows": rows, "shards": len(per_shard), "manifest_rows": int(manifest.get("rows") or 0), "uri": dg.MetadataValue.path(uri)},
    )


@dg.asset_check(asset=ASSET, name="schema", blocking=True, partitions_def=source_partitions,
                description="Every shard starts with id, text, source_id (strings); ids are 32-hex and sorted.")  # fmt: skip
def normalized_schema(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
    try:
        uri = output_uri(context, ASSET)
    except NoOutput as err:
        return missing_output(ASSET, err)
    problems: list[str] = []
    columns: list[str] = []
    for shard in storage.list_shards(uri):
        name = storage.basename(shard)
        try:
            schema = parquet_schema(shard)
            ids = storage.read_parquet(shard, columns=["id"]).column("id").to_pylist() if "id" in schema.names else []
        except CorruptOutput as err:
            problems.append(str(err))
            continue
        columns = columns or list(schema.names)
        if tuple(schema.names[:3]) != LEADING_COLUMNS:
            problems.append(f"{name}: columns start with {schema.names[:3]}, not {list(LEADING_COLUMNS)}")
            continue
        wrong = [c for c in LEADING_COLUMNS if not _is_string(schema.field(c).type)]
        if wrong:
            problems.append(f"{name}: {', '.join(f'{c} is {schema.field(c).type}' for c in wrong)} (strings expected)")
            continue
        bad = next((i for i in ids if i is None or not _ID.match(i)), False)
        if bad is not False:
            problems.append(f"{name}: id {bad!r} is not 32 lowercase hex characters")
        elif any(a > b for a, b in zip(ids, ids[1:])):
            problems.append(f"{name}: rows are not sorted by id")
    return dg.AssetCheckResult(
        passed=not problems,
        severity=dg.AssetCheckSeverity.ERROR,
        description="; ".join(problems[:5]) + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else "") or "schema and ids as expected",
        metadata={"columns": ", ".join(columns), "problems": len(problems)},
    )


def bad_row_share(manifest: dict) -> tuple[int, int, float]:
    """Unreadable rows, rows read, and the unreadable share of all rows the files held."""
    bad = sum(int(manifest.get("bad_rows", {}).get(reason, 0)) for reason in formats.UNREADABLE)
    rows_in = int(manifest.get("counters", {}).get("rows_in", 0))
    total = rows_in + bad
    return bad, rows_in, (bad / total if total else 0.0)


@dg.asset_check(asset=ASSET, name="bad_rows", blocking=True, partitions_def=source_partitions,
                description=f"At most {formats.MAX_BAD_ROW_SHARE:.0%} of the rows in the source's files are unreadable.")  # fmt: skip
def normalized_bad_rows(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
    try:
        uri = output_uri(context, ASSET)
    except NoOutput as err:
        return missing_output(ASSET, err)
    manifest = storage.read_manifest(uri) or {}
    bad, rows_in, share = bad_row_share(manifest)
    passed = share <= formats.MAX_BAD_ROW_SHARE
    reasons = {r: int(manifest.get("bad_rows", {}).get(r, 0)) for r in formats.UNREADABLE}
    description = (
        f"{bad} of {rows_in + bad} rows ({share:.2%}) are unreadable"
        + ("" if passed else f", more than {formats.MAX_BAD_ROW_SHARE:.0%}: the files are corrupt or read under the "
           f"wrong format; the warnings of normalized name the files and lines, fix the catalog entry's input_format "
           f"or fetch the files again")  # fmt: skip
    )
    return dg.AssetCheckResult(
        passed=passed,
        severity=dg.AssetCheckSeverity.ERROR,
        description=description,
        metadata={"unreadable_rows": bad, "rows_in": rows_in, "share": share, **{f"bad_rows.{k}": v for k, v in reasons.items()}},
    )


NORMALIZED_CHECKS = [normalized_rows, normalized_schema, normalized_bad_rows]
