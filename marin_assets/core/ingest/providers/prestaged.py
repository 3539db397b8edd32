"""The ``prestaged`` kind: shards built elsewhere and copied under ``MARIN_PREFIX`` by hand.

Nothing is fetched. The entry's ``staged_path`` must exist and hold exactly
``expected_shards`` files matching its ``allow`` globs, each a readable Parquet file
(magic bytes at both ends). The check is recorded as ``<staged_path>/_manifest.json`` and
``normalized`` reads the shards in place. What to copy where, and how each copy was built,
is described in ``PRESTAGED.md`` beside this module; every error points there.
"""

from __future__ import annotations

import concurrent.futures
import re
from pathlib import Path
from typing import Any

from marin_assets.core.ingest.hub import select_paths
from marin_assets.core.ingest.providers import ProviderAccess, rawcopy, register
from marin_assets.core.ingest.providers.rawcopy import Progress, ProviderError
from marin_assets.core.runtime import storage, trust

STAGING_DOC = str(Path(__file__).with_name("PRESTAGED.md"))
CHECK_WORKERS = 16
LISTED_NAMES = 20
_DIGITS = re.compile(r"(\d+)")


def _where_described(source: Any) -> str:
    return f"see the '{source.name}' section of {STAGING_DOC} for where the canonical copy lives and how it was built"


def expected_names(found: list[str], expected: int) -> list[str] | None:
    """The names a complete set would have, inferred from the numbering of those found.

    Works when the names differ only in one number (``part-00003-of-00514.parquet``,
    ``shard_17.parquet``); returns None when no single numbering explains them.
    """
    if not found:
        return None
    split = [_DIGITS.split(name) for name in found]
    shape = [part if i % 2 == 0 else None for i, part in enumerate(split[0])]
    if any(len(s) != len(split[0]) or [p if i % 2 == 0 else None for i, p in enumerate(s)] != shape for s in split):
        return None
    positions = range(1, len(shape), 2)
    if not positions:
        return None
    varying = [i for i in positions if len({s[i] for s in split}) > 1]
    if len(varying) > 1:
        return None
    index = varying[0] if varying else positions[0]
    values = [int(s[index]) for s in split]
    widths = {len(s[index]) for s in split}
    width = widths.pop() if len(widths) == 1 and split[0][index].startswith("0") else 0
    low = min(values)
    start = 0 if low == 0 else 1 if low == 1 else low
    template = split[0]

    def render(n: int) -> str:
        parts = list(template)
        parts[index] = str(n).zfill(width)
        return "".join(parts)

    return [render(n) for n in range(start, start + expected)]


def _listing(root: str, source: Any) -> dict[str, int]:
    fs, path = storage.filesystem(root)
    base = path.rstrip("/")
    sizes = {}
    for name, info in fs.find(base, detail=True).items():
        rel = name[len(base) :].lstrip("/") if name.startswith(base) else name
        if any(part.startswith((".", "_")) for part in rel.split("/")):
            continue
        sizes[rel] = int(info.get("size") or 0)
    p = source.provider
    return {rel: sizes[rel] for rel in select_paths(sorted(sizes), list(p.allow) or None, list(p.exclude) or None)}


def _is_parquet(uri: str, size: int) -> bool:
    if size < 12:
        return False
    fs, path = storage.filesystem(uri)
    return fs.cat_file(path, start=0, end=4) == b"PAR1" and fs.cat_file(path, start=size - 4, end=size) == b"PAR1"


def _names(items: list[str]) -> str:
    shown = ", ".join(items[:LISTED_NAMES])
    return shown + (f", ... ({len(items) - LISTED_NAMES} more)" if len(items) > LISTED_NAMES else "")


def verify(source: Any, layout: storage.Layout) -> dict[str, int]:
    """The staged shards (relative path -> size), or ``ProviderError`` saying what is missing."""
    p = source.provider
    root = layout.staged(p.staged_path)
    globs = ", ".join(p.allow) or "every file"
    if not storage.exists(root):
        raise ProviderError(
            f"source '{source.name}': nothing is staged at {root} (expected {p.expected_shards} shards matching {globs}); "
            f"copy them there before running; {_where_described(source)}"
        )
    if (local := storage.local_path(root)) is not None:  # a link is a path the listing would not check
        trust.links_inside(local, f"source '{source.name}': staged folder")
    shards = _listing(root, source)
    expected = p.expected_shards
    if expected is not None and len(shards) != expected:
        names = sorted(Path(rel).name for rel in shards)
        complete = expected_names(names, expected)
        detail = ""
        if complete is not None:
            missing = sorted(set(complete) - set(names))
            extra = sorted(set(names) - set(complete))
            detail = (f"; missing: {_names(missing)}" if missing else "") + (f"; unexpected: {_names(extra)}" if extra else "")
        raise ProviderError(
            f"source '{source.name}': {root} holds {len(shards)} shards matching {globs} but expected_shards is {expected}"
            f"{detail}; finish the copy (or fix the catalog entry); {_where_described(source)}"
        )
    with concurrent.futures.ThreadPoolExecutor(max_workers=CHECK_WORKERS) as pool:
        readable = dict(zip(shards, pool.map(lambda rel: _is_parquet(storage.join(root, rel), shards[rel]), shards), strict=True))
    broken = sorted(rel for rel, ok in readable.items() if not ok)
    if broken:
        raise ProviderError(
            f"source '{source.name}': {len(broken)} staged shards under {root} are empty or not complete Parquet files: "
            f"{_names(broken)}; copy them again; {_where_described(source)}"
        )
    return shards


@register("prestaged")
def fetch(source: Any, layout: storage.Layout, progress: Progress = None, *, access: ProviderAccess = ProviderAccess()) -> dict[str, Any]:
    del access  # nothing is fetched
    p = source.provider
    root = layout.staged(p.staged_path)
    shards = verify(source, layout)
    listing = storage.fingerprint("staged_listing", sorted(shards.items()))
    fp = rawcopy.recipe_fingerprint("prestaged", source, listing=listing)
    existing = storage.read_manifest(root)
    if existing is not None and existing.get("fingerprint") == fp:
        return existing | {"reused": True}
    rawcopy.say(progress, f"{source.name}: {len(shards)} staged shards verified under {root}")
    manifest = {
        "kind": "prestaged",
        "source": source.name,
        "staged_path": p.staged_path,
        "revision": p.revision,
        "fingerprint": fp,
        "files": [{"path": rel, "size": size} for rel, size in sorted(shards.items())],
        "counters": {"files": len(shards), "bytes": sum(shards.values()), "fetched": 0},
    }
    return rawcopy.RawCopy(root).complete(manifest)
