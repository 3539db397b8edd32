"""The import structure: the catalog imports no code of the project, each core package imports
only what its docstring allows, the Dagster wiring imports down (never an asset module from
another module of the wiring), and no module of the product or the benches imports itself back
through others."""

from __future__ import annotations

import ast
import importlib
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[1]
CORE = REPO / "marin_assets" / "core"


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: pathlib.Path, known: set[str]) -> set[str]:
    """Project modules a file imports, at module level or inside functions (``from a import b``
    counts ``a.b`` when that is a module, else ``a``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module for a in node.names}
    return {m for m in found if m in known}


def import_graph(*folders: str) -> dict[str, set[str]]:
    files = {module_name(p): p for folder in folders for p in (REPO / folder).rglob("*.py")}
    return {name: imported_modules(path, set(files)) - {name} for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_cycle_finder_sees_a_circle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_in_the_product_or_the_benches() -> None:
    assert cycles(import_graph("marin_assets", "bench")) == []


def allowed_imports(package: str) -> set[str]:
    doc = importlib.import_module(f"marin_assets.core.{package}").__doc__ or ""
    match = re.search(r"May import: (.*?)\.?\s*$", doc, re.S)
    assert match, f"marin_assets/core/{package}/__init__.py: its docstring needs a 'May import:' line"
    if match.group(1).startswith("nothing"):
        return set()
    return {re.sub(r"\s*\(.*", "", part).strip() for part in match.group(1).split(",")}


def test_every_core_package_documents_its_purpose_and_imports_only_what_it_allows() -> None:
    graph = import_graph("marin_assets")
    packages = sorted(p.name for p in CORE.iterdir() if (p / "__init__.py").exists())
    assert {"runtime", "ingest", "dedup", "decon", "embed", "pool", "mixture"} <= set(packages)
    offenders = []
    for package in packages:
        allowed = allowed_imports(package) | {package}
        doc = importlib.import_module(f"marin_assets.core.{package}").__doc__ or ""
        assert len(doc.split()) >= 15, f"core/{package}: say what the package owns"
        for module, targets in graph.items():
            if not module.startswith(f"marin_assets.core.{package}"):
                continue
            for target in targets:
                if target == LAYERS[0]:
                    continue  # the error vocabulary, below every layer
                if target.startswith("marin_assets.catalog"):
                    used = "catalog"
                elif target.startswith("marin_assets.core.") and target != "marin_assets.core.specs":
                    used = target.split(".")[2]
                else:
                    used = target  # anything else of the product (defs, testing, specs) is never allowed
                if used not in allowed:
                    offenders.append(f"{module} imports {target}")
    assert offenders == []


LAYERS = ("marin_assets.errors", "marin_assets.catalog", "marin_assets.core", "marin_assets.defs")
"""From the bottom up: a layer imports only from the layers below it and itself. ``errors`` (the
four kinds of failure, importing nothing) is the vocabulary every layer's errors derive from."""


def layer_of(module: str) -> int | None:
    return next((i for i, layer in enumerate(LAYERS) if module == layer or module.startswith(layer + ".")), None)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports from a layer into a layer above it, or out of the three layers (demo, testing, CLI, code location)."""
    found = []
    for module, targets in sorted(graph.items()):
        here = layer_of(module)
        if here is None:
            continue
        for target in sorted(targets):
            there = layer_of(target)
            if there is None or there > here:
                found.append(f"{module} imports {target}")
    return found


def test_the_layer_check_sees_an_arrow_back_up() -> None:
    graph = {"marin_assets.catalog.sources": {"marin_assets.core.ingest.formats"}, "marin_assets.core.x": {"marin_assets.defs.y"},
             "marin_assets.defs.z": {"marin_assets.demo.run"}, "marin_assets.defs.w": {"marin_assets.core.x", "marin_assets.catalog.sources"}}
    assert upward_imports(graph) == [
        "marin_assets.catalog.sources imports marin_assets.core.ingest.formats",
        "marin_assets.core.x imports marin_assets.defs.y",
        "marin_assets.defs.z imports marin_assets.demo.run",
    ]


def test_catalog_core_and_defs_import_only_downward() -> None:
    assert upward_imports(import_graph("marin_assets")) == []


def asset_modules(graph: dict[str, set[str]]) -> set[str]:
    return {m for m in graph if re.fullmatch(r"marin_assets\.defs\.\w+\.assets", m)}


def test_no_module_of_the_wiring_imports_an_asset_module() -> None:
    """Asset modules share what they need through core or one non-asset defs module; only the
    code location (``marin_assets.definitions``) gathers them."""
    graph = import_graph("marin_assets")
    assets = asset_modules(graph)
    assert {"marin_assets.defs.ingest.assets", "marin_assets.defs.pool.assets"} <= assets
    offenders = sorted(f"{m} imports {t}" for m, targets in graph.items() if m.startswith("marin_assets.defs") for t in targets & assets)
    assert offenders == []
