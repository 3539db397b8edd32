"""The one partitioning of per-source assets: a partition per catalog source name."""

from __future__ import annotations

import dagster as dg

from marin_assets.catalog.sources import load_catalog

# Loaded leniently: an invalid entry becomes a partition whose source_pins observation fails
# with its error, and every other source still loads.
source_partitions = dg.StaticPartitionsDefinition(list(load_catalog(strict=False).partition_names))
