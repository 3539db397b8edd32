"""A Hub-compatible server under an attacker's control, and a host that records what reaches it.

``HostileHub`` answers the requests the download code makes (repo info, tree listings, file
bodies, bucket listings and bucket files) with whatever the test chooses (a 429 with a one-year
``Retry-After`` included): tree or bucket
entries such as ``../../../../outside/X``, redirects and pagination ``Link`` headers that point
at another host, bodies longer than listed, bytes of another format. ``RecordingHost`` is that
other host (on 127.0.0.2, another loopback address): it records every request it gets and
whether it carried a credential, so a test can assert that no token left its own host.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import posixpath
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

SHA = "0123456789abcdef0123456789abcdef01234567"
ONE_YEAR_S = 365 * 24 * 3600 + 1


@dataclasses.dataclass(frozen=True)
class Seen:
    host: str
    method: str
    path: str
    authorization: str | None


@dataclasses.dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = dataclasses.field(default_factory=dict)


Route = Callable[[str, dict[str, str]], Reply | None]


class _Server:
    """A loopback HTTP server whose answers come from ``route(path, headers)``; every request is recorded."""

    def __init__(self, host: str):
        self.host = host
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None

    def route(self, path: str, headers: dict[str, str]) -> Reply | None:  # overridden
        return None

    @property
    def base(self) -> str:
        assert self._httpd is not None
        return f"http://{self.host}:{self._httpd.server_address[1]}"

    def start(self) -> Any:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._serve(True)

            def do_HEAD(self) -> None:
                self._serve(False)

            def _serve(self, body: bool) -> None:
                path = unquote(urlsplit(self.path).path)
                headers = {k.lower(): v for k, v in self.headers.items()}
                with server._lock:
                    server.seen.append(Seen(server.host, self.command, self.path, headers.get("authorization")))
                reply = server.route(path, headers) or Reply(404, b'{"error": "not found"}')
                self.send_response(reply.status)
                for key, value in reply.headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                if body:
                    self.wfile.write(reply.body)

        self._httpd = ThreadingHTTPServer((self.host, 0), Handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def credentials_seen(self) -> list[Seen]:
        with self._lock:
            return [s for s in self.seen if s.authorization]


class RecordingHost(_Server):
    """Another host (127.0.0.2): serves ``files`` by path and answers ``[]`` to listings."""

    def __init__(self, host: str = "127.0.0.2"):
        super().__init__(host)
        self.files: dict[str, bytes] = {}

    def route(self, path: str, headers: dict[str, str]) -> Reply | None:
        if path in self.files:
            return Reply(200, self.files[path], {"Content-Type": "application/octet-stream"})
        if "/tree" in path:
            return Reply(200, b"[]", {"Content-Type": "application/json"})
        return None


def _json(payload: Any, headers: dict[str, str] | None = None) -> Reply:
    return Reply(200, json.dumps(payload).encode(), {"Content-Type": "application/json", **(headers or {})})


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class HostileHub(_Server):
    """One dataset repo and one bucket whose listings, bodies, redirects and links the test chooses.

    ``files`` maps a listed path to its bytes (any path, ``..`` included); ``listed_size``
    overrides the size a listing announces; ``redirect`` maps a path to the URL its body
    redirects to; ``bucket_next`` is the pagination link of the bucket's first listing page.
    """

    def __init__(self, repo: str = "evil/corpus", bucket: str = "evil/bucket", host: str = "127.0.0.1"):
        super().__init__(host)
        self.repo, self.bucket = repo, bucket
        self.files: dict[str, bytes] = {}
        self.listed_size: dict[str, int] = {}
        self.redirect: dict[str, str] = {}
        self.bucket_next: str | None = None
        self.tree_next: str | None = None
        self.throttled: dict[str, int] = {}  # path prefix -> how many more requests get a 429 with a one-year reset

    def _entry(self, path: str, data: bytes) -> dict[str, Any]:
        size = self.listed_size.get(path, len(data))
        return {"type": "file", "oid": git_blob_sha1(data), "size": size, "path": path,
                "lfs": {"oid": hashlib.sha256(data).hexdigest(), "size": size, "pointerSize": 130}}  # fmt: skip

    def _body(self, path: str) -> Reply | None:
        if path in self.redirect:
            return Reply(302, b"", {"Location": self.redirect[path], "X-Repo-Commit": SHA})
        if path in self.files:
            data = self.files[path]
            return Reply(200, data, {"X-Repo-Commit": SHA, "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
                                     "Content-Type": "application/octet-stream"})  # fmt: skip
        return None

    def _served(self, prefix: str, path: str) -> Reply | None:
        """The body of a listed file, also where a client's URL normalization sends a ``..`` path."""
        if path.startswith(prefix) and (reply := self._body(path[len(prefix) :])) is not None:
            return reply
        for listed in list(self.files) + list(self.redirect):
            if posixpath.normpath(prefix + listed) == posixpath.normpath(path):
                return self._body(listed)
        return None

    def route(self, path: str, headers: dict[str, str]) -> Reply | None:
        for prefix, left in self.throttled.items():
            if path.startswith(prefix) and left:
                self.throttled[prefix] = left - 1
                return Reply(429, b'{"error": "rate limited"}', {"Retry-After": str(ONE_YEAR_S), "Content-Type": "application/json"})
        dataset = f"/api/datasets/{self.repo}"
        if path.startswith(f"{dataset}/revision/"):
            return _json({"_id": "0" * 24, "id": self.repo, "sha": SHA, "private": False, "gated": False,
                          "disabled": False, "downloads": 0, "likes": 0, "tags": [], "siblings": []})  # fmt: skip
        if path.startswith(f"{dataset}/tree/"):
            link = {"Link": f'<{self.tree_next}>; rel="next"'} if self.tree_next else {}
            return _json([self._entry(p, d) for p, d in sorted(self.files.items())], link)
        if (reply := self._served(f"/datasets/{self.repo}/resolve/{SHA}/", path)) is not None:
            return reply
        if path.startswith(f"/api/buckets/{self.bucket}/tree"):
            entries = [{"type": "file", "path": p, "size": self.listed_size.get(p, len(d)), "xetHash": "",
                        "uploadedAt": "2026-01-01T00:00:00Z"} for p, d in sorted(self.files.items())]  # fmt: skip
            link = {"Link": f'<{self.bucket_next}>; rel="next"'} if self.bucket_next else {}
            return _json(entries, link)
        return self._served(f"/buckets/{self.bucket}/resolve/", path)
