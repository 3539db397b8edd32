"""Checks on per-source attribute outputs: co-partitioning for every attribute stage, and the
vectors of ``embeddings`` (dimension of the model, unit length)."""

import dagster as dg
import numpy as np

from marin_assets.core.embed import embeddings as embed
from marin_assets.core.runtime import storage
from marin_assets.errors import CorruptOutput
from marin_assets.core import specs
from marin_assets.core.specs import EMBEDDINGS
from marin_assets.defs.checks.output import NoOutput, damaged, missing_output, output_uri, parquet_schema
from marin_assets.defs.partitions import source_partitions

# Attribute stages joined shard by shard with their input (same basenames, same row counts).
CO_PARTITIONED = tuple(s.name for s in specs.ALL if s.co_partitioned)

# Output dimension of the encoders we know; another model is checked for consistency only.
KNOWN_DIMENSIONS = {"microsoft/harrier-oss-v1-0.6b": 1024, embed.OFFLINE_MODEL: 384}
NORM_TOLERANCE = 0.05  # int8 codes with range +-0.3 keep unit norms within ~1e-3
MAX_OFF_NORM_FRACTION = 0.01
SAMPLE_ROWS_PER_SHARD = 4096


def co_partitioned_check(asset: str) -> dg.AssetChecksDefinition:
    """``co_partitioned`` on ``asset``: shards pair up with its recorded input's shards, rows match."""

    @dg.asset_check(asset=asset, name="co_partitioned", blocking=True, partitions_def=source_partitions,
                    description="Same shard names and row counts as the input it was computed from (rows join by position).")  # fmt: skip
    def _check(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        try:
            uri = output_uri(context, asset)
        except NoOutput as err:
            return missing_output(asset, err)
        manifest = storage.read_manifest(uri) or {}
        inputs = manifest.get("inputs") or []
        if not inputs:
            return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.ERROR, description=f"{uri} has no manifest with its inputs; rematerialize {asset}")
        source_uri = inputs[0]["uri"]
        problems = damaged(uri, manifest)
        try:
            ours = {storage.basename(u): storage.parquet_num_rows(u) for u in storage.list_shards(uri)}
            theirs = {storage.basename(u): storage.parquet_num_rows(u) for u in storage.list_shards(source_uri)}
        except CorruptOutput as err:
            return missing_output(asset, err)
        if sorted(ours) != sorted(theirs):
            missing, extra = sorted(set(theirs) - set(ours)), sorted(set(ours) - set(theirs))
            problems.append(f"shards differ from the input's: missing {missing[:3]}, extra {extra[:3]}")
        problems += [f"{name}: {ours[name]} rows, input has {theirs[name]}" for name in sorted(set(ours) & set(theirs)) if ours[name] != theirs[name]]
        return dg.AssetCheckResult(
            passed=not problems,
            severity=dg.AssetCheckSeverity.ERROR,
            description="; ".join(problems[:5]) or f"{len(ours)} shards, {sum(ours.values())} rows, aligned with the input",
            metadata={"shards": len(ours), "rows": sum(ours.values()), "input": dg.MetadataValue.path(source_uri)},
        )

    return _check


@dg.asset_check(asset=EMBEDDINGS.name, name="dimension", blocking=True, partitions_def=source_partitions,
                description="Every shard stores vectors of one dimension, the model's own.")  # fmt: skip
def embeddings_dimension(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
    try:
        uri = output_uri(context, EMBEDDINGS.name)
    except NoOutput as err:
        return missing_output(EMBEDDINGS.name, err)
    dims: dict[str, int] = {}
    models: set[str] = set()
    for shard in storage.list_shards(uri):
        try:
            schema = parquet_schema(shard)
        except CorruptOutput as err:
            return missing_output(EMBEDDINGS.name, err)
        field = schema.field("embedding").type
        dims[storage.basename(shard)] = int(getattr(field, "list_size", -1))
        meta = embed.embedding_metadata(schema)
        models.add(str(meta.get("model", "")))
        if meta.get("dim") not in (None, dims[storage.basename(shard)]):
            dims[storage.basename(shard)] = -1
    found = sorted(set(dims.values()))
    expected = {KNOWN_DIMENSIONS[m] for m in models if m in KNOWN_DIMENSIONS}
    problems = []
    if len(found) != 1 or found[0] <= 0:
        problems.append(f"shards disagree on the dimension (or with their own metadata): {found}")
    if len(models) > 1:
        problems.append(f"shards come from several models: {sorted(models)}")
    if expected and found and found != sorted(expected):
        problems.append(f"{sorted(models)[0]} embeds in {sorted(expected)[0]} dimensions, the shards hold {found}")
    return dg.AssetCheckResult(
        passed=not problems and bool(dims),
        severity=dg.AssetCheckSeverity.ERROR,
        description="; ".join(problems) or (f"{found[0]} dimensions ({', '.join(sorted(models))})" if dims else "no shards"),
        metadata={"dim": found[0] if len(found) == 1 else -1, "model": ", ".join(sorted(models)), "expected_dim": sorted(expected)[0] if expected else -1},
    )


@dg.asset_check(asset=EMBEDDINGS.name, name="unit_norm", blocking=True, partitions_def=source_partitions,
                description=f"Stored vectors dequantize to unit length (|norm - 1| <= {NORM_TOLERANCE} for 99% of a sample), none empty or NaN.")  # fmt: skip
def embeddings_unit_norm(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
    try:
        uri = output_uri(context, EMBEDDINGS.name)
    except NoOutput as err:
        return missing_output(EMBEDDINGS.name, err)
    norms = []
    for shard in storage.list_shards(uri):
        try:
            table = storage.read_parquet(shard, columns=["id", "embedding"])
        except CorruptOutput as err:
            return missing_output(EMBEDDINGS.name, err)
        table = table.slice(0, SAMPLE_ROWS_PER_SHARD)
        if table.num_rows:
            norms.append(np.linalg.norm(embed.vectors_from_table(table, normalize=False), axis=1))
    values = np.concatenate(norms) if norms else np.zeros(0)
    bad = int(np.count_nonzero(~np.isfinite(values) | (values == 0)))
    off = float(np.mean(np.abs(values - 1.0) > NORM_TOLERANCE)) if values.size else 0.0
    passed = bad == 0 and off <= MAX_OFF_NORM_FRACTION
    stats = {"sampled": int(values.size), "empty_or_nan": bad, "off_unit_fraction": round(off, 6)}
    if values.size:
        stats |= {"norm_min": round(float(np.nanmin(values)), 6), "norm_max": round(float(np.nanmax(values)), 6), "norm_mean": round(float(np.nanmean(values)), 6)}
    return dg.AssetCheckResult(
        passed=passed,
        severity=dg.AssetCheckSeverity.ERROR,
        description=(f"{values.size} sampled vectors are unit length" if passed else
                     f"{bad} empty/NaN vectors, {off:.1%} off unit length: re-embed (check the model and int8 range)"),  # fmt: skip
        metadata=stats,
    )


ATTRIBUTE_CHECKS = [co_partitioned_check(a) for a in CO_PARTITIONED] + [embeddings_dimension, embeddings_unit_norm]
