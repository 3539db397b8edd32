"""Family transforms: provider rows -> rows with ``text`` and ``source_id``.

Each transform is a ``BatchTransform`` (see ``marin_assets.core.ingest.normalize``): it takes a polars
DataFrame of provider rows and returns the rendered rows plus counters of rows it filtered or
could not render, keyed by reason. Transforms register themselves under the name the catalog
uses in its ``transform`` field.
"""

from __future__ import annotations

from collections.abc import Callable

from marin_assets.core.ingest.normalize import BatchTransform

REGISTRY: dict[str, BatchTransform] = {}


def register(name: str) -> Callable[[BatchTransform], BatchTransform]:
    def wrap(fn: BatchTransform) -> BatchTransform:
        if name in REGISTRY:
            raise ValueError(f"transform '{name}' is registered twice")
        REGISTRY[name] = fn
        return fn

    return wrap


def get_transform(name: str) -> BatchTransform | None:
    _load_all()
    return REGISTRY.get(name)


def known_transforms() -> set[str]:
    _load_all()
    return set(REGISTRY)


def _load_all() -> None:
    """Import every transform module in this package so that they register."""
    import importlib
    import pkgutil

    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
