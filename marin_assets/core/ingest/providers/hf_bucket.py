"""Hugging Face storage buckets (``hf`` kind with ``repo_type = "bucket"``, e.g. biocorpus).

A bucket has no commits. Its catalog pin is a snapshot date (``revision``) plus a
fingerprint of the selected files (``sha256``): the sha256 of the lines
``<relative path>\\t<size>\\t<xet hash>\\n`` of every selected file, sorted by path. The
bucket is listed, the selection (allow/exclude globs) fingerprinted and compared to the pin
*before* anything is copied, so a bucket that changed since the snapshot fails with the
files that differ instead of yielding other data under the old pin.

The Hub's bucket HTTP API (the one ``huggingface_hub`` >= 1.6 uses for ``hf://buckets/``):

* ``GET {endpoint}/api/buckets/{namespace}/{name}/tree/{prefix}?recursive=true``: JSON list
  of ``{"type": "file", "path", "size", "xetHash", "mtime", "uploadedAt"}``, paginated with
  ``Link: <next url>; rel="next"``;
* ``GET {endpoint}/buckets/{namespace}/{name}/resolve/{path}``: the file's bytes (usually a
  redirect to the Xet bridge; the token is not forwarded across hosts).

The ``HF_ENDPOINT`` and ``HF_TOKEN`` settings apply as for dataset repos. Each file is checked against its
size and, when ``hf_xet`` is installed, its Xet hash recomputed locally.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import re
from typing import Any
from urllib.parse import quote

from marin_assets.core.ingest.hub import hub_endpoint, select_paths
from marin_assets.core.ingest.providers import ProviderAccess, http, rawcopy, register
from marin_assets.core.ingest.providers.rawcopy import Progress, ProviderError
from marin_assets.core.runtime import storage, trust

WORKERS = 4
_NEXT_LINK = re.compile(r'<([^>]+)>\s*;\s*rel="?next"?')


def snapshot_fingerprint(files: list[dict[str, Any]]) -> str:
    """sha256 over ``path\\tsize\\txet_hash`` lines of the selected files, sorted by path."""
    lines = "".join(f"{f['path']}\t{int(f['size'])}\t{f['xet_hash']}\n" for f in sorted(files, key=lambda f: f["path"]))
    return hashlib.sha256(lines.encode("utf-8")).hexdigest()


def xet_hash_of(path: str) -> str | None:
    """The Xet hash of a local file, or None where ``hf_xet`` is not installed."""
    try:
        import hf_xet  # noqa: PLC0415
    except ImportError:
        return None
    return str(hf_xet.hash_files([path])[0].hash)


def _auth_headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def _list_prefix(globs: tuple[str, ...]) -> str:
    """The longest folder that holds every glob's matches ("" = the whole bucket)."""
    folders = []
    for glob in globs:
        literal = re.split(r"[*?\[{]", glob, maxsplit=1)[0]
        folders.append(literal.rsplit("/", 1)[0] if "/" in literal else "")
    if not folders or any(not f for f in folders):
        return ""
    common = os.path.commonprefix(folders)
    return common.rsplit("/", 1)[0] if common not in folders else common


def list_bucket(source: Any, *, access: ProviderAccess, counters: http.FetchCounters) -> list[dict[str, Any]]:
    """Every file of the bucket under the selection's folder, following the pagination."""
    p = source.provider
    endpoint = hub_endpoint(access.hf_endpoint)
    prefix = _list_prefix(p.allow)
    url = f"{endpoint}/api/buckets/{p.repo_id}/tree" + (f"/{quote(prefix, safe='')}" if prefix else "") + "?recursive=true"
    hint = f"the bucket is private or the token lacks access: set HF_TOKEN to a token that can read buckets/{p.repo_id}"
    entries: list[dict[str, Any]] = []
    while url:
        headers: dict[str, str] = {}
        page = http.fetch_json(url, what=f"source '{source.name}' listing buckets/{p.repo_id}", policy=access.policy,
                               headers=trust.credentials_for(url, endpoint, _auth_headers(access.hf_token)), access_hint=hint,
                               counters=counters, mirror=False,
                               headers_out=headers)  # fmt: skip
        if not isinstance(page, list):
            raise ProviderError(f"source '{source.name}': the bucket listing of buckets/{p.repo_id} is not a JSON list; the API changed")
        entries.extend(e for e in page if isinstance(e, dict) and e.get("type") == "file")
        match = _NEXT_LINK.search(headers.get("Link", ""))
        url = match.group(1) if match else ""
        if url.startswith("/"):
            url = endpoint + url
    what = f"source '{source.name}' listing buckets/{p.repo_id}"
    return [
        {"path": trust.safe_relpath(e.get("path"), what), "size": int(e["size"]), "xet_hash": str(e.get("xetHash") or ""),
         "uploaded_at": e.get("uploadedAt")}
        for e in entries
    ]


def _snapshot_end(revision: str) -> datetime.datetime:
    day = datetime.date.fromisoformat(revision)
    return datetime.datetime.combine(day + datetime.timedelta(days=1), datetime.time(), tzinfo=datetime.UTC)


def _newer_than(files: list[dict[str, Any]], revision: str) -> list[str]:
    end = _snapshot_end(revision)
    newer = []
    for f in files:
        stamp = f.get("uploaded_at")
        try:
            when = datetime.datetime.fromisoformat(str(stamp).replace("Z", "+00:00")) if stamp else None
        except ValueError:
            when = None
        if when is not None and when >= end:
            newer.append(f["path"])
    return newer


@register("hf_bucket")
def fetch(source: Any, layout: storage.Layout, progress: Progress = None, *, access: ProviderAccess = ProviderAccess()) -> dict[str, Any]:
    p = source.provider
    counters = http.FetchCounters()
    listed = list_bucket(source, access=access, counters=counters)
    selected = sorted((f for f in listed if select_paths([f["path"]], list(p.allow) or None, list(p.exclude) or None)),
                      key=lambda f: f["path"])  # fmt: skip
    if not selected:
        raise ProviderError(
            f"source '{source.name}': no file of buckets/{p.repo_id} matches allow={list(p.allow)} exclude={list(p.exclude)} "
            f"({len(listed)} files listed); fix the file selection in the catalog"
        )
    snapshot = snapshot_fingerprint(selected)
    if p.sha256 and snapshot != p.sha256:
        newer = _newer_than(selected, p.revision)
        raise ProviderError(
            f"source '{source.name}': buckets/{p.repo_id} no longer matches the {p.revision} snapshot: its {len(selected)} "
            f"selected files fingerprint to {snapshot}, the catalog pins {p.sha256}"
            + (f"; files uploaded after {p.revision}: {', '.join(newer[:10])}" if newer else "")
            + "; if the bucket changed on purpose, review it and set provider.sha256 (and the revision date) in the catalog"
        )
    fp = rawcopy.recipe_fingerprint("hf_bucket", source, snapshot=snapshot)
    uri = rawcopy.dest_uri(layout, f"hf/buckets/{p.repo_id}", p.revision, fp)
    if (stored := rawcopy.reused(uri)) is not None:
        return stored
    copy = rawcopy.RawCopy(uri)
    done = copy.finished()
    todo = [f for f in selected if f["path"] not in done or done[f["path"]].get("xet_hash") != f["xet_hash"]]
    rawcopy.say(progress, f"{source.name}: {len(selected)} files, {len(selected) - len(todo)} already copied")
    endpoint = hub_endpoint(access.hf_endpoint)

    def task(remote: dict[str, Any], staging: str) -> dict[str, Any]:
        local = os.path.join(staging, hashlib.sha1(remote["path"].encode()).hexdigest())
        url = f"{endpoint}/buckets/{p.repo_id}/resolve/{quote(remote['path'])}"
        verified: dict[str, bool] = {}

        def validate(body: Any) -> None:
            computed = xet_hash_of(local)
            verified["xet"] = computed is not None
            if computed is not None and remote["xet_hash"] and computed != remote["xet_hash"]:
                raise http.CorruptBody(f"xet hash {computed} differs from the listed {remote['xet_hash']}")

        try:
            with open(local, "w+b") as body:
                fetched = http.fetch_into(url, body, what=f"source '{source.name}' buckets/{p.repo_id}/{remote['path']}",
                                          policy=access.policy, headers=trust.credentials_for(url, endpoint, _auth_headers(access.hf_token)),
                                          expected_size=remote["size"],
                                          validate=validate, counters=counters, mirror=False)  # fmt: skip
            storage.put_file(local, trust.child_uri(uri, remote["path"], f"source '{source.name}' buckets/{p.repo_id}"))
        finally:
            if os.path.exists(local):
                os.remove(local)
        record = {"path": remote["path"], "size": fetched.size, "sha256": fetched.sha256, "xet_hash": remote["xet_hash"],
                  "xet_verified": verified.get("xet", False)}  # fmt: skip
        copy.mark(record)
        rawcopy.say(progress, f"{source.name}: copied {remote['path']}")
        return record

    with rawcopy.staging_dir(access.staging_dir, "marin-bucket-") as staging:
        records, errors = rawcopy.run_tasks([lambda f=f: task(f, staging) for f in todo], WORKERS)
    rawcopy.raise_first(errors, what=f"source '{source.name}'", done=len(selected) - len(todo) + len(records), total=len(selected), uri=uri)
    by_path = done | {r["path"]: r for r in records}
    files = [by_path[f["path"]] for f in selected]
    return copy.complete({
        "kind": "hf_bucket_snapshot",
        "source": source.name,
        "repo_id": f"buckets/{p.repo_id}",
        "endpoint": endpoint,
        "revision": p.revision,
        "snapshot_fingerprint": snapshot,
        "fingerprint": fp,
        "files": files,
        "counters": {
            "files": len(files),
            "bytes": sum(f["size"] for f in files),
            "xet_verified": sum(bool(f.get("xet_verified")) for f in files),
            "fetched": len(records),
            "reused": len(selected) - len(todo),
            **counters.as_dict(),
        },
    })  # fmt: skip
