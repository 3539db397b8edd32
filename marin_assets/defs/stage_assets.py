"""Assets generated from stage specs: dependencies, partitions, group and code version come from
the spec (``marin_assets.core.specs``), so an asset's ``deps`` are exactly its declared inputs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import dagster as dg

from marin_assets.core.stages import StageSpec
from marin_assets.defs.partitions import source_partitions


def key(spec: StageSpec) -> dg.AssetKey:
    return dg.AssetKey(spec.name)


def stage_asset(spec: StageSpec, **kwargs: Any) -> Callable[[Callable[..., Any]], dg.AssetsDefinition]:
    """``@dg.asset`` for ``spec``; ``kwargs`` add what is Dagster's own (description, kinds, pool, checks)."""
    for field in ("name", "deps", "partitions_def", "group_name", "code_version"):
        if field in kwargs:
            raise TypeError(f"stage_asset({spec.name}): '{field}' comes from the stage spec")
    return dg.asset(
        name=spec.name,
        deps=[key(i) for i in spec.inputs],
        partitions_def=source_partitions if spec.partitioned else None,
        group_name=spec.group or None,
        code_version=spec.code_version,
        **kwargs,
    )
