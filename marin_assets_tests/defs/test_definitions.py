"""The code location loads, validates, and keeps its asset graph and layering."""

from __future__ import annotations

import ast
import json
import os
import pathlib
import subprocess
import sys

import dagster as dg
import pytest

from marin_assets.catalog.sources import load_catalog

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "marin_assets"
SNAPSHOT = pathlib.Path(__file__).with_name("asset_graph.json")


def _checks(defs: dg.Definitions) -> dict[str, list[str]]:
    """The written asset checks of each asset that has any. The rest follows from the specs: the
    graph (``test_stage_assets``) and the co-partition check of every co-partitioned stage (below)."""
    graph = defs.resolve_asset_graph()
    found = {}
    for key in sorted(graph.get_all_asset_keys(), key=lambda k: k.to_user_string()):
        if checks := sorted(c.name for c in graph.get(key).check_keys if c.name != "co_partitioned"):
            found[key.to_user_string()] = checks
    return found


def test_every_co_partitioned_stage_and_only_those_has_the_co_partition_check() -> None:
    from marin_assets.core import specs
    from marin_assets.definitions import defs

    graph = defs.resolve_asset_graph()
    checked = {k.to_user_string() for k in graph.get_all_asset_keys() if any(c.name == "co_partitioned" for c in graph.get(k).check_keys)}
    assert checked == {s.name for s in specs.ALL if s.co_partitioned}


def test_definitions_load_and_validate() -> None:
    from marin_assets.definitions import defs

    dg.Definitions.validate_loadable(defs)
    normalized = defs.resolve_assets_def("normalized")
    assert normalized.partitions_def is not None
    assert list(normalized.partitions_def.get_partition_keys()) == list(load_catalog().names)
    assert len(normalized.partitions_def.get_partition_keys()) == 146


def test_asset_checks_match_snapshot() -> None:
    """A reviewed list of every asset's checks: regenerate with MARIN_UPDATE_SNAPSHOT=1 when it changes on purpose."""
    from marin_assets.definitions import defs

    checks = _checks(defs)
    if os.environ.get("MARIN_UPDATE_SNAPSHOT") or not SNAPSHOT.exists():
        SNAPSHOT.write_text(json.dumps(checks, indent=2) + "\n")
    assert checks == json.loads(SNAPSHOT.read_text())


def test_every_phase_job_selects_the_stages_its_specs_name() -> None:
    from marin_assets.core import specs
    from marin_assets.definitions import defs

    for phase in specs.PHASES:
        job = defs.resolve_job_def(phase.name)
        assert {k.to_user_string() for k in job.asset_layer.selected_asset_keys} == {s.name for s in phase.stages}
    assert all(s.phase for s in specs.ALL if s is not specs.SOURCE_PINS), "give each stage a phase (the job that builds it)"


def stage_name_literals(source: str) -> list[str]:
    """String constants equal to a stage's name: the spec (``specs.X.name``) says it instead."""
    from marin_assets.core import specs

    return [f"line {n.lineno}: {n.value!r}" for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Constant) and n.value in specs.BY_NAME]


def test_no_stage_name_string_in_the_wiring() -> None:
    assert stage_name_literals("x = 'pool'\ny = f'{a}'\nz = 'pools'\n") == ["line 1: 'pool'"]
    offenders = {str(p.relative_to(PACKAGE)): found for p in sorted((PACKAGE / "defs").rglob("*.py")) if (found := stage_name_literals(p.read_text()))}
    assert offenders == {}


def test_no_asset_function_shadows_a_name_its_module_imports() -> None:
    shadowed = []
    for path in sorted((PACKAGE / "defs").rglob("*.py")):
        tree = ast.parse(path.read_text())
        imported = {a.asname or a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
        shadowed += [f"{path.relative_to(PACKAGE)}: {n.name}" for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in imported]
    assert shadowed == []


@pytest.mark.system
def test_core_and_catalog_never_import_dagster() -> None:
    offenders = []
    for layer in ("core", "catalog"):
        for path in (PACKAGE / layer).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                if any(n == "dagster" or n.startswith("dagster.") or n.startswith("dagster_") for n in names):
                    offenders.append(str(path.relative_to(PACKAGE)))
    assert offenders == []
    # and importing every core/catalog module does not pull dagster in indirectly
    modules = [".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts) for layer in ("core", "catalog") for p in (PACKAGE / layer).rglob("*.py")]
    code = "import importlib, sys\nfor m in %r: importlib.import_module(m.removesuffix('.__init__'))\nprint('dagster' in sys.modules)" % modules
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"


def layer_violations(source: str) -> list[str]:
    """What a core or catalog module must not do: read the environment, import dagster, import the tests."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os" and node.attr in ("environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"):
            found.append(f"line {node.lineno}: os.{node.attr}")
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            found += [f"line {node.lineno}: from os import {a.name}" for a in node.names if a.name in ("environ", "environb", "getenv", "getenvb", "putenv", "unsetenv")]
        for name in names:
            if name == "dagster" or name.startswith(("dagster.", "dagster_")):
                found.append(f"line {node.lineno}: imports {name}")
            if name == "marin_assets_tests" or name.startswith("marin_assets_tests."):
                found.append(f"line {node.lineno}: imports {name}")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("marin_assets_tests"):
            found.append(f"line {node.lineno}: names module {node.value!r}")
    return found


def test_layer_rules_catch_what_they_forbid() -> None:
    bad = (
        "import os\nfrom os import getenv\nimport dagster as dg\nfrom dagster_k8s import x\n"
        "import marin_assets_tests.recipes\nimport importlib\nimportlib.import_module('marin_assets_tests.recipes')\n"
        "a = os.environ.get('X')\nb = os.getenv('Y')\n"
    )
    assert len(layer_violations(bad)) == 7
    assert layer_violations("import os\npath = os.path.join('a', 'b')\n") == []


def test_core_and_catalog_read_no_environment_and_never_import_dagster_or_tests() -> None:
    offenders = {
        str(path.relative_to(PACKAGE)): found
        for layer in ("core", "catalog")
        for path in sorted((PACKAGE / layer).rglob("*.py"))
        if (found := layer_violations(path.read_text()))
    }
    assert offenders == {}


def test_product_code_never_imports_the_tests_and_only_entry_points_use_testing() -> None:
    """The wheel ships no tests, so no product module may need them; the local Hub server
    (``marin_assets.testing``) serves the demo and ``serve-hub``, never a pipeline stage."""
    tests_users, testing_users = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE))
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n.startswith("marin_assets_tests") for n in names):
                tests_users.append(rel)
            if any(n.startswith("marin_assets.testing") for n in names) and not rel.startswith("testing/"):
                testing_users.append(rel)
    assert tests_users == []
    assert sorted(set(testing_users)) == ["cli.py", "demo/run.py"]


@pytest.mark.system  # the Dagster CLI in a subprocess, as `make check`
def test_dagster_cli_validates_the_code_location(tmp_path) -> None:
    exe = pathlib.Path(sys.executable).with_name("dagster")
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path)}
    done = subprocess.run([str(exe), "definitions", "validate", "-m", "marin_assets.definitions"], capture_output=True, text=True, cwd=PACKAGE.parent, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
