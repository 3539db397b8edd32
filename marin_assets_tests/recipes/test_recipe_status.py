"""``marin_assets.core.ingest.recipes``: implemented recipes and fixture coverage per catalog entry."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from marin_assets.catalog.sources import CatalogError, load_catalog
from marin_assets.core.ingest.recipes import UNKNOWN, checked_catalog, format_status, recipe_status, summarize
from marin_assets_tests.fixtures.pipeline import catalog_with
from marin_assets_tests.recipes import covered_sources


def test_every_hub_entry_is_implemented_and_fixture_tested() -> None:
    rows = recipe_status(load_catalog(), covered_sources())
    hub = [r for r in rows if r.kind == "hf"]
    assert len(hub) == 137
    assert [r.name for r in hub if not (r.implemented and r.fixture)] == []
    assert {r.recipe for r in hub if r.name.startswith("nemotron_cc_v2/")} == {"generic"}
    assert next(r for r in rows if r.name == "agenttrove").pin == "open-thoughts/AgentTrove@b395a43"


def test_missing_transform_and_unknown_coverage_are_reported(tmp_path: Path) -> None:
    extra = {
        "name": "demo/new-family", "family": "demo", "rough_tokens_b": 0.5, "input_format": "parquet",
        "transform": "no_such_family", "provider": {"kind": "hf", "repo_id": "demo/new", "revision": "abcdef1"},
    }  # fmt: skip
    path = catalog_with(tmp_path / "catalog.toml", entries=[extra], keep=["agenttrove", "cp/peps"])
    with pytest.raises(CatalogError, match="no_such_family"):  # the pipeline refuses it when the catalog loads
        checked_catalog(path)
    rows = {r.name: r for r in recipe_status(load_catalog(path), covered_sources())}
    new = rows["demo/new-family"]
    assert (new.implemented, new.fixture, new.recipe) == (False, False, "no_such_family")
    assert "no_such_family" in new.missing
    assert summarize(list(rows.values()))["total"] == {"entries": 3, "implemented": 2, "fixtures": 2, "ready": 2}
    text = format_status(path, covered_sources())
    assert "implemented 2/3; fixture-tested 2/3" in text
    assert "no: needs the family transform 'no_such_family'" in text
    unknown = recipe_status(load_catalog(path))
    assert {r.fixture for r in unknown} == {None}
    assert UNKNOWN in format_status(path)


def test_status_covers_the_fixture_registry_and_stays_free_of_dagster() -> None:
    code = (
        "import sys; from marin_assets_tests.recipes.__main__ import main; main([]); "
        "assert 'dagster' not in sys.modules, 'core imported dagster'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    total = len(load_catalog())
    summary = next(line for line in done.stdout.splitlines() if line.startswith("total:"))
    assert summary.startswith(f"total: {total} entries; implemented ")
    assert f"fixture-tested {len(covered_sources() & set(load_catalog().names))}/{total}" in summary
    assert UNKNOWN not in done.stdout


def test_the_recipe_table_is_status_recipes(tmp_path: Path, capsys) -> None:
    """``marin-assets status`` is the instance's table of sources; the recipe table moved to ``--recipes``."""
    from marin_assets.cli import main

    path = catalog_with(tmp_path / "catalog.toml", keep=["agenttrove", "cp/peps"])
    assert main(["status", "--recipes", "--catalog", str(path)]) == 0
    assert capsys.readouterr().out.strip() == format_status(str(path)).strip()
