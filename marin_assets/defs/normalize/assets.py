"""``normalized``: canonical Parquet shards of each source."""

import dagster as dg

from marin_assets.core.ingest import normalize
from marin_assets.core.ingest import raw as ingest
from marin_assets.core.ingest.transforms import get_transform, known_transforms
from marin_assets.core.runtime import stages
from marin_assets.core.specs import NORMALIZED, RAW_FILES
from marin_assets.defs.metadata import markdown_table, materialized
from marin_assets.defs.resources import MarinResource, source_or_fail
from marin_assets.defs.stage_assets import stage_asset
from marin_assets.defs.ray import step_log


@stage_asset(
    NORMALIZED,
    kinds={"parquet"},
    description="Canonical rows (id, text, source_id, provider columns), about 256 MiB zstd shards sorted by id.",
)
def normalized(context: dg.AssetExecutionContext, marin: MarinResource) -> dg.MaterializeResult:
    source = source_or_fail(marin, context.partition_key)
    ingest.check_recipe(source, sorted(known_transforms()))
    layout = marin.layout()
    raw = ingest.locate_raw(source, layout)
    params = ingest.normalize_params(source, marin.shard_bytes())
    transform = get_transform(source.transform) if source.transform else None
    files = ingest.source_inputs(source, raw)
    manifest = stages.run_stage(
        NORMALIZED,
        layout,
        source=source.name,
        inputs=[stages.StageInput(raw["uri"], raw["fingerprint"], RAW_FILES.name)],
        decided_by={
            "params": params.fingerprint_params(),
            "transform": source.transform,
            "transform_version": getattr(transform, "version", "1"),
            "subdir": source.provider.subdir,
            "allow": source.provider.allow,
            "exclude": source.provider.exclude,
        },
        build=lambda out: normalize.normalize_source(
            source.name,
            files,
            out.uri,
            params,
            fmt=ingest.input_format(source),
            transform=transform,
            runner=marin.runner(),
            progress=step_log(context),
        ),
    )
    bad = manifest.get("bad_rows", {})
    return materialized(
        manifest,
        rows=manifest["rows"],
        counters=manifest["counters"],
        shards=len(manifest["shards"]),
        bad_rows=markdown_table([{"reason": k, "rows": v} for k, v in sorted(bad.items())]) if bad else None,
        bad_rows_total=sum(bad.values()),
    )
