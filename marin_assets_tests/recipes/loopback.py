"""A loopback HTTP server standing in for the web and API providers, and the encoders of their files.

``LoopbackServer`` serves byte strings and small API handlers on 127.0.0.1 with ``Range``
support, records every request and injects faults (HTTP status storms, connections cut
mid-body, corrupted bodies), so the real provider code runs against it through
``MARIN_WEB_MIRROR`` (web and API sources) or ``HF_ENDPOINT`` (buckets).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import io
import json
import socket
import tarfile
import threading
import zipfile
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import zstandard

# --------------------------------------------------------------------------- server


@dataclasses.dataclass
class Answer:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = dataclasses.field(default_factory=dict)


Handler = Callable[[str, dict[str, list[str]], Mapping[str, str]], Answer]


@dataclasses.dataclass
class Fault:
    pattern: str
    kind: str  # "status" | "cut" | "corrupt"
    times: int | None
    status: int = 503
    headers: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: str
    status: int
    range: str | None


class LoopbackServer:
    """Serve ``files`` (exact paths) and ``handlers`` (path prefixes) with faults on demand."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.handlers: dict[str, Handler] = {}
        self.faults: list[Fault] = []
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None

    # ---- setup
    def put(self, path: str, data: bytes) -> str:
        self.files[path] = data
        return self.url(path)

    def handle(self, prefix: str, handler: Handler) -> None:
        self.handlers[prefix] = handler

    def fail(self, pattern: str, kind: str, times: int | None = 1, status: int = 503, headers: dict[str, str] | None = None) -> None:
        self.faults.append(Fault(pattern, kind, times, status, dict(headers or {})))

    @property
    def base(self) -> str:
        assert self._httpd is not None
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def url(self, path: str) -> str:
        return self.base + path

    def count(self, path_glob: str = "*", status: int | None = None) -> int:
        return sum(1 for r in self.requests if fnmatch.fnmatch(r.path, path_glob) and (status is None or r.status == status))

    # ---- serving
    def _take_fault(self, path: str) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if (fault.times is None or fault.times > 0) and fnmatch.fnmatch(path, fault.pattern):
                    if fault.times is not None:
                        fault.times -= 1
                    return fault
        return None

    def _record(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)

    def start(self) -> LoopbackServer:
        server = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_HEAD(self) -> None:
                self._serve(body=False)

            def do_GET(self) -> None:
                self._serve(body=True)

            def _send(self, answer: Answer, body: bool, cut: bool = False) -> None:
                self.send_response(answer.status)
                for key, value in answer.headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(answer.body)))
                if cut:
                    self.send_header("Connection", "close")
                self.end_headers()
                if body and answer.body:
                    if cut:
                        self.wfile.write(answer.body[: max(1, len(answer.body) // 2)])
                        self.wfile.flush()
                        self.connection.shutdown(socket.SHUT_RDWR)
                        self.close_connection = True
                        return
                    self.wfile.write(answer.body)

            def _serve(self, body: bool) -> None:
                parts = urlsplit(self.path)
                path, query = parts.path, parts.query
                rng = self.headers.get("Range")
                fault = server._take_fault(path)
                if fault is not None and fault.kind == "status":
                    server._record(Request(self.command, path, query, fault.status, rng))
                    self._send(Answer(fault.status, b"fault", fault.headers), body)
                    return
                answer = self._answer(path, query)
                if answer.status == 200 and rng and rng.startswith("bytes="):
                    start = int(rng.removeprefix("bytes=").split("-", 1)[0] or 0)
                    total = len(answer.body)
                    answer = Answer(206, answer.body[start:], answer.headers | {"Content-Range": f"bytes {start}-{total - 1}/{total}"})
                if fault is not None and fault.kind == "corrupt" and answer.body:
                    damaged = bytearray(answer.body)
                    for i in range(len(damaged) // 3, len(damaged), max(1, len(damaged) // 7)):
                        damaged[i] ^= 0x5A
                    answer = Answer(answer.status, bytes(damaged), answer.headers)
                server._record(Request(self.command, path, query, answer.status, rng))
                self._send(answer, body, cut=fault is not None and fault.kind == "cut")

            def _answer(self, path: str, query: str) -> Answer:
                if path in server.files:
                    return Answer(200, server.files[path], {"Content-Type": "application/octet-stream"})
                for prefix in sorted(server.handlers, key=len, reverse=True):
                    if path.startswith(prefix):
                        return server.handlers[prefix](path, parse_qs(query), self.headers)
                return Answer(404, b"not found")

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()


# --------------------------------------------------------------------------- encoders


def jsonl(rows: Sequence[Mapping[str, Any] | bytes]) -> bytes:
    return b"".join((r if isinstance(r, bytes) else json.dumps(r, ensure_ascii=False).encode()) + b"\n" for r in rows)


def zstd(data: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=3, write_checksum=True).compress(data)


def tar_gz(members: Mapping[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def zip_bytes(members: Mapping[str, bytes | None]) -> bytes:
    """A zip; a member whose content is None is a directory entry."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            if data is None:
                archive.writestr(zipfile.ZipInfo(name.rstrip("/") + "/"), b"")
            else:
                archive.writestr(name, data)
    return buf.getvalue()
