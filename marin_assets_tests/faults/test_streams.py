"""Item 7: the merge stream (``storage.open_stream`` on Cloud Storage) rides out 503s at open and on resume.

A proxy in front of the storage emulator answers the stream's first GET with a 503, and the
GET that resumes it after a dropped connection with a 503 too: the reader still gets every byte
once, in order, and the proxy saw each refused request tried again.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import fsspec
import fsspec.asyn
import pytest

from marin_assets.core.runtime import storage
from marin_assets.core.runtime.retry import RetryPolicy


class Refusing(ThreadingHTTPServer):
    """Forwards every request to ``upstream``; the first plain and the first ranged media GET get a 503."""

    daemon_threads = True

    def __init__(self, upstream: str) -> None:
        super().__init__(("127.0.0.1", 0), _Forward)
        self.upstream = urlsplit(upstream)
        self.refused: list[str] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def refuse(self, kind: str) -> bool:
        with self.lock:
            if kind in self.refused:
                return False
            self.refused.append(kind)
            return True


class _Forward(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *_args) -> None:
        pass

    def _handle(self) -> None:
        server: Refusing = self.server  # type: ignore[assignment]
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.command == "GET" and "alt=media" in self.path and server.refuse("resume" if self.headers.get("Range") else "open"):
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        upstream = http.client.HTTPConnection(server.upstream.hostname, server.upstream.port, timeout=60)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
        upstream.request(self.command, self.path, body=body or None, headers=headers)
        answer = upstream.getresponse()
        data = answer.read()
        self.send_response(answer.status)
        for key, value in answer.getheaders():
            if key.lower() not in ("transfer-encoding", "content-length", "connection"):
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        upstream.close()

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _handle


@pytest.fixture
def refusing_store(gcs_prefix: str, gcs_emulator: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Refusing]]:
    server = Refusing(gcs_emulator)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setitem(fsspec.config.conf, "gcs", {**fsspec.config.conf["gcs"], "endpoint_url": server.url})
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", server.url)
    monkeypatch.setattr(storage._GcsObjectStream, "POLICY", RetryPolicy(attempts=4, base_wait_s=0, min_wait_s=0, max_wait_s=0))
    fsspec.filesystem("gcs").clear_instance_cache()
    try:
        yield gcs_prefix, server
    finally:
        server.shutdown()
        fsspec.filesystem("gcs").clear_instance_cache()


def test_a_503_at_open_and_on_resume_is_tried_again(world, refusing_store):
    prefix, server = refusing_store
    body = bytes(range(65, 91)) * (80 << 10)  # ~2 MiB, larger than the client's read buffer
    uri = storage.join(prefix, "merge-input.bin")
    storage.write_bytes(uri, body)
    world.inject(2)
    stream = storage.open_stream(uri, 1 << 16)
    try:
        head = stream.read(300 << 10)
        raw = stream.raw

        async def drop() -> None:
            raw._response.connection.transport.abort()

        fsspec.asyn.sync(raw._fs.loop, drop)
        rest = stream.read()
    finally:
        stream.close()
    assert server.refused == ["open", "resume"]
    assert head + rest == body
