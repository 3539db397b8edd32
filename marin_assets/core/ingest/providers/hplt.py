"""HPLT v3.0 English shards (``web`` kind, transform ``hplt_register_filter``).

The catalog url is a template, ``.../eng_Latn/{tier}_{shard}.jsonl.zst``; its allow globs name
the WDS quality tiers (``"8_*.jsonl.zst"``), ``TIER_SHARDS`` says how many shards each tier
has (numbered from 1), and ``expected_shards`` must equal the total, so a changed selection
cannot go unnoticed. Each shard is fetched verified (length, complete zstd decode) and stored
as published, except that every record gains ``"wds_tier"``: the tier is known only from the
file name, and the register filter needs it.
"""

from __future__ import annotations

import io
import os
import re
from typing import Any

import zstandard

from marin_assets.core.ingest.hub import select_paths
from marin_assets.core.ingest.providers import ProviderAccess, http, rawcopy
from marin_assets.core.ingest.providers.rawcopy import Progress, ProviderError
from marin_assets.core.runtime import storage

# Shards per WDS tier in HPLT v3.0 eng_Latn (tiers 5-10: 1,294 shards).
TIER_SHARDS = {5: 74, 6: 119, 7: 275, 8: 479, 9: 344, 10: 3}
_TIER_GLOB = re.compile(r"^(\d+)_\*\.jsonl\.zst$")
WORKERS = 4


def shard_plan(source: Any) -> list[tuple[int, int, str, str]]:
    """``(tier, shard, url, relative path)`` of every shard the entry selects, checked."""
    p = source.provider
    if "{tier}" not in p.url or "{shard}" not in p.url:
        raise ProviderError(f"source '{source.name}': url {p.url!r} must contain {{tier}} and {{shard}}; fix the catalog entry")
    tiers = []
    for glob in p.allow:
        match = _TIER_GLOB.match(glob)
        if not match or int(match.group(1)) not in TIER_SHARDS:
            raise ProviderError(
                f"source '{source.name}': allow glob {glob!r} does not name a known WDS tier "
                f"({', '.join(f'{t}_*.jsonl.zst' for t in TIER_SHARDS)}); fix the catalog entry"
            )
        tiers.append(int(match.group(1)))
    if not tiers:
        raise ProviderError(f"source '{source.name}': allow lists no WDS tier ('<tier>_*.jsonl.zst'); fix the catalog entry")
    plan = []
    for tier in sorted(set(tiers)):
        for shard in range(1, TIER_SHARDS[tier] + 1):
            path = f"{tier}_{shard}.jsonl.zst"
            if select_paths([path], list(p.allow), list(p.exclude) or None):
                plan.append((tier, shard, p.url.format(tier=tier, shard=shard), path))
    if p.expected_shards is not None and len(plan) != p.expected_shards:
        counts = " + ".join(f"{TIER_SHARDS[t]} (tier {t})" for t in sorted(set(tiers)))
        raise ProviderError(
            f"source '{source.name}': the selected tiers have {counts} = {len(plan)} shards but "
            f"expected_shards is {p.expected_shards}; fix allow/exclude or expected_shards in the catalog entry"
        )
    return plan


def _tag_lines(data: bytes, prefix: bytes) -> tuple[bytes, int, int]:
    """Whole JSON lines with ``prefix`` spliced after each opening brace; (bytes, rows, blank lines)."""
    out = []
    rows = blank = 0
    for line in data.split(b"\n"):
        stripped = line.strip()
        if not stripped:
            blank += 1
            continue
        rows += 1
        if stripped.startswith(b"{"):
            rest = stripped[1:].lstrip()
            stripped = b"{" + prefix + (b"" if rest.startswith(b"}") else b",") + rest
        out.append(stripped + b"\n")
    return b"".join(out), rows, blank


def transcode(published: io.BufferedIOBase, out: io.BufferedIOBase, tier: int) -> dict[str, int]:
    """Decompress a published shard, tag its records with the tier, compress again.

    Raises ``CorruptBody`` when the zstd stream is damaged or truncated.
    """
    prefix = b'"wds_tier":%d' % tier
    rows = blank = 0
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(published, read_across_frames=True)
        writer = zstandard.ZstdCompressor(level=3, write_checksum=True).stream_writer(out, closefd=False)
        pending = b""
        while block := reader.read(16 << 20):
            block = pending + block
            cut = block.rfind(b"\n")
            if cut < 0:
                pending = block
                continue
            pending = block[cut + 1 :]
            data, n, b = _tag_lines(block[: cut + 1], prefix)
            rows, blank = rows + n, blank + b
            writer.write(data)
        if pending.strip():
            data, n, b = _tag_lines(pending, prefix)
            rows, blank = rows + n, blank + b
            writer.write(data)
        writer.flush(zstandard.FLUSH_FRAME)
    except zstandard.ZstdError as err:
        raise http.CorruptBody(f"zstd stream does not decode: {err}") from None
    return {"rows": rows, "blank_lines": blank}


def fetch(source: Any, layout: storage.Layout, progress: Progress = None, *, access: ProviderAccess = ProviderAccess()) -> dict[str, Any]:
    plan = shard_plan(source)
    p = source.provider
    fp = rawcopy.recipe_fingerprint("hplt", source, shards=[path for *_, path in plan])
    uri = rawcopy.dest_uri(layout, rawcopy.url_key(p.url), p.revision, fp)
    if (stored := rawcopy.reused(uri)) is not None:
        return stored
    copy = rawcopy.RawCopy(uri)
    done = copy.finished()
    todo = [item for item in plan if item[3] not in done]
    counters = http.FetchCounters()
    rawcopy.say(progress, f"{source.name}: {len(done)}/{len(plan)} shards already copied, fetching {len(todo)}")

    def task(tier: int, shard: int, url: str, path: str, staging: str) -> dict[str, Any]:
        published = os.path.join(staging, f"{tier}_{shard}.published")
        tagged = os.path.join(staging, f"{tier}_{shard}.tagged")
        stats: dict[str, int] = {}

        def validate(body: Any) -> None:
            with open(tagged, "wb") as out:
                stats.update(transcode(body, out, tier))

        try:
            with open(published, "w+b") as body:
                fetched = http.fetch_into(url, body, what=f"source '{source.name}' shard {path}", policy=access.policy, mirrors=access.mirrors,
                                          validate=validate, counters=counters)  # fmt: skip
            storage.put_file(tagged, storage.join(uri, path))
        finally:
            for leftover in (published, tagged):
                if os.path.exists(leftover):
                    os.remove(leftover)
        record = {"path": path, "tier": tier, "shard": shard, "published_size": fetched.size,
                  "published_sha256": fetched.sha256, "size": storage.size(storage.join(uri, path)), **stats}  # fmt: skip
        copy.mark(record)
        rawcopy.say(progress, f"{source.name}: copied {path} ({stats.get('rows', 0)} records)")
        return record

    with rawcopy.staging_dir(access.staging_dir, "marin-hplt-") as staging:
        records, errors = rawcopy.run_tasks([lambda item=item: task(*item, staging) for item in todo], WORKERS)
    rawcopy.raise_first(errors, what=f"source '{source.name}'", done=len(done) + len(records), total=len(plan), uri=uri)
    by_path = done | {r["path"]: r for r in records}
    files = [by_path[path] for *_, path in plan]
    return copy.complete({
        "kind": "hplt_shards",
        "source": source.name,
        "url": http.display_url(p.url),
        "revision": p.revision,
        "fingerprint": fp,
        "files": files,
        "counters": {
            "files": len(files),
            "records": sum(f.get("rows", 0) for f in files),
            "bytes": sum(f["published_size"] for f in files),
            "fetched": len(records),
            "reused": len(done),
            **counters.as_dict(),
        },
    })  # fmt: skip
