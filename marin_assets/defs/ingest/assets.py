"""``source_pins`` (observed from the catalog) and ``raw_files`` (provider files at the pin)."""

import dagster as dg

from marin_assets.core import hub, ingest
from marin_assets.defs.metadata import materialized
from marin_assets.defs.partitions import source_partitions
from marin_assets.defs.resources import MarinResource, source_or_fail

REMOVED = "removed-from-catalog"


@dg.observable_source_asset(
    partitions_def=source_partitions,
    group_name="ingest",
    description="Each source's recipe as the catalog pins it; the data version is the recipe fingerprint.",
    automation_condition=dg.AutomationCondition.cron_tick_passed("*/5 * * * *"),
)
def source_pins(context, marin: MarinResource) -> dg.DataVersionsByPartition:
    catalog = marin.catalog()
    names = set(catalog.names)
    versions = {
        key: ingest.recipe_fingerprint(catalog.by_name(key)) if key in names else REMOVED
        for key in source_partitions.get_partition_keys()
    }
    removed = sorted(k for k, v in versions.items() if v == REMOVED)
    if removed:
        context.log.warning(f"sources removed from the catalog: {', '.join(removed)}")
    return dg.DataVersionsByPartition(versions)


@dg.asset(
    partitions_def=source_partitions,
    deps=[source_pins],
    group_name="ingest",
    pool="hf_download",
    kinds={"huggingface", "parquet"},
    code_version=ingest.CODE_VERSION,
    description="Provider files as published at the pinned revision, verified, shared by content address.",
)
def raw_files(context: dg.AssetExecutionContext, marin: MarinResource) -> dg.MaterializeResult:
    source = source_or_fail(marin, context.partition_key)
    policy = marin.retry_policy()
    manifest = ingest.fetch_raw(
        source,
        marin.catalog(),
        marin.layout(),
        download=lambda repo, rev, allow, exclude, dest, progress: hub.download_snapshot(
            repo,
            rev,
            allow=list(allow) or None,
            exclude=list(exclude) or None,
            dest_uri=dest,
            on_progress=progress,
            policy=policy,
        ),
        resolve=lambda repo, rev, repo_type: hub.resolve_revision(repo, rev, repo_type, policy=policy),
        progress=context.log.info,
    )
    return materialized(
        manifest,
        counters=manifest.get("counters", {}),
        repo=source.provider.repo_id,
        pin=source.provider.revision,
        revision=manifest.get("revision") or manifest.get("resolved_revision"),
        files=len(manifest.get("files", [])),
    )
