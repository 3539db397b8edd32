"""Automation conditions, chosen per asset from the shape of the graph.

The rule is generic so that new stages are automated without touching this module:

* a **per-source** (partitioned) asset is rebuilt when a dependency's *data version* changed
  (our data versions are content fingerprints, so a re-run that reused its output changes
  nothing downstream), or when its dependency will be rebuilt on the same tick (so a pin
  change becomes one run of the source's whole chain). Only partitions that were built
  before are rebuilt: the first build of a source is a backfill. A partition added by a
  code-location reload (a new catalog entry) is built as soon as its inputs exist. A
  partition whose name left the catalog is never requested.
* a **global** (unpartitioned) asset is rebuilt when the data version of any partition of
  its dependencies changed, once none of them is in progress or about to be requested (the
  global steps run after the per-source chains of that tick, in their own run).
* **exceptions** (``EXCEPTIONS``): an asset whose author set ``automation_condition``
  keeps it (``source_pins`` is observed on a cron); model training steps are manual.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping
from typing import Any

import dagster as dg
from dagster import AutomationCondition as AC

from marin_assets.catalog.sources import default_catalog_path, load_catalog

MANUAL = None  # an exception that means: never automated, rebuilt by hand or backfill

# Assets that do not follow the rule. Training a global model is expensive and changes every
# source downstream of it, so it is a deliberate act (UI, backfill), never a side effect of a
# pin change; the sources whose inputs changed are still re-assigned with the current model.
EXCEPTIONS: dict[str, dg.AutomationCondition | None] = {
    "topic_model": MANUAL,
    "quality_model": MANUAL,
}


# --------------------------------------------------------------------------- custom operand


def _catalog_mtime() -> tuple[str, int]:
    path = str(default_catalog_path())
    try:
        return path, os.stat(path).st_mtime_ns
    except OSError:
        return path, -1


@functools.lru_cache(maxsize=4)
def _catalog_names(path: str, mtime_ns: int) -> frozenset[str]:
    return frozenset(load_catalog(path).names)


def catalog_names() -> frozenset[str]:
    """Source names in the catalog as it is on disk now (``MARIN_CATALOG`` or the packaged one)."""
    return _catalog_names(*_catalog_mtime())


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


# --------------------------------------------------------------------------- the two conditions


def _dep_data_changed() -> dg.AutomationCondition:
    """(Evaluated on a dependency) its data version changed since the last tick, in a run that
    did not also build the asset being evaluated."""
    return (AC.data_version_changed() & ~AC.executed_with_root_target()).with_label("data_version_changed")


def _no_dep_failed_blocking_check() -> dg.AutomationCondition:
    return ~AC.any_deps_match(AC.any_checks_match(AC.check_failed(), blocking_only=True)).with_label(
        "any_dep_failed_a_blocking_check"
    )


def per_source_condition() -> dg.AutomationCondition:
    """For partitioned assets: rebuild the partitions whose inputs changed (see module doc)."""
    inputs_changed = AC.any_deps_match(_dep_data_changed() | AC.will_be_requested()).with_label("any_dep_changed_or_requested")
    rebuild = (inputs_changed & ~AC.missing()).with_label("built_before_and_inputs_changed")
    new_partition = AC.newly_missing().with_label("new_partition")
    return (
        (rebuild | new_partition).since_last_handled()
        & ~AC.any_deps_missing()
        & ~AC.any_deps_in_progress()
        & ~AC.in_progress()
        & _no_dep_failed_blocking_check()
        & InCatalog()
    ).with_label("marin_per_source")


def global_condition() -> dg.AutomationCondition:
    """For unpartitioned assets: rebuild after any dependency partition's data changed."""
    inputs_changed = AC.any_deps_match(_dep_data_changed()).with_label("any_dep_partition_changed")
    return (
        (inputs_changed & ~AC.missing()).with_label("built_before_and_inputs_changed").since_last_handled()
        & ~AC.any_deps_in_progress()
        & ~AC.any_deps_match(AC.will_be_requested()).with_label("any_dep_requested_this_tick")
        & ~AC.in_progress()
    ).with_label("marin_global")


def condition_for(spec: dg.AssetSpec, exceptions: Mapping[str, Any] = EXCEPTIONS) -> dg.AutomationCondition | None:
    """The condition an asset gets: its own, an exception, or the rule for its shape."""
    name = spec.key.to_user_string()
    if spec.automation_condition is not None:
        return spec.automation_condition
    if name in exceptions:
        return exceptions[name]
    return per_source_condition() if spec.partitions_def is not None else global_condition()


def with_conditions(assets: Iterable[Any], exceptions: Mapping[str, Any] = EXCEPTIONS) -> list[Any]:
    """The assets with a condition on every executable asset spec (source assets unchanged)."""
    out: list[Any] = []
    for asset in assets:
        if isinstance(asset, dg.AssetsDefinition) and asset.is_executable and not asset.is_observable:
            asset = asset.map_asset_specs(lambda spec: spec.replace_attributes(automation_condition=condition_for(spec, exceptions)))
        out.append(asset)
    return out
