"""Status at a glance: every catalog source's state on an instance, with the reason.

A source is *never built* (no per-source asset materialized), *partly built* (its chain stops
before its last stage), *building* (its latest run is queued or running), *failed* (its latest
run failed: the cause is the innermost error), *stale* (built, but something it read moved:
its pin, a per-source input rebuilt since, or its own slice of a global decision, judged by the
``per_source_digest`` each global step publishes, the rule automation follows), or *built*.
The state is read from the instance's event log: one query per asset for what is built, then
one per built source and asset for what it read. ``marin-assets status``
prints it; the ``source_status`` sensor records it as a check on ``source_pins`` for the UI.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
from collections.abc import Mapping
from typing import Any

import dagster as dg
from dagster._core.events import DagsterEventType

from marin_assets.core.specs import POOL, RAW_FILES, SOURCE_PINS
from marin_assets.core.ingest import raw as ingest
from marin_assets.defs.alerts import run_failure_alert
from marin_assets.defs.automation.conditions import INPUT_POINTER, RECIPE_METADATA, SLICE_METADATA
from marin_assets.defs.slices import global_of
from marin_assets.defs.metadata import table as metadata_table
from marin_assets.defs.resources import MarinResource

BUILDING = (dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED)
ORDER = ("failed", "stale", "building", "partly built", "built", "never built")


@dataclasses.dataclass(frozen=True)
class SourceStatus:
    source: str
    state: str
    reason: str = ""
    last_build: float | None = None  # timestamp of its latest materialization
    tokens: int | None = None  # tokens in its pool, by the pinned tokenizer


def _value(metadata: Any, key: str) -> Any:
    entry = (metadata or {}).get(key)
    return getattr(entry, "value", entry)


class _Log:
    """The event-log reads: the latest materialization per partition, one query per asset; then
    the records of the partitions built (their input pointers), cached."""

    def __init__(self, instance: dg.DagsterInstance, graph: Any):
        self.instance, self.graph = instance, graph
        self.per_source = sorted(k for k in graph.materializable_asset_keys
                                 if graph.get(k).partitions_def is not None and k.to_user_string() != SOURCE_PINS.name)  # fmt: skip
        storage = instance.event_log_storage
        self.latest = {k: storage.get_latest_storage_id_by_partition(k, DagsterEventType.ASSET_MATERIALIZATION) for k in self.per_source}

    def parents(self, key: dg.AssetKey) -> list[dg.AssetKey]:
        return sorted(p for p in self.graph.get(key).parent_keys if p.to_user_string() != SOURCE_PINS.name)

    @functools.cache
    def record(self, key: dg.AssetKey, partition: str | None = None, storage_id: int | None = None) -> Any:
        flt = dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition] if partition else None, storage_ids=[storage_id] if storage_id else None)
        records = self.instance.fetch_materializations(flt, limit=1).records
        return records[0] if records else None

    @functools.cache
    def slice_recorded(self, key: dg.AssetKey) -> Mapping[str, int]:
        """When each source's slice was last recorded (storage id)."""
        return self.instance.event_log_storage.get_latest_storage_id_by_partition(key, DagsterEventType.ASSET_OBSERVATION)

    @functools.cache
    def latest_global(self, key: dg.AssetKey) -> int | None:
        record = self.record(key)
        return record.storage_id if record else None

    def slice_at(self, key: dg.AssetKey, storage_id: int, source: str) -> str | None:
        record = self.record(key, storage_id=storage_id)
        digests = _value(record.asset_materialization.metadata, SLICE_METADATA) if record else None
        return str(digests.get(source)) if isinstance(digests, dict) else None

    def moved_inputs(self, source: str) -> list[str]:
        """What each built asset of the source read that has moved since, in graph order."""
        reasons: list[str] = []
        for key in self.per_source:
            if source not in self.latest[key]:
                continue
            record = self.record(key, source)
            tags = (record.asset_materialization.tags if record and record.asset_materialization else None) or {}
            for parent in self.parents(key):
                read = int(tags.get(INPUT_POINTER + parent.to_user_string(), -1))
                if global_of(parent) is not None:  # a slice is recorded again only when it moved
                    if self.slice_recorded(parent).get(source, -1) > read:
                        reasons.append(f"its slice of {global_of(parent).to_user_string()} moved")
                    continue
                partitioned = self.graph.get(parent).partitions_def is not None
                newest = self.latest.get(parent, {}).get(source) if partitioned else self.latest_global(parent)
                if newest is None or newest <= read:
                    continue
                if partitioned:
                    reasons.append(f"{parent.to_user_string()} was rebuilt after {key.to_user_string()}")
                elif read < 0 or self.slice_at(parent, read, source) is None or self.slice_at(parent, read, source) != self.slice_at(parent, newest, source):
                    reasons.append(f"its slice of {parent.to_user_string()} moved")
        return list(dict.fromkeys(reasons))


def _failure(instance: dg.DagsterInstance, source: str) -> tuple[str, str] | None:
    """(state, reason) from the source's latest run, when it failed or is still going."""
    runs = instance.get_run_records(dg.RunsFilter(tags={"dagster/partition": source}), limit=1)
    if not runs:
        return None
    run = runs[0].dagster_run
    if run.status in BUILDING:
        return "building", f"run {run.run_id[:8]} {run.status.value.lower()}"
    if run.status == dg.DagsterRunStatus.FAILURE:
        return "failed", f"run {run.run_id[:8]}: {run_failure_alert(instance, run.run_id, 'run failed')['cause']}"
    return None


def source_status(instance: dg.DagsterInstance, graph: Any, catalog: Any) -> list[SourceStatus]:
    """Every catalog source's state on ``instance`` (``graph``: the code location's asset graph)."""
    log = _Log(instance, graph)
    pool, raw = dg.AssetKey(POOL.name), dg.AssetKey(RAW_FILES.name)
    out = []
    for source in catalog:
        name = source.name
        built = [k for k in log.per_source if name in log.latest[k]]
        if not built:
            out.append(SourceStatus(name, "never built"))
            continue
        last = log.record(pool, name) or log.record(built[-1], name)
        tokens = _value(last.asset_materialization.metadata, "tokens") if last and last.asset_key == pool else None
        when = last.timestamp if last else None
        raw_record = log.record(raw, name)
        recipe = _value(raw_record.asset_materialization.metadata, RECIPE_METADATA) if raw_record else None
        reasons = ([f"pin changed: built for recipe {str(recipe)[:8]}, the catalog's is {ingest.recipe_fingerprint(source)[:8]}"]
                   if raw_record and recipe != ingest.recipe_fingerprint(source) else []) + log.moved_inputs(name)  # fmt: skip
        run_state = _failure(instance, name)
        if run_state:
            state, reason = run_state
            out.append(SourceStatus(name, state, "; ".join([reason, *reasons]), when, tokens))
        elif reasons:
            out.append(SourceStatus(name, "stale", "; ".join(reasons), when, tokens))
        elif pool not in built:
            missing = [k.to_user_string() for k in log.per_source if k not in built]
            out.append(SourceStatus(name, "partly built", f"not built yet: {', '.join(missing)}", when, tokens))
        else:
            out.append(SourceStatus(name, "built", "", when, tokens))
    return out


def _when(ts: float | None) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC") if ts else ""


def status_rows(statuses: list[SourceStatus], every: bool = False) -> list[dict[str, str]]:
    """Table rows, failed first, then stale, ...; never-built sources only when ``every``."""
    ordered = sorted(statuses, key=lambda s: (ORDER.index(s.state), s.source))
    return [{"source": s.source, "state": s.state, "reason": s.reason, "last build": _when(s.last_build),
             "tokens": f"{s.tokens:,}" if s.tokens is not None else ""}
            for s in ordered if every or s.state != "never built"]  # fmt: skip


def status_summary(statuses: list[SourceStatus]) -> str:
    counts = {state: sum(s.state == state for s in statuses) for state in ORDER}
    return f"{len(statuses)} catalog sources: " + ", ".join(f"{n} {state}" for state, n in counts.items() if n)


def format_source_status(statuses: list[SourceStatus], every: bool = False) -> str:
    rows = status_rows(statuses, every)
    lines = [status_summary(statuses)]
    if rows:
        widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in ("source", "state", "last build", "tokens")}
        lines.append(f"{'source':{widths['source']}}  {'state':{widths['state']}}  {'last build':{widths['last build']}}  {'tokens':>{widths['tokens']}}  reason")
        lines += [f"{r['source']:{widths['source']}}  {r['state']:{widths['state']}}  {r['last build']:{widths['last build']}}  {r['tokens']:>{widths['tokens']}}  {r['reason']}" for r in rows]
    never = [s.source for s in statuses if s.state == "never built"]
    if never and not every:
        lines.append(f"never built: {len(never)} sources (--all lists them)")
    return "\n".join(lines)


# --------------------------------------------------------------------------- the same table in the UI

STATUS_CHECK = "source_status"
STATUS_INTERVAL_S = 120


def status_table(statuses: list[SourceStatus]) -> dg.MetadataValue:
    """The table for the UI (a Dagster table, shown inline): every source ever built, failed and
    stale first; the never-built ones are counted in the summary."""
    return metadata_table(status_rows(statuses), columns=["source", "state", "reason", "last build", "tokens"])


def status_evaluation(statuses: list[SourceStatus]) -> dict[str, Any]:
    """The ``source_status`` verdict: fails (a warning) while a source failed or is stale."""
    troubled = [s for s in statuses if s.state in ("failed", "stale")]
    return dict(
        passed=not troubled, severity=dg.AssetCheckSeverity.WARN,
        description=status_summary(statuses) + ("; " + ", ".join(f"{s.source}: {s.state}" for s in troubled[:10]) if troubled else ""),
        metadata={"summary": status_summary(statuses), "sources": status_table(statuses),
                  **{state: sum(s.state == state for s in statuses) for state in ORDER}},
    )  # fmt: skip


def _statuses(instance: dg.DagsterInstance, graph: Any, marin: Any) -> list[SourceStatus]:
    return source_status(instance, graph, marin.catalog())


@dg.asset_check(asset=SOURCE_PINS.name, name=STATUS_CHECK, description="Every catalog source: built, stale (why), failed (why), never built; last build and tokens (marin-assets status).")
def source_status_check(context, marin: MarinResource) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(**status_evaluation(_statuses(context.instance, context.repository_def.asset_graph, marin)))


@dg.sensor(name="source_status", minimum_interval_seconds=STATUS_INTERVAL_S, default_status=dg.DefaultSensorStatus.RUNNING,
           description=f"Every {STATUS_INTERVAL_S // 60} minutes: records the source_status check on source_pins when the table of sources changed (no run).")  # fmt: skip
def source_status_sensor(context: dg.SensorEvaluationContext, marin: MarinResource) -> dg.SensorResult:
    statuses = _statuses(context.instance, context.repository_def.asset_graph, marin)
    digest = hashlib.sha256(repr(status_rows(statuses)).encode()).hexdigest()[:16]
    if digest == context.cursor:
        return dg.SensorResult(skip_reason=f"unchanged: {status_summary(statuses)}")
    evaluation = dg.AssetCheckEvaluation(asset_key=dg.AssetKey(SOURCE_PINS.name), check_name=STATUS_CHECK, **status_evaluation(statuses))
    return dg.SensorResult(asset_events=[evaluation], cursor=digest, skip_reason=status_summary(statuses))
