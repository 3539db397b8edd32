"""Items 4 and 8: a killed run frees its pool slot; one bad catalog entry does not take the location down."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster._core.events import DagsterEventType, EngineEventData
from dagster._core.launcher.default_run_launcher import DefaultRunLauncher
from dagster._core.storage.dagster_run import DagsterRunStatus
from dagster._daemon.monitoring.run_monitoring import monitor_started_run

from marin_assets.catalog.sources import CatalogError
from marin_assets.core.ingest.recipes import checked_catalog
from marin_assets import errors
from marin_assets.defs import runs
from marin_assets_tests.fixtures.pipeline import catalog_with

REPO_ROOT = Path(__file__).resolve().parents[2]
POOL = "hf_download"


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def instance_from_dagster_yaml(tmp_path: Path):
    """A real instance configured by the project's dagster.yaml (the embedded default)."""
    config = yaml.safe_load((REPO_ROOT / "dagster.yaml").read_text())
    (tmp_path / "home").mkdir(parents=True, exist_ok=True)
    return dg.instance_for_test(temp_dir=str(tmp_path / "home"), overrides=config)


def started_run_holding_the_slot(instance, pid: int) -> dg.DagsterRun:
    """A run as a kill -9 leaves it: STARTED, its worker's pid recorded, the pool's only slot claimed."""
    run = instance.add_run(dg.DagsterRun(job_name="__ASSET_JOB", run_id=str(uuid.uuid4()), status=DagsterRunStatus.STARTED))
    instance.report_engine_event(f"Started process for run (pid: {pid}).", run, EngineEventData.in_process(pid))
    storage = instance.event_log_storage
    storage.set_concurrency_slots(POOL, 1)
    assert storage.claim_concurrency_slot(POOL, run.run_id, "raw_files").is_claimed
    return run


OTHER_RUN = str(uuid.uuid4())


def other_run_can_claim(instance) -> bool:
    """Whether the rerun's step gets the pool slot (it waits in line until then)."""
    return instance.event_log_storage.claim_concurrency_slot(POOL, OTHER_RUN, "raw_files").is_claimed


def test_the_default_launcher_cannot_tell_a_dead_run(world):
    world.inject()
    assert DefaultRunLauncher().supports_check_run_worker_health is False  # why dead runs stayed STARTED


def test_run_monitoring_fails_a_killed_run_on_the_embedded_default(world, tmp_path):
    with instance_from_dagster_yaml(world.scratch) as instance:
        assert isinstance(instance.run_launcher, runs.MonitoredRunLauncher)
        assert instance.run_monitoring_enabled and instance.run_monitoring_settings["free_slots_after_run_end_seconds"] <= 300
        dead = started_run_holding_the_slot(instance, dead_pid())
        alive = instance.add_run(dg.DagsterRun(job_name="__ASSET_JOB", run_id=str(uuid.uuid4()), status=DagsterRunStatus.STARTED))
        instance.report_engine_event("Started process for run.", alive, EngineEventData.in_process(os.getpid()))
        world.inject()
        assert not other_run_can_claim(instance), "the dead run holds the only slot"
        for run in (dead, alive):  # one pass of the daemon's run monitoring, as `dagster dev` runs it
            monitor_started_run(instance, None, instance.get_run_record_by_id(run.run_id), logging.getLogger("test"))
        assert instance.get_run_by_id(dead.run_id).status == DagsterRunStatus.FAILURE
        assert instance.get_run_by_id(alive.run_id).status == DagsterRunStatus.STARTED
        # the daemon frees a failed run's slots free_slots_after_run_end_seconds later; the command does it now
        stuck = runs.free_stuck_runs(instance)
        assert [s.run_id for s in stuck] == [dead.run_id]
        assert other_run_can_claim(instance)


@pytest.mark.system  # end to end: the CLI in a subprocess on a real instance
def test_marin_assets_runs_lists_and_frees_stuck_runs(world, tmp_path):
    home = world.scratch / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO_ROOT / "dagster.yaml").read_text())
    env = dict(os.environ, DAGSTER_HOME=str(home), PYTHONPATH=str(REPO_ROOT))
    from dagster import DagsterInstance

    os.environ["DAGSTER_HOME"] = str(home)
    try:
        instance = DagsterInstance.get()
        run = started_run_holding_the_slot(instance, dead_pid())
        instance.dispose()
    finally:
        del os.environ["DAGSTER_HOME"]
    world.inject()
    listed = subprocess.run([sys.executable, "-m", "marin_assets.cli", "runs"], env=env, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert run.run_id in listed.stdout and "worker process" in listed.stdout and "--free" in listed.stdout
    freed = subprocess.run([sys.executable, "-m", "marin_assets.cli", "runs", "--free"], env=env, capture_output=True, text=True, timeout=120)
    assert freed.returncode == 0 and run.run_id in freed.stdout
    os.environ["DAGSTER_HOME"] = str(home)
    try:
        instance = DagsterInstance.get()
        assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.FAILURE
        assert other_run_can_claim(instance)
        instance.dispose()
    finally:
        del os.environ["DAGSTER_HOME"]


# --------------------------------------------------------------------------- item 8


def test_an_unknown_transform_is_refused_when_the_catalog_loads(world, tmp_path):
    path = catalog_with(world.scratch / "bad.toml", edit={"cp/peps": {"transform": "no_such_transform"}})
    world.inject()
    with pytest.raises(CatalogError, match="cp/peps.*transform.*no_such_transform") as caught:
        checked_catalog(path)
    assert isinstance(caught.value, errors.ConfigurationError)
    lenient = checked_catalog(path, strict=False)
    assert len(lenient) == 145 and [k for k, _ in lenient.broken] == ["cp/peps"]
    assert "cp/peps" in lenient.partition_names


def test_one_bad_entry_fails_its_source_pins_observation_and_the_rest_load(world, pipeline, tmp_path):
    from dagster._core.definitions.observe import observe

    from marin_assets.defs.ingest.assets import source_pins

    world.root = Path(pipeline.prefix)
    pipeline.catalog_path = str(catalog_with(world.scratch / "bad.toml", edit={"cp/peps": {"transform": "no_such_transform"}}))
    world.inject()
    result = observe([source_pins], instance=pipeline.instance, resources={"marin": pipeline.resource}, raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert "cp/peps" in failure.message + str(failure.event_specific_data.error) and "no_such_transform" in str(failure.event_specific_data.error)
    records = pipeline.instance.fetch_observations(dg.AssetKey("source_pins"), limit=1000).records
    observed = {r.partition_key: r.event_log_entry.asset_observation for r in records}
    assert len(observed) == 146
    assert observed["cp/peps"].tags["dagster/data_version"] == "invalid-catalog-entry"
    assert "no_such_transform" in str(observed["cp/peps"].metadata["error"].value)
    assert observed["cp/pubmed"].tags["dagster/data_version"] not in ("invalid-catalog-entry", "removed-from-catalog")


@pytest.mark.system
def test_the_code_location_loads_with_a_bad_entry(world, tmp_path):
    path = catalog_with(world.scratch / "bad.toml", edit={"cp/peps": {"transform": "no_such_transform"}},
                        entries=[{"name": "../escape", "family": "x", "rough_tokens_b": 1.0, "input_format": "jsonl",
                                  "provider": {"kind": "hf", "repo_id": "a/b", "revision": "0123456"}}])  # fmt: skip
    world.inject(2)
    code = ("from marin_assets.definitions import defs\n"
            "keys = defs.resolve_assets_def('normalized').partitions_def.get_partition_keys()\n"
            "print(len(keys), 'cp/peps' in keys, [k for k in keys if k.startswith('invalid-entry-')])")  # fmt: skip
    env = dict(os.environ, MARIN_CATALOG=str(path), PYTHONPATH=str(REPO_ROOT))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[:2] == ["147", "True"] and "invalid-entry-147" in done.stdout


# --------------------------------------------------------------------------- a rerun without the daemon


@dg.asset(pool=POOL)
def fetched_files() -> int:
    return 1


def fetch_job() -> dg.JobDefinition:
    """One step in the ``hf_download`` pool, with the project's executor (reconstructable by name)."""
    from marin_assets.defs.automation.execution import executor_from_env

    job = dg.define_asset_job("fetch_job", selection=[fetched_files], executor_def=executor_from_env("in_process"))
    return dg.Definitions(assets=[fetched_files], jobs=[job]).resolve_job_def("fetch_job")


def test_a_rerun_frees_the_slot_a_dead_run_holds_without_the_daemon(world):
    with instance_from_dagster_yaml(world.scratch) as instance:
        dead = started_run_holding_the_slot(instance, dead_pid())
        world.inject()
        with dg.execute_job(dg.reconstructable(fetch_job), instance=instance) as result:
            assert result.success
        assert instance.get_run_by_id(dead.run_id).status == DagsterRunStatus.FAILURE
        messages = [e.message for e in instance.all_logs(dead.run_id)]
        assert any("waits for pool 'hf_download'" in m and "is gone" in m for m in messages), messages
        assert other_run_can_claim(instance), "the rerun released the slot it took over"


RUN_BLOCKED = """
import sys, dagster as dg, yaml
from marin_assets_tests.faults.test_runs_and_catalog import REPO_ROOT, fetch_job
config = yaml.safe_load((REPO_ROOT / "dagster.yaml").read_text())
with dg.instance_for_test(temp_dir=sys.argv[1], overrides=config) as instance:
    dg.execute_job(dg.reconstructable(fetch_job), instance=instance)
"""


def blocked_run(instance, child: subprocess.Popen, holder: str, limit_s: float = 180.0) -> str:
    """The id of the child's run once its step reports waiting for the pool slot (polled, not slept for)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        for run in instance.get_runs():
            records = instance.get_records_for_run(run.run_id, of_type=DagsterEventType.ENGINE_EVENT).records
            if run.run_id != holder and any("blocked by limit for pool" in (r.event_log_entry.message or "") for r in records):
                return run.run_id
        try:
            child.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            continue
        raise AssertionError(f"the run ended before it waited for the slot: {child.stderr.read().decode()[-3000:]}")
    raise AssertionError("the run never reported waiting for the slot")


@pytest.mark.system  # a run in a subprocess, blocked on a pool slot a live run holds, then SIGTERM
def test_a_step_blocked_on_a_pool_slot_exits_on_sigterm(world):
    home = world.scratch / "home"
    with instance_from_dagster_yaml(world.scratch) as instance:
        holder = started_run_holding_the_slot(instance, os.getpid())  # alive: this test's process
        world.inject()
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
        child = subprocess.Popen([sys.executable, "-c", RUN_BLOCKED, str(home)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            run_id = blocked_run(instance, child, holder.run_id)
            child.send_signal(signal.SIGTERM)
            child.wait(timeout=120)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        status = instance.get_run_by_id(run_id).status
        assert status in (DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED), status
        assert instance.get_run_by_id(holder.run_id).status == DagsterRunStatus.STARTED  # a live holder is left alone
        assert [s.run_id for s in instance.event_log_storage.get_concurrency_info(POOL).claimed_slots] == [holder.run_id]


# --------------------------------------------------------------------------- hostile catalog files

LOAD_CATALOG = """
import json, sys
from marin_assets.catalog.sources import CatalogError, load_catalog
from marin_assets.core.runtime.runner import peak_rss_bytes, reset_peak_rss
reset_peak_rss()
before = peak_rss_bytes()
try:
    load_catalog(sys.argv[1])
    error = ""
except CatalogError as err:
    error = str(err)
print(json.dumps({"error": error, "grown": peak_rss_bytes() - before}))
"""


@pytest.mark.parametrize(("name", "what"), [("deep.toml", "nests arrays or tables too deeply"), ("huge.toml", "over the")])
def test_a_deeply_nested_or_huge_catalog_is_a_catalog_error_naming_the_file(world, name, what):
    path = world.scratch / name
    if name == "deep.toml":
        path.write_text("x = " + "[" * 100_000 + "]" * 100_000 + "\n")  # 0.2 MB
    else:
        with open(path, "wb") as handle:  # 210 MB, sparse: never read
            handle.truncate(210 << 20)
    world.inject()
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    done = subprocess.run([sys.executable, "-c", LOAD_CATALOG, str(path)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = __import__("json").loads(done.stdout.strip().splitlines()[-1])
    assert str(path) in seen["error"] and what in seen["error"]
    world.peak(f"catalog {name}", seen["grown"], 64 << 20)


def test_the_catalog_sensor_reports_a_deeply_nested_catalog_by_name(world, pipeline):
    from marin_assets.defs.automation.sensors import catalog_changes

    path = world.scratch / "deep.toml"
    path.write_text("x = " + "[" * 100_000 + "]" * 100_000 + "\n")
    pipeline.catalog_path = str(path)
    world.inject()
    with dg.instance_for_test() as instance, pytest.raises(CatalogError, match=f"{path}.*too deeply"):
        catalog_changes(dg.build_sensor_context(instance=instance, resources={"marin": pipeline.resource}))
