"""Providers other than Hugging Face dataset repos: web, API, pre-staged, Hub buckets.

Each provider module registers a fetch function under its kind:
``fetch(source, layout, progress, *, access) -> manifest`` that puts (or verifies) the
source's files under the storage root and returns a manifest with at least ``uri`` (the folder holding the
files), ``files`` (paths relative to ``uri``), ``revision`` (what the pin resolved to) and
``fingerprint``; ``reused`` when nothing had to be fetched.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Callable
from typing import Any

from marin_assets.core.ingest.hub import DEFAULT_POLICY, RetryPolicy

Fetch = Callable[..., dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class ProviderAccess:
    """How this site reaches providers. The settings build it; core reads no environment.

    ``mirrors``: ``(origin prefix, replacement prefix)`` pairs for web and API URLs (see
    ``http.parse_mirrors``); ``hf_endpoint``/``hf_token``: the Hub (buckets) and its token,
    sent to that host only; ``staging_dir``: local scratch for downloads (None: system temp).
    """

    policy: RetryPolicy = DEFAULT_POLICY
    mirrors: tuple[tuple[str, str], ...] = ()
    hf_endpoint: str | None = None
    hf_token: str | None = None
    staging_dir: str | None = None

REGISTRY: dict[str, Fetch] = {}


def register(kind: str) -> Callable[[Fetch], Fetch]:
    def wrap(fn: Fetch) -> Fetch:
        if kind in REGISTRY:
            raise ValueError(f"provider '{kind}' is registered twice")
        REGISTRY[kind] = fn
        return fn

    return wrap


def get_provider(kind: str) -> Fetch | None:
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
    return REGISTRY.get(kind)
