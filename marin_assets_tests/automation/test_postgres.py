"""The production instance template on real services: PostgreSQL on loopback for storage and the
GCS emulator for compute logs (only the Kubernetes launcher is left out). Assets run, the
automation conditions and the sensors tick, all stored in Postgres."""

from __future__ import annotations

import uuid
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster._core.definitions.observe import observe

from marin_assets.defs.automation.drift_sensor import drift_check_names, pin_drift
from marin_assets.defs.automation.sensors import CATALOG_CHECK, catalog_changes
from marin_assets.defs.ingest.assets import source_pins
from marin_assets.defs.resources import MarinResource
from marin_assets_tests.automation.sources import PEPS, publish_source, run_with_checks
from marin_assets_tests.automation.system import postgres_env, postgres_server
from marin_assets_tests.fixtures.pipeline import Pipeline, catalog_with

pytestmark = pytest.mark.system  # PostgreSQL: `make test` runs it, `make test-fast` does not

TEMPLATE = Path(__file__).resolve().parents[2] / "deploy" / "dagster.production.yaml"


@pytest.fixture(scope="module")
def postgres():
    with postgres_server() as settings:
        yield settings


@pytest.fixture
def production_instance(postgres, gcs_emulator, tmp_path, monkeypatch):
    """DAGSTER_HOME holding the production template (minus the Kubernetes run launcher)."""
    config = yaml.safe_load(TEMPLATE.read_text())
    config.pop("run_launcher")
    config["run_monitoring"]["max_resume_run_attempts"] = 0  # only the Kubernetes launcher resumes runs
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(yaml.safe_dump(config))
    prefix = f"compute-logs-{uuid.uuid4().hex[:8]}"
    for key, value in {**postgres_env(postgres), "MARIN_LOG_BUCKET": "marin-test", "MARIN_LOG_PREFIX": prefix, "STORAGE_EMULATOR_HOST": gcs_emulator}.items():
        monkeypatch.setenv(key, value)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        yield instance, prefix


def test_runs_automation_and_sensors_on_postgres_storage(production_instance, hub_store, hub_server, tmp_path, monkeypatch) -> None:
    instance, log_prefix = production_instance
    assert type(instance.run_storage).__name__ == "PostgresRunStorage"
    assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"
    catalog = catalog_with(tmp_path / "catalog.toml")
    monkeypatch.setenv("MARIN_CATALOG", str(catalog))
    monkeypatch.setenv("MARIN_PREFIX", str(tmp_path / "data"))
    pipeline = Pipeline(prefix=str(tmp_path / "data"), catalog_path=str(catalog), instance=instance)
    publish_source(hub_store, PEPS)

    assert observe([source_pins], instance=instance, resources={"marin": pipeline.resource}).success
    result = run_with_checks(pipeline, ["raw_files", "normalized"], PEPS, raise_on_error=True)
    assert all(e.passed for e in result.get_asset_check_evaluations())
    stored = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=dg.AssetKey("normalized"), asset_partitions=[PEPS]), limit=1).records
    assert stored and stored[0].asset_materialization.metadata["dagster/row_count"].value == 6

    from marin_assets_tests.automation.test_conditions import Ticks

    ticks = Ticks(instance)
    assert ticks() == {}
    new_sha = publish_source(hub_store, PEPS, version=2, commit="")
    catalog_with(catalog, edit={PEPS: {"provider": {"revision": new_sha[:7]}}})
    assert observe([source_pins], instance=instance, resources={"marin": pipeline.resource}).success
    assert ticks() == {"raw_files": [PEPS], "normalized": [PEPS]}, "per-partition data versions compared in Postgres"

    from marin_assets_tests.automation.test_sensors import Sensor

    catalog_tick = Sensor(catalog_changes, instance, pipeline.resource).tick()
    assert "agree" in catalog_tick.skip_reason.skip_message
    only_peps = MarinResource(catalog_path=str(catalog_with(tmp_path / "peps.toml", keep=[PEPS], edit={PEPS: {"provider": {"revision": new_sha[:7]}}})))
    drift = Sensor(pin_drift, instance, only_peps)
    for _ in range(2):  # the same check answered on every tick, stored each time
        drift.tick()
    key = dg.AssetCheckKey(dg.AssetKey("source_pins"), drift_check_names([PEPS])[PEPS])
    history = instance.event_log_storage.get_asset_check_execution_history(key, limit=5)
    assert len(history) == 2 and history[0].status.value == "SUCCEEDED", "the catalog pin is what main serves"
    catalog_key = dg.AssetCheckKey(dg.AssetKey("source_pins"), CATALOG_CHECK)
    assert instance.event_log_storage.get_asset_check_execution_history(catalog_key, limit=5)

    from google.cloud import storage as gcs

    names = [b.name for b in gcs.Client().list_blobs("marin-test", prefix=log_prefix)]
    run_id = result.run_id
    assert any(run_id in name for name in names), f"step logs of run {run_id} on GCS: {names[:5]}"
