"""Automation ticks after a code-location reload, in a fresh process (``test_conditions``).

Reads the sensor cursor left by the parent test, loads the definitions against the edited
catalog (``MARIN_CATALOG``: it has a new entry, so a new partition), and prints one JSON line:
what a tick requests before ``source_pins`` has seen the entry, after, and on the next tick.
"""

from __future__ import annotations

import json
import sys
import warnings

import dagster as dg
from dagster._core.definitions.observe import observe
from dagster._serdes import deserialize_value


def main(cursor_file: str) -> None:
    warnings.filterwarnings("ignore")
    from marin_assets.catalog.sources import load_catalog
    from marin_assets.definitions import defs
    from marin_assets.defs.ingest.assets import source_pins
    from marin_assets.defs.partitions import source_partitions
    from marin_assets.defs.resources import MarinResource

    # source_pins is observed on its own 5-minute cron, independent of what this test changes
    keys = [k for k in defs.resolve_asset_graph().get_all_asset_keys() if k.to_user_string() != "source_pins"]
    cursor = deserialize_value(open(cursor_file).read())
    out: dict = {"partitions_include_new": set(load_catalog().names) <= set(source_partitions.get_partition_keys())}
    with dg.DagsterInstance.get() as instance:
        def tick() -> dict:
            nonlocal cursor
            result = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=cursor)
            cursor = result.cursor
            return {k.to_user_string(): sorted(map(str, result.get_requested_partitions(k))) for k in keys if result.get_num_requested(k)}

        out["before_observation"] = tick()
        observe([source_pins], instance=instance, resources={"marin": MarinResource()})
        out["after_observation"] = tick()
        out["next_tick"] = tick()
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
