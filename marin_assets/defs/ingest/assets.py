"""``source_pins`` (observed from the catalog), ``raw_files`` (provider files at the pin) and ``normalized`` (canonical Parquet shards of each source)."""

import dagster as dg

from marin_assets.core.ingest import hub, normalize
from marin_assets.core.ingest import raw as ingest
from marin_assets.core.ingest.transforms import get_transform, known_transforms
from marin_assets.core.runtime import stages
from marin_assets.core.specs import NORMALIZED, RAW_FILES, SOURCE_PINS
from marin_assets.defs.metadata import markdown_table, materialized
from marin_assets.defs.partitions import INVALID, REMOVED, source_partitions
from marin_assets.defs.ray import step_log
from marin_assets.defs.resources import MarinResource, source_or_fail
from marin_assets.defs.stage_assets import stage_asset, tags_for

DATA_VERSION_TAG = "dagster/data_version"


@dg.observable_source_asset(
    name=SOURCE_PINS.name,
    partitions_def=source_partitions,
    group_name=SOURCE_PINS.group,
    tags=tags_for(SOURCE_PINS),
    description=(
        "Each source's recipe as the catalog pins it; the data version is the recipe fingerprint. "
        "The catalog_changes sensor records it (runless, only for recipes that changed); observing "
        "a partition here records that partition only."
    ),
)
def source_pins(context, marin: MarinResource) -> dg.DataVersionsByPartition:
    catalog = marin.catalog()
    names = set(catalog.names)
    broken = dict(catalog.broken)
    keys = [context.partition_key] if context.has_partition_key else source_partitions.get_partition_keys()
    versions = {key: ingest.recipe_fingerprint(catalog.by_name(key)) if key in names else INVALID if key in broken else REMOVED for key in keys}
    broken = {k: v for k, v in broken.items() if k in versions}
    removed = sorted(k for k, v in versions.items() if v == REMOVED)
    if removed:
        context.log.warning(f"sources removed from the catalog: {', '.join(removed)}")
    if not broken:
        return dg.DataVersionsByPartition(versions)
    # Record every source's version at once (events of a failing step would be dropped), then fail
    # the observation naming each invalid entry.
    for key, version in versions.items():
        context.instance.report_runless_asset_event(dg.AssetObservation(
            asset_key=context.asset_key, partition=key, tags={DATA_VERSION_TAG: version},
            metadata={"error": broken[key]} if key in broken else {},
        ))  # fmt: skip
    raise dg.Failure(
        f"{len(broken)} invalid catalog entr{'y' if len(broken) == 1 else 'ies'} (the other sources load): "
        + "; ".join(f"{key}: {error}" for key, error in sorted(broken.items())),
        metadata={"invalid_entries": dg.MetadataValue.json(broken)},
    )


@stage_asset(
    RAW_FILES,
    pool="hf_download",
    kinds={"huggingface", "parquet"},
    description="Provider files as published at the pinned revision, verified, shared by content address.",
)
def raw_files(context: dg.AssetExecutionContext, marin: MarinResource) -> dg.MaterializeResult:
    source = source_or_fail(marin, context.partition_key)
    try:
        manifest = _copy(context, marin, source)
    except (hub.HubAuthError, hub.RevisionGoneError, hub.NotServedHere) as err:  # expected: gated, repo or revision gone, not served here
        raise dg.Failure(
            description=str(err),
            metadata={"source": source.name, "repo": source.provider.repo_id or "", "pin": source.provider.revision or "", "error": type(err).__name__},
            allow_retries=False,
        ) from None
    return materialized(
        manifest,
        counters=manifest.get("counters", {}),
        repo=source.provider.repo_id,
        pin=source.provider.revision,
        revision=manifest.get("revision") or manifest.get("resolved_revision"),
        files=len(manifest.get("files", [])),
        recipe=ingest.recipe_fingerprint(source),
    )


def _copy(context: dg.AssetExecutionContext, marin: MarinResource, source) -> dict:
    access = marin.provider_access()
    policy, hub_access = access.policy, marin.hub_kwargs()
    layout = marin.layout()
    return stages.run_copy(
        record_uri=ingest.pin_record_uri(layout, source),
        fetch=lambda: ingest.fetch_raw(
            source,
            marin.catalog(),
            layout,
            download=lambda repo, rev, allow, exclude, dest, progress: hub.download_snapshot(
                repo,
                rev,
                allow=list(allow) or None,
                exclude=list(exclude) or None,
                dest_uri=dest,
                on_progress=progress,
                policy=policy,
                staging_dir=access.staging_dir,
                **hub_access,
            ),
            resolve=lambda repo, rev, repo_type: hub.resolve_revision(repo, rev, repo_type, policy=policy, **hub_access),
            progress=step_log(context),
            access=access,
        ),
    )


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
            **normalize.plan_inputs(files),
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
