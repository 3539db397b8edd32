"""``marin-assets status`` and the ``source_status`` check: every catalog source's state, read from
a real instance (small assets named like the stages, real catalog entries)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from marin_assets.catalog.sources import load_catalog
from marin_assets.core.ingest import raw as ingest
from marin_assets.defs.resources import MarinResource
from marin_assets.defs.slices import record_slices, slice_assets
from marin_assets.defs.status import STATUS_CHECK, format_source_status, source_status, source_status_check, source_status_sensor
from marin_assets_tests.fixtures.pipeline import catalog_with

pytestmark = pytest.mark.system  # real instance, a dozen runs (~30 s)

NAMES = ["agenttrove", "cp/peps", "cp/libretexts", "dolma_code_prose"]
PARTS = dg.StaticPartitionsDefinition(NAMES)
SLICES = {"agenttrove": "1", "cp/peps": "1"}
FAIL: set[str] = set()


def _recipes(path: Path) -> dict[str, str]:
    return {s.name: ingest.recipe_fingerprint(s) for s in load_catalog(path)}


@pytest.fixture
def catalog(tmp_path: Path) -> Path:
    return catalog_with(tmp_path / "catalog.toml", keep=NAMES)


def graph_for(catalog: Path) -> list:
    recipes = _recipes(catalog)

    @dg.asset(partitions_def=PARTS, deps=["source_pins"])
    def raw_files(context) -> dg.MaterializeResult:
        return dg.MaterializeResult(metadata={"recipe": recipes[context.partition_key]})

    @dg.asset
    def exact_duplicates() -> dg.MaterializeResult:
        version = "-".join(f"{k}={v}" for k, v in sorted(SLICES.items()))
        record_slices(SLICES, version)  # as every global step with per-source digests does
        return dg.MaterializeResult(metadata={"per_source_digest": dict(SLICES)}, data_version=dg.DataVersion(version))

    (by_source,) = slice_assets({}, PARTS, names=["exact_duplicates"])

    @dg.asset(partitions_def=PARTS, deps=[raw_files, "exact_duplicates_by_source"])
    def pool(context) -> dg.MaterializeResult:
        if context.partition_key in FAIL:
            raise dg.Failure(f"source '{context.partition_key}': band edges missing; rebuild quality_bands")
        return dg.MaterializeResult(metadata={"tokens": 1000 + len(context.partition_key)})

    return [dg.AssetSpec("source_pins", partitions_def=PARTS), raw_files, exact_duplicates, by_source, pool]


def build(instance, assets, selection: str, partition: str | None = None) -> None:
    dg.materialize(assets, selection=selection, partition_key=partition, instance=instance, raise_on_error=False)


def states(instance, assets, catalog: Path) -> dict[str, tuple[str, str]]:
    graph = dg.Definitions(assets=assets).resolve_asset_graph()
    return {s.source: (s.state, s.reason) for s in source_status(instance, graph, load_catalog(catalog))}


def test_every_source_is_listed_with_its_state_and_reason(catalog: Path, tmp_path: Path) -> None:
    assets = graph_for(catalog)
    FAIL.clear()
    SLICES.update({"agenttrove": "1", "cp/peps": "1"})
    with dg.instance_for_test() as instance:
        for name in ("agenttrove", "cp/peps", "cp/libretexts"):
            build(instance, assets, "raw_files", name)
        build(instance, assets, "exact_duplicates")
        for name in ("agenttrove", "cp/peps"):
            build(instance, assets, "pool", name)
        now = states(instance, assets, catalog)
        assert now == {"agenttrove": ("built", ""), "cp/peps": ("built", ""), "cp/libretexts": ("partly built", "not built yet: pool"),
                       "dolma_code_prose": ("never built", "")}  # fmt: skip

        SLICES["agenttrove"] = "2"  # a dedup change that moves one source's slice only
        build(instance, assets, "exact_duplicates")
        now = states(instance, assets, catalog)
        assert now["agenttrove"] == ("stale", "its slice of exact_duplicates moved")
        assert now["cp/peps"] == ("built", ""), "its slice did not move: current"

        FAIL.add("cp/peps")
        build(instance, assets, "pool", "cp/peps")
        state, reason = states(instance, assets, catalog)["cp/peps"]
        assert state == "failed" and reason.endswith("pool: source 'cp/peps': band edges missing; rebuild quality_bands")

        edited = catalog_with(tmp_path / "edited.toml", keep=NAMES, edit={"cp/libretexts": {"provider": {"revision": "f" * 40}}})
        state, reason = states(instance, assets, edited)["cp/libretexts"]
        assert state == "stale" and reason.startswith("pin changed: built for recipe ")

        graph = dg.Definitions(assets=assets).resolve_asset_graph()
        text = format_source_status(source_status(instance, graph, load_catalog(catalog)))
        assert text.splitlines()[0] == "4 catalog sources: 1 failed, 1 stale, 1 partly built, 1 never built"
        assert [line.split()[0] for line in text.splitlines()[2:5]] == ["cp/peps", "agenttrove", "cp/libretexts"], "failed first, then stale"


def test_the_ui_check_is_recorded_when_the_table_changes(catalog: Path) -> None:
    assets = graph_for(catalog)
    FAIL.clear()
    marin = MarinResource(catalog_path=str(catalog))
    defs = dg.Definitions(assets=assets, asset_checks=[source_status_check], sensors=[source_status_sensor], resources={"marin": marin})
    with dg.instance_for_test() as instance:
        build(instance, assets, "raw_files", "agenttrove")

        def tick(cursor):
            context = dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs, resources={"marin": marin})
            return source_status_sensor(context)

        first = tick(None)
        (evaluation,) = first.asset_events
        assert evaluation.check_name == STATUS_CHECK and evaluation.passed
        rows = [r.data for r in evaluation.metadata["sources"].records]
        assert rows == [{"source": "agenttrove", "state": "partly built", "reason": "not built yet: pool", "last build": rows[0]["last build"], "tokens": ""}]
        assert evaluation.metadata["summary"].value == "4 catalog sources: 1 partly built, 3 never built"
        assert evaluation.metadata["never built"].value == 3
        assert tick(first.cursor).asset_events == [], "an unchanged table records nothing"
