"""Registry of recipe fixtures: provider files for a catalog source and what they must become.

A fixture builder takes the catalog entry and returns a ``FixtureCase``: the files as the
provider publishes them (paths relative to the repo or download root, bytes in the
provider's own format) and the expected outcome of ``normalized`` (row count, exact texts of
known rows, bad-row counters by reason). Register builders with ``@register_fixture(name)``
in any module of this package whose name ends in ``_fixtures``; ``fixture_builders()``
imports them all, so new providers add modules without touching this file.

``marin_assets.core.ingest.recipes`` reads ``covered_sources()`` to report fixture coverage.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import polars as pl

FIXTURE_MODULE_SUFFIX = "_fixtures"


@dataclasses.dataclass(frozen=True)
class FixtureCase:
    """Provider files for one source and the normalized result they must give.

    ``texts`` maps the ``source_id`` of known rows to their exact normalized text (key None:
    a row without a provider id, at most one); ``all_texts``, when given, is the exact set of
    every normalized text. ``bad_rows`` are the exact bad-row counters (an empty mapping means
    none may be reported); ``counters`` are normalize counters to check exactly (e.g.
    ``empty_dropped``, ``whitespace_compacted``, ``duplicates``). ``columns`` must be present
    in the normalized shards (``absent_columns`` must not).
    """

    files: Mapping[str, bytes]
    rows: int
    texts: Mapping[str | None, str] = dataclasses.field(default_factory=dict)
    all_texts: Sequence[str] | None = None
    bad_rows: Mapping[str, int] = dataclasses.field(default_factory=dict)
    counters: Mapping[str, int] = dataclasses.field(default_factory=dict)
    columns: Sequence[str] = ()
    absent_columns: Sequence[str] = ()
    check: Callable[[pl.DataFrame], None] | None = None


Builder = Callable[[Any], FixtureCase]

_BUILDERS: dict[str, Builder] = {}


def register_fixture(*names: str) -> Callable[[Builder], Builder]:
    """Register ``builder(source) -> FixtureCase`` for the named catalog sources."""

    def wrap(builder: Builder) -> Builder:
        for name in names:
            if name in _BUILDERS and _BUILDERS[name] is not builder:
                raise ValueError(f"fixture for source '{name}' is registered twice")
            _BUILDERS[name] = builder
        return builder

    return wrap


def _load_all() -> None:
    for info in pkgutil.iter_modules(__path__):
        if info.name.endswith(FIXTURE_MODULE_SUFFIX):
            importlib.import_module(f"{__name__}.{info.name}")


def fixture_builders() -> dict[str, Builder]:
    """Every registered builder by source name (imports all ``*_fixtures`` modules first)."""
    _load_all()
    return dict(_BUILDERS)


def covered_sources() -> set[str]:
    """Names of the catalog sources a fixture test covers."""
    return set(fixture_builders())
