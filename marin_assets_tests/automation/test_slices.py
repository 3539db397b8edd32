"""Global decisions judged per source: a small graph on a real temporary instance, the
project's conditions attached, evaluated tick by tick as the automation sensor does; the
consumer reads the decision directly, or through its slice asset (``defs/slices.py``), and
automation does the same either way."""


import dagster as dg
import pytest

from dagster._core.definitions.data_version import CachingStaleStatusResolver
from dagster._core.loader import LoadingContextForTest

from marin_assets.defs.automation.conditions import INPUT_POINTER, catalog_names, with_conditions
from marin_assets.defs.slices import record_slices, slice_assets

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


# The same decision read through its slice: named as a project step that has one.
@dg.asset(name="exact_duplicates", deps=[per_source])
def sliced_decision() -> dg.MaterializeResult:
    digests = STATE["digests"]
    version = "-".join(f"{k}={v}" for k, v in sorted(digests.items()))
    record_slices(digests, version)
    return dg.MaterializeResult(metadata={"per_source_digest": dg.MetadataValue.json(digests)}, data_version=dg.DataVersion(version))


(SLICE,) = slice_assets({}, SOURCES, names=["exact_duplicates"])


@dg.asset(name="consumer", partitions_def=SOURCES, deps=[per_source, "exact_duplicates_by_source"])
def sliced_consumer(context: dg.AssetExecutionContext) -> None:
    STATE.setdefault("built", []).append(context.partition_key)


GRAPHS = {
    "direct": (with_conditions([per_source, decision, consumer]), "decision", "decision"),
    "through its slice": (with_conditions([per_source, sliced_decision, SLICE, sliced_consumer]), "exact_duplicates", "exact_duplicates_by_source"),
}


class Ticks:
    def __init__(self, instance: dg.DagsterInstance):
        self.defs, self.instance, self.cursor = dg.Definitions(assets=STATE["assets"]), instance, None

    def __call__(self) -> dict[str, list]:
        result = dg.evaluate_automation_conditions(defs=self.defs, instance=self.instance, cursor=self.cursor)
        self.cursor = result.cursor
        names = ("per_source", STATE["decision"], "consumer")
        return {k.to_user_string().replace(STATE["decision"], "decision"): sorted(result.get_requested_partitions(k), key=str)
                for k in (dg.AssetKey(n) for n in names) if result.get_num_requested(k)}  # fmt: skip


def build(instance: dg.DagsterInstance, names: list[str], partition: str | None = None) -> None:
    names = [STATE["decision"] if n == "decision" else n for n in names]
    assert dg.materialize(STATE["assets"], instance=instance, selection=names, partition_key=partition).success


def stale(instance: dg.DagsterInstance) -> list[str]:
    """The consumer partitions Dagster's own stale status calls stale (Unsynced in the UI)."""
    resolver = CachingStaleStatusResolver(instance, dg.Definitions(assets=STATE["assets"]).resolve_asset_graph(), LoadingContextForTest(instance))
    return [p for p in (A, B, C) if resolver.get_status(dg.AssetKey("consumer"), p).value == "STALE"]


@pytest.fixture(params=list(GRAPHS))
def instance(request):
    STATE.clear()
    STATE["assets"], STATE["decision"], STATE["input"] = GRAPHS[request.param]
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
    read = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=dg.AssetKey("consumer"), asset_partitions=[B]), limit=1).records[0].asset_materialization.tags
    old = read[INPUT_POINTER + STATE["input"]]
    STATE["digests"] = {A: "1", B: "2", C: "1"}
    build(instance, ["decision"])
    assert ticks() == {"consumer": [B]}, "only b's part of the decision moved"
    if STATE["input"] != "decision":
        assert stale(instance) == [B], "Dagster's stale status: exactly the partition whose slice moved"

    # b rebuilt by a run that started before the decision landed: it read the old decision
    instance.report_runless_asset_event(dg.AssetMaterialization("consumer", partition=B, tags={INPUT_POINTER + STATE["input"]: old}))
    assert ticks() == {"consumer": [B]}, "a rebuild from the replaced decision is not current"
    build(instance, ["consumer"], B)
    assert ticks() == {}, "rebuilt from the decision that moved: settled"
    assert ticks() == {}
    if STATE["input"] != "decision":
        assert stale(instance) == []


def test_no_source_is_rebuilt_while_a_global_input_is_being_replaced(instance) -> None:
    ticks = Ticks(instance)
    assert ticks() == {}
    STATE["source"] = {A: "2"}
    build(instance, ["per_source"], A)
    assert ticks() == {"decision": [None]}, "a's own input changed, but the decision it reads is requested"
    build(instance, ["decision"])  # (the daemon runs it now; while in progress it holds them back too)  # same digests: no other source moved
    assert ticks() == {"consumer": [A]}, "a is rebuilt once the decision landed, and only a"
