"""The offline demo end to end: every stage on the bundled sample, then the pool's invariants.

This is what `make demo` runs (the real assets, the local Hub server, the offline encoder), into
a temporary DAGSTER_HOME and MARIN_PREFIX.
"""

from __future__ import annotations

import dagster as dg
import polars as pl
import pytest

from marin_assets.catalog.sources import load_catalog
from marin_assets.core import specs
from marin_assets.core.dedup import decisions as dedup
from marin_assets.core.pool import curated as pool
from marin_assets.core.runtime import stages, storage
from marin_assets.demo.run import run_demo
from marin_assets.demo.sample import DEMO_SOURCES

pytestmark = pytest.mark.system  # the whole demo pipeline: `make test` runs it, `make test-fast` does not


@pytest.fixture(scope="module")
def demo_root(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("demo")
    with pytest.MonkeyPatch.context() as mp:
        for key, value in {"DAGSTER_HOME": root / "home", "MARIN_PREFIX": root / "data", "MARIN_DEMO_HUB": root / "hub"}.items():
            mp.setenv(key, str(value))
        for key in ("HF_ENDPOINT", "MARIN_EVALS", "MARIN_QUALITY_ANNOTATIONS", "MARIN_CATALOG"):
            mp.delenv(key, raising=False)
        assert run_demo() == 0
        yield str(root / "data")


def _read(uri: str, columns: list[str] | None = None) -> pl.DataFrame:
    return pl.from_arrow(storage.read_parquet(uri, columns))  # type: ignore[return-value]


def _attribute(layout: storage.Layout, stage: specs.StageSpec, source: str, columns: list[str]) -> pl.DataFrame:
    found = stages.current_input(layout, stage, source)
    return pl.concat([_read(u, columns) for u in storage.list_shards(found.uri)])


def test_pool_holds_every_surviving_document_exactly_once(demo_root: str) -> None:
    layout = storage.Layout(demo_root)
    catalog = load_catalog()
    exact = stages.current_input(layout, specs.EXACT_DUPLICATES).uri
    fuzzy = stages.current_input(layout, specs.FUZZY_DUPLICATES).uri
    flagged_total = 0
    for source in DEMO_SOURCES:
        docs = _attribute(layout, specs.NORMALIZED, source, ["id"])
        contaminated = _attribute(layout, specs.CONTAMINATION, source, ["id", "contaminated"]).filter(pl.col("contaminated"))["id"]
        flagged_total += contaminated.len()
        removed = set(contaminated.to_list()) | set(_read(dedup.removed_uri(exact, source), ["id"])["id"].to_list())
        if not catalog.by_name(source).fuzzy_exempt:
            removed |= set(_read(dedup.removed_uri(fuzzy, source), ["id"])["id"].to_list())
        pool = stages.current_input(layout, specs.POOL, source)
        assert pool.data_uri == storage.join(demo_root, "pool", source, pool.fingerprint)
        files = storage.glob(storage.join(pool.data_uri, "*", "*.parquet"))
        pooled = pl.concat([_read(f, ["id", "source", "topic", "band", "tokens"]) for f in files])
        assert pooled["id"].n_unique() == pooled.height  # exactly once
        assert set(pooled["id"].to_list()) == set(docs["id"].to_list()) - removed
        assert (pooled["source"] == source).all()
        assert pooled["topic"].is_between(0, 39).all() and pooled["band"].is_between(0, 4).all()
        assert (pooled["tokens"] > 0).all()
    assert flagged_total >= 3  # the sample's documents that copy demo eval items


def test_sampling_groups_count_the_pool_and_weights_sum_to_one(demo_root: str) -> None:
    layout = storage.Layout(demo_root)
    out = stages.current_input(layout, specs.SAMPLING_GROUPS).uri
    groups = _read(storage.join(out, "groups.parquet"))
    assert groups.height == 200
    assert sorted(groups["group"].to_list())[:2] == ["c00q0", "c00q1"]
    assert abs(groups["weight"].sum() - 1.0) < 1e-9
    files = pool.read_pool_files(storage.join(out, "pool_files.parquet"))
    pooled = pl.concat([_read(f, ["id", "tokens"]).with_columns(pl.lit(g).alias("group")) for g, fs in files.items() for f in fs])
    per_group = pooled.group_by("group").agg(pl.len().alias("documents"), pl.col("tokens").sum().alias("tokens"))
    joined = groups.join(per_group, on="group", how="left", suffix="_pool").fill_null(0)
    assert (joined["documents"] == joined["documents_pool"]).all()
    assert (joined["tokens"] == joined["tokens_pool"]).all()
    assert storage.exists(storage.join(out, "groups.csv"))


def test_second_demo_run_reuses_every_output(demo_root: str, monkeypatch, capsys) -> None:
    root = demo_root.rsplit("/", 1)[0]
    for key, sub in {"DAGSTER_HOME": "home", "MARIN_PREFIX": "data", "MARIN_DEMO_HUB": "hub"}.items():
        monkeypatch.setenv(key, f"{root}/{sub}")
    before = {p for p in storage.glob(f"{demo_root}/**/_manifest.json")}
    assert run_demo() == 0
    after = {p for p in storage.glob(f"{demo_root}/**/_manifest.json")}
    assert after == before  # nothing new was computed
    out = capsys.readouterr().out
    assert "False" not in out.split("normalized sources:")[1]  # every source reports reused=True
    report = out.split("rebuild report (against the catalog and the last published build):")[1].split("\n\n")[0]
    assert "tokens by " in report and all(f"  {name} " in report for name in DEMO_SOURCES), report
    assert "published 8.5%: 2.13T of 25T" in report


def test_sampling_groups_check_names_a_pool_whose_slice_moved(demo_root: str) -> None:
    """A pool built before its part of a global decision moved is stale; the blocking check on
    ``sampling_groups`` fails and names it, and only it."""
    from marin_assets.defs.pool.assets import pools_current, stale_pools

    layout, catalog = storage.Layout(demo_root), load_catalog()
    pools, _ = stages.current_inputs(layout, specs.POOL, list(DEMO_SOURCES))
    assert len(pools) == len(DEMO_SOURCES) and stale_pools(layout, pools, catalog) == {}, "the demo leaves every pool current"
    assert pools_current({}, len(pools)).passed

    exact = stages.current_input(layout, specs.EXACT_DUPLICATES)
    manifest_uri = storage.manifest_uri(exact.uri)
    original = storage.read_json(manifest_uri)
    victim = sorted(DEMO_SOURCES)[0]
    moved = {**original, "stats": {**original["stats"], "removed_ids_digest": {**original["stats"]["removed_ids_digest"], victim: "moved"}}}
    storage.write_json(manifest_uri, moved)  # the exact-dedup decision changed for this source only
    try:
        stale = stale_pools(layout, pools, catalog)
        check = pools_current(stale, len(pools))
    finally:
        storage.write_json(manifest_uri, original)
    assert list(stale) == [victim]
    assert not check.passed and check.severity == dg.AssetCheckSeverity.ERROR and victim in (check.description or "")


def test_every_column_of_every_output_is_described(demo_root: str) -> None:
    """The Columns panel shows a description for each column of each stage's Parquet output."""
    from marin_assets.defs.metadata import column_schema

    undescribed, seen = [], 0
    for manifest_path in storage.glob(f"{demo_root}/**/_manifest.json"):
        manifest = storage.read_json(manifest_path)
        folder = manifest_path.rsplit("/", 1)[0]
        schema = column_schema({**manifest, "uri": manifest.get("uri") or folder})
        for column in schema.columns if schema else []:
            seen += 1
            if not column.description:
                undescribed.append(f"{manifest.get('stage')}.{column.name}")
    assert seen and not undescribed, sorted(set(undescribed))
