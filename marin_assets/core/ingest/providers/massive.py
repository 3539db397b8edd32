"""MASSIVE v1.1 (``web`` kind, transform ``massive_function_calling``).

The release is one tarball (the Hugging Face entry of the dataset only holds a loading
script pointing at it). It is fetched verified (length, sha256 when the catalog pins one,
a complete gzip/tar read), and its per-locale ``{locale}.jsonl`` members are stored as
published under ``data/``. ``expected_shards`` is the number of locales (52).
"""

from __future__ import annotations

import os
import tarfile
import zlib
from typing import Any

from marin_assets.core.ingest.providers import ProviderAccess, http, rawcopy
from marin_assets.core.ingest.providers.rawcopy import Progress, ProviderError
from marin_assets.core.runtime import storage


def _locale_members(tar: tarfile.TarFile) -> list[tarfile.TarInfo]:
    members = [m for m in tar.getmembers() if m.isfile() and m.name.endswith(".jsonl")]
    return sorted(members, key=lambda m: os.path.basename(m.name))


def _check_tarball(body: Any) -> None:
    """Read the whole archive once: a truncated or damaged body fails here, not later."""
    try:
        with tarfile.open(fileobj=body, mode="r:gz") as tar:
            for member in _locale_members(tar):
                handle = tar.extractfile(member)
                while handle is not None and handle.read(8 << 20):
                    pass
    except (tarfile.TarError, EOFError, OSError, zlib.error) as err:
        raise http.CorruptBody(f"the tarball does not read ({type(err).__name__}: {err})") from None


def fetch(source: Any, layout: storage.Layout, progress: Progress = None, *, access: ProviderAccess = ProviderAccess()) -> dict[str, Any]:
    p = source.provider
    fp = rawcopy.recipe_fingerprint("massive", source)
    uri = rawcopy.dest_uri(layout, rawcopy.url_key(p.url), p.revision, fp)
    if (stored := rawcopy.reused(uri)) is not None:
        return stored
    counters = http.FetchCounters()
    copy = rawcopy.RawCopy(uri)
    with rawcopy.staging_dir(access.staging_dir, "marin-massive-") as staging:
        local = os.path.join(staging, "release.tar.gz")
        with open(local, "w+b") as body:
            fetched = http.fetch_into(p.url, body, what=f"source '{source.name}' tarball", policy=access.policy, mirrors=access.mirrors,
                                      expected_sha256=p.sha256 or None, validate=_check_tarball, counters=counters)  # fmt: skip
        rawcopy.say(progress, f"{source.name}: fetched the tarball ({fetched.size} bytes)")
        files = []
        with tarfile.open(local, mode="r:gz") as tar:
            members = _locale_members(tar)
            names = [os.path.basename(m.name) for m in members]
            if len(set(names)) != len(names):
                raise ProviderError(f"source '{source.name}': the tarball holds two members with one locale name; report it upstream")
            if p.expected_shards is not None and len(members) != p.expected_shards:
                raise ProviderError(
                    f"source '{source.name}': the tarball at {http.display_url(p.url)} holds {len(members)} locale files "
                    f"({', '.join(names[:8])}{', ...' if len(names) > 8 else ''}) but expected_shards is "
                    f"{p.expected_shards}; check the release version and the catalog entry"
                )
            for member, name in zip(members, names, strict=True):
                path = f"data/{name}"
                handle = tar.extractfile(member)
                assert handle is not None
                with storage.open_atomic(storage.join(uri, path)) as out:
                    while chunk := handle.read(8 << 20):
                        out.write(chunk)
                files.append({"path": path, "size": member.size, "member": member.name})
    return copy.complete({
        "kind": "massive_release",
        "source": source.name,
        "url": http.display_url(p.url),
        "revision": p.revision,
        "fingerprint": fp,
        "archive": {"size": fetched.size, "sha256": fetched.sha256},
        "files": files,
        "counters": {"files": len(files), "bytes": fetched.size, "fetched": 1, **counters.as_dict()},
    })  # fmt: skip
