"""``with_automation`` is generic over the graph: conditions follow an asset's shape, with
explicit exceptions, and a global step's change reaches only the partitions built before."""

from __future__ import annotations

import dagster as dg
from dagster._core.definitions.observe import observe

import pytest

from marin_assets.defs.automation import with_automation
from marin_assets_tests.automation.sources import LIBRE, PEPS

pytestmark = pytest.mark.system  # automation ticks over the whole asset graph, about a minute: `make test` runs it, `make test-fast` does not

THIRD = "dolma_code_prose"  # a catalog name (automation skips partitions not in the catalog)
PARTS = dg.StaticPartitionsDefinition([PEPS, LIBRE, THIRD])
VERSIONS: dict[str, str] = {}


def _version(context) -> dg.MaterializeResult:
    key = context.asset_key.to_user_string() + (f"[{context.partition_key}]" if context.has_partition_key else "")
    return dg.MaterializeResult(data_version=dg.DataVersion(VERSIONS.get(key, "v1")))


@dg.observable_source_asset(partitions_def=PARTS, automation_condition=dg.AutomationCondition.cron_tick_passed("0 * * * *"))
def pins(context) -> dg.DataVersionsByPartition:
    return dg.DataVersionsByPartition({k: VERSIONS.get(f"pins[{k}]", "p1") for k in PARTS.get_partition_keys()})


@dg.asset(partitions_def=PARTS, deps=[pins])
def per_source(context):
    return _version(context)


@dg.asset(deps=[per_source])
def global_step(context):
    return _version(context)


@dg.asset(partitions_def=PARTS, deps=[per_source, global_step])
def attribute(context):
    return _version(context)


@dg.asset(deps=[per_source])
def topic_model(context):  # in EXCEPTIONS: manual
    return _version(context)


@dg.asset(deps=[per_source])
def decision(context):
    """A global step that decides per source, like dedup: its metadata says which source's part changed."""
    digests = {k: VERSIONS.get(f"decision[{k}]", "d1") for k in PARTS.get_partition_keys()}
    return dg.MaterializeResult(data_version=dg.DataVersion(str(sorted(digests.items()))), metadata={"per_source_digest": dg.MetadataValue.json(digests)})


@dg.asset(partitions_def=PARTS, deps=[per_source, decision])
def pool(context):
    return _version(context)


ASSETS = with_automation([pins, per_source, global_step, attribute, topic_model, decision, pool])
DEFS = dg.Definitions(assets=ASSETS)


def _condition(name: str):
    return DEFS.resolve_asset_graph().get(dg.AssetKey(name)).automation_condition


def test_conditions_follow_the_shape_of_the_graph() -> None:
    assert _condition("per_source").get_label() == "marin_per_source"
    assert _condition("attribute").get_label() == "marin_per_source"
    assert _condition("global_step").get_label() == "marin_global"
    assert _condition("topic_model") is None, "model training is an explicit exception: manual"
    assert _condition("pins") == pins.automation_condition, "an author's own condition is kept"


def test_a_global_change_reaches_only_partitions_built_before_and_changed() -> None:
    VERSIONS.clear()
    with dg.instance_for_test() as instance:
        observe([pins], instance=instance)
        for key in (PEPS, LIBRE, THIRD):
            dg.materialize(ASSETS, selection=["per_source"], partition_key=key, instance=instance)
        dg.materialize(ASSETS, selection=["global_step", "topic_model", "decision"], instance=instance)
        for key in (PEPS, LIBRE):  # THIRD never got its attribute or pool
            dg.materialize(ASSETS, selection=["attribute", "pool"], partition_key=key, instance=instance)
        cursor = None

        def tick() -> dict[str, set]:
            nonlocal cursor
            result = dg.evaluate_automation_conditions(defs=DEFS, instance=instance, cursor=cursor)
            cursor = result.cursor
            keys = ["per_source", "global_step", "attribute", "topic_model", "decision", "pool"]
            return {k: result.get_requested_partitions(dg.AssetKey(k)) for k in keys if result.get_num_requested(dg.AssetKey(k))}

        assert tick() == {}
        VERSIONS["per_source[" + THIRD + "]"] = "v2"
        dg.materialize(ASSETS, selection=["per_source"], partition_key=THIRD, instance=instance)
        assert tick() == {"global_step": {None}, "decision": {None}}, "topic_model is manual; THIRD's attribute was never built"
        VERSIONS["global_step"] = "v2"
        VERSIONS[f"decision[{LIBRE}]"] = "d2"
        dg.materialize(ASSETS, selection=["global_step", "decision"], instance=instance)
        assert tick() == {"attribute": {PEPS, LIBRE}, "pool": {LIBRE}}, "a per-source decision reaches only the sources it changed for"
        assert tick() == {"attribute": {PEPS, LIBRE}, "pool": {LIBRE}}, "requested until rebuilt from the new decisions"
        for key, selection in ((PEPS, ["attribute"]), (LIBRE, ["attribute", "pool"])):
            dg.materialize(ASSETS, selection=selection, partition_key=key, instance=instance)
        assert tick() == {}
        dg.materialize(ASSETS, selection=["global_step", "decision"], instance=instance)  # same data versions again
        assert tick() == {}
