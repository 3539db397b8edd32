"""Each source's slice of a global decision, as an asset of its own, so that Dagster's staleness
follows the rule the pool follows.

A global step that decides per source (``exact_duplicates`` and ``fuzzy_duplicates``: the
source's removals; ``boilerplate_ngrams``: its drop sets; ``quality_bands``: the band edges of
its topics) publishes ``per_source_digest``. ``<step>_by_source`` is a per-source asset that no
step runs: the global step observes it as it publishes, one observation per source whose
digest changed, with the digest as its data version (an observable asset's data version is its
latest observation: Dagster's stale status and input records both read those). The per-source
stages read it instead of the whole decision (``stage_assets.deps_for``), so after a global
change the UI marks *Unsynced* exactly the partitions whose slice moved. Automation reads through it to the global
step (``conditions``): its behaviour is the one it had with the global step as a direct input.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import dagster as dg
from dagster._core.definitions.data_version import DATA_VERSION_TAG
from dagster._core.events import DagsterEventType

from marin_assets.core.specs import BOILERPLATE_NGRAMS, EXACT_DUPLICATES, FUZZY_DUPLICATES, QUALITY_BANDS
from marin_assets.defs.partitions import source_partitions

SLICED = frozenset(s.name for s in (EXACT_DUPLICATES, FUZZY_DUPLICATES, BOILERPLATE_NGRAMS, QUALITY_BANDS))
SUFFIX = "_by_source"


def slice_key(global_name: str) -> dg.AssetKey:
    return dg.AssetKey(global_name + SUFFIX)


SLICE_OF = {slice_key(name): dg.AssetKey(name) for name in sorted(SLICED)}  # slice -> the global step it is cut from


def global_of(key: dg.AssetKey) -> dg.AssetKey | None:
    """The global step a slice asset is cut from (None: not a slice)."""
    return SLICE_OF.get(key)


def slice_assets(groups: Mapping[str, str], partitions: dg.PartitionsDefinition = source_partitions,
                 names: Iterable[str] = SLICED) -> list[dg.AssetsDefinition]:  # fmt: skip
    """The slice assets of the global steps ``names``, each in its step's group (``groups``: step
    name -> group), partitioned like the sources.

    They are observable (their data versions are observations) and observed only by the global
    step they are cut from; observing one from the UI explains that."""
    specs = [
        dg.AssetSpec(
            slice_key(name), deps=[name], partitions_def=partitions, group_name=groups.get(name) or None,
            description=f"This source's part of {name} (per_source_digest); recorded by {name} when it publishes, "
                        "data version = the digest. The per-source stages read it, so only the sources whose part moved turn Unsynced.",
            tags={"scope": "per_source", "stage": name},
        )  # fmt: skip
        for name in sorted(names)
    ]

    @dg.multi_observable_source_asset(specs=specs, can_subset=True, name="decision_slices")
    def decision_slices(context):  # noqa: ANN202 (an observation function that only explains)
        steps = ", ".join(sorted(global_of(k).to_user_string() for k in context.selected_asset_keys))  # type: ignore[union-attr]
        raise dg.Failure(f"a slice is observed by its global step when it publishes: materialize {steps} to record it")

    return [decision_slices]


def slice_versions(digests: Mapping[str, Any] | None, decision: str, partitions: list[str]) -> dict[str, str]:
    """The data version of every partition's slice: its digest (``none`` where the step decided
    nothing for it); a step that published no digests gives every source the whole decision."""
    if digests is None:
        return {p: decision for p in partitions}
    return {p: str(digests.get(p) or "none") for p in partitions}


def record_slices(digests: Mapping[str, Any] | None, decision: str) -> int:
    """Inside a global step: observe its slice asset for every partition whose slice changed
    since it was last recorded (every partition the first time). Returns how many."""
    try:
        context = dg.AssetExecutionContext.get()
    except dg.DagsterInvariantViolationError:
        return 0  # outside a step (a test of the metadata alone)
    keys = [k for k in context.selected_asset_keys if k.to_user_string() in SLICED]
    if len(keys) != 1:
        return 0
    (key,) = keys
    target = slice_key(key.to_user_string())
    graph = context.job_def.asset_layer.asset_graph
    partitions = (graph.get(target).partitions_def if graph.has(target) else source_partitions).get_partition_keys()
    versions = slice_versions(digests, decision, partitions)
    recorded = context.instance.event_log_storage.get_latest_tags_by_partition(target, DagsterEventType.ASSET_OBSERVATION, [DATA_VERSION_TAG])
    changed = {p: v for p, v in versions.items() if recorded.get(p, {}).get(DATA_VERSION_TAG) != v}
    for partition, version in sorted(changed.items()):
        context.log_event(dg.AssetObservation(asset_key=target, partition=partition, tags={DATA_VERSION_TAG: version}))
    return len(changed)
