"""Automation switched on over the full catalog of a demo instance, tick by tick.

The demo is built by ``marin-assets demo`` into a temporary ``DAGSTER_HOME`` (real SQLite
instance, dagster.yaml of the embedded default). Then the real sensors are evaluated as the
daemon evaluates them, three ticks in a row, each tick = ``catalog_changes`` (whose
observations are written as runless events) then ``marin_automation`` (the declarative
automation sensor with its carried cursor). The daemon itself is not started: on this
project's CI machine a daemon tick cadence of 30-60 s would make three ticks take minutes
while adding nothing the sensor evaluation does not already decide.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from marin_assets_tests.automation.system import REPO
from marin_assets_tests.fixtures.pipeline import catalog_with

pytestmark = pytest.mark.system

MAX_RUNS_PER_TICK = 5
MAX_GROWTH_PER_QUIET_TICK = 256 * 1024  # bytes of instance storage a tick with no change may add


def _tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def demo_home(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("demo_scale")
    home = root / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    env = {**os.environ, "DAGSTER_HOME": str(home), "MARIN_PREFIX": str(root / "data"), "MARIN_DEMO_HUB": str(root / "hub")}
    for key in ("MARIN_CATALOG", "HF_TOKEN", "HF_ENDPOINT", "MARIN_AUTOMATION"):
        env.pop(key, None)
    done = subprocess.run([sys.executable, "-m", "marin_assets.cli", "demo"], cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return root


class Tick:
    """One daemon tick: catalog_changes, then marin_automation, each with its own cursor."""

    def __init__(self, instance: dg.DagsterInstance, marin):
        from marin_assets.definitions import defs

        self.defs, self.instance, self.marin = defs, instance, marin
        self.catalog = next(s for s in defs.sensors if s.name == "catalog_changes")
        self.automation = next(s for s in defs.sensors if s.name == "marin_automation")
        self.cursors: dict[str, str | None] = {"catalog": None, "automation": None}

    def __call__(self) -> tuple[int, dict[str, set]]:
        context = dg.build_sensor_context(instance=self.instance, cursor=self.cursors["catalog"], definitions=self.defs, resources={"marin": self.marin})
        result = self.catalog(context)
        self.cursors["catalog"] = result.cursor
        observations = 0
        for event in result.asset_events:
            self.instance.report_runless_asset_event(event)
            observations += isinstance(event, dg.AssetObservation)
        context = dg.build_sensor_context(instance=self.instance, cursor=self.cursors["automation"], definitions=self.defs, resources={"marin": self.marin})
        result = self.automation(context)
        self.cursors["automation"] = result.cursor
        requested: dict[str, set] = {}
        for request in result.run_requests or []:
            subset = request.asset_graph_subset
            if subset is not None:
                for part in subset.iterate_asset_partitions():
                    requested.setdefault(part.asset_key.to_user_string(), set()).add(part.partition_key)
            for key in request.asset_selection or []:
                requested.setdefault(key.to_user_string(), set()).add(request.partition_key)
        return observations, requested


def _runs(requested: dict[str, set]) -> int:
    """Runs the requests become: one per source partition (its chain), one for the global steps."""
    partitions = {p for parts in requested.values() for p in parts}
    return len(partitions - {None}) + (1 if None in partitions else 0)


def test_automation_on_over_the_full_catalog_of_a_demo_instance(demo_home: Path, monkeypatch) -> None:
    from marin_assets.catalog.sources import load_catalog
    from marin_assets.defs.partitions import source_partitions
    from marin_assets.defs.resources import MarinResource
    from marin_assets.demo.sample import DEMO_SOURCES

    home, prefix = demo_home / "dagster_home", demo_home / "data"
    catalog_path = demo_home / "catalog.toml"
    catalog_with(catalog_path)  # the packaged catalog, editable
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("MARIN_PREFIX", str(prefix))
    monkeypatch.setenv("MARIN_CATALOG", str(catalog_path))
    partitions = source_partitions.get_partition_keys()
    assert len(partitions) == len(load_catalog(catalog_path).names) == 146

    with dg.DagsterInstance.get() as instance:
        tick = Tick(instance, MarinResource(catalog_path=str(catalog_path)))
        runs_before = len(instance.get_run_records())
        sizes = [_tree_bytes(home)]
        history = []
        for label in ("switched on", "nothing changed"):
            observations, requested = tick()
            sizes.append(_tree_bytes(home))
            history.append((label, observations, requested))
        edited = next(n for n in DEMO_SOURCES if load_catalog(catalog_path).by_name(n).provider.kind == "hf")
        catalog_with(catalog_path, edit={edited: {"provider": {"revision": "f" * 40}}})
        observations, requested = tick()
        sizes.append(_tree_bytes(home))
        history.append((f"pin of {edited} edited", observations, requested))

        for (label, observed, req), before, after in zip(history, sizes, sizes[1:]):
            print(f"tick '{label}': {observed} pin observations, {_runs(req)} runs requested, instance +{after - before} bytes")

        (_, first_obs, first), (_, quiet_obs, quiet), (_, edit_obs, edit) = history
        assert first_obs == 146, "the first tick records every pin: the baseline"
        assert first == {}, "switching automation on requests nothing that is up to date"
        assert quiet_obs == 0 and quiet == {}, "an unchanged catalog: nothing recorded, nothing requested"
        assert sizes[2] - sizes[1] <= MAX_GROWTH_PER_QUIET_TICK, "a quiet tick barely grows the instance"
        assert edit_obs == 1
        built = {
            key.to_user_string()
            for key in tick.defs.resolve_asset_graph().get_all_asset_keys()
            if key.to_user_string() != "source_pins"
            and tick.defs.resolve_asset_graph().get(key).partitions_def is not None
            and instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=key, asset_partitions=[edited]), limit=1).records
        }
        assert set(edit) == built and all(parts == {edited} for parts in edit.values()), f"exactly {edited}'s chain: {edit}"
        assert all(_runs(req) <= MAX_RUNS_PER_TICK for _, _, req in history)
        assert len(instance.get_run_records()) == runs_before, "the sensors themselves launch no run"


def test_every_row_count_after_the_demo_matches_the_rows_on_disk(demo_home: Path, monkeypatch) -> None:
    """``dagster/row_count`` of every materialization whose output is Parquet shards equals
    the rows of those shards (read from the output's manifest)."""
    from marin_assets.core import storage

    monkeypatch.setenv("DAGSTER_HOME", str(demo_home / "dagster_home"))
    compared, wrong = [], []
    with dg.DagsterInstance.get() as instance:
        for record in _all_materializations(instance):
            mat = record.asset_materialization
            meta = {k: getattr(v, "value", v) for k, v in mat.metadata.items()}
            if "dagster/row_count" not in meta or "uri" not in meta:
                continue
            manifest = storage.read_manifest(str(meta["uri"]))
            shards = [s for s in (manifest or {}).get("shards") or [] if str(s).endswith(".parquet")]
            if not shards:
                continue
            on_disk = sum(storage.parquet_num_rows(storage.join(str(meta["uri"]), s)) for s in shards)
            name = f"{mat.asset_key.to_user_string()}[{mat.partition or ''}]"
            compared.append(name)
            if on_disk != meta["dagster/row_count"]:
                wrong.append(f"{name}: row_count {meta['dagster/row_count']}, {on_disk} rows on disk")
    print(f"{len(compared)} materializations compared")
    assert compared and not wrong, wrong


def _all_materializations(instance: dg.DagsterInstance) -> list:
    from marin_assets.definitions import defs

    out = []
    for key in defs.resolve_asset_graph().get_all_asset_keys():
        out.extend(instance.fetch_materializations(key, limit=10000).records)
    return out
