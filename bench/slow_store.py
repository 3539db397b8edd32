"""An object store on the local disk that counts its requests and adds a latency to each one.

``slowstore://<absolute path>`` behaves like a bucket: a write is one upload (``pipe_file``), a
read fetches blocks by range, ``info``/``ls``/``rm`` are requests of their own, and a delete of many
objects is one request per 100 (a batch, as Cloud Storage's JSON API allows). ``fs.protocol`` also
names ``s3a`` so the storage layer treats it as an object store (atomic single uploads, no rename).

Counts live in the filesystem instance (``SlowStore.requests``, by kind), so the task code under
measurement runs unchanged; ``SlowStore.latency_s`` is slept once per request.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem
from fsspec.spec import AbstractBufferedFile, AbstractFileSystem

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
