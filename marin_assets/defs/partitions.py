"""The one partitioning of per-source assets: a partition per catalog source name."""

from __future__ import annotations

import dagster as dg

from marin_assets.catalog.sources import load_catalog
from marin_assets.defs.settings import configured_catalog_path

# Loaded leniently: an invalid entry becomes a partition whose source_pins observation fails
# with its error, and every other source still loads. The partitions are fixed when the code
# location loads (a reload picks up new entries).
source_partitions = dg.StaticPartitionsDefinition(list(load_catalog(configured_catalog_path(), strict=False).partition_names))
