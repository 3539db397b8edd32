"""Pin-change automation on the real definitions and a real temporary instance.

Assets really run (local Hub fixtures, ``materialize``); ``source_pins`` is really observed
from an edited catalog; conditions are evaluated tick by tick with a carried cursor, as the
``marin_automation`` sensor does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.definitions.observe import observe
from dagster._serdes import serialize_value

from marin_assets.defs.partitions import REMOVED
from marin_assets_tests.automation.sources import LIBRE, PEPS, entry_like, publish_source
from marin_assets_tests.fixtures.pipeline import catalog_with

pytestmark = [pytest.mark.system, pytest.mark.sqlite_instance]  # automation ticks across code-location reloads, minutes: `make test` runs it, `make test-fast` does not

CHAIN = ["raw_files", "normalized", "minhash_buckets"]
GLOBALS = ["exact_duplicates", "fuzzy_duplicates"]


class Ticks:
    """Evaluates the automation conditions of ``defs`` tick after tick, like the sensor."""

    def __init__(self, instance: dg.DagsterInstance, defs: dg.Definitions | None = None):
        from marin_assets.definitions import defs as real

        self.defs, self.instance, self.cursor = defs or real, instance, None

    def __call__(self) -> dict[str, list]:
        result = dg.evaluate_automation_conditions(defs=self.defs, instance=self.instance, cursor=self.cursor)
        self.cursor = result.cursor
        # source_pins is observed on its own 5-minute cron: a test that happens to span a cron
        # boundary would see that observation requested, whatever the pins did.
        keys = [k for k in self.defs.resolve_asset_graph().get_all_asset_keys() if k.to_user_string() != "source_pins"]
        return {k.to_user_string(): sorted(result.get_requested_partitions(k), key=str) for k in keys if result.get_num_requested(k)}


def observe_pins(pipeline) -> None:
    from marin_assets.defs.ingest.assets import source_pins

    result = observe([source_pins], instance=pipeline.instance, resources={"marin": pipeline.resource})
    assert result.success


def pin_versions(instance: dg.DagsterInstance, names: list[str]) -> dict[str, str | None]:
    """The data version ``source_pins`` last recorded per partition."""
    out = {}
    for name in names:
        record = instance.get_latest_data_version_record(dg.AssetKey("source_pins"), is_source=True, partition_key=name)
        out[name] = record.asset_observation.data_version if record else None
    return out


@pytest.fixture
def observed(pipeline, hub_store, tmp_path, monkeypatch):
    """An editable copy of the catalog in use, PEPS and LIBRE on the local Hub, pins observed."""
    catalog = catalog_with(tmp_path / "catalog.toml")
    monkeypatch.setenv("MARIN_CATALOG", str(catalog))
    pipeline.catalog_path = str(catalog)
    for name in (PEPS, LIBRE):
        publish_source(hub_store, name)
    observe_pins(pipeline)
    return pipeline


@pytest.fixture
def built(observed):
    """PEPS and LIBRE built through minhash_buckets, and both global dedup steps."""
    for name in (PEPS, LIBRE):
        observed.materialize(CHAIN, partition=name)
    observed.materialize(GLOBALS)
    return observed


@pytest.fixture
def one_built(observed):
    """PEPS built through normalized."""
    observed.materialize(["raw_files", "normalized"], partition=PEPS)
    return observed


def test_a_pin_change_rebuilds_that_source_then_the_globals(built, hub_store, tmp_path) -> None:
    ticks = Ticks(built.instance)
    assert ticks() == {}, "what exists before automation is on is not rebuilt"
    observe_pins(built)
    assert ticks() == {}, "re-observing an unchanged catalog requests nothing"

    new_sha = publish_source(hub_store, PEPS, version=2, commit="")
    catalog_with(Path(built.catalog_path), edit={PEPS: {"provider": {"revision": new_sha[:7]}}})
    assert ticks() == {}, "nothing happens before source_pins is observed"
    observe_pins(built)
    assert ticks() == {name: [PEPS] for name in CHAIN}, "only the changed source's chain, as one tick"

    built.materialize(CHAIN, partition=PEPS)
    assert ticks() == {name: [None] for name in GLOBALS}, "then the global steps, and the chain is not asked again"
    built.materialize(GLOBALS)
    assert ticks() == {}
    observe_pins(built)
    assert ticks() == {}

    result = built.materialize(["normalized"], partition=LIBRE)
    assert built.metadata(result, "normalized")["reused"] is True
    assert ticks() == {}, "same fingerprint, same data version: minhash_buckets and dedup stay"


def test_removed_entries_are_reported_and_never_requested(one_built) -> None:
    built = one_built
    ticks = Ticks(built.instance)
    assert ticks() == {}
    catalog_with(Path(built.catalog_path), keep=[n for n in _catalog_names(built) if n != PEPS])
    observe_pins(built)
    assert pin_versions(built.instance, [PEPS])[PEPS] == REMOVED
    assert pin_versions(built.instance, [LIBRE])[LIBRE] not in (None, REMOVED)
    assert ticks() == {}, "a source that left the catalog is not rebuilt (it could only fail)"


def _catalog_names(pipeline) -> list[str]:
    from marin_assets.catalog.sources import load_catalog

    return list(load_catalog(pipeline.catalog_path).names)


def test_a_new_entry_is_built_after_the_code_location_reloads(one_built, tmp_path) -> None:
    built = one_built
    new = "cp/peps_mirror"
    ticks = Ticks(built.instance)
    assert ticks() == {}
    catalog_with(Path(built.catalog_path), entries=[entry_like(PEPS, new)])
    assert ticks() == {}, "before a reload the new entry is not a partition"
    cursor = tmp_path / "cursor.json"
    cursor.write_text(serialize_value(ticks.cursor))
    env = {**os.environ, "MARIN_CATALOG": built.catalog_path, "DAGSTER_HOME": built.instance.root_directory, "MARIN_PREFIX": built.prefix}
    done = subprocess.run(
        [sys.executable, "-m", "marin_assets_tests.automation.reload_tick", str(cursor)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    ticks_after_reload = json.loads(done.stdout.strip().splitlines()[-1])
    assert ticks_after_reload["partitions_include_new"] is True
    assert ticks_after_reload["before_observation"] == {}, "source_pins has not seen the entry yet"
    requested = ticks_after_reload["after_observation"]
    assert {"raw_files", "normalized", "minhash_buckets"} <= set(requested)
    assert all(parts == [new] for parts in requested.values()), requested
    assert ticks_after_reload["next_tick"] == {}


def test_catalog_changes_records_changed_pins_runless_and_its_baseline_requests_nothing(pipeline, hub_store, tmp_path, monkeypatch) -> None:
    """The real ``catalog_changes`` sensor records ``source_pins`` without a run: every pin on
    its first tick (the baseline, which rebuilds nothing already built for its pin), then only
    the pins that changed; a changed pin then rebuilds exactly that source's chain."""
    from marin_assets.defs.automation.sensors import catalog_changes
    from marin_assets_tests.automation.test_sensors import Sensor

    catalog = catalog_with(tmp_path / "catalog.toml")
    monkeypatch.setenv("MARIN_CATALOG", str(catalog))
    pipeline.catalog_path = str(catalog)
    publish_source(hub_store, PEPS)
    pipeline.materialize(CHAIN, partition=PEPS)  # built before automation, never observed
    ticks, sensor = Ticks(pipeline.instance), Sensor(catalog_changes, pipeline.instance, pipeline.resource)
    assert ticks() == {}
    runs_before = len(pipeline.instance.get_run_records())

    baseline = [e for e in sensor.tick().asset_events if isinstance(e, dg.AssetObservation)]
    names = _catalog_names(pipeline)
    assert sorted(e.partition for e in baseline) == sorted(names), "the first tick records every pin"
    assert ticks() == {}, "the baseline rebuilds nothing that is built for its pin"
    assert not [e for e in sensor.tick().asset_events if isinstance(e, dg.AssetObservation)], "unchanged pins: nothing recorded"
    assert ticks() == {}

    catalog_with(Path(pipeline.catalog_path), edit={PEPS: {"provider": {"revision": "0" * 40}}})
    changed = [e for e in sensor.tick().asset_events if isinstance(e, dg.AssetObservation)]
    assert [e.partition for e in changed] == [PEPS]
    assert pin_versions(pipeline.instance, [PEPS])[PEPS] == changed[0].tags["dagster/data_version"]
    assert ticks() == {name: [PEPS] for name in CHAIN}, "exactly the changed source's chain"
    assert len(pipeline.instance.get_run_records()) == runs_before, "observations are runless: no run, no drift checks"
