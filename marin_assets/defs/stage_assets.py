"""Assets generated from stage specs: dependencies, partitions, group and code version come from
the spec (``marin_assets.core.specs``), so an asset's ``deps`` are its declared inputs (plus
``source_pins`` for per-source stages, see ``deps_for``). A spec that names its shard function
gets its whole asset here (``shard_asset``); the others are written with ``stage_asset``."""

import functools
from collections.abc import Callable
from typing import Any

import dagster as dg

from marin_assets.core.runtime import stages, storage
from marin_assets.core.runtime.stages import StageSpec
from marin_assets.core.specs import SOURCE_PINS
from marin_assets.defs.metadata import materialized
from marin_assets.defs.partitions import proxy_run_partitions, source_partitions, study_partitions
from marin_assets.defs.ray import step_log
from marin_assets.defs.resources import MarinResource, source_or_fail
from marin_assets.defs.slices import SLICED, slice_key

# Who answers for the assets, and the tags the UI filters by: set here, once, for every stage.
OWNERS = ["team:marin-data"]


def tags_for(spec: StageSpec) -> dict[str, str]:
    return {"stage": spec.name, "scope": "per_source" if spec.partitioned else "global"}


def key(spec: StageSpec) -> dg.AssetKey:
    return dg.AssetKey(spec.name)


def partitions_for(spec: StageSpec) -> dg.PartitionsDefinition | None:
    """Per source, per study (or study and proxy run), or none for a global stage."""
    if spec.study_stage:
        return proxy_run_partitions if spec.by_run else study_partitions
    return source_partitions if spec.partitioned else None


def deps_for(spec: StageSpec) -> list[dg.AssetKey]:
    """The spec's inputs, plus ``source_pins`` for every per-source stage that does not read it:
    Dagster marks stale only the direct dependents of a changed data version, and a pin edit
    rebuilds the source's whole chain, so the whole chain is shown stale. Automation ignores
    this extra edge (``conditions.per_source_condition``); the stage never reads it. A global
    input that publishes per-source digests is read through its slice asset (``defs/slices.py``):
    the stage turns stale only where its own part of the decision moved."""
    deps = [slice_key(i.name) if spec.partitioned and i.name in SLICED else key(i) for i in spec.inputs]
    if spec.partitioned and spec.name != SOURCE_PINS.name and SOURCE_PINS not in spec.inputs:
        deps.append(key(SOURCE_PINS))
    return deps


def stage_asset(spec: StageSpec, **kwargs: Any) -> Callable[[Callable[..., Any]], dg.AssetsDefinition]:
    """``@dg.asset`` for ``spec``; ``kwargs`` add what is Dagster's own (description, kinds, pool, checks)."""
    for field in ("name", "deps", "partitions_def", "group_name", "code_version"):
        if field in kwargs:
            raise TypeError(f"stage_asset({spec.name}): '{field}' comes from the stage spec")
    decorate = dg.asset(
        name=spec.name,
        deps=deps_for(spec),
        partitions_def=partitions_for(spec),
        group_name=spec.group or None,
        code_version=spec.code_version,
        owners=kwargs.pop("owners", OWNERS),
        tags={**tags_for(spec), **kwargs.pop("tags", {})},
        **kwargs,
    )
    return lambda fn: decorate(named_writer(fn))


def named_writer(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` run with its Dagster run named as the writer of what it writes, so a second run
    that wants to write the same output is told which run holds it."""

    @functools.wraps(fn)
    def run(context: Any, *args: Any, **kwargs: Any) -> Any:
        token = storage.WRITER.set(f"run {context.run_id}")
        try:
            return fn(context, *args, **kwargs)
        finally:
            storage.WRITER.reset(token)

    return run


def shard_asset(spec: StageSpec) -> dg.AssetsDefinition:
    """The asset of a per-source spec that names its ``shard_fn``: each shard of the source's
    current inputs (co-partitioned, in the spec's order) mapped to one output shard with the
    parameters' reference values; its metadata are the shards' counters."""
    if not (spec.shard_fn and spec.partitioned):
        raise TypeError(f"shard_asset({spec.name}): only a per-source spec with a shard_fn is generated")

    @stage_asset(spec, kinds={"parquet"}, description=spec.description or None)
    def _asset(context: dg.AssetExecutionContext, marin: MarinResource) -> dg.MaterializeResult:
        source = source_or_fail(marin, context.partition_key)
        layout = marin.layout()
        manifest = stages.run_shards(
            spec,
            layout,
            source=source.name,
            inputs=[stages.current_input(layout, i, source.name) for i in spec.inputs],
            shard_fn=spec.shard_fn,
            params=spec.params() if spec.params else None,
            runner=marin.runner(),
            progress=step_log(context),
        )
        totals = manifest["totals"]
        return materialized(manifest, rows=int(totals.get(spec.rows_counter, 0)), counters=totals)

    return _asset
