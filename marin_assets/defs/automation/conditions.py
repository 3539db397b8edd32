"""Automation conditions, chosen per asset from the shape of the graph.

The rule is generic so that new stages are automated without touching this module:

* a **per-source** (partitioned) asset is rebuilt when a dependency's *data version* changed
  (our data versions are content fingerprints, so a re-run that reused its output changes
  nothing downstream), or when its dependency will be rebuilt on the same tick (so a pin
  change becomes one run of the source's whole chain). A global dependency counts for the
  sources whose part of it changed: every global step that decides per source publishes
  ``per_source_digest`` ({source: digest}) in its metadata (dedup removals, boilerplate drop
  sets, the band edges of the source's topics), and only the sources whose digest moved are
  rebuilt (``GlobalSliceMoved``, until rebuilt from the new decision); a global step without
  it counts for all. A stage reads such a step through its slice asset (``defs/slices.py``, so
  that Dagster's stale status is per source too); automation judges the step behind the slice.
  A source is not rebuilt while one of the global steps it reads is requested, in progress or
  about to be (``_globals_settled``): nothing is published from a decision being replaced.
  Only partitions that were built before are rebuilt: the first build of a source is a
  backfill. A partition added by a code-location reload (a new catalog entry) is built as
  soon as its inputs exist. A partition whose name left the catalog is never requested.
* a **global** (unpartitioned) asset is rebuilt when the data version of any partition of
  its dependencies changed, once none of them is in progress or about to be requested (the
  global steps run after the per-source chains of that tick, in their own run).
* **exceptions** (``EXCEPTIONS``): an asset whose author set ``automation_condition``
  keeps it; model training steps are manual. ``source_pins`` has none: the
  ``catalog_changes`` sensor records its observations (runless, only for changed recipes).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

import dagster as dg
from dagster import AutomationCondition as AC
from dagster._core.events import DagsterEventType

from marin_assets.catalog.sources import default_catalog_path
from marin_assets.core.ingest import raw as ingest
from marin_assets.core.ingest.recipes import checked_catalog
from marin_assets.core.specs import ALL as ALL_SPECS
from marin_assets.core.specs import QUALITY_MODEL, SOURCE_PINS, TOPIC_MODEL
from marin_assets.defs.settings import configured_catalog_path
from marin_assets.defs.slices import global_of

MANUAL = None  # an exception that means: never automated, rebuilt by hand or backfill

# Assets that do not follow the rule. Training a global model is expensive and changes every
# source downstream of it, so it is a deliberate act (UI, backfill), never a side effect of a
# pin change; the sources whose inputs changed are still re-assigned with the current model.
EXCEPTIONS: dict[str, dg.AutomationCondition | None] = {
    TOPIC_MODEL.name: MANUAL,
    QUALITY_MODEL.name: MANUAL,
}


# --------------------------------------------------------------------------- custom operand


def _catalog_mtime() -> tuple[str, int]:
    path = configured_catalog_path() or str(default_catalog_path())
    try:
        return path, os.stat(path).st_mtime_ns
    except OSError:
        return path, -1


@functools.lru_cache(maxsize=4)
def _catalog_names(path: str, mtime_ns: int) -> frozenset[str]:
    return frozenset(checked_catalog(path, strict=False).names)


def catalog_names() -> frozenset[str]:
    """Source names in the catalog as it is on disk now (``MARIN_CATALOG`` or the packaged one)."""
    return _catalog_names(*_catalog_mtime())


@functools.lru_cache(maxsize=4)
def _recipes(path: str, mtime_ns: int) -> dict[str, str]:
    return {s.name: ingest.recipe_fingerprint(s) for s in checked_catalog(path)}


def catalog_recipes() -> dict[str, str]:
    """Recipe fingerprint per source in the catalog as it is on disk now."""
    return _recipes(*_catalog_mtime())


RECIPE_METADATA = "recipe"


class BuiltForAnotherRecipe(dg.AutomationCondition):
    """True for partitions whose last materialization was built for another recipe than the
    catalog's current one (read from its ``recipe`` metadata; a materialization without it
    counts as another recipe).

    ``source_pins``' first observation of a partition counts as a data-version change; this
    keeps that baseline (switching automation on, a lost sensor cursor) from rebuilding sources
    that are already built for their pin. Only the candidates (partitions whose pin was just
    observed to change) are looked up, one event-log query each.
    """

    @property
    def name(self) -> str:
        return "built_for_another_recipe"

    @property
    def description(self) -> str:
        return "Last built for another recipe than the catalog's"

    def evaluate(self, context):  # type: ignore[override]
        subset = context.candidate_subset
        if not subset.is_partitioned or subset.is_empty:
            return dg.AutomationResult(context=context, true_subset=context.get_empty_subset())
        instance = context.asset_graph_view.instance
        recipes = catalog_recipes()
        stale: set[str] = set()
        for partition in subset.expensively_compute_partition_keys():
            records = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=context.key, asset_partitions=[partition]), limit=1).records
            if not records or records[0].asset_materialization is None:
                continue
            built = records[0].asset_materialization.metadata.get(RECIPE_METADATA)
            if getattr(built, "value", built) != recipes.get(partition):
                stale.add(partition)
        return dg.AutomationResult(context=context, true_subset=subset.compute_intersection_with_partition_keys(stale))


class InCatalog(dg.AutomationCondition):
    """True for partitions whose source is in the catalog now; always true when unpartitioned.

    A source removed from the catalog stays a partition until the code location reloads;
    ``source_pins`` then reports ``removed-from-catalog`` for it, and this keeps automation
    from requesting a build that could only fail.
    """

    @property
    def name(self) -> str:
        return "in_catalog"

    @property
    def description(self) -> str:
        return "Partition's source is in the catalog now"

    def evaluate(self, context):  # type: ignore[override]
        subset = context.candidate_subset
        if subset.is_partitioned:
            subset = subset.compute_intersection_with_partition_keys(set(catalog_names()))
        return dg.AutomationResult(context=context, true_subset=subset)


SLICE_METADATA = "per_source_digest"
INPUT_POINTER = "dagster/input_event_pointer/"  # Dagster records, per input, the event a step read when it started


def _latest_version_and_slices(instance: dg.DagsterInstance, key: dg.AssetKey) -> dict[str, Any] | None:
    record = instance.get_latest_data_version_record(key)
    if record is None:
        return None
    event = record.asset_materialization or record.asset_observation
    if event is None:
        return None
    digests = event.metadata.get(SLICE_METADATA)
    value = getattr(digests, "value", digests)
    return {"version": event.tags.get("dagster/data_version") if event.tags else None, "event": record.storage_id,
            "slices": {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else None}  # fmt: skip


def moved_slices(before: Mapping[str, Any] | None, now: Mapping[str, Any] | None) -> set[str] | None:
    """The partitions whose slice of a global dependency moved between two of its records
    (``None``: every partition, the dependency publishes no per-source digests)."""
    if before is None or now is None or now["version"] == before["version"]:
        return set()
    if now["slices"] is None or before["slices"] is None:
        return None
    return {k for k in set(now["slices"]) | set(before["slices"]) if now["slices"].get(k) != before["slices"].get(k)}


def _read_after(instance: dg.DagsterInstance, key: dg.AssetKey, partition: str, waits: Mapping[str, int]) -> bool | None:
    """Whether the partition's latest materialization read every dependency in ``waits`` at
    that event or a later one (``None``: the partition was never built)."""
    records = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition]), limit=1).records
    if not records or records[0].asset_materialization is None:
        return None
    tags = records[0].asset_materialization.tags or {}
    return all(int(tags.get(INPUT_POINTER + dep, -1)) >= event for dep, event in waits.items())


def global_inputs(graph: Any, key: dg.AssetKey) -> list[dg.AssetKey]:
    """The global steps an asset reads: its unpartitioned dependencies, and the step behind each
    slice it reads (``defs/slices.py``)."""
    parents = graph.get(key).parent_keys
    return sorted({global_of(p) or p for p in parents if global_of(p) or graph.get(p).partitions_def is None})


def _waits_for(instance: dg.DagsterInstance, input_key: dg.AssetKey, partitions: set[str], event: int) -> dict[str, tuple[str, int]]:
    """Per partition, the input and the event a rebuild must have read: the global step's new
    output, or (read through a slice) the partition's slice recorded with it."""
    if not partitions:
        return {}
    if global_of(input_key) is None:
        return {p: (input_key.to_user_string(), event) for p in partitions}
    observed = instance.event_log_storage.get_latest_storage_id_by_partition(input_key, DagsterEventType.ASSET_OBSERVATION, set(partitions))
    return {p: (input_key.to_user_string(), observed.get(p, event)) for p in partitions}


class GlobalSliceMoved(dg.AutomationCondition):
    """True for built partitions whose slice of an unpartitioned dependency moved and that have
    not been rebuilt from that dependency's new output since.

    Each tick compares every global dependency's latest record with the one seen on the
    previous tick (this condition's cursor); the partitions whose entry of its
    ``per_source_digest`` moved (every built partition, if it publishes none) become *pending*,
    each with the event it waits for. A pending partition stays true until its latest
    materialization read that event or a later one (Dagster records the input events a step
    read when it started): a rebuild that started before the dependency landed is requested
    again, not taken as current. Only pending partitions are looked up, one query each.
    """

    @property
    def name(self) -> str:
        return "global_slice_moved"

    @property
    def description(self) -> str:
        return "This source's part of a global dependency moved since it was built"

    def evaluate(self, context):  # type: ignore[override]
        graph, key = context.asset_graph, context.key
        instance = context.asset_graph_view.instance
        subset = context.candidate_subset
        state = json.loads(context.cursor) if context.cursor else None
        if state is not None and "seen" not in state:
            state = {"seen": state, "pending": {}}  # the cursor of the version that kept no pending set
        via = {global_of(p) or p: p for p in graph.get(key).parent_keys}  # the input that carries each global step
        seen = {global_.to_user_string(): _latest_version_and_slices(instance, global_) for global_ in global_inputs(graph, key)}
        if not subset.is_partitioned:
            return dg.AutomationResult(context=context, true_subset=context.get_empty_subset(), cursor=json.dumps({"seen": seen, "pending": {}}, sort_keys=True))
        pending: dict[str, dict[str, int]] = dict((state or {}).get("pending", {}))
        candidates = set(subset.expensively_compute_partition_keys())
        for dep, now in seen.items():
            if state is None:
                break  # the first evaluation is the baseline
            moved = moved_slices(state["seen"].get(dep), now)
            targets = candidates if moved is None else moved & candidates
            if not targets:  # nothing moved (or the step has no output yet)
                continue
            for partition, (name, event) in _waits_for(instance, via[dg.AssetKey(dep)], targets, now["event"]).items():  # type: ignore[index]
                pending.setdefault(partition, {})[name] = event
        stale = set()
        for partition, waits in sorted(pending.items()):
            read = _read_after(instance, key, partition, waits) if partition in candidates else None
            if read is False:
                stale.add(partition)
            else:  # rebuilt from the new decision, never built (a backfill builds it), or no longer a partition
                del pending[partition]
        cursor = json.dumps({"seen": seen, "pending": pending}, sort_keys=True)
        return dg.AutomationResult(context=context, true_subset=subset.compute_intersection_with_partition_keys(stale), cursor=cursor)


class RequestedThisTick(dg.AutomationCondition):
    """(Evaluated on a dependency) it is requested on this tick, whatever run it will be in.

    Dagster's ``will_be_requested`` counts only a dependency that can run in the same run as
    the asset evaluated, so a global step requested on the tick is invisible from a per-source
    asset (and per-source partitions from a global one).
    """

    @property
    def name(self) -> str:
        return "requested_this_tick"

    @property
    def description(self) -> str:
        return "Requested on this tick"

    def evaluate(self, context):  # type: ignore[override]
        requested = context.request_subsets_by_key.get(context.key)
        true = context.candidate_subset.compute_intersection(requested) if requested is not None else context.get_empty_subset()
        return dg.AutomationResult(context=context, true_subset=true)


# --------------------------------------------------------------------------- the two conditions


def _dep_data_changed() -> dg.AutomationCondition:
    """(Evaluated on a dependency) its data version changed since the last tick, in a run that
    did not also build the asset being evaluated."""
    return (AC.data_version_changed() & ~AC.executed_with_root_target()).with_label("data_version_changed")


def _any_input(condition: dg.AutomationCondition, slices: Iterable[str] = ()) -> dg.AutomationCondition:
    """``condition`` on a dependency, or on the global step behind a slice dependency: automation
    sees through a slice to the step it is cut from, as if that step were the input."""
    slices = sorted(slices)
    if not slices:
        return AC.any_deps_match(condition)
    through = dg.AssetSelection.assets(*slices)
    return AC.any_deps_match(condition).ignore(through) | AC.any_deps_match(AC.any_deps_match(condition)).allow(through)


def _no_dep_failed_blocking_check(slices: Iterable[str] = ()) -> dg.AutomationCondition:
    return ~_any_input(AC.any_checks_match(AC.check_failed(), blocking_only=True), slices).with_label(
        "any_dep_failed_a_blocking_check"
    )


# Stages that read source_pins; the other per-source stages depend on it only so that the UI
# marks a source's whole chain stale after a pin edit (``stage_assets.deps_for``).
_READS_PINS = frozenset(s.name for s in ALL_SPECS if SOURCE_PINS in s.inputs)


def _globals_settled(global_deps: Iterable[str], slices: Iterable[str] = ()) -> dg.AutomationCondition:
    """None of these global dependencies (direct, or behind a slice) is requested, in progress,
    or about to be (one of its own dependencies is requested, in progress, or was just updated:
    the global step is then requested on a later tick): a source is not rebuilt from a decision
    being replaced."""
    unsettled = (RequestedThisTick() | AC.in_progress() | AC.any_deps_in_progress()
                 | AC.any_deps_match(RequestedThisTick() | AC.newly_updated()))  # fmt: skip
    globals_ = dg.AssetSelection.assets(*sorted(global_deps))
    unsettled_input = AC.any_deps_match(unsettled).allow(globals_)
    if slices:
        unsettled_input = unsettled_input | AC.any_deps_match(unsettled_input).allow(dg.AssetSelection.assets(*sorted(slices)))
    return ~unsettled_input.with_label("global_inputs_settled")


def per_source_condition(global_deps: Iterable[str] = (), pins_dep: bool = False, pins_edge: bool = False,
                         automated_globals: Iterable[str] | None = None, slices: Iterable[str] = ()) -> dg.AutomationCondition:  # fmt: skip
    """For partitioned assets: rebuild the partitions whose inputs changed (see module doc).

    ``global_deps`` are the unpartitioned dependencies: they are judged per source by
    ``GlobalSliceMoved`` instead of by their data version alone; ``automated_globals`` (default:
    all of them) are those automation rebuilds, which must be settled before a source is built
    from them. ``pins_dep``: the asset reads ``source_pins``, whose change counts only where the
    asset was built for another recipe (``BuiltForAnotherRecipe``). ``pins_edge``:
    ``source_pins`` is a dependency the asset does not read (for staleness in the UI); it is
    ignored, the chain follows its inputs. ``slices``: the slice assets it reads
    (``defs/slices.py``), each standing for its global step (in ``global_deps``): automation
    judges the step behind it, as if the step were the input.
    """
    per_source_deps = AC.any_deps_match(_dep_data_changed() | AC.will_be_requested())
    pins = dg.AssetSelection.assets(SOURCE_PINS.name)
    if pins_dep:
        pin_changed = (AC.any_deps_match(AC.data_version_changed()).allow(pins) & BuiltForAnotherRecipe()).with_label("pin_changed")
        per_source_deps = per_source_deps.ignore(pins) | pin_changed
    elif pins_edge:
        per_source_deps = per_source_deps.ignore(pins)
    global_deps, slices = sorted(global_deps), sorted(slices)
    if global_deps or slices:
        per_source_deps = per_source_deps.ignore(dg.AssetSelection.assets(*global_deps, *slices))
    inputs_changed = per_source_deps.with_label("any_dep_changed_or_requested")
    rebuild = (inputs_changed & ~AC.missing()).with_label("built_before_and_inputs_changed")
    new_partition = AC.newly_missing().with_label("new_partition")
    wanted = (rebuild | new_partition).since_last_handled()
    if global_deps:
        # state, not an event: true until rebuilt from the new decision; a failed rebuild waits for a person
        wanted = wanted | (GlobalSliceMoved() & ~AC.execution_failed()).with_label("own_slice_of_a_global_input_moved")
    missing, running = (_any_input(AC.missing(), slices), _any_input(AC.in_progress(), slices)) if slices else (AC.any_deps_missing(), AC.any_deps_in_progress())
    condition = (
        wanted
        & ~missing
        & ~running
        & ~AC.in_progress()
        & _no_dep_failed_blocking_check(slices)
        & InCatalog()
    )
    settle = sorted(global_deps if automated_globals is None else automated_globals)
    return (condition & _globals_settled(settle, slices) if settle else condition).with_label("marin_per_source")


def global_condition() -> dg.AutomationCondition:
    """For unpartitioned assets: rebuild after any dependency partition's data changed."""
    inputs_changed = AC.any_deps_match(_dep_data_changed()).with_label("any_dep_partition_changed")
    return (
        (inputs_changed & ~AC.missing()).with_label("built_before_and_inputs_changed").since_last_handled()
        & ~AC.any_deps_in_progress()
        & ~AC.any_deps_match(RequestedThisTick()).with_label("any_dep_requested_this_tick")
        & ~AC.in_progress()
    ).with_label("marin_global")


def condition_for(spec: dg.AssetSpec, unpartitioned: set[dg.AssetKey] = frozenset(),  # type: ignore[assignment]
                  exceptions: Mapping[str, Any] = EXCEPTIONS) -> dg.AutomationCondition | None:  # fmt: skip
    """The condition an asset gets: its own, an exception, or the rule for its shape.

    ``unpartitioned`` are the keys of the graph's unpartitioned assets (to tell global deps).
    """
    name = spec.key.to_user_string()
    if spec.automation_condition is not None:
        return spec.automation_condition
    if name in exceptions:
        return exceptions[name]
    if spec.partitions_def is None:
        return global_condition()
    deps = {d.asset_key for d in spec.deps}
    pins = dg.AssetKey(SOURCE_PINS.name)
    slices = sorted(k.to_user_string() for k in deps if global_of(k))
    global_deps = sorted({k.to_user_string() for k in deps if k in unpartitioned} | {global_of(k).to_user_string() for k in deps if global_of(k)})  # type: ignore[union-attr]
    automated = [d for d in global_deps if exceptions.get(d, True) is not MANUAL]
    return per_source_condition(global_deps, pins_dep=pins in deps and name in _READS_PINS, pins_edge=pins in deps,
                                automated_globals=automated, slices=slices)  # fmt: skip


def _unpartitioned_keys(assets: list[Any]) -> set[dg.AssetKey]:
    keys: set[dg.AssetKey] = set()
    for asset in assets:
        if isinstance(asset, dg.AssetsDefinition):
            keys |= {spec.key for spec in asset.specs if spec.partitions_def is None}
        elif isinstance(asset, dg.SourceAsset) and asset.partitions_def is None:
            keys.add(asset.key)
    return keys


def with_conditions(assets: Iterable[Any], exceptions: Mapping[str, Any] = EXCEPTIONS) -> list[Any]:
    """The assets with a condition on every executable asset spec (source assets unchanged)."""
    assets = list(assets)
    unpartitioned = _unpartitioned_keys(assets)
    out: list[Any] = []
    for asset in assets:
        if isinstance(asset, dg.AssetsDefinition) and asset.is_executable and not asset.is_observable:
            asset = asset.map_asset_specs(lambda spec: spec.replace_attributes(automation_condition=condition_for(spec, unpartitioned, exceptions)))
        out.append(asset)
    return out
