"""Followed runs: each run trained to its end (in process, as Ray tasks, or through the launcher's
submit and status templates), a failing one retried up to the limit and then named with its causes,
results written where the study reads them."""

from __future__ import annotations

import json
import sys

import pytest

from marin_assets.core.mixture import jobs, launcher, results
from marin_assets_tests.core.mixture import standin_trainer

TRAINER = "marin_assets_tests.core.mixture.standin_trainer:train_run"


def _config(rid: str, fail_attempts: int = 0, seed: int = 0) -> dict:
    return {"run_id": rid, "mixture_id": f"m{rid}", "seed": seed, "experiment_budget": 1e4, "fail_attempts": fail_attempts}


def _jobs() -> list[jobs.ProxyJob]:
    return [jobs.ProxyJob("r0000", _config("r0000")), jobs.ProxyJob("r0001", _config("r0001", fail_attempts=1), seed=2),
            jobs.ProxyJob("r0002", _config("r0002", fail_attempts=99), size="big")]


def _check(report: jobs.FollowReport, tmp_path) -> None:
    assert sorted(report.finished) == ["r0000", "r0001"] and report.attempts == {"r0000": 1, "r0001": 2, "r0002": 3}
    assert report.finished["r0001"]["macro_bpb"] == pytest.approx(2.02)  # the job's seed reached the trainer
    assert list(report.failed) == ["r0002"] and len(report.failed["r0002"]) == 3
    assert "RuntimeError: worker lost its device on attempt 3" in report.failed["r0002"][-1]
    assert "r0002 failed 3 time(s)" in report.describe_failures()
    found = results.read_results(str(tmp_path))
    assert results.final_metrics(results.rows_for_run(found, "r0001", "mr0001").rows) == {"bpb/web": 2.1, "macro_bpb": pytest.approx(2.02)}
    assert found.conflicts == {} and "r0002" not in found.rows["run_id"].to_list()


def test_runs_in_process_are_retried_then_named(tmp_path) -> None:
    events = []
    report = jobs.follow(_jobs(), TRAINER, str(tmp_path), retries=2, on_event=lambda *e: events.append(e))
    _check(report, tmp_path)
    assert ("failed", "r0001", 1) == events[3][:3] and events[-1][:3] == ("gave_up", "r0002", 3)


def test_a_rerun_rewrites_a_run_s_results_without_duplicates(tmp_path) -> None:
    config = _config("r0000")
    jobs.write_results(str(tmp_path), config, {"macro_bpb": 3.0})
    jobs.write_results(str(tmp_path), config, {"macro_bpb": 2.5})
    found = results.read_results(str(tmp_path))
    assert found.rows.height == 1 and results.final_metrics(found.rows) == {"macro_bpb": 2.5}


def test_a_trainer_path_that_does_not_load_is_refused_before_anything_runs(tmp_path) -> None:
    with pytest.raises(jobs.TrainerError, match="importable 'module:function'"):
        jobs.follow(_jobs(), "marin_assets_tests.core.mixture.standin_trainer:nope", str(tmp_path))


@pytest.mark.system  # starts a local Ray cluster
def test_runs_as_ray_tasks_on_a_local_cluster(tmp_path) -> None:
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    try:
        _check(jobs.follow(_jobs(), TRAINER, str(tmp_path), ray_address="local", retries=2), tmp_path)
    finally:
        ray.shutdown()


def test_the_launcher_follows_a_standin_trainer_retries_and_names_the_failure(tmp_path) -> None:
    """Submit and status templates drive a stand-in cluster: each run trains in its own process."""
    script = standin_trainer.__file__
    paths = {}
    for job in _jobs():
        path = tmp_path / f"{job.run_id}.json"
        path.write_text(json.dumps(job.config))
        paths[job.run_id] = str(path)
    out = tmp_path / "results"
    out.mkdir()
    events = []
    report = launcher.follow(f"{sys.executable} {script} submit {{config}} {{run_id}} {{results}}", f"{sys.executable} {script} status {{run_id}} {{results}}",
                             paths, study="s", results=str(out), retries=2, poll_s=0.05, on_event=lambda *e: events.append(e))
    assert sorted(report.finished) == ["r0000", "r0001"] and report.attempts == {"r0000": 1, "r0001": 2, "r0002": 3}
    assert report.failed == {"r0002": [f"worker lost its device on attempt {n}" for n in (1, 2, 3)]}
    assert ("gave_up", "r0002", 3, "worker lost its device on attempt 3") in events
    found = results.read_results(str(out))
    assert sorted(set(found.rows["run_id"].to_list())) == ["r0000", "r0001"]


def test_a_status_without_a_json_state_is_unknown_and_counts_as_a_failure(tmp_path) -> None:
    state = launcher.status(f"{sys.executable} -c \"print('queued')\"", config="c", run_id="r", study="s", results="x")
    assert state["state"] == "unknown" and "without a JSON state" in state["detail"]
    report = launcher.follow(f"{sys.executable} -c \"print('ok')\"", f"{sys.executable} -c \"print('queued')\"", {"r0": "c"}, study="s",
                             results=str(tmp_path), retries=1, poll_s=0.0, max_unknown=2)
    assert report.attempts == {"r0": 2} and len(report.failed["r0"]) == 2
