"""Recipe status of every catalog entry: can this version build it, and does a fixture test it?

``implemented`` means the entry's provider kind and family transform are both available (the
same check ``normalized`` runs before it starts). Fixture coverage is passed in by the caller
(the test suite's registry prints it: ``python -m marin_assets_tests.recipes``); without it
coverage is reported as unknown rather than guessed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from marin_assets.catalog.sources import Catalog, load_catalog
from marin_assets.core.ingest import raw as ingest
from marin_assets.core.ingest.formats import CATALOG_FORMATS
from marin_assets.core.ingest.transforms import known_transforms

GENERIC = "generic"
UNKNOWN = "unknown (python -m marin_assets_tests.recipes reports it from a checkout)"


def checked_catalog(path: str | Path | None = None, *, strict: bool = True) -> Catalog:
    """The catalog, each entry checked against what this version builds: the format table and
    the family transforms (the catalog receives them; it imports nothing of the code)."""
    return load_catalog(path, strict=strict, known_formats=CATALOG_FORMATS, known_transforms=known_transforms())


@dataclasses.dataclass(frozen=True)
class RecipeStatus:
    name: str
    kind: str  # provider kind; Hub buckets show as "hf-bucket"
    pin: str
    recipe: str  # the family transform, or "generic"
    implemented: bool
    missing: str  # what is not implemented yet ("" when implemented)
    fixture: bool | None  # None: coverage not given


def recipe_status(catalog: Catalog, covered: set[str] | None = None) -> list[RecipeStatus]:
    """One row per entry, in catalog order; ``covered`` is the set of fixture-tested names
    (None: unknown)."""
    known = sorted(known_transforms())
    fixtures = covered
    rows = []
    for source in catalog:
        provider = source.provider
        try:
            ingest.check_recipe(source, known)
            missing = ""
        except ingest.RecipeNotImplemented as exc:
            missing = str(exc).split(": ", 1)[-1].removeprefix(f"source '{source.name}' ")
        rows.append(
            RecipeStatus(
                name=source.name,
                kind="hf-bucket" if provider.kind == "hf" and provider.repo_type == "bucket" else provider.kind,
                pin=provider.pin,
                recipe=source.transform or GENERIC,
                implemented=not missing,
                missing=missing,
                fixture=None if fixtures is None else source.name in fixtures,
            )
        )
    return rows


def _yes(flag: bool | None, unknown: str = "unknown") -> str:
    return unknown if flag is None else ("yes" if flag else "no")


def summarize(rows: Sequence[RecipeStatus]) -> dict[str, Any]:
    """Totals overall and per provider kind."""
    kinds: dict[str, dict[str, int]] = {}
    for row in rows:
        k = kinds.setdefault(row.kind, {"entries": 0, "implemented": 0, "fixtures": 0, "ready": 0})
        k["entries"] += 1
        k["implemented"] += row.implemented
        k["fixtures"] += bool(row.fixture)
        k["ready"] += row.implemented and bool(row.fixture)
    total = {key: sum(k[key] for k in kinds.values()) for key in ("entries", "implemented", "fixtures", "ready")}
    return {"total": total, "kinds": dict(sorted(kinds.items())), "fixtures_known": all(r.fixture is not None for r in rows)}


def format_status(catalog_path: str | Path | None = None, covered: set[str] | None = None) -> str:
    """The status table of the catalog at ``catalog_path`` (default: the packaged catalog)."""
    rows = recipe_status(load_catalog(catalog_path, known_formats=CATALOG_FORMATS), covered)  # lists what is not implemented yet
    width = max([len(r.name) for r in rows] + [6])
    recipe_width = max([len(r.recipe) for r in rows] + [6])
    lines = [f"{'source':<{width}}  {'kind':<9}  {'recipe':<{recipe_width}}  {'implemented':<11}  {'fixture':<7}  pin"]
    for r in rows:
        implemented = "yes" if r.implemented else f"no: {r.missing}"
        lines.append(
            f"{r.name:<{width}}  {r.kind:<9}  {r.recipe:<{recipe_width}}  {implemented:<11}  {_yes(r.fixture):<7}  {r.pin}"
        )
    summary = summarize(rows)
    total = summary["total"]
    fixtures = f"{total['fixtures']}/{total['entries']}" if summary["fixtures_known"] else UNKNOWN
    lines.append(
        f"total: {total['entries']} entries; implemented {total['implemented']}/{total['entries']}; "
        f"fixture-tested {fixtures}; implemented and fixture-tested {total['ready']}/{total['entries']}"
        if summary["fixtures_known"]
        else f"total: {total['entries']} entries; implemented {total['implemented']}/{total['entries']}; fixture-tested {fixtures}"
    )
    for kind, k in summary["kinds"].items():
        covered = f", fixture-tested {k['fixtures']}" if summary["fixtures_known"] else ""
        lines.append(f"  {kind}: {k['entries']} entries, implemented {k['implemented']}{covered}")
    return "\n".join(lines)
