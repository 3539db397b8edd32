"""The one partitioning of per-source assets: a partition per catalog source name."""

from __future__ import annotations

import dagster as dg

from marin_assets.catalog.sources import load_catalog

source_partitions = dg.StaticPartitionsDefinition(list(load_catalog().names))
