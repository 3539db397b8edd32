"""The catalog-changes and pin-drift sensors, ticked with ``build_sensor_context`` on a real
temporary instance; drift answers come from the local Hub server with real edits to its repos."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import dagster as dg
import pytest

from marin_assets.defs.automation.drift_sensor import SUMMARY_CHECK, drift_check_names, pin_drift
from marin_assets.defs.automation.sensors import CATALOG_CHECK, catalog_changes
from marin_assets.defs.resources import MarinResource
from marin_assets_tests.automation.sources import LIBRE, PEPS, entry_like, publish_source
from marin_assets_tests.fixtures.pipeline import catalog_with

DOCS = "starcoder2/documentation"
GATED = "dolma_code_prose"
GONE = "eai-taxonomy-code-w-dclm"
WEB = "ghalogs/public"  # a web pin whose archive is staged under MARIN_PREFIX
DRIFT_SOURCES = [PEPS, LIBRE, DOCS, GATED, GONE, WEB]


class Sensor:
    """Ticks one sensor like the daemon does: carries the cursor, records its asset events."""

    def __init__(self, sensor, instance: dg.DagsterInstance, marin: MarinResource):
        self.sensor, self.instance, self.marin, self.cursor = sensor, instance, marin, None

    def tick(self) -> dg.SensorResult:
        from marin_assets.definitions import defs

        context = dg.build_sensor_context(instance=self.instance, cursor=self.cursor, definitions=defs, resources={"marin": self.marin})
        result = self.sensor(context)
        self.cursor = result.cursor
        for event in result.asset_events:
            self.instance.report_runless_asset_event(event)
        return result


def _evaluations(result: dg.SensorResult, check: str) -> dict[str | None, dg.AssetCheckEvaluation]:
    return {e.partition: e for e in result.asset_events if isinstance(e, dg.AssetCheckEvaluation) and e.check_name == check}


DRIFT_CHECKS = drift_check_names(DRIFT_SOURCES)


def _drift(result: dg.SensorResult) -> dict[str, dg.AssetCheckEvaluation]:
    """Per-source drift verdicts of a tick, by source name."""
    by_check = {e.check_name: e for e in result.asset_events if isinstance(e, dg.AssetCheckEvaluation)}
    return {name: by_check[check] for name, check in DRIFT_CHECKS.items() if check in by_check}


def _meta(evaluation: dg.AssetCheckEvaluation, key: str):
    value = evaluation.metadata[key]
    return getattr(value, "value", value)


# --------------------------------------------------------------------------- catalog changes


def test_catalog_changes_reports_new_removed_and_changed_entries(tmp_path: Path) -> None:
    catalog = catalog_with(tmp_path / "catalog.toml")
    with dg.DagsterInstance.ephemeral() as instance:
        sensor = Sensor(catalog_changes, instance, MarinResource(catalog_path=str(catalog)))
        first = sensor.tick()
        assert "agree" in first.skip_reason.skip_message
        assert _evaluations(first, CATALOG_CHECK)[None].passed
        assert sensor.tick().asset_events == [], "an unchanged state is reported once, not every minute"
        assert len(sensor.cursor) < 200 and "cp/" not in sensor.cursor, f"a compact cursor (a digest), not every pin: {sensor.cursor}"
        assert sum(isinstance(e, dg.AssetObservation) for e in first.asset_events) == 146, "the pins are in the observations"

        catalog_with(catalog, edit={PEPS: {"provider": {"revision": "abcdef1"}}, LIBRE: {"license": "CC-BY-4.0"}})
        changed = sensor.tick().skip_reason.skip_message
        assert f"recipes changed since the last tick: {PEPS} " in changed, "a licence edit is not a recipe change"

        names = [line.split('"')[1] for line in catalog.read_text().splitlines() if line.startswith("name = ")]
        catalog_with(catalog, keep=[n for n in names if n != DOCS], entries=[entry_like(PEPS, "cp/peps_mirror")])
        result = sensor.tick()
        message = result.skip_reason.skip_message
        assert "not partitions yet: cp/peps_mirror" in message and "reload" in message
        assert f"left the catalog: {DOCS}" in message
        verdict = _evaluations(result, CATALOG_CHECK)[None]
        assert not verdict.passed
        assert _meta(verdict, "new_entries") == "cp/peps_mirror" and _meta(verdict, "removed_entries") == DOCS
        history = instance.event_log_storage.get_asset_check_execution_history(dg.AssetCheckKey(dg.AssetKey("source_pins"), CATALOG_CHECK), limit=5)
        assert len(history) == 2, "recorded in the instance, visible on the source_pins page"


# --------------------------------------------------------------------------- pin drift


@pytest.fixture
def drift_hub(hub_store, tmp_path):
    """Fixture repos at the catalog's pins, then: LIBRE's branch moves, DOCS's pinned revision
    is removed, GATED becomes gated; GONE was never published."""
    for name in (PEPS, LIBRE, DOCS, GATED):
        publish_source(hub_store, name)
    from marin_assets.catalog.sources import load_catalog

    repo = {n: load_catalog().by_name(n).provider.repo_id for n in DRIFT_SOURCES}
    publish_source(hub_store, LIBRE, version=2, commit="")
    pinned_docs = hub_store.resolve(repo[DOCS], load_catalog().by_name(DOCS).provider.revision)
    publish_source(hub_store, DOCS, version=2, commit="")
    hub_store.remove_revision(repo[DOCS], pinned_docs)
    hub_store.set_gated(repo[GATED], True)
    return MarinResource(catalog_path=str(catalog_with(tmp_path / "catalog.toml", keep=DRIFT_SOURCES)))


@pytest.mark.system
def test_drift_sensor_reports_each_pin_in_bounded_ticks(drift_hub, hub_server, monkeypatch) -> None:
    monkeypatch.setenv("MARIN_DRIFT_BATCH", "2")
    monkeypatch.setenv("MARIN_DRIFT_PERIOD_S", "60")  # 6 pins a minute: more than the cap of 2 per tick
    with dg.DagsterInstance.ephemeral() as instance:
        sensor = Sensor(pin_drift, instance, drift_hub)
        seen: dict[str, dg.AssetCheckEvaluation] = {}
        asked_per_tick = []
        for _ in range(3):
            result = sensor.tick()
            asked_per_tick.append(result.skip_reason.skip_message.split(" (")[0])
            seen.update(_drift(result))
        assert asked_per_tick == ["checked 2 of 6 pins"] * 3, "MARIN_DRIFT_BATCH pins per tick"
        assert set(json.loads(sensor.cursor)["status"]) == set(DRIFT_SOURCES), "the cursor walked every pin"
        status = {name: _meta(e, "status") for name, e in seen.items()}
        assert status[PEPS] == "ok" and seen[PEPS].passed
        assert status[LIBRE] == "branch-moved" and not seen[LIBRE].passed and seen[LIBRE].severity == dg.AssetCheckSeverity.WARN
        assert status[DOCS] == "revision-gone" and seen[DOCS].severity == dg.AssetCheckSeverity.ERROR
        assert status[GATED] == "gated" and "gated = true" in seen[GATED].description
        assert GONE not in seen, "without HF_TOKEN a missing repo may be private: unknown, not a verdict"
        assert _meta(seen[LIBRE], "branch_head") != _meta(seen[LIBRE], "resolved")

        summary = _evaluations(result, SUMMARY_CHECK)[None]
        assert not summary.passed and summary.severity == dg.AssetCheckSeverity.ERROR
        assert _meta(summary, "pins_known") == 6 and _meta(summary, "pins_total") == 6
        assert _meta(summary, "pins_revision_gone") == 1 and _meta(summary, "pins_unknown") == 2
        status = json.loads(sensor.cursor)["status"]
        assert status[GONE]["status"] == "unknown"
        assert status[WEB]["status"] == "unknown" and "not staged" in status[WEB]["detail"], "web pins are asked by their own recipe"

        recorded = {
            name for name in DRIFT_SOURCES
            if instance.event_log_storage.get_asset_check_execution_history(dg.AssetCheckKey(dg.AssetKey("source_pins"), DRIFT_CHECKS[name]), limit=5)
        }  # fmt: skip
        assert recorded == {PEPS, LIBRE, DOCS, GATED}, "recorded in the instance, listed on the source_pins page"

        monkeypatch.setenv("HF_TOKEN", "hf_any")
        for _ in range(3):
            verdict = _drift(sensor.tick()).get(GONE)
            if verdict:
                break
        assert verdict is not None and _meta(verdict, "status") == "repo-gone", "with a token, not found means gone"


def test_drift_sensor_degrades_to_unknown_when_the_provider_is_unreachable(drift_hub, hub_server, monkeypatch) -> None:
    monkeypatch.setenv("MARIN_DRIFT_PERIOD_S", "60")  # a pace that asks for every pin each tick, up to the batch cap
    with dg.DagsterInstance.ephemeral() as instance:
        sensor = Sensor(pin_drift, instance, drift_hub)
        before = sensor.tick()
        assert _meta(_drift(before)[LIBRE], "status") == "branch-moved"
        cursor = json.loads(sensor.cursor)

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            closed = sock.getsockname()[1]
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed}")
        offline = sensor.tick()
        message = offline.skip_reason.skip_message
        assert "unreachable" in message and "stopped early" in message
        assert _drift(offline) == {}, "an unknown answer records no verdict"
        after = json.loads(sensor.cursor)
        assert after["status"][LIBRE]["status"] == "branch-moved", "the last real answer is kept"
        assert cursor["last"] == DOCS, "the first tick walked every pin (the default cap is 10)"
        assert after["last"] == LIBRE, "the walk wrapped to the first pin, found it unreachable, and moves on next tick"


def test_drift_pace_covers_every_pin_once_per_period_with_few_requests_per_tick() -> None:
    from marin_assets.defs.automation.drift_sensor import pins_per_tick

    per_tick = pins_per_tick(146, 600, 86400, cap=10)
    assert per_tick == 2, "146 pins a day at a tick every 10 minutes: 2 pins (4 provider requests) a tick"
    assert per_tick * (86400 // 600) >= 146, "every pin within the period"
    assert pins_per_tick(146, 3 * 3600, 86400, cap=10) == 10, "a daemon that was down catches up, capped"
    assert pins_per_tick(6, 600, 86400, cap=10) == 1 and pins_per_tick(0, 600, 86400, cap=10) == 0


def test_every_sensor_reads_well_in_the_ui() -> None:
    """The sensor page shows a target as its selection string (never a Python repr) and a
    description that names the sensor's real cadence."""
    from marin_assets.definitions import defs
    from marin_assets.defs.automation.sensors import AUTOMATION_INTERVAL_S, CATALOG_INTERVAL_S

    for sensor in defs.sensors or []:
        selection = getattr(sensor, "asset_selection", None)
        if selection is not None:
            text = selection.to_selection_str()  # what the UI prints; raises where it would fall back to repr
            assert "Selection(" not in text and text, (sensor.name, text)
        assert sensor.description and "<" not in sensor.description, sensor.name
    by_name = {s.name: s for s in defs.sensors or []}
    assert by_name["marin_automation"].minimum_interval_seconds == AUTOMATION_INTERVAL_S
    assert by_name["catalog_changes"].minimum_interval_seconds == CATALOG_INTERVAL_S
