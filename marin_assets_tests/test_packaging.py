"""The built wheel ships the product (code, catalog, demo data, the local Hub server) and no tests."""

from __future__ import annotations

import ast
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.system
def test_wheel_contains_no_test_module(tmp_path: pathlib.Path) -> None:
    src = tmp_path / "src"  # a copy, so the build leaves nothing behind in the checkout
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for package in ("marin_assets", "marin_assets_tests"):
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "dist"), str(src)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("marin_assets-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        sources = {n: archive.read(n).decode() for n in names if n.endswith(".py")}
    assert [n for n in names if not n.startswith(("marin_assets/", "marin_assets-"))] == []  # marin_assets_tests/ included
    assert {"marin_assets/testing/hub_server.py", "marin_assets/catalog/sources.toml", "marin_assets/definitions.py"} <= set(names)
    importers = [
        n for n, text in sources.items() for node in ast.walk(ast.parse(text))
        if isinstance(node, (ast.Import, ast.ImportFrom))
        and any(m.startswith("marin_assets_tests") for m in ([a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]))
    ]  # fmt: skip
    assert importers == [], "product modules import the tests the wheel does not ship"
