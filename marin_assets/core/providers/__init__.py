"""Providers other than Hugging Face dataset repos: web, API, pre-staged, Hub buckets.

Each provider module registers a fetch function under its kind:
``fetch(source, layout, progress) -> manifest`` that puts (or verifies) the source's files
under ``MARIN_PREFIX`` and returns a manifest with at least ``uri`` (the folder holding the
files), ``files`` (paths relative to ``uri``), ``revision`` (what the pin resolved to) and
``fingerprint``; ``reused`` when nothing had to be fetched.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any

Fetch = Callable[[Any, Any, Callable[[str], None] | None], dict[str, Any]]

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
