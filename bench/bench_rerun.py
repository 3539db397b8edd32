"""Re-running an unchanged partition: the embedded default (in-process executor) against
Dagster's multiprocess executor, as a run worker runs it.

Each run is a fresh process, like the run worker the daemon's launcher starts: it imports the
code location and executes the ``source_chain`` job for one demo partition on a real SQLite
instance (``dg.execute_job`` of a reconstructable job, so the multiprocess executor really
starts a process per step). The partition is built once first; every timed run reuses its
outputs. Runs are interleaved A B A B; the median and range are printed.

Then the same re-run through the daemon, as a user launches it: ``dagster-daemon run`` on the
project's workspace.yaml and the embedded default instance (queued run coordinator, the
monitored default launcher); each round submits the run with ``dagster job launch`` and reads
from the run record when it was queued, started (the run worker has loaded the code) and
finished. The median and range of queued -> finished are printed with their two parts.

Goal: the embedded default re-runs an unchanged partition in seconds (< 20 s) and faster than
multiprocess, and through the daemon in < 30 s (queueing, the run worker's start and code load
included).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench import harness

REPO = Path(__file__).resolve().parents[1]
SOURCE = "cp/peps"
ROUNDS = int(os.environ.get("BENCH_RERUN_ROUNDS", "1" if os.environ.get("BENCH_QUICK") else "3"))
GOAL_S = 20.0
DAEMON_GOAL_S = 30.0

CHILD = """
import sys, dagster as dg
from dagster._core.definitions.reconstruct import ReconstructableRepository
job = ReconstructableRepository.for_module("marin_assets.definitions", "defs").get_reconstructable_job("source_chain")
with dg.DagsterInstance.get() as instance:
    result = dg.execute_job(job, instance=instance, tags={"dagster/partition": sys.argv[1]}, raise_on_error=True)
    assert result.success
"""


def run(env: dict[str, str], executor: str) -> float:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CHILD, SOURCE], cwd=REPO, env={**env, "MARIN_EXECUTOR": executor}, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{executor} run failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - started


def through_daemon(env: dict[str, str], home: Path, root: Path) -> list[dict[str, float]]:
    """``ROUNDS`` re-runs submitted to a running daemon; per run: total, launch and steps seconds."""
    import dagster as dg

    exe = Path(sys.executable).with_name
    out: list[dict[str, float]] = []
    with open(root / "daemon.log", "wb") as log:
        daemon = subprocess.Popen([str(exe("dagster-daemon")), "run", "-w", str(REPO / "workspace.yaml")], cwd=REPO, env=env,
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        try:
            with dg.DagsterInstance.from_config(str(home)) as instance:
                for _ in range(ROUNDS):
                    run_id = str(uuid.uuid4())
                    subprocess.run([str(exe("dagster")), "job", "launch", "-w", str(REPO / "workspace.yaml"), "-j", "source_chain", "--run-id", run_id,
                                    "--tags", json.dumps({"dagster/partition": SOURCE})], cwd=REPO, env=env, check=True, capture_output=True)  # fmt: skip
                    deadline = time.monotonic() + 600
                    while True:
                        record = instance.get_run_record_by_id(run_id)
                        if record is not None and record.dagster_run.is_finished:
                            break
                        if time.monotonic() > deadline or daemon.poll() is not None:
                            raise SystemExit(f"run {run_id} did not finish through the daemon; see {root / 'daemon.log'}")
                        time.sleep(0.5)
                    if record.dagster_run.status != dg.DagsterRunStatus.SUCCESS:
                        raise SystemExit(f"run {run_id} ended {record.dagster_run.status}")
                    queued = record.create_timestamp.timestamp()
                    starting = min((e.timestamp for e in instance.all_logs(run_id, of_type=dg.DagsterEventType.RUN_STARTING)), default=queued)
                    out.append({"total": record.end_time - queued, "dequeue": starting - queued, "load": record.start_time - starting, "steps": record.end_time - record.start_time})
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(daemon.pid, signal.SIGTERM)
            daemon.wait(timeout=60)
    return out


def main() -> int:
    from marin_assets.demo.run import DEMO_ENV, demo_hub

    with tempfile.TemporaryDirectory(prefix="bench_rerun_") as root, demo_hub(os.path.join(root, "hub")) as endpoint:
        home = Path(root, "home")
        home.mkdir()
        (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
        env = {**os.environ, **DEMO_ENV, "DAGSTER_HOME": str(home), "MARIN_PREFIX": os.path.join(root, "data"), "HF_ENDPOINT": endpoint, "PYTHONPATH": str(REPO)}
        env.pop("HF_TOKEN", None)
        env.pop("MARIN_CATALOG", None)
        print(f"building {SOURCE}'s source_chain once ...", file=sys.stderr, flush=True)
        run(env, "in_process")
        times: dict[str, list[float]] = {"in_process": [], "multiprocess": []}
        for _ in range(ROUNDS):
            for executor in times:  # interleaved A B A B
                times[executor].append(run(env, executor))
        daemon = through_daemon(env, home, Path(root))
    for executor, values in times.items():
        print(f"unchanged {SOURCE} source_chain re-run, {executor:12s}: median {statistics.median(values):.1f} s (range {min(values):.1f}-{max(values):.1f} s, {len(values)} runs, run-worker process included)")
    default, multi = statistics.median(times["in_process"]), statistics.median(times["multiprocess"])
    print(f"ratio multiprocess / in_process: {multi / default:.2f}x")
    total = [d["total"] for d in daemon]
    parts = (("total", "queued -> finished"), ("dequeue", "queued -> launched (the daemon's dequeue)"),
             ("load", "launched -> started (run worker process, imports, code location load)"), ("steps", "started -> finished (11 steps and checks)"))  # fmt: skip
    for key, what in parts:
        values = [d[key] for d in daemon]
        print(f"unchanged {SOURCE} source_chain through the daemon, {what}: median {statistics.median(values):.1f} s (range {min(values):.1f}-{max(values):.1f} s, {len(values)} runs)")
    through = statistics.median(total)
    met_daemon = through < DAEMON_GOAL_S
    goal_daemon = f"an unchanged partition re-runs through the daemon in < {DAEMON_GOAL_S:.0f} s"
    goal = f"embedded default (in_process) re-runs an unchanged partition in < {GOAL_S:.0f} s and faster than multiprocess"
    harness.absolute_goal(goal, f"{default:.1f} s vs {multi:.1f} s ({multi / default:.2f}x)", default < GOAL_S and default < multi)
    harness.absolute_goal(goal_daemon, f"{through:.1f} s [{min(total):.1f}..{max(total):.1f}]", met_daemon)
    return 0


if __name__ == "__main__":
    sys.exit(harness.exit_status(main()))
