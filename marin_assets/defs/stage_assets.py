"""Assets generated from stage specs: dependencies, partitions, group and code version come from
the spec (``marin_assets.core.specs``), so an asset's ``deps`` are its declared inputs (plus
``source_pins`` for per-source stages, see ``deps_for``)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import dagster as dg

from marin_assets.core import specs
from marin_assets.core.runtime.stages import StageSpec
from marin_assets.core.specs import SOURCE_PINS
from marin_assets.defs.mixture.partitions import proxy_run_partitions, study_partitions
from marin_assets.defs.partitions import source_partitions
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
    return dg.asset(
        name=spec.name,
        deps=deps_for(spec),
        partitions_def=partitions_for(spec),
        group_name=spec.group or None,
        code_version=spec.code_version,
        owners=kwargs.pop("owners", OWNERS),
        tags={**tags_for(spec), **kwargs.pop("tags", {})},
        **kwargs,
    )


def stage_assets() -> list[dg.AssetsDefinition | dg.SourceAsset]:
    """The asset of every spec, found in the ``assets`` module of its group's folder
    (``marin_assets/defs/<group>/assets.py``): a new stage needs no list of its own."""
    found: dict[str, dg.AssetsDefinition | dg.SourceAsset] = {}
    for group in dict.fromkeys(s.group for s in specs.ALL):
        module = importlib.import_module(f"marin_assets.defs.{group}.assets")
        for value in vars(module).values():
            if isinstance(value, (dg.AssetsDefinition, dg.SourceAsset)) and value.key.to_user_string() in specs.BY_NAME:
                found[value.key.to_user_string()] = value
    missing = [s.name for s in specs.ALL if s.name not in found]
    if missing:
        raise TypeError(f"no asset for the stages {missing}: write one with @stage_asset in marin_assets/defs/<group>/assets.py")
    return [found[s.name] for s in specs.ALL]
