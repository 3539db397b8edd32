"""Fetching the eval sets of the registry: Hub repos at their locked commits, web archives by hash, local files.

Kept apart from ``decon`` so that the n-gram rule stays a pure function of rows; this module
only decides where each set's files come from and puts them under ``raw/evals/``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import tempfile
from collections.abc import Callable
from typing import Any

from marin_assets.catalog.evals import EvalRegistry, EvalSet, HuggingFaceProvider, LocalFileProvider, WebArchiveProvider, resolve_pins, write_lock
from marin_assets.core import hub, stages, storage
from marin_assets.core.providers import ProviderAccess


def lock_branch_pins(registry: EvalRegistry, resolve: Callable[[str, str], str] | None = None) -> EvalRegistry:
    """Resolve branch pins once and record them in the lock file beside the registry.

    Later builds read the lock and never ask the Hub again, so an eval set cannot change under
    the index without a deliberate lock update.
    """
    branch_pins = [s for s in registry.sets if isinstance(s.provider, HuggingFaceProvider) and s.provider.is_branch]
    if all(s.provider.lock_key in registry.lock.revisions for s in branch_pins):
        return registry
    resolver = resolve or (lambda repo, branch: hub.resolve_revision(repo, branch, "dataset"))
    lock = resolve_pins(registry, resolver)
    if registry.lock_path:
        write_lock(lock, registry.lock_path)
    return dataclasses.replace(registry, lock=lock)


def fetch_eval_set(eval_set: EvalSet, registry: EvalRegistry, layout: storage.Layout, access: ProviderAccess = ProviderAccess()) -> list[str]:
    """Local URIs of the set's files, downloading them under ``raw/evals/`` when needed.

    ``access`` (retry policy, mirrors, Hub endpoint and token, staging folder) comes from the settings.
    """
    provider = eval_set.provider
    if isinstance(provider, LocalFileProvider):
        return [provider.path]
    if isinstance(provider, HuggingFaceProvider):
        revision = registry.revision(eval_set)
        dest = layout.raw("evals__" + provider.repo.replace("/", "__"), revision)
        manifest = stages.commit_copy(dest, lambda: hub.download_snapshot(
            provider.repo, revision, list(provider.files) or None, None, dest, access.policy,
            endpoint=access.hf_endpoint, token=access.hf_token, staging_dir=access.staging_dir))
        paths = [f["path"] for f in manifest["files"]]
        return [storage.join(dest, p) for p in sorted(paths) if not p.endswith((".md", ".gitattributes", ".py"))]
    if isinstance(provider, WebArchiveProvider):
        return [_fetch_archive(provider, registry.archive_sha256(eval_set), layout, access)]
    raise TypeError(f"eval set {eval_set.name!r}: unknown provider {type(provider).__name__}")


def _fetch_archive(provider: WebArchiveProvider, sha256: str, layout: storage.Layout, access: ProviderAccess) -> str:
    from marin_assets.core.providers import http  # noqa: PLC0415

    name = provider.url.rstrip("/").rsplit("/", 1)[-1] or "archive"
    dest = storage.join(layout.root, "raw", "evals__web", sha256[:16], name)
    if storage.exists(dest):
        return dest
    with tempfile.TemporaryDirectory(prefix="marin-eval-", dir=access.staging_dir) as tmp:
        local = os.path.join(tmp, name)
        with open(local, "wb") as out:
            http.fetch_into(provider.url, out, what=f"eval archive {name}", policy=access.policy,
                            mirrors=access.mirrors, expected_sha256=sha256)
        storage.put_file(local, dest)
    return dest


def registry_digest(registry: EvalRegistry) -> str:
    """Fingerprint input: the registry's recipe and the commits its branch pins are locked to."""
    payload: dict[str, Any] = {"recipe": registry.recipe(), "lock": registry.lock.to_json()}
    return hashlib.sha256(storage.canonical_json(payload).encode()).hexdigest()[:16]
