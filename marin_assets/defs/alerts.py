"""Alerts: a failed run or a failed check reaches a person without anyone looking.

Two sensors read the instance's event log from their cursor on every tick (``MARIN_ALERT_INTERVAL_S``,
30 s): ``run_failures`` each failed run, ``check_failures`` each failed check that blocks
(``blocking`` or severity ERROR; warnings stay in the UI). Each alert names the run, the assets
and partition, and the cause (the innermost error's message, or the check's description), and
goes to the sink the ``alerts`` resource names: an HTTP POST of the alert as JSON to
``MARIN_ALERT_WEBHOOK``, and/or ``MARIN_ALERT_COMMAND`` run with the JSON on stdin. A sink that
fails fails the tick (shown in the UI) and the cursor stays, so the alert is sent again on the
next tick. With no sink set, the tick's message lists what it would have sent. The first tick
records where the log ends: history is not replayed. Both start running: they launch nothing.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import dagster as dg
import requests
from dagster._core.event_api import RunStatusChangeRecordsFilter
from dagster._core.events import DagsterEventType

from marin_assets.defs.resources import AlertResource
from marin_assets.defs.settings import defs_setting_number

ALERT_INTERVAL_S = max(1, int(defs_setting_number("MARIN_ALERT_INTERVAL_S", 30)))
BATCH = 100  # events read per tick at most; the rest on the next tick


def innermost_cause(error: Any) -> str:
    """The message of the error that started it all (a step's user error wraps the real one)."""
    while error is not None and getattr(error, "cause", None) is not None:
        error = error.cause
    if error is None:
        return "unknown cause"
    first = (error.message.strip().splitlines() or [error.cls_name or "unknown cause"])[0]
    head, sep, rest = first.partition(": ")  # "module.Class: message" -> "message"
    return rest if sep and head.split(".")[-1] == error.cls_name else first


def run_failure_alert(instance: dg.DagsterInstance, run_id: str, run_message: str) -> dict[str, Any]:
    """What a person needs about a failed run: which run, which assets and partition, and why."""
    run = instance.get_run_by_id(run_id)
    failures = instance.all_logs(run_id, of_type=DagsterEventType.STEP_FAILURE)
    steps = [(e.dagster_event.step_key, innermost_cause(e.dagster_event.step_failure_data.error)) for e in failures if e.dagster_event]
    selected = sorted(k.to_user_string() for k in (run.asset_selection or [])) if run else []
    return {
        "kind": "run_failure",
        "run_id": run_id,
        "job": run.job_name if run else "",
        # an asset step's key is its asset key (path joined by "__"); a run that failed before any step names its selection
        "assets": [key.replace("__", "/") for key, _ in steps] or selected,
        "partition": (run.tags.get("dagster/partition") if run else None) or "",
        "cause": "; ".join(f"{key}: {cause}" for key, cause in steps) or run_message,
    }


def check_failure_alerts(instance: dg.DagsterInstance, run_id: str) -> list[dict[str, Any]]:
    """Every failed blocking check of a run (blocking checks run inside runs, never runless)."""
    run = instance.get_run_by_id(run_id)
    alerts = []
    for entry in instance.all_logs(run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION):
        evaluation = entry.dagster_event.event_specific_data
        if evaluation.passed or not (evaluation.blocking or evaluation.severity == dg.AssetCheckSeverity.ERROR):
            continue
        alerts.append({
            "kind": "check_failure",
            "run_id": run_id,
            "assets": [evaluation.asset_key.to_user_string()],
            "check": evaluation.check_name,
            "partition": (run.tags.get("dagster/partition") if run else None) or "",
            "cause": evaluation.description or f"check {evaluation.check_name} failed",
        })
    return alerts


def deliver(alert: dict[str, Any], sink: AlertResource) -> None:
    """Send one alert to every configured sink; raise if one refuses it."""
    body = json.dumps(alert, sort_keys=True)
    if webhook := sink.resolved("webhook"):
        response = requests.post(webhook, data=body, headers={"Content-Type": "application/json"}, timeout=10)
        response.raise_for_status()
    if command := sink.resolved("command"):
        done = subprocess.run(command, shell=True, input=body, text=True, capture_output=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"MARIN_ALERT_COMMAND exited {done.returncode}: {done.stderr.strip()[-500:]}")


def summary(alert: dict[str, Any]) -> str:
    what = alert.get("check") or alert.get("job") or "run"
    where = ", ".join(alert["assets"]) + (f" [{alert['partition']}]" if alert["partition"] else "")
    return f"{alert['kind']} {what} ({where}) run {alert['run_id']}: {alert['cause']}"


def ended_runs(instance: dg.DagsterInstance, ends: tuple[DagsterEventType, ...], after: int | None) -> list[Any]:
    """Run-end records after storage id ``after`` (None: only the newest), oldest first, up to a
    storage id every type was read to (so a batch cut short by ``BATCH`` loses nothing)."""
    batches = [instance.fetch_run_status_changes(RunStatusChangeRecordsFilter(event_type=end, after_storage_id=after),
                                                 limit=BATCH if after is not None else 1, ascending=after is not None).records
               for end in ends]  # fmt: skip
    bound = min((b[-1].storage_id for b in batches if len(b) == BATCH), default=None)
    records = sorted((r for b in batches for r in b), key=lambda r: r.storage_id)
    return [r for r in records if bound is None or r.storage_id <= bound]


def alert_sensor(name: str, ends: tuple[DagsterEventType, ...], describe: str, alerts_of: Any) -> dg.SensorDefinition:
    """A sensor that sends ``alerts_of(instance, run_id)`` for each run that ended (``ends``) since its cursor."""

    @dg.sensor(name=name, minimum_interval_seconds=ALERT_INTERVAL_S, default_status=dg.DefaultSensorStatus.RUNNING,
               description=f"Every {ALERT_INTERVAL_S} s: sends {describe} to MARIN_ALERT_WEBHOOK / MARIN_ALERT_COMMAND (docs/operations.md).")  # fmt: skip
    def _sensor(context: dg.SensorEvaluationContext, alerts: AlertResource) -> dg.SkipReason:
        if context.cursor is None:
            latest = ended_runs(context.instance, ends, None)
            context.update_cursor(str(max((r.storage_id for r in latest), default=0)))
            return dg.SkipReason("baseline recorded: alerts start from here")
        sent = []
        for record in ended_runs(context.instance, ends, int(context.cursor)):
            for alert in alerts_of(context.instance, record.run_id):
                if alerts.configured():
                    deliver(alert, alerts)
                context.log.warning(summary(alert))
                sent.append(summary(alert))
            context.update_cursor(str(record.storage_id))  # delivered: not sent again
        if not sent:
            return dg.SkipReason("nothing failed since the last tick")
        where = "sent" if alerts.configured() else "not sent (set MARIN_ALERT_WEBHOOK or MARIN_ALERT_COMMAND)"
        return dg.SkipReason(f"{len(sent)} alert(s) {where}: " + " | ".join(sent))

    return _sensor


def _run_alerts(instance: dg.DagsterInstance, run_id: str) -> list[dict[str, Any]]:
    failure = instance.all_logs(run_id, of_type=DagsterEventType.RUN_FAILURE)
    message = failure[-1].dagster_event.message if failure and failure[-1].dagster_event else None
    return [run_failure_alert(instance, run_id, message or "run failed")]


ALERT_SENSORS = [
    alert_sensor("run_failures", (DagsterEventType.RUN_FAILURE,), "each failed run (run id, assets, partition, cause)", _run_alerts),
    alert_sensor("check_failures", (DagsterEventType.RUN_SUCCESS, DagsterEventType.RUN_FAILURE),
                 "each failed blocking check of a run that ended (run id, asset, check, cause)", check_failure_alerts),
]
