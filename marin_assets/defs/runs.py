"""Runs whose process died: detect them, fail them, free their pool slots.

Dagster's run monitoring frees the slots of a run that died, but only when the run launcher
can tell whether a run's worker is alive, and the ``DefaultRunLauncher`` of the embedded
default cannot: a run killed with ``kill -9`` stays STARTED and keeps its ``hf_download``
slot, so the next run waits forever. ``MonitoredRunLauncher`` is the default launcher plus
that health check (the worker's process id, recorded by Dagster in the run's first engine
event, must still run on this machine); ``dagster.yaml`` uses it, so the daemon fails a dead
run within ``run_monitoring.poll_interval_seconds`` and frees its slots
``free_slots_after_run_end_seconds`` later.

``stuck_runs`` / ``free_stuck_runs`` do the same on demand (``marin-assets runs [--free]``),
also for runs that ended but still hold slots. Without the daemon a step blocked on a pool does
it itself: ``free_dead_holders`` frees the slots of a pool held by runs whose process is gone
(the executor calls it while a step waits, see ``defs.automation.execution``).
"""

from __future__ import annotations

import dataclasses

import dagster as dg
from dagster._core.events import DagsterEventType
from dagster._core.launcher.base import CheckRunHealthResult, WorkerStatus
from dagster._core.launcher.default_run_launcher import DefaultRunLauncher
from dagster._core.storage.dagster_run import FINISHED_STATUSES, DagsterRunStatus, RunsFilter

from marin_assets.core.runtime.trust import pid_alive

ACTIVE = (DagsterRunStatus.STARTING, DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING)


def worker_pid(instance: dg.DagsterInstance, run_id: str) -> int | None:
    """The process id of a run's worker: the first engine event of the run that records one."""
    records = instance.get_records_for_run(run_id, of_type=DagsterEventType.ENGINE_EVENT, limit=50).records
    for record in records:
        event = record.event_log_entry.dagster_event
        data = getattr(event, "engine_event_data", None) if event is not None else None
        pid = (getattr(data, "metadata", None) or {}).get("pid")
        if pid is not None:
            try:
                return int(getattr(pid, "value", pid))
            except (TypeError, ValueError):
                continue
    return None


def worker_status(instance: dg.DagsterInstance, run: dg.DagsterRun) -> CheckRunHealthResult:
    pid = worker_pid(instance, run.run_id)
    if pid is None:  # not started yet, or started elsewhere: nothing to tell
        return CheckRunHealthResult(WorkerStatus.RUNNING, "no worker process recorded yet")
    if pid_alive(pid):
        return CheckRunHealthResult(WorkerStatus.RUNNING, f"worker process {pid} is running", run_worker_id=str(pid))
    return CheckRunHealthResult(
        WorkerStatus.FAILED, f"the run's worker process {pid} is gone (killed or crashed)", run_worker_id=str(pid)
    )


class MonitoredRunLauncher(DefaultRunLauncher):
    """The default run launcher, plus the worker health check that run monitoring needs."""

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: dg.DagsterRun) -> CheckRunHealthResult:
        return worker_status(self._instance, run)


@dataclasses.dataclass(frozen=True)
class StuckRun:
    run_id: str
    job_name: str
    status: str
    reason: str
    slots: int


def _slots_by_run(instance: dg.DagsterInstance) -> dict[str, int]:
    storage = instance.event_log_storage
    if not storage.supports_global_concurrency_limits:
        return {}
    counts: dict[str, int] = {}
    for pool in storage.get_concurrency_keys():
        for slot in storage.get_concurrency_info(pool).claimed_slots:
            counts[slot.run_id] = counts.get(slot.run_id, 0) + 1
    return counts


def stuck_runs(instance: dg.DagsterInstance) -> list[StuckRun]:
    """Active runs whose worker is gone, and finished runs that still hold pool slots."""
    slots = _slots_by_run(instance)
    found = []
    for record in instance.get_run_records(RunsFilter(statuses=list(ACTIVE))):
        run = record.dagster_run
        health = worker_status(instance, run)
        if health.status == WorkerStatus.FAILED:
            found.append(StuckRun(run.run_id, run.job_name, run.status.value, health.msg or "", slots.get(run.run_id, 0)))
    finished = instance.get_run_records(RunsFilter(run_ids=list(slots), statuses=list(FINISHED_STATUSES))) if slots else []
    for record in finished:
        run = record.dagster_run
        found.append(StuckRun(run.run_id, run.job_name, run.status.value, "ended but still holds pool slots", slots[run.run_id]))
    return found


def free_stuck_runs(instance: dg.DagsterInstance) -> list[StuckRun]:
    """Mark every stuck active run failed and free the pool slots of all stuck runs."""
    stuck = stuck_runs(instance)
    for item in stuck:
        run = instance.get_run_by_id(item.run_id)
        if run is not None and run.status in ACTIVE:
            instance.report_run_failed(run, f"marin-assets runs --free: {item.reason}; marked failed, its pool slots freed")
        if instance.event_log_storage.supports_global_concurrency_limits:
            instance.event_log_storage.free_concurrency_slots_for_run(item.run_id)
    return stuck


def free_dead_holders(instance: dg.DagsterInstance, pool: str, waiting_run_id: str) -> list[StuckRun]:
    """Free the slots of ``pool`` held by runs whose worker process is gone (failing them) or that ended.

    Only where run workers are processes of this machine (the default launcher): a process id
    recorded elsewhere says nothing here, and there the launcher's own health check applies.
    """
    storage = instance.event_log_storage
    if not isinstance(instance.run_launcher, DefaultRunLauncher) or not storage.supports_global_concurrency_limits:
        return []
    holders: dict[str, int] = {}
    for slot in storage.get_concurrency_info(pool).claimed_slots:
        if slot.run_id != waiting_run_id:
            holders[slot.run_id] = holders.get(slot.run_id, 0) + 1
    freed = []
    for record in instance.get_run_records(RunsFilter(run_ids=list(holders))) if holders else []:
        run = record.dagster_run
        if run.status in ACTIVE:
            health = worker_status(instance, run)
            if health.status != WorkerStatus.FAILED:
                continue
            reason = health.msg or "worker process gone"
            instance.report_run_failed(run, f"run {waiting_run_id} waits for pool '{pool}': {reason}; marked failed, its pool slots freed")
        elif run.status in FINISHED_STATUSES:
            reason = "ended but still held pool slots"
        else:
            continue
        storage.free_concurrency_slots_for_run(run.run_id)
        freed.append(StuckRun(run.run_id, run.job_name, run.status.value, reason, holders[run.run_id]))
    return freed


def format_stuck(stuck: list[StuckRun], freed: bool) -> str:
    if not stuck:
        return "no stuck runs: every active run's process is alive and no finished run holds a pool slot"
    lines = [f"{'freed' if freed else 'stuck'}: {len(stuck)} run(s)"]
    for item in stuck:
        lines.append(f"  {item.run_id}  {item.job_name}  {item.status}  slots={item.slots}  {item.reason}")
    if not freed:
        lines.append("free them with: marin-assets runs --free")
    return "\n".join(lines)


def start_retry_cursors(instance: dg.DagsterInstance) -> None:
    """What the daemon's run-retry consumer (``run_retries`` in ``dagster.yaml``) does on its
    first start, without its warning: each event type it follows starts at the newest event,
    so no run that ended before is retried. Cursors already set are left alone."""
    from dagster._daemon.auto_run_reexecution.event_log_consumer import DAGSTER_EVENT_TYPES, _create_cursor_key

    keys = {_create_cursor_key(event_type) for event_type in DAGSTER_EVENT_TYPES}
    missing = keys - set(instance.daemon_cursor_storage.get_cursor_values(keys))
    if missing:
        newest = str(instance.event_log_storage.get_maximum_record_id() or 0)
        instance.daemon_cursor_storage.set_cursor_values(dict.fromkeys(missing, newest))
