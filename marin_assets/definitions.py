"""The Dagster code location of marin-assets: every domain's definitions, merged."""

from __future__ import annotations

import dagster as dg

from marin_assets.defs.ingest.assets import raw_files, source_pins
from marin_assets.defs.jobs import source_chain
from marin_assets.defs.normalize.assets import normalized
from marin_assets.defs.resources import MarinResource

defs = dg.Definitions(
    assets=[source_pins, raw_files, normalized],
    jobs=[source_chain],
    resources={"marin": MarinResource()},
)
