"""Item 3: two materializations of one partition, and two first runs on a fresh instance.

Two real ``dagster asset materialize`` processes build the same partition at once, on local disk
and on Cloud Storage (the emulator): each either finishes or stops at once naming the run that
writes the output; none fails any other way, and the output is whole (every file as its
manifest records it, no writer left holding it). The instance, created once before the runs
(``marin-assets instance``, which ``make home`` runs), stays usable. And the very first two runs
of an instance that ``make home`` has just prepared, started at once, both finish and leave it
usable (one schema version stamped per database).
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from marin_assets.core import specs
from marin_assets.core.runtime import stages, storage

REPO_ROOT = Path(__file__).resolve().parents[2]
SOURCE = "cp/peps"
ROUNDS = int(os.environ.get("FAULT_WRITER_ROUNDS", "2"))
BIN = Path(sys.executable).parent


def materialize(env: dict[str, str], asset: str) -> subprocess.Popen:
    return subprocess.Popen([str(BIN / "dagster"), "asset", "materialize", "-m", "marin_assets.definitions", "--select", asset,
                             "--partition", SOURCE], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip


def finished(process: subprocess.Popen) -> tuple[int, str]:
    out, _ = process.communicate(timeout=600)
    return process.returncode, out


@pytest.fixture
def demo_env(world, tmp_path):
    from marin_assets.demo.run import DEMO_ENV, demo_hub

    home = world.scratch / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO_ROOT / "dagster.yaml").read_text())
    with demo_hub(str(world.scratch / "hub")) as endpoint:
        env = {**os.environ, **DEMO_ENV, "DAGSTER_HOME": str(home), "MARIN_PREFIX": str(world.root), "HF_ENDPOINT": endpoint,
               "PYTHONPATH": str(REPO_ROOT), "MARIN_STAGING_DIR": str(world.staging)}  # fmt: skip
        env.pop("HF_TOKEN", None)
        env.pop("MARIN_CATALOG", None)
        subprocess.run([str(BIN / "marin-assets"), "instance"], env=env, check=True, timeout=300)
        yield env


def race(world, env: dict[str, str], root: str) -> dict[str, int]:
    """``ROUNDS`` pairs of runs of ``normalized`` on one partition, the output removed before each."""
    layout = storage.Layout(root)
    outcomes = {"finished": 0, "stopped naming the other run": 0}
    for _ in range(ROUNDS):
        storage.remove(specs.NORMALIZED.group_uri(layout, SOURCE), recursive=True)
        pair = [materialize(env, "normalized"), materialize(env, "normalized")]
        world.inject()
        for code, out in map(finished, pair):
            if code == 0:
                outcomes["finished"] += 1
            else:
                assert "is being written by run " in out and "OutputBusy" in out, out[-4000:]
                outcomes["stopped naming the other run"] += 1
            assert "FileNotFoundError" not in out, out[-4000:]
        current = stages.current_input(layout, specs.NORMALIZED, SOURCE)
        manifest = storage.read_manifest(current.uri)
        assert manifest["files"] and stages.damaged_files(stages.Output(current.uri, current.fingerprint), manifest, digests=True) == {}
        assert not storage.exists(storage.join(current.uri, storage.WRITING))
    assert outcomes["finished"] >= ROUNDS  # at least one of each pair
    runs = subprocess.run([str(BIN / "marin-assets"), "runs"], env=env, capture_output=True, text=True, timeout=300)
    assert runs.returncode == 0, runs.stderr[-3000:]  # the instance is usable
    return outcomes


@pytest.mark.system  # pairs of Dagster processes, ~30 s a round
def test_two_runs_of_one_partition_on_local_disk_never_tear_it(world, demo_env):
    assert finished(materialize(demo_env, "raw_files"))[0] == 0
    print(race(world, demo_env, str(world.root)))


@pytest.mark.system
def test_two_runs_of_one_partition_on_cloud_storage_never_tear_it(world, demo_env, gcs_prefix, gcs_emulator):
    env = {**demo_env, "MARIN_PREFIX": gcs_prefix, "STORAGE_EMULATOR_HOST": gcs_emulator, "FSSPEC_GCS_TOKEN": "anon",
           "FSSPEC_GCS_ENDPOINT_URL": gcs_emulator, "FSSPEC_GCS_PROJECT": "marin-test"}  # fmt: skip
    code, out = finished(materialize(env, "raw_files"))
    assert code == 0, out[-4000:]
    print(race(world, env, gcs_prefix))


def make_home(home: Path, env: dict[str, str]) -> None:
    """What ``make home`` does: a ``DAGSTER_HOME`` with the checkout's ``dagster.yaml`` (``make home``
    links it; a copy here, as a link out of the test's folder counts as a file outside it), its
    storage created once."""
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO_ROOT / "dagster.yaml").read_text())
    subprocess.run([str(BIN / "marin-assets"), "instance"], env=env, check=True, timeout=300)


def stamped_versions(home: Path) -> dict[str, int]:
    """Rows of each SQLite database's schema-version table: two make every later command fail."""
    databases = sorted(home.rglob("*.db"))
    assert databases, f"no storage under {home}"
    counts = {}
    for db in databases:
        with sqlite3.connect(db) as connection:
            counts[str(db.relative_to(home))] = connection.execute("SELECT COUNT(*) FROM alembic_version").fetchone()[0]
    return counts


@pytest.mark.system  # ROUNDS fresh instances, two Dagster processes each
def test_two_first_runs_on_a_fresh_instance_leave_it_usable(world, demo_env):
    import dagster as dg

    sources = ("cp/peps", "cp/libretexts")
    for round_ in range(ROUNDS):
        home = world.scratch / f"fresh-{round_}"
        env = {**demo_env, "DAGSTER_HOME": str(home), "MARIN_PREFIX": str(world.root / f"fresh-{round_}")}
        make_home(home, env)
        pair = [subprocess.Popen([str(BIN / "marin-assets"), "materialize", "--select", "raw_files", "--partition", source], cwd=REPO_ROOT,
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for source in sources]  # fmt: skip
        world.inject()
        for code, out in map(finished, pair):
            assert code == 0, out[-4000:]
        assert set(stamped_versions(home).values()) == {1}, stamped_versions(home)
        runs = subprocess.run([str(BIN / "marin-assets"), "runs"], env=env, capture_output=True, text=True, timeout=300)
        assert runs.returncode == 0, runs.stderr[-3000:]
        with dg.DagsterInstance.from_config(str(home)) as instance:
            records = instance.get_run_records()
            assert sorted(r.dagster_run.tags.get("dagster/partition") for r in records) == sorted(sources)
            assert {r.dagster_run.status for r in records} == {dg.DagsterRunStatus.SUCCESS}
