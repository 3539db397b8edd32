"""Fixture sources for the automation tests: real catalog entries, tiny files on the local Hub."""

from __future__ import annotations

import gzip
import json
import random
from typing import Any

from marin_assets.catalog.sources import load_catalog

PEPS = "cp/peps"  # Dolma-style gzipped JSON lines
LIBRE = "cp/libretexts"  # same format, another repo


def json_gz(texts: list[str]) -> bytes:
    return gzip.compress("".join(json.dumps({"id": f"doc-{i}", "text": t}) + "\n" for i, t in enumerate(texts)).encode())


_VOCABULARY = [a + b for a in ("ka", "lo", "mi", "nu", "pe", "ra", "si", "to", "vu", "ze") for b in ("bar", "den", "fis", "gol", "hum", "jet", "kor", "lin", "mop", "nax")]


def texts_for(name: str, version: int = 1, rows: int = 6) -> list[str]:
    """Distinct documents per source and version (no fuzzy duplicates across fixtures)."""
    rng = random.Random(f"{name}/{version}")
    return [" ".join(rng.choice(_VOCABULARY) for _ in range(60)) + f" ({name} {version} {i})" for i in range(rows)]


def publish_source(store: Any, name: str, version: int = 1, commit: str | None = None, branch: str | None = "main") -> str:
    """Publish ``name``'s repo with its fixture texts; at the catalog pin unless ``commit`` is given."""
    provider = load_catalog().by_name(name).provider
    files = {"data/part-0.json.gz": json_gz(texts_for(name, version))}
    return store.publish(provider.repo_id, files, commit=commit if commit is not None else provider.revision, branch=branch)


def entry_like(name: str, new_name: str) -> dict[str, Any]:
    """A catalog table for a new source reading the same provider files as ``name``."""
    import tomllib

    from marin_assets.catalog.sources import default_catalog_path

    raw = tomllib.loads(default_catalog_path().read_text())
    table = next(dict(s) for s in raw["source"] if s["name"] == name)
    table["provider"] = dict(table["provider"])
    table["name"] = new_name
    return table


def run_with_checks(pipeline: Any, selection: Any, partition: str, raise_on_error: bool = False) -> Any:
    """Run like the UI does: the selected assets with their checks (or checks alone), in one run."""
    import dagster as dg

    from marin_assets.definitions import defs
    from marin_assets.defs.automation import CHECKS
    from marin_assets.defs.partitions import source_partitions

    assets = [a for a in defs.assets or [] if isinstance(a, dg.AssetsDefinition) and a.is_executable]
    job = dg.define_asset_job("under_test", selection=selection, partitions_def=source_partitions)
    with_checks = dg.Definitions(assets=assets, asset_checks=CHECKS, jobs=[job], resources={**(defs.resources or {}), "marin": pipeline.resource})
    # the partition goes in as its run tag: a run of checks alone has no asset to validate a key against
    return with_checks.resolve_job_def("under_test").execute_in_process(
        instance=pipeline.instance, tags={"dagster/partition": partition}, raise_on_error=raise_on_error
    )
