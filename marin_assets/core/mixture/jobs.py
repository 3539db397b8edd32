"""Proxy and validation runs as jobs: each run one Ray task with its resources (or, without a
cluster, one call in this process), followed to its end, retried a bounded number of times,
its results written where the study reads them.

A trainer is a function ``train_run(config, results_dir, size=..., seed=...) -> metrics``:
``config`` the run's trainer config (a dict, as the swarm writes it), ``results_dir`` the
study's ``results/`` folder, ``size`` a name on the trainer's model-size ladder (``""``: the
proxy's own size), ``seed`` the run's seed; it returns the run's final metrics (``macro_bpb``,
``bpb/<domain>``...). It may write its own rows for earlier steps to
``<results_dir>/<run_id>.jsonl``; once it returns, that file is rewritten with the final step, so
a retried run never leaves two results for one step. The trainer is named by an importable
``module:function`` path, so a Ray worker on another machine loads it from its own install.

:func:`follow` keeps every run submitted, waits for each to end, submits a failed run again
until it has had ``1 + retries`` attempts, and names every run that failed for good with the
cause of each attempt; one failed run never stops the others. ``on_event`` sees every start,
failure and finish (how an orchestrator logs progress; core never knows who listens).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from marin_assets.core.runtime import storage
from marin_assets.errors import ConfigurationError
from marin_assets.core.runtime.runner import TaskResources, connect_ray

CAUSE_CHARS = 600


class TrainerError(ConfigurationError, ValueError):
    """A trainer path that cannot be loaded; the message names the fix."""


@dataclasses.dataclass(frozen=True)
class ProxyJob:
    """One run to train: its config, ladder size, seed and what its task reserves."""

    run_id: str
    config: Mapping[str, Any]
    size: str = ""
    seed: int = 0
    resources: TaskResources = TaskResources()


@dataclasses.dataclass
class FollowReport:
    """Final metrics of the runs that finished, the causes of every failed attempt, attempts per run."""

    finished: dict[str, dict[str, float]]
    failed: dict[str, list[str]]  # runs that failed for good -> cause of each attempt
    attempts: dict[str, int]

    def describe_failures(self) -> str:
        return "; ".join(f"{rid} failed {len(causes)} time(s), last: {causes[-1]}" for rid, causes in sorted(self.failed.items()))


def load_trainer(path: str) -> Callable[..., Mapping[str, float]]:
    """``module:function`` -> the function."""
    module, _, name = path.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise TrainerError(f"trainer {path!r} cannot be loaded ({exc}); give an importable 'module:function'") from exc


def results_rows(config: Mapping[str, Any], metrics: Mapping[str, float], step: int) -> list[dict[str, Any]]:
    """``metrics`` as rows of the results schema at ``step`` (tokens: the run's budget)."""
    tokens = float(config.get("experiment_budget", 0.0))
    return [{"run_id": config["run_id"], "mixture_id": config["mixture_id"], "step": step, "tokens": tokens, "metric": m, "value": float(v)}
            for m, v in sorted(metrics.items())]


def write_results(results_dir: str, config: Mapping[str, Any], metrics: Mapping[str, float]) -> str:
    """The run's results file (``<run_id>.jsonl``), rewritten: the trainer's own rows of this
    mixture, the final metrics at its last reported step (replacing what it wrote there)."""
    uri = storage.join(results_dir, f"{config['run_id']}.jsonl")
    earlier = storage.read_bytes(uri).decode("utf-8", errors="replace").splitlines() if storage.exists(uri) else []
    rows = [r for r in (_json_or_none(line) for line in earlier) if isinstance(r, dict) and r.get("mixture_id") == config["mixture_id"]]
    steps = [int(r["step"]) for r in rows if isinstance(r.get("step"), int)]
    final = results_rows(config, metrics, max(steps) if steps else 1)
    kept = [r for r in rows if r.get("metric") not in metrics or r.get("step") != final[0]["step"]]
    storage.write_bytes(uri, "".join(json.dumps(r, sort_keys=True) + "\n" for r in [*kept, *final]).encode())
    return uri


def _json_or_none(line: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None


def run_job(trainer: str, job: ProxyJob, results_dir: str) -> dict[str, float]:
    """One attempt of one run (in a Ray worker or here): train, check the metrics, write them."""
    metrics = {str(k): float(v) for k, v in dict(load_trainer(trainer)(dict(job.config), results_dir, size=job.size, seed=job.seed)).items()}
    bad = sorted(k for k, v in metrics.items() if not math.isfinite(v))
    if not metrics or bad:
        raise ValueError(f"trainer returned {'no metrics' if not metrics else f'non-finite {bad}'} for run {job.run_id}")
    write_results(results_dir, job.config, metrics)
    return metrics


def _cause(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None)  # a Ray task error carries the task's own exception
    exc = cause if isinstance(cause, BaseException) else exc
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return text[-CAUSE_CHARS:]


Event = Callable[[str, str, int, str], None]  # (kind: started/failed/finished/gave_up, run id, attempt, detail)


def follow(jobs: Sequence[ProxyJob], trainer: str, results_dir: str, *, ray_address: str | None = None, retries: int = 2,
           on_event: Event | None = None, local_cpus: int = 0) -> FollowReport:
    """Train every job to its end (Ray tasks on ``ray_address``, else here, one after another)."""
    load_trainer(trainer)  # a bad path fails before anything is submitted
    fs, path = storage.filesystem(results_dir)
    fs.makedirs(path, exist_ok=True)  # where the trainer may write its own rows
    emit = on_event or (lambda *_: None)
    report = FollowReport({}, {}, {})
    causes: dict[str, list[str]] = {j.run_id: [] for j in jobs}
    if not ray_address:
        for job in jobs:
            for attempt in range(1, retries + 2):
                report.attempts[job.run_id] = attempt
                emit("started", job.run_id, attempt, "in process")
                try:
                    report.finished[job.run_id] = run_job(trainer, job, results_dir)
                except Exception as exc:  # noqa: BLE001 -- every cause is recorded by run id
                    causes[job.run_id].append(_cause(exc))
                    emit("failed", job.run_id, attempt, causes[job.run_id][-1])
                    continue
                emit("finished", job.run_id, attempt, "")
                break
        report.failed = {r: c for r, c in causes.items() if r not in report.finished}
        for rid in report.failed:
            emit("gave_up", rid, report.attempts[rid], report.failed[rid][-1])
        return report
    ray = connect_ray(ray_address, local_cpus)
    remote = ray.remote(run_job)

    def submit(job: ProxyJob) -> Any:
        report.attempts[job.run_id] = report.attempts.get(job.run_id, 0) + 1
        emit("started", job.run_id, report.attempts[job.run_id], f"Ray task {job.resources.ray_options()}")
        return remote.options(max_retries=0, **job.resources.ray_options()).remote(trainer, job, results_dir)

    pending = {submit(job): job for job in jobs}
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                job = pending.pop(ref)
                attempt = report.attempts[job.run_id]
                try:
                    report.finished[job.run_id] = ray.get(ref)
                except Exception as exc:  # noqa: BLE001 -- a task error or a lost worker: recorded, retried
                    causes[job.run_id].append(_cause(exc))
                    emit("failed", job.run_id, attempt, causes[job.run_id][-1])
                    if attempt <= retries:
                        pending[submit(job)] = job
                    else:
                        report.failed[job.run_id] = causes[job.run_id]
                        emit("gave_up", job.run_id, attempt, causes[job.run_id][-1])
                    continue
                emit("finished", job.run_id, attempt, "")
    finally:
        for ref in pending:
            ray.cancel(ref)
    return report
