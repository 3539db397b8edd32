"""``normalized``: canonical Parquet shards of each source."""

import dagster as dg

from marin_assets.core import ingest, normalize, storage
from marin_assets.core.transforms import get_transform, known_transforms
from marin_assets.defs.ingest.assets import raw_files
from marin_assets.defs.metadata import markdown_table, materialized
from marin_assets.defs.partitions import source_partitions
from marin_assets.defs.resources import MarinResource, source_or_fail


@dg.asset(
    partitions_def=source_partitions,
    deps=[raw_files],
    group_name="normalize",
    kinds={"parquet"},
    code_version=normalize.CODE_VERSION,
    description="Canonical rows (id, text, source_id, provider columns), about 256 MiB zstd shards sorted by id.",
)
def normalized(context: dg.AssetExecutionContext, marin: MarinResource) -> dg.MaterializeResult:
    source = source_or_fail(marin, context.partition_key)
    ingest.check_recipe(source, sorted(known_transforms()))
    layout = marin.layout()
    raw = ingest.locate_raw(source, layout)
    params = ingest.normalize_params(source, marin.shard_bytes())
    transform = get_transform(source.transform) if source.transform else None
    fp = storage.fingerprint(
        "normalized",
        {
            "params": params.fingerprint_params(),
            "transform": source.transform,
            "transform_version": getattr(transform, "version", "1"),
            "subdir": source.provider.subdir,
            "allow": source.provider.allow,
            "exclude": source.provider.exclude,
        },
        normalize.CODE_VERSION,
        [raw["fingerprint"]],
    )
    inputs = ingest.source_inputs(source, raw)
    out_dir = layout.normalized(source.name, fp)
    manifest = normalize.normalize_source(
        source.name,
        inputs,
        out_dir,
        params,
        fmt=ingest.input_format(source),
        transform=transform,
        runner=marin.runner(),
        fingerprint=fp,
        progress=context.log.info,
    )
    storage.publish_current(layout.group("normalized", source.name), fp, out_dir)
    bad = manifest.get("bad_rows", {})
    return materialized(
        manifest | {"uri": out_dir, "fingerprint": fp},
        rows=manifest["rows"],
        counters=manifest["counters"],
        shards=len(manifest["shards"]),
        bad_rows=markdown_table([{"reason": k, "rows": v} for k, v in sorted(bad.items())]) if bad else None,
        bad_rows_total=sum(bad.values()),
    )
