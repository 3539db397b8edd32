"""The scheduled pin-drift sensor and the checks it reports on ``source_pins``.

Each tick asks the provider about the next few pins (a cursor walks the catalog, so a tick's
time stays bounded however many sources there are) and records, per source, a result of that
source's check ``pin_drift_<source>`` on ``source_pins`` (one check per source, so the
asset's Checks tab lists every source with its last verdict), plus ``pin_drift_summary`` over
the last known state of every pin. It never edits the catalog and never launches a run.

Pace: every pin is checked at least once per ``MARIN_DRIFT_PERIOD_S`` (86400, daily). A tick
checks ``ceil(pins x seconds since the last tick / period)`` pins, at most ``MARIN_DRIFT_BATCH``
(10) and within ``MARIN_DRIFT_BUDGET_S`` (30 s); ticks come every ``MARIN_DRIFT_INTERVAL_S``
(600). With 146 pins that is 1-2 pins (2-4 provider requests) per 10-minute tick.
"""

import datetime as dt
import hashlib
import json
import math
import re
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import dagster as dg

from marin_assets.core.ingest import drift
from marin_assets.defs.automation.sensors import SOURCE_PINS, default_status
from marin_assets.defs.metadata import markdown_table
from marin_assets.defs.partitions import source_partitions
from marin_assets.defs.resources import MarinResource
from marin_assets.defs.settings import defs_setting_number

DRIFT_PREFIX = "pin_drift_"
SUMMARY_CHECK = "pin_drift_summary"
UNREACHABLE = "the provider is unreachable"


def drift_check_names(names: Iterable[str]) -> dict[str, str]:
    """Check name per source: ``pin_drift_`` + the name with every other character as ``_``
    (a short hash is appended when two names would collide)."""
    out: dict[str, str] = {}
    taken = {SUMMARY_CHECK}
    for name in sorted(names):
        check = DRIFT_PREFIX + re.sub(r"[^A-Za-z0-9_]", "_", name)
        if check in taken:
            check += "_" + hashlib.sha1(name.encode()).hexdigest()[:6]
        taken.add(check)
        out[name] = check
    return out


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def drift_verdict(report: drift.PinReport) -> dict[str, Any]:
    """A report as keyword arguments of a check result/evaluation."""
    severity = dg.AssetCheckSeverity.ERROR if report.status in drift.BROKEN else dg.AssetCheckSeverity.WARN
    return dict(
        passed=report.status == drift.OK,
        severity=severity,
        description=f"{report.status}: {report.detail}",
        metadata={
            "status": report.status,
            "pin": report.pin,
            "resolved": report.resolved or "",
            "branch": report.branch,
            "branch_head": report.branch_head or "",
            "gated": "unknown" if report.gated is None else str(report.gated).lower(),
        },
    )


def summary_verdict(statuses: dict[str, dict[str, Any]], total_pins: int) -> dict[str, Any]:
    """``pin_drift_summary`` from the last known status of every checked pin."""
    counts = Counter(s["status"] for s in statuses.values())
    broken = sorted(n for n, s in statuses.items() if s["status"] in drift.BROKEN)
    attention = sorted(n for n, s in statuses.items() if s["status"] in drift.ATTENTION)
    rows = [
        {"source": n, "status": s["status"], "checked": s["checked"], "detail": s["detail"]}
        for n, s in sorted(statuses.items()) if s["status"] != drift.OK
    ]  # fmt: skip
    return dict(
        passed=not broken and not attention,
        severity=dg.AssetCheckSeverity.ERROR if broken else dg.AssetCheckSeverity.WARN,
        description=(
            f"{len(statuses)} of {total_pins} pins checked so far: "
            + ", ".join(f"{counts[k]} {k}" for k in sorted(counts))
        ),
        metadata={
            **{f"pins_{k.replace('-', '_')}": counts[k] for k in sorted(counts)},
            "pins_known": len(statuses),
            "pins_total": total_pins,
            "not_ok": markdown_table(rows, ["source", "status", "checked", "detail"]),
        },
    )


def _walk(names: Sequence[str], after: str) -> list[str]:
    """Names in catalog order starting after ``after`` and wrapping around."""
    start = next((i for i, n in enumerate(names) if n > after), 0) if after else 0
    return list(names[start:]) + list(names[:start])


def check_batch(sources: Iterable[Any], batch: int, budget_s: float, layout: Any = None,
                access: Any = None) -> tuple[list[drift.PinReport], str | None]:  # fmt: skip
    """Check up to ``batch`` pins within ``budget_s``; stop early when a provider is unreachable.

    Returns the reports and why the walk stopped early (``None`` if it did not).
    """
    started = time.monotonic()
    reports: list[drift.PinReport] = []
    asked = 0
    for source in sources:
        if asked >= batch:
            return reports, None
        if time.monotonic() - started > budget_s:
            return reports, f"time budget of {budget_s:.0f}s used"
        report = drift.check_source_pin(source, layout=layout, **({"access": access} if access is not None else {}))
        reports.append(report)
        if report.status != drift.NOT_CHECKED:
            asked += 1
        if report.network_failure:
            return reports, UNREACHABLE
    return reports, None


def pins_per_tick(total: int, elapsed_s: float, period_s: float, cap: int) -> int:
    """Pins to check on a tick so that ``total`` pins are covered once per ``period_s``."""
    if total <= 0:
        return 0
    return max(1, min(cap, math.ceil(total * max(elapsed_s, 0.0) / max(period_s, 1.0))))


INTERVAL_S = int(defs_setting_number("MARIN_DRIFT_INTERVAL_S", 600))


@dg.sensor(
    name="pin_drift",
    minimum_interval_seconds=INTERVAL_S,
    default_status=default_status(),
    description=(
        "Checks every pin at least once a day (MARIN_DRIFT_PERIOD_S), a few per tick: is the pinned "
        "revision still served, did its branch move, is the repo now gated or gone. Records check "
        "results on source_pins; never changes a pin, never launches a run."
    ),
)
def pin_drift(context: dg.SensorEvaluationContext, marin: MarinResource) -> dg.SensorResult:
    cap = int(defs_setting_number("MARIN_DRIFT_BATCH", 10))
    budget = defs_setting_number("MARIN_DRIFT_BUDGET_S", 30)
    period = defs_setting_number("MARIN_DRIFT_PERIOD_S", 86400)
    catalog = marin.catalog()
    partitions = set(source_partitions.get_partition_keys())
    sources = [s for s in catalog if s.name in partitions]
    total = len(sources)
    checks = _CHECK_NAMES
    state = json.loads(context.cursor) if context.cursor else {}
    now = time.time()
    elapsed = max(INTERVAL_S, now - state["at"]) if state.get("at") else INTERVAL_S
    batch = pins_per_tick(total, elapsed, period, cap)
    if cap * period < total * INTERVAL_S:
        context.log.warning(f"MARIN_DRIFT_BATCH={cap} pins every {INTERVAL_S}s cannot cover {total} pins every {period:.0f}s")
    statuses: dict[str, dict[str, Any]] = {n: s for n, s in state.get("status", {}).items() if n in partitions}
    order = _walk([s.name for s in sources], state.get("last", ""))
    reports, stopped = check_batch((catalog.by_name(n) for n in order), batch, budget, marin.layout(), marin.provider_access())
    events: list[dg.AssetCheckEvaluation] = []
    for report in reports:
        if report.status == drift.NOT_CHECKED:
            continue
        if report.status != drift.UNKNOWN or report.source not in statuses:
            statuses[report.source] = {"status": report.status, "detail": report.detail, "checked": _now()}
        if report.status != drift.UNKNOWN and report.source in checks:  # unknown keeps the last real verdict
            events.append(dg.AssetCheckEvaluation(asset_key=SOURCE_PINS, check_name=checks[report.source], **drift_verdict(report)))
    asked = [r for r in reports if r.status != drift.NOT_CHECKED]
    if asked:
        events.append(dg.AssetCheckEvaluation(asset_key=SOURCE_PINS, check_name=SUMMARY_CHECK, **summary_verdict(statuses, total)))
    # The walk moves past an unreachable pin (its last real verdict stays): one provider that
    # is always down, or blocked in an air-gapped site, must not stall every other pin.
    last = reports[-1].source if reports else state.get("last", "")
    counts = Counter(r.status for r in asked)
    message = (
        f"checked {len(asked)} of {total} pins"
        + (f" ({asked[0].source} .. {asked[-1].source})" if asked else "")
        + (": " + ", ".join(f"{counts[k]} {k}" for k in sorted(counts)) if counts else "")
        + "".join(f"; {r.source}: {r.status} ({r.detail})" for r in asked if r.status != drift.OK)
        + (f"; stopped early: {stopped}" if stopped else "")
    )
    if any(r.status in drift.BROKEN for r in asked):
        context.log.warning(message)
    return dg.SensorResult(asset_events=events, cursor=json.dumps({"last": last, "status": statuses, "at": now}, sort_keys=True), skip_reason=message)


SOURCE_NAMES_AT_LOAD = list(source_partitions.get_partition_keys())  # one check per source, like the partitions
_CHECK_NAMES = drift_check_names(SOURCE_NAMES_AT_LOAD)
_SOURCE_OF = {check: name for name, check in _CHECK_NAMES.items()}


@dg.multi_asset_check(
    name="pin_drift",
    specs=[
        dg.AssetCheckSpec(check, asset=SOURCE_PINS, description=f"{name}: the provider still serves what the catalog pins (for Hub repos: revision served, branch not moved, not newly gated or gone).")
        for name, check in _CHECK_NAMES.items()
    ],
    can_subset=True,
)
def pin_drift_checks(context: dg.AssetCheckExecutionContext, marin: MarinResource) -> Iterable[dg.AssetCheckResult]:
    catalog = marin.catalog()
    for key in sorted(context.selected_asset_check_keys, key=lambda k: k.name):
        name = _SOURCE_OF[key.name]
        if name not in catalog.names:
            yield dg.AssetCheckResult(check_name=key.name, asset_key=SOURCE_PINS, passed=False, severity=dg.AssetCheckSeverity.WARN,
                                      description=f"{name} is no longer in the catalog")  # fmt: skip
            continue
        report = drift.check_source_pin(catalog.by_name(name), layout=marin.layout(), access=marin.provider_access())
        yield dg.AssetCheckResult(check_name=key.name, asset_key=SOURCE_PINS, **drift_verdict(report))


@dg.asset_check(asset=SOURCE_PINS, name=SUMMARY_CHECK, description="Drift of every pin in the catalog (checks them all; the sensor spreads this over ticks).")
def pin_drift_summary(marin: MarinResource) -> dg.AssetCheckResult:
    partitions = set(source_partitions.get_partition_keys())
    sources = [s for s in marin.catalog() if s.name in partitions]
    access = marin.provider_access()
    reports = [drift.check_source_pin(s, layout=marin.layout(), access=access) for s in sources]
    statuses = {r.source: {"status": r.status, "detail": r.detail, "checked": _now()} for r in reports if r.status != drift.NOT_CHECKED}
    return dg.AssetCheckResult(**summary_verdict(statuses, len(statuses)))


DRIFT_CHECKS = [pin_drift_checks, pin_drift_summary]
