"""An object store on the local disk that counts its requests and adds a latency to each one.

``slowstore://<absolute path>`` behaves like a bucket: a write is one upload (``pipe_file``), a
read fetches blocks by range (an open file looks its size up first; ``cat_file`` is one ranged
GET, as on Cloud Storage; ``open_stream`` one GET of a whole object, read as it arrives), ``info``/``ls``/``rm`` are requests of their own, and a delete of many
objects is one request per 100 (a batch, as Cloud Storage's JSON API allows). ``fs.protocol`` also
names ``s3a`` so the storage layer treats it as an object store (atomic single uploads, no rename).

Counts live in the filesystem class (``SlowStore.requests``, by kind), so the task code under
measurement runs unchanged; ``SlowStore.latency_s`` is slept once per request. They are the
counts of one process: a task run by Ray or a process pool makes its requests in its worker, so
:class:`RequestCountingRunner` wraps each task function in :class:`CountedTask`, which returns the
task's own requests with its counters (and, unpickled in the worker, registers the store there).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem
from fsspec.spec import AbstractBufferedFile, AbstractFileSystem

from marin_assets.core.runtime.runner import ShardResult, ShardRunner, ShardTask

PROTOCOL = "slowstore"
DELETE_BATCH = 100
_COUNT_LOCK = threading.Lock()


class SlowFile(AbstractBufferedFile):
    """Reads as ranged GETs of ``block_size`` bytes (fsspec's read-ahead cache), writes as one upload."""

    def _fetch_range(self, start: int, end: int) -> bytes:
        self.fs.request("get")
        with open(self.path, "rb") as handle:
            handle.seek(start)
            return handle.read(end - start)

    def _initiate_upload(self) -> None:
        self._parts: list[bytes] = []

    def _upload_chunk(self, final: bool = False) -> bool:
        self._parts.append(self.buffer.getvalue())
        if final:
            self.fs.pipe_file(self.path, b"".join(self._parts))
        return True


class SlowStore(AbstractFileSystem):
    protocol = (PROTOCOL, "s3a")
    root_marker = "/"
    cachable = True
    latency_s = float(os.environ.get("REHEARSE_LATENCY_MS", "0")) / 1000
    requests: collections.Counter = collections.Counter()

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._local = LocalFileSystem()

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        path = str(path)
        for prefix in (f"{PROTOCOL}://", f"{PROTOCOL}:"):
            if path.startswith(prefix):
                path = path[len(prefix):]
        return "/" + path.lstrip("/") if path else "/"

    @classmethod
    def request(cls, kind: str) -> None:
        with _COUNT_LOCK:  # tasks read with threads: a count must not lose an increment
            cls.requests[kind] += 1
        if cls.latency_s:
            time.sleep(cls.latency_s)

    @classmethod
    def total(cls) -> int:
        return sum(cls.requests.values())

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        path = self._strip_protocol(path)
        entries = self._local.ls(path, detail=detail) if os.path.isdir(path) else []
        for _ in range(1 + len(entries) // 1000):  # one page per 1,000 objects
            self.request("list")
        return entries

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        self.request("stat")
        return self._local.info(self._strip_protocol(path))

    def exists(self, path: str, **kwargs: Any) -> bool:
        self.request("stat")
        return os.path.exists(self._strip_protocol(path))

    def makedirs(self, path: str, exist_ok: bool = False) -> None:  # a bucket has no folders
        os.makedirs(self._strip_protocol(path), exist_ok=True)

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        os.makedirs(self._strip_protocol(path), exist_ok=True)

    def pipe_file(self, path: str, value: bytes, **kwargs: Any) -> None:
        self.request("put")
        path = self._strip_protocol(path)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.upload"
        with open(tmp, "wb") as handle:
            handle.write(value)
        os.replace(tmp, path)

    def put_file(self, lpath: str, rpath: str, **kwargs: Any) -> None:
        """A local file uploaded: one request, its bytes streamed (a store's client sends a large
        file in chunks; holding it whole, twice while joined, would count as the uploader's memory)."""
        self.request("put")
        path = self._strip_protocol(rpath)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        shutil.copyfile(lpath, f"{path}.upload")
        os.replace(f"{path}.upload", path)

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        """One GET of the object or of a byte range (negative ``start``: its last bytes), as a store's ranged read."""
        self.request("get")
        with open(self._strip_protocol(path), "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            lo = 0 if start is None else (max(0, size + start) if start < 0 else start)
            hi = size if end is None else (size + end if end < 0 else min(end, size))
            handle.seek(lo)
            return handle.read(max(0, hi - lo))

    def open_stream(self, path: str, buffer_bytes: int) -> Any:
        """One GET of a whole object, its body read as it arrives (:func:`storage.open_stream`)."""
        self.request("get")
        return open(self._strip_protocol(path), "rb", buffering=buffer_bytes)

    def _open(self, path: str, mode: str = "rb", block_size: int | None = None, **kwargs: Any) -> SlowFile:
        path = self._strip_protocol(path)
        if "r" in mode and not os.path.exists(path):
            self.request("get")
            raise FileNotFoundError(path)
        return SlowFile(self, path, mode, block_size=block_size or 5 * 2**20, **kwargs)

    def rm_file(self, path: str) -> None:
        self.request("delete")
        os.remove(self._strip_protocol(path))

    def rm(self, path: Any, recursive: bool = False, maxdepth: int | None = None) -> None:
        paths = [path] if isinstance(path, str) else list(path)
        files: list[str] = []
        for p in paths:
            local = self._strip_protocol(p)
            if recursive and os.path.isdir(local):
                files += [f for f in self.find(local)]
            elif os.path.exists(local):
                files.append(local)
        for start in range(0, len(files), DELETE_BATCH):
            self.request("delete")
            for f in files[start:start + DELETE_BATCH]:
                os.remove(self._strip_protocol(f))

    def find(self, path: str, maxdepth: int | None = None, withdirs: bool = False, detail: bool = False, **kwargs: Any) -> Any:
        local = self._strip_protocol(path)
        found = sorted(os.path.join(root, name) for root, _, names in os.walk(local) for name in names)
        self.request("list")  # one listing of a prefix (paged by 1,000 on a real store: counted below)
        for _ in range(len(found) // 1000):
            self.request("list")
        return {f: self._local.info(f) for f in found} if detail else found


fsspec.register_implementation(PROTOCOL, SlowStore, clobber=True)


def uri(path: str) -> str:
    """The store's URI of a local path (the same bytes, read and written through the store)."""
    return f"{PROTOCOL}://{os.path.abspath(path)}"


class CountedTask:
    """A shard task function that adds ``requests``, the store requests it made, to its counters,
    and ``start_rss_kb``, its worker's resident size when it started.

    A worker process runs one task at a time, so the change of its counter over the call is the
    task's own (the runner's check for a finished shard and its write of the counters, two
    requests per task, fall outside). A worker that is never recycled starts a task with what
    earlier tasks left resident: the task's peak less that is its own working set.
    """

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)

    def __call__(self, inputs: list[str], output: str, params: Any) -> dict[str, Any]:
        before, start_kb = SlowStore.total(), _resident_kb()
        stats = dict(self.fn(inputs, output, params))
        stats["requests"] = SlowStore.total() - before
        stats["start_rss_kb"] = start_kb
        return stats


def _resident_kb() -> int:
    """This process's resident size now (VmRSS), KiB; 0 where /proc is not available."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            return next((int(line.split()[1]) for line in status if line.startswith("VmRSS:")), 0)
    except OSError:
        return 0


class RequestCountingRunner(ShardRunner):
    """A :class:`ShardRunner` that runs every task as a :class:`CountedTask` and keeps, per task
    function, the requests of each task it ran (``per_task``; shards reused from an earlier run
    are not counted), the most input files one was given (``widest``), and the most a task's
    peak rose above its worker's size at its start (``own_peak_kb``) and that size (``start_kb``)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        object.__setattr__(self, "per_task", {})
        object.__setattr__(self, "widest", {})
        object.__setattr__(self, "own_peak_kb", {})
        object.__setattr__(self, "start_kb", {})

    def map(self, tasks: Sequence[ShardTask], on_done: Callable[[ShardResult], None] | None = None) -> list[ShardResult]:
        results = super().map([dataclasses.replace(t, fn=CountedTask(t.fn)) for t in tasks], on_done)
        for task, result in zip(tasks, results):
            name = task.fn.__name__
            self.widest[name] = max(self.widest.get(name, 0), len(task.inputs))
            if not result.reused:
                self.per_task.setdefault(name, []).append(int(result.stats["requests"]))
                own = result.peak_rss_bytes // 1024 - int(result.stats["start_rss_kb"])
                self.own_peak_kb[name] = max(self.own_peak_kb.get(name, 0), own)
                self.start_kb[name] = max(self.start_kb.get(name, 0), int(result.stats["start_rss_kb"]))
        return results
