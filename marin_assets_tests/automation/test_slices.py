"""Global decisions judged per source: a small graph on a real temporary instance, the
project's conditions attached, evaluated tick by tick as the automation sensor does."""


import dagster as dg
import pytest

from marin_assets.defs.automation.conditions import INPUT_POINTER, catalog_names, with_conditions

pytestmark = pytest.mark.system  # real runs on a temporary instance: ~15 s each on a loaded machine

A, B, C = sorted(catalog_names())[:3]  # partitions must be catalog sources (automation skips others)
SOURCES = dg.StaticPartitionsDefinition([A, B, C])
STATE: dict = {}


@dg.asset(partitions_def=SOURCES)
def per_source(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
    return dg.MaterializeResult(data_version=dg.DataVersion(STATE["source"].get(context.partition_key, "1")))


@dg.asset(deps=[per_source])
def decision() -> dg.MaterializeResult:
    digests = STATE["digests"]
    return dg.MaterializeResult(metadata={"per_source_digest": dg.MetadataValue.json(digests)},
                                data_version=dg.DataVersion("-".join(f"{k}={v}" for k, v in sorted(digests.items()))))  # fmt: skip


@dg.asset(partitions_def=SOURCES, deps=[per_source, decision])
def consumer(context: dg.AssetExecutionContext) -> None:
    STATE.setdefault("built", []).append(context.partition_key)


ASSETS = with_conditions([per_source, decision, consumer])


class Ticks:
    def __init__(self, instance: dg.DagsterInstance):
        self.defs, self.instance, self.cursor = dg.Definitions(assets=ASSETS), instance, None

    def __call__(self) -> dict[str, list]:
        result = dg.evaluate_automation_conditions(defs=self.defs, instance=self.instance, cursor=self.cursor)
        self.cursor = result.cursor
        return {k.to_user_string(): sorted(result.get_requested_partitions(k), key=str) for k in (dg.AssetKey(n) for n in ("per_source", "decision", "consumer")) if result.get_num_requested(k)}


def build(instance: dg.DagsterInstance, names: list[str], partition: str | None = None) -> None:
    assert dg.materialize(ASSETS, instance=instance, selection=names, partition_key=partition).success


@pytest.fixture
def instance():
    STATE.clear()
    STATE.update(source={}, digests={A: "1", B: "1", C: "1"})
    with dg.instance_for_test() as instance:
        for p in (A, B, C):
            build(instance, ["per_source"], p)
        build(instance, ["decision"])
        for p in (A, B, C):
            build(instance, ["consumer"], p)
        yield instance


def test_only_the_sources_whose_slice_moved_are_rebuilt_until_rebuilt_from_it(instance) -> None:
    ticks = Ticks(instance)
    assert ticks() == {}, "the first tick is the baseline"
    old = instance.get_latest_data_version_record(dg.AssetKey("decision")).storage_id
    STATE["digests"] = {A: "1", B: "2", C: "1"}
    build(instance, ["decision"])
    assert ticks() == {"consumer": [B]}, "only b's part of the decision moved"

    # b rebuilt by a run that started before the decision landed: it read the old decision
    instance.report_runless_asset_event(dg.AssetMaterialization("consumer", partition=B, tags={INPUT_POINTER + "decision": str(old)}))
    assert ticks() == {"consumer": [B]}, "a rebuild from the replaced decision is not current"
    build(instance, ["consumer"], B)
    assert ticks() == {}, "rebuilt from the decision that moved: settled"
    assert ticks() == {}


def test_no_source_is_rebuilt_while_a_global_input_is_being_replaced(instance) -> None:
    ticks = Ticks(instance)
    assert ticks() == {}
    STATE["source"] = {A: "2"}
    build(instance, ["per_source"], A)
    assert ticks() == {"decision": [None]}, "a's own input changed, but the decision it reads is requested"
    build(instance, ["decision"])  # (the daemon runs it now; while in progress it holds them back too)  # same digests: no other source moved
    assert ticks() == {"consumer": [A]}, "a is rebuilt once the decision landed, and only a"
