"""A provider's copy under ``raw/``: resumable file by file, complete once its manifest exists.

Every provider here writes the same way: each finished file leaves a marker under
``_partial/``, so a killed run fetches only what is missing; the provider returns the
manifest (``uri``, ``files``, ``revision``, ``fingerprint``, ``counters``), the stage runner
writes it last, and a repeated call is a no-op that returns the stored manifest with ``reused``.
"""

from __future__ import annotations

import concurrent.futures
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote, urlsplit

from marin_assets.core.ingest.providers.http import ProviderAccessError, ProviderGoneError, ProviderUnreachable
from marin_assets.core.runtime import storage, trust
from marin_assets.errors import ProviderRefused

CODE_VERSION = "1"
PARTIAL_DIR = storage.PARTIAL_DIR

Progress = Callable[[str], None] | None


class ProviderError(ProviderRefused, RuntimeError):
    """A provider recipe that cannot run as configured; the message names source, path and fix."""


def url_key(url: str) -> str:
    """A ``raw/`` key from a provider URL: host and the folder of the path, template parts dropped."""
    parts = urlsplit(url)
    folder = parts.path.rsplit("/", 1)[0] if "/" in parts.path else ""
    segments = [s for s in folder.split("/") if s and "{" not in s]
    key = "/".join([parts.hostname or "unknown-host", *segments])
    return re.sub(r"[^A-Za-z0-9._/-]", "_", key)


def recipe_fingerprint(kind: str, source: Any, **extra: Any) -> str:
    """Fingerprint of what decides a provider copy: kind, the provider pin and family extras."""
    p = source.provider
    recipe = {
        "kind": kind,
        "url": p.url,
        "repo_id": p.repo_id,
        "revision": p.revision,
        "sha256": p.sha256,
        "allow": list(p.allow),
        "exclude": list(p.exclude),
        "staged_path": p.staged_path,
        "expected_shards": p.expected_shards,
        **extra,
    }
    return storage.fingerprint("raw_files", recipe, CODE_VERSION)


def dest_uri(layout: storage.Layout, key: str, revision: str, fingerprint: str) -> str:
    label = re.sub(r"[^A-Za-z0-9._-]", "_", revision) if revision else "unversioned"
    return layout.raw(key, f"{label}-{fingerprint[:12]}")


def reused(uri: str) -> dict[str, Any] | None:
    """The stored manifest of a complete copy, flagged as reused."""
    manifest = storage.read_manifest(uri)
    if manifest is None:
        return None
    counters = dict(manifest.get("counters", {}))
    counters.update(fetched=0, retries=0, bytes_fetched=0)
    return manifest | {"counters": counters, "reused": True}


class RawCopy:
    """Markers of finished files under ``<uri>/_partial`` and the manifest written last."""

    def __init__(self, uri: str):
        self.uri = uri
        self._lock = threading.Lock()

    def _marker(self, path: str) -> str:
        return storage.join(self.uri, PARTIAL_DIR, quote(path, safe="") + ".json")

    def finished(self) -> dict[str, dict[str, Any]]:
        """Records of the files a previous run completed (keyed by relative path)."""
        records: dict[str, dict[str, Any]] = {}
        for uri in storage.listdir(storage.join(self.uri, PARTIAL_DIR)):
            if not uri.endswith(".json"):
                continue
            try:
                record = storage.read_json(uri)
            except (ValueError, OSError):
                continue  # a torn marker: that file is simply made again
            if storage.exists(storage.join(self.uri, record["path"])):
                records[record["path"]] = record
        return records

    def mark(self, record: dict[str, Any]) -> None:
        storage.write_json(self._marker(record["path"]), record)

    def complete(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """The copy's manifest; ``stages.commit_copy`` writes it last and drops the markers."""
        return {k: v for k, v in manifest.items() if k != "reused"} | {"uri": self.uri, "reused": False}


@contextmanager
def staging_dir(root: str | None, prefix: str) -> Iterator[str]:
    """A local scratch folder under ``root`` (the ``MARIN_STAGING_DIR`` setting; None: the system
    temp), removed afterwards.

    Leftovers of killed runs under the same folder are removed first.
    """
    with trust.staging_area(root or None, prefix) as path:
        yield path


FATAL = (ProviderAccessError, ProviderGoneError, ProviderUnreachable, ProviderError)


def run_tasks(tasks: Sequence[Callable[[], dict[str, Any]]], workers: int) -> tuple[list[dict[str, Any]], list[Exception]]:
    """Run independent file tasks on a thread pool; a fatal error stops the ones not started.

    Returns the records of the tasks that finished and the errors of those that did not, so a
    caller reports both and a rerun resumes from the markers.
    """
    stop = threading.Event()
    records: list[dict[str, Any]] = []
    errors: list[Exception] = []
    lock = threading.Lock()

    def run(task: Callable[[], dict[str, Any]]) -> None:
        if stop.is_set():
            return
        try:
            record = task()
        except FATAL as err:
            stop.set()
            with lock:
                errors.append(err)
            return
        except Exception as err:  # noqa: BLE001 - keep the other files going; the rerun resumes
            with lock:
                errors.append(err)
            return
        with lock:
            records.append(record)

    if workers <= 1 or len(tasks) <= 1:
        for task in tasks:
            run(task)
    else:
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="provider-fetch") as pool:
            list(pool.map(run, tasks))
    return records, errors


def raise_first(errors: Sequence[Exception], *, what: str, done: int, total: int, uri: str) -> None:
    """Raise the most telling error of a partial run, saying what is kept for the rerun."""
    if not errors:
        return
    fatal = [e for e in errors if isinstance(e, FATAL)]
    first = fatal[0] if fatal else errors[0]
    if isinstance(first, ProviderError):
        raise first
    message = f"{first} [{what}: {len(errors)} of {total} files failed; {done} are stored under {uri} and will not be fetched again]"
    try:
        error = type(first)(message)
    except TypeError:  # an exception type with another constructor
        raise first from None
    raise error from first


def say(progress: Progress, line: str) -> None:
    if progress is not None:
        progress(line)
