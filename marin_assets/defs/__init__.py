"""The Dagster definitions of marin-assets (``marin_assets.definitions`` collects them).

The definitions use six Dagster APIs that Dagster marks beta or preview, on purpose; their
warnings are filtered here, each by its own message, before any definition module is imported
(the CLI, the code server and ``dg`` all import through this package). Any other beta or
preview warning still shows.
"""

import re
import warnings

import dagster as dg

_ACCEPTED = (
    # source_pins is observed (the recipes are its data versions), never materialized.
    (dg.BetaWarning, "Function `observable_source_asset` is currently in beta"),
    # each source's slice of a global decision is observed by that step (defs/slices.py).
    (dg.BetaWarning, "Function `multi_observable_source_asset` is currently in beta"),
    # per-source checks (row counts, schema, co-partitioning) are partitioned like their asset.
    (dg.PreviewWarning, "Specifying a partitions_def on an AssetCheckSpec is currently in preview"),
    # marin_automation runs in the code server: its in_catalog operand reads the catalog file.
    (dg.BetaWarning, "Parameter `use_user_code_server` of initializer `AutomationConditionSensorDefinition.__init__`"),
    # marin_automation's target is the whole graph ("*"), source_pins included.
    (dg.BetaWarning, "Parameter `include_sources` of function `AssetSelection.all`"),
    # a mixture study reads the source dimension of its study x source partitions.
    (dg.BetaWarning, "Class `MultiToSingleDimensionPartitionMapping` is currently in beta"),
)
for _category, _message in _ACCEPTED:
    warnings.filterwarnings("ignore", message=re.escape(_message), category=_category)
