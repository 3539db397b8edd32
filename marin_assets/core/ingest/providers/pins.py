"""Drift checks for the non-Hub-repo pins: is what the catalog pins still what is served?

``check_pin(source)`` asks cheaply (a listing, a manifest, one byte of a file) and answers
``(status, detail)`` with the drift statuses: ``ok``; ``revision-gone`` when the provider
now serves something else (a changed manifest, a bucket that no longer fingerprints to the
pin, a file that is gone); ``unknown`` when it cannot tell (unreachable, not staged,
refused). It never raises for provider or network trouble and never changes a pin.
"""

from __future__ import annotations

import hashlib
from typing import Any

from marin_assets.core.ingest.hub import DownloadError, RetryPolicy, select_paths
from marin_assets.core.ingest.providers import ProviderAccess, ghalogs, hf_bucket, hplt, http, nsf_awards, prestaged
from marin_assets.core.ingest.providers.rawcopy import ProviderError
from marin_assets.core.runtime import storage
from marin_assets.errors import NotServedHere

OK, REVISION_GONE, UNKNOWN, NOT_CHECKED = "ok", "revision-gone", "unknown", "not-checked"
QUICK = RetryPolicy(attempts=2, base_wait_s=0.5, min_wait_s=0.5, max_wait_s=2.0, max_jitter_s=0.2, rate_limit_margin_s=1.0, timeout_s=10.0)


def _first_byte(url: str, what: str, access: ProviderAccess) -> None:
    http.fetch_bytes(url, what=what, policy=access.policy, mirrors=access.mirrors, headers={"Range": "bytes=0-0"})


def _check(source: Any, layout: storage.Layout, access: ProviderAccess) -> tuple[str, str]:
    p = source.provider
    if p.kind == "hf" and p.repo_type == "bucket":
        listed = hf_bucket.list_bucket(source, access=access, counters=http.FetchCounters())
        selected = [f for f in listed if select_paths([f["path"]], list(p.allow) or None, list(p.exclude) or None)]
        fingerprint = hf_bucket.snapshot_fingerprint(selected)
        if p.sha256 and fingerprint != p.sha256:
            return REVISION_GONE, f"buckets/{p.repo_id} fingerprints to {fingerprint} over {len(selected)} files, the pin is {p.sha256}"
        return OK, f"buckets/{p.repo_id}: {len(selected)} files match the {p.revision} snapshot"
    if p.kind == "prestaged":
        shards = prestaged.verify(source, layout)
        return OK, f"{len(shards)} staged shards under {layout.staged(p.staged_path)}"
    transform = source.transform or ""
    if transform == "ghalogs_sanitize":
        archive = ghalogs.archive_uri(source, layout)
        return (OK, f"archive staged at {archive}") if storage.exists(archive) else (UNKNOWN, f"archive not staged at {archive}")
    if transform == "docx_corpus_records":
        manifest, _ = http.fetch_bytes(p.url, what=f"source '{source.name}' manifest", policy=access.policy, mirrors=access.mirrors)
        digest = hashlib.sha256(manifest).hexdigest()
        if p.sha256 and digest != p.sha256:
            return REVISION_GONE, f"the manifest now hashes to {digest}, the pin is {p.sha256}"
        return OK, "the manifest matches its pin"
    if transform == "nsf_award_abstracts":
        listing = http.fetch_json(p.url, what=f"source '{source.name}' listing", policy=access.policy, mirrors=access.mirrors,
                                 headers=nsf_awards.LIST_HEADERS)
        links = nsf_awards.year_links(listing, source.name)
        years = nsf_awards.year_range(source) or range(0)
        missing = [y for y in years if y not in links]
        return OK, f"{len(links)} yearly archives listed" + (f"; none for {', '.join(map(str, missing))}" if missing else "")
    if transform == "hplt_register_filter":
        plan = hplt.shard_plan(source)
        for _, _, url, path in (plan[0], plan[-1]):
            _first_byte(url, f"source '{source.name}' shard {path}", access)
        return OK, f"{len(plan)} shards planned; the first and last are served"
    if p.url:
        _first_byte(p.url, f"source '{source.name}'", access)
        return OK, f"{http.display_url(p.url)} is served"
    return NOT_CHECKED, f"no drift check for {p.kind} pins of this recipe"


def check_pin(source: Any, layout: storage.Layout, *, access: ProviderAccess = ProviderAccess(policy=QUICK)) -> tuple[str, str]:
    """``(status, detail)`` for ``source``'s pin; never raises for provider or network trouble."""
    try:
        return _check(source, layout, access)
    except NotServedHere as err:  # the demo Hub: a wrong endpoint for this source, not a gone pin
        return UNKNOWN, str(err)
    except http.ProviderGoneError as err:
        return REVISION_GONE, str(err)
    except (DownloadError, ProviderError, OSError, ValueError) as err:
        return UNKNOWN, f"provider unreachable or failing: {type(err).__name__}: {str(err)[:300]}"
