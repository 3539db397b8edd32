"""Jobs: a source's whole per-source chain (partitioned, for backfills) and the global curation."""

from __future__ import annotations

import dagster as dg

from marin_assets.defs.partitions import source_partitions

# Every materializable per-source asset is in the chain; groups are the stage names.
PER_SOURCE_GROUPS = ("ingest", "normalize")

source_chain = dg.define_asset_job(
    "source_chain",
    selection=dg.AssetSelection.groups(*PER_SOURCE_GROUPS) - dg.AssetSelection.keys("source_pins"),
    partitions_def=source_partitions,
    description="One source from its pinned download to its per-source outputs (partitioned: backfill with --partitions).",
)
