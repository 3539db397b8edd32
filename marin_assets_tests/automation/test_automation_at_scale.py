"""Automation switched on over the full catalog of a demo instance, tick by tick.

The demo is built by ``marin-assets demo`` into a temporary ``DAGSTER_HOME`` (real SQLite
instance, dagster.yaml of the embedded default). Two tests switch automation on over it:

* the real daemon (``dagster-daemon run`` on the project's ``workspace.yaml``, its own code
  server) with the sensor cadences set to seconds (``MARIN_CATALOG_INTERVAL_S``,
  ``MARIN_AUTOMATION_INTERVAL_S``: 60 s and 30 s in production would make three rounds take
  minutes); the test polls the instance's tick records with a deadline;
* the same sensors evaluated in this process, tick by tick, as the daemon evaluates them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest

from marin_assets_tests.automation.system import REPO, wait_for
from marin_assets_tests.fixtures.pipeline import catalog_with

pytestmark = pytest.mark.system

MAX_RUNS_PER_TICK = 5
MAX_GROWTH_PER_QUIET_TICK = 256 * 1024  # bytes of instance storage a tick with no change may add


def _tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def demo_home(built_demo: Path) -> Path:
    return built_demo


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
        waiting = _reads_automated_globals(tick.defs)
        assert set(edit) == built - waiting and all(parts == {edited} for parts in edit.values()), f"exactly {edited}'s chain: {edit}"
        assert all(_runs(req) <= MAX_RUNS_PER_TICK for _, _, req in history)
        assert len(instance.get_run_records()) == runs_before, "the sensors themselves launch no run"


def _reads_automated_globals(defs) -> set[str]:
    """Per-source assets that read a global step automation rebuilds (dedup, boilerplate, bands):
    they wait until those steps have landed, so they are not in the chain's first run."""
    from marin_assets.defs.automation.conditions import EXCEPTIONS, global_inputs

    graph = defs.resolve_asset_graph()
    return {
        key.to_user_string() for key in graph.materializable_asset_keys
        if graph.get(key).partitions_def is not None
        and any(g.to_user_string() not in EXCEPTIONS for g in global_inputs(graph, key))
    }  # fmt: skip


def test_every_row_count_after_the_demo_matches_the_rows_on_disk(demo_home: Path, monkeypatch) -> None:
    """``dagster/row_count`` of every materialization whose output is Parquet shards equals
    the rows of those shards (read from the output's manifest)."""
    from marin_assets.core.runtime import storage

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


# --------------------------------------------------------------------------- the real daemon

ROUND_TIMEOUT_S = 600  # one round on a loaded CI machine: a catalog tick, then an automation tick over 146 partitions


def _event_log_bytes(home: Path) -> int:
    """The SQLite event log (index plus per-run logs) of an embedded-default instance."""
    return _tree_bytes(home / "history" / "runs") if (home / "history" / "runs").exists() else 0


class Daemon:
    """``dagster-daemon run`` on the project's workspace.yaml, its output in a log file."""

    def __init__(self, env: dict[str, str], log_path: Path):
        self.env, self.log_path = env, log_path
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "Daemon":
        exe = str(Path(sys.executable).with_name("dagster-daemon"))
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen([exe, "run", "-w", str(REPO / "workspace.yaml")], cwd=REPO, env=self.env,
                                        stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        return self

    def __exit__(self, *exc) -> None:
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)  # the daemon's own group: it and its code server
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        self._log.close()

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def alive(self) -> None:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"dagster-daemon exited with {self.process.returncode}:\n{self.tail()}")


class SensorTicks:
    """The finished ticks of one sensor, read from the instance (oldest first)."""

    def __init__(self, instance: dg.DagsterInstance, name: str):
        self.instance, self.name, self.state = instance, name, None

    def finished(self) -> list:
        from dagster._core.scheduler.instigation import InstigatorType, TickStatus

        if self.state is None:
            states = self.instance.all_instigator_state(instigator_type=InstigatorType.SENSOR)
            self.state = next((s for s in states if s.instigator_name == self.name), None)
            if self.state is None:
                return []
        ticks = self.instance.get_ticks(self.state.instigator_origin_id, self.state.selector_id, limit=1000)
        return sorted((t for t in ticks if t.status != TickStatus.STARTED), key=lambda t: t.timestamp)


def test_the_daemon_switched_on_over_the_full_catalog(demo_home: Path, tmp_path: Path) -> None:
    """Rounds of the real daemon (on, idle, idle again, one pin edit); a round is a ``catalog_changes``
    tick followed by a ``marin_automation`` tick that started after it. Runs it requests stay
    queued (``max_concurrent_runs: 0``): the test measures what automation asks for."""
    from dagster._core.scheduler.instigation import TickStatus

    from marin_assets.catalog.sources import load_catalog
    from marin_assets.demo.sample import DEMO_SOURCES

    home = tmp_path / "dagster_home"
    shutil.copytree(demo_home / "dagster_home_as_built", home)
    config = (REPO / "dagster.yaml").read_text()
    assert "max_concurrent_runs: 4" in config
    (home / "dagster.yaml").write_text(config.replace("max_concurrent_runs: 4", "max_concurrent_runs: 0"))
    catalog_path = tmp_path / "catalog.toml"
    catalog_with(catalog_path)
    env = {
        **os.environ, "DAGSTER_HOME": str(home), "MARIN_PREFIX": str(demo_home / "data"), "MARIN_CATALOG": str(catalog_path),
        "MARIN_AUTOMATION": "on", "MARIN_CATALOG_INTERVAL_S": "5", "MARIN_AUTOMATION_INTERVAL_S": "5",
        "MARIN_DRIFT_INTERVAL_S": "3600", "HF_ENDPOINT": "http://127.0.0.1:9", "MARIN_RETRY_WAIT_S": "0",
        "HF_HUB_DISABLE_TELEMETRY": "1", "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1",
    }  # fmt: skip
    env.pop("HF_TOKEN", None)
    edited = next(n for n in DEMO_SOURCES if load_catalog(catalog_path).by_name(n).provider.kind == "hf")

    pins = dg.AssetKey("source_pins")
    with dg.DagsterInstance.from_config(str(home)) as instance, Daemon(env, tmp_path / "daemon.log") as daemon:
        from marin_assets.definitions import defs

        graph = defs.resolve_asset_graph()
        chain = {
            key.to_user_string()
            for key in graph.get_all_asset_keys()
            if key != pins and graph.get(key).partitions_def is not None
            and instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=key, asset_partitions=[edited]), limit=1).records
        }  # fmt: skip
        catalog_ticks, automation_ticks = SensorTicks(instance, "catalog_changes"), SensorTicks(instance, "marin_automation")
        observations = lambda: len(instance.fetch_observations(pins, limit=10000).records)  # noqa: E731
        before = {"observations": observations(), "runs": len(instance.get_run_records()), "bytes": _tree_bytes(home), "log": _event_log_bytes(home)}
        rounds = []

        def one_round(label: str, after: float) -> dict:
            """Wait for a catalog tick started after ``after``, then an automation tick started after it ended."""
            started = time.monotonic()

            def catalog_tick():
                daemon.alive()
                return next((t for t in catalog_ticks.finished() if t.timestamp >= after), None)

            catalog = wait_for(f"a catalog_changes tick ({label})", catalog_tick, ROUND_TIMEOUT_S, every_s=1.0, diagnose=daemon.tail)
            catalog_end = catalog.end_timestamp or catalog.timestamp

            def automation_tick():
                daemon.alive()
                return next((t for t in automation_ticks.finished() if t.timestamp >= catalog_end), None)

            automation = wait_for(f"a marin_automation tick after the catalog tick ({label})", automation_tick, ROUND_TIMEOUT_S, every_s=1.0, diagnose=daemon.tail)
            now = {"observations": observations(), "runs": len(instance.get_run_records()), "bytes": _tree_bytes(home), "log": _event_log_bytes(home)}
            ticks_in_round = [t for t in automation_ticks.finished() if after <= t.timestamp <= automation.timestamp]
            result = {
                "label": label, "catalog": catalog, "automation": automation,
                "observations": now["observations"] - before["observations"], "runs": now["runs"] - before["runs"],
                "bytes": now["bytes"] - before["bytes"], "log": now["log"] - before["log"],
                "automation_ticks": len(ticks_in_round), "failed": [t for t in (catalog, *ticks_in_round) if t.status == TickStatus.FAILURE],
                "seconds": time.monotonic() - started,
            }  # fmt: skip
            before.update(now)
            print(f"daemon round '{label}': {result['observations']} pin observations, {result['runs']} runs, "
                  f"{result['automation_ticks']} automation ticks, instance +{result['bytes']:,} B (event log +{result['log']:,} B), "
                  f"{result['seconds']:.0f} s", flush=True)  # fmt: skip
            rounds.append(result)
            return result

        on = one_round("switched on", 0.0)
        idle = one_round("nothing changed", on["automation"].end_timestamp or on["automation"].timestamp)
        # The first quiet tick stores the automation evaluations that differ from the baseline
        # tick's; from the next one on, a quiet tick stores only its tick record.
        steady = one_round("nothing changed again", idle["automation"].end_timestamp or idle["automation"].timestamp)
        catalog_with(catalog_path, edit={edited: {"provider": {"revision": "f" * 40}}})
        edit_at = time.time()
        edit = one_round(f"pin of {edited} edited", edit_at)

        assert not any(r["failed"] for r in rounds), [(t.instigator_name, t.error) for r in rounds for t in r["failed"]]
        assert on["observations"] == 146, "the first catalog tick records every pin: the baseline"
        assert on["runs"] == 0 and on["automation"].requested_asset_materialization_count == 0, "switching automation on requests nothing up to date"
        assert idle["observations"] == 0 and idle["runs"] == 0, "an unchanged catalog: nothing recorded, nothing requested"
        assert idle["log"] <= MAX_GROWTH_PER_QUIET_TICK, f"a quiet round barely grows the event log: +{idle['log']:,} B"
        assert steady["observations"] == 0 and steady["runs"] == 0
        assert steady["bytes"] <= MAX_GROWTH_PER_QUIET_TICK, f"a steady quiet round barely grows the instance: +{steady['bytes']:,} B"
        assert edit["observations"] == 1, "one pin edit: one observation"
        new_runs = [r.dagster_run for r in instance.get_run_records()][: edit["runs"]]
        requested = {key.to_user_string() for run in new_runs for key in run.asset_selection or ()}
        chain -= _reads_automated_globals(defs)
        assert requested == chain and {run.tags.get("dagster/partition") for run in new_runs} == {edited}, f"exactly {edited}'s chain: {requested} vs {chain}"
        assert all(r["runs"] <= MAX_RUNS_PER_TICK for r in rounds)
