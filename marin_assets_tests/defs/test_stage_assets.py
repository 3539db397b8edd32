"""The asset wiring follows the stage specs: one asset per spec, its deps exactly the declared inputs."""

from __future__ import annotations

import dagster as dg
import pytest

from marin_assets.core import specs
from marin_assets.defs.stage_assets import stage_asset


def test_every_asset_is_a_spec_with_deps_group_partitions_and_code_version_from_it() -> None:
    from marin_assets.definitions import defs
    from marin_assets.defs.partitions import source_partitions

    from marin_assets.defs.slices import SLICED, slice_key

    graph = defs.resolve_asset_graph()
    assets = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert assets == {s.name for s in specs.ALL} | {slice_key(n).to_user_string() for n in SLICED}
    for spec in specs.ALL:
        node = graph.get(dg.AssetKey(spec.name))
        # per-source stages also depend on source_pins, for staleness in the UI (stage_assets.deps_for),
        # and read a global decision with per-source digests through its slice (defs/slices.py)
        by_source = node.partitions_def == source_partitions and spec is not specs.SOURCE_PINS
        pins = {specs.SOURCE_PINS.name} if by_source else set()
        inputs = {slice_key(i.name).to_user_string() if by_source and i.name in SLICED else i.name for i in spec.inputs}
        assert sorted(p.to_user_string() for p in node.parent_keys) == sorted(inputs | pins), spec.name
        assert node.group_name == spec.group, spec.name
        assert (node.partitions_def is not None) == spec.partitioned, spec.name
        if node.is_materializable:
            assert node.code_version == spec.code_version, spec.name


def test_wiring_cannot_be_declared_twice() -> None:
    with pytest.raises(TypeError, match="'deps' comes from the stage spec"):
        stage_asset(specs.POOL, deps=["normalized"])


def test_a_spec_that_names_its_shard_function_gets_its_asset_generated() -> None:
    from marin_assets.definitions import defs

    generated = [s for s in specs.ALL if s.shard_fn]
    assert specs.MINHASH_BUCKETS in generated
    for spec in generated:
        asset = defs.resolve_assets_def(dg.AssetKey(spec.name))
        assert asset.descriptions_by_key[asset.key] == spec.description
        assert asset.required_resource_keys >= {"marin"}


def test_only_a_per_source_spec_is_generated() -> None:
    from marin_assets.defs.stage_assets import shard_asset

    with pytest.raises(TypeError, match="only a per-source spec with a shard_fn"):
        shard_asset(specs.EXACT_DUPLICATES)
