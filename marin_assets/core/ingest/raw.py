"""From a catalog entry to provider files under ``raw/`` and the list of files to normalize.

A source's raw copy is addressed by content: provider repo, resolved revision and file
selection. Sources of one family download (the same ``share_key``) download the union of their
selections once and share that copy; each then normalizes only its own subset.

A small pin record ``raw/_pins/<source>/<recipe fingerprint>.json`` maps the catalog pin to the
resolved revision and the copy, so later stages find the raw copy without asking the provider
again (the stage runner writes it, with the copy's manifest). Paths listed in a raw manifest
are checked to stay inside the copy.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

from marin_assets.core.ingest.formats import SUPPORTED_FORMATS, format_of_name
from marin_assets.core.ingest.hub import select_paths
from marin_assets.core.ingest.normalize import NormalizeParams
from marin_assets.core.runtime import stages, storage, trust
from marin_assets.errors import BadInput, ConfigurationError

CODE_VERSION = "1"


class RecipeNotImplemented(ConfigurationError, RuntimeError):
    """A catalog entry whose recipe this version of the project cannot run yet."""


class RawFilesMissing(BadInput, RuntimeError):
    """A stage needs a source's raw files that were never downloaded."""


def recipe_fingerprint(source: Any) -> str:
    """Fingerprint of everything in a catalog entry that defines how the source is built."""
    recipe = source.recipe_fingerprint() if hasattr(source, "recipe_fingerprint") else dataclasses.asdict(source)
    if isinstance(recipe, str):
        return recipe
    return storage.fingerprint("source_recipe", recipe)


def family_selection(source: Any, catalog: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Allow and exclude globs of the download shared by ``source``'s family.

    An empty allow list anywhere in the family means "all repo files".
    """
    members = [s for s in catalog if s.provider.share_key == source.provider.share_key] or [source]
    if any(not s.provider.allow for s in members):
        allow: tuple[str, ...] = ()
    else:
        allow = tuple(sorted({g for s in members for g in s.provider.allow}))
    exclude = tuple(sorted(set.intersection(*(set(s.provider.exclude) for s in members)))) if members else ()
    return allow, exclude


def raw_key(source: Any) -> str:
    """Directory name for a provider repo: ``org__name`` (buckets: ``buckets__org__name``)."""
    return source.provider.repo_id.strip("/").replace("/", "__")


def pin_record_uri(layout: storage.Layout, source: Any) -> str:
    """Where the raw copy for ``source``'s current recipe is recorded (one record per recipe)."""
    return storage.join(layout.root, "raw", "_pins", source.name, recipe_fingerprint(source) + ".json")


def fetch_raw(
    source: Any,
    catalog: Any,
    layout: storage.Layout,
    *,
    download: Callable[..., dict[str, Any]],
    resolve: Callable[..., str],
    progress: Callable[[str], None] | None = None,
    access: Any = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Fetch ``source``'s provider files at its pin (a complete shared copy is reused).

    Hugging Face sources download their family's selection with the injected hub client
    (``download_snapshot`` and ``resolve_revision``: callers choose endpoint, token and retry
    policy). Other provider kinds go through ``marin_assets.core.ingest.providers`` with ``access``
    (a ``providers.ProviderAccess``: retry policy, mirrors, Hub endpoint and token, staging folder).
    Returns the copy's manifest and its pin record (``uri``, ``revision``, ``fingerprint``,
    ``pin``); ``stages.run_copy`` records both.
    """
    provider = source.provider
    if provider.kind == "hf" and provider.repo_type != "bucket":
        allow, exclude = family_selection(source, catalog)
        selection_fp = storage.fingerprint("selection", {"allow": allow, "exclude": exclude})[:8]
        revision = resolve(provider.repo_id, provider.revision, provider.repo_type or "dataset")
        dest = layout.raw(raw_key(source), f"{revision}-{selection_fp}" if allow or exclude else revision)
        manifest = download(provider.repo_id, revision, allow, exclude, dest, progress)
        fp = storage.fingerprint(
            "raw_files",
            {"repo": provider.repo_id, "revision": revision, "allow": allow, "exclude": exclude},
            CODE_VERSION,
        )
    else:
        from marin_assets.core.ingest import providers  # noqa: PLC0415 - optional provider modules

        fetch = providers.get_provider(provider.kind if provider.kind != "hf" else "hf_bucket")
        if fetch is None:
            raise RecipeNotImplemented(
                f"recipe not implemented yet: source '{source.name}' needs the '{provider.kind}' provider"
            )
        manifest = fetch(source, layout, progress, access=access or providers.ProviderAccess())
        dest, revision, fp = manifest["uri"], manifest.get("revision", provider.revision), manifest["fingerprint"]
    return manifest, {"uri": dest, "revision": revision, "fingerprint": fp, "pin": provider.revision}


def locate_raw(source: Any, layout: storage.Layout) -> dict[str, Any]:
    """The raw copy a previous ``fetch_raw`` made for ``source``'s current recipe."""
    found = stages.recorded_copy(pin_record_uri(layout, source))
    if found is None:
        raise RawFilesMissing(
            f"source '{source.name}': no complete raw files for its current pin ({source.provider.revision}) "
            f"under {layout.root}; materialize raw_files for partition '{source.name}' first"
        )
    return found


def _manifest_paths(manifest: dict[str, Any]) -> list[str]:
    files = manifest.get("files", [])
    return sorted(f["path"] if isinstance(f, dict) else str(f) for f in files)


def source_inputs(source: Any, raw: dict[str, Any]) -> list[str]:
    """The files of the raw copy that ``source`` itself normalizes, in sorted order.

    Keeps the source's own globs and sub-directory, drops hidden files and files of formats
    normalize does not read.
    """
    provider = source.provider
    local = storage.local_path(raw["uri"])
    chosen = []
    for path in _manifest_paths(raw):
        trust.safe_relpath(path, f"source '{source.name}': raw manifest of {raw['uri']}")
        if any(part.startswith(".") or part.startswith("_") for part in path.split("/")):
            continue
        if provider.subdir and not path.startswith(provider.subdir.rstrip("/") + "/"):
            continue
        if not select_paths([path], list(provider.allow) or None, list(provider.exclude) or None):
            continue
        if format_of_name(path) is None:
            continue
        if local is not None:
            trust.real_path_inside(local, os.path.join(local, path), f"source '{source.name}'")
        chosen.append(storage.join(raw["uri"], path))
    return chosen


def normalize_params(source: Any, target_shard_bytes: int | None = None) -> NormalizeParams:
    """The catalog entry's normalize parameters (transformed rows always carry ``text``/``source_id``)."""
    transformed = bool(getattr(source, "transform", None))
    kwargs: dict[str, Any] = {
        "text_field": "text" if transformed else source.text_field,
        "id_field": "source_id" if transformed else (source.id_field or None),
        "exact_dedup": getattr(source, "exact_dedup", True),
        "bare": getattr(source, "bare", False),
    }
    if target_shard_bytes:
        kwargs["target_shard_bytes"] = target_shard_bytes
    return NormalizeParams(**kwargs)


def input_format(source: Any) -> str | None:
    """A single declared format, or None to detect each file's format from its name."""
    fmt = getattr(source, "input_format", None)
    return fmt if fmt in SUPPORTED_FORMATS else None


def check_recipe(source: Any, known_transforms: Sequence[str]) -> None:
    """Raise ``RecipeNotImplemented`` naming what is missing for this source."""
    from marin_assets.core.ingest import providers  # noqa: PLC0415

    kind = source.provider.kind
    if source.provider.repo_type == "bucket":
        kind = "hf_bucket"
    if kind != "hf" and providers.get_provider(kind) is None:
        raise RecipeNotImplemented(f"recipe not implemented yet: source '{source.name}' needs the '{kind}' provider")
    if source.transform and source.transform not in known_transforms:
        raise RecipeNotImplemented(
            f"recipe not implemented yet: source '{source.name}' needs the family transform '{source.transform}'"
        )
