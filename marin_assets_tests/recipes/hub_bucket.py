"""The Hub's bucket API for one bucket, served on the loopback server: the bucket sources' provider."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from marin_assets_tests.recipes.loopback import Answer, LoopbackServer


# --------------------------------------------------------------------------- Hub bucket


@dataclasses.dataclass
class BucketFile:
    path: str
    data: bytes
    uploaded_at: str = "2026-07-29T12:00:00.000Z"


def xet_hash(data: bytes, scratch: str) -> str:
    import hf_xet  # the Hub computes the same hash when a file is uploaded

    path = f"{scratch}/{hashlib.sha1(data).hexdigest()}"
    with open(path, "wb") as handle:
        handle.write(data)
    return str(hf_xet.hash_files([path])[0].hash)


class BucketApi:
    """The Hub's bucket API for one bucket: paginated tree listing and resolve redirects."""

    def __init__(self, server: LoopbackServer, bucket_id: str, files: Sequence[BucketFile], scratch: str, page_size: int = 2):
        self.server, self.bucket_id, self.scratch, self.page_size = server, bucket_id, scratch, page_size
        self.files: dict[str, BucketFile] = {}
        self.hashes: dict[str, str] = {}
        for f in files:
            self.add(f)
        server.handle(f"/api/buckets/{bucket_id}/tree", self.tree)
        server.handle(f"/buckets/{bucket_id}/resolve/", self.resolve)
        server.handle("/xet-bridge/", self.bridge)

    def add(self, f: BucketFile) -> None:
        self.files[f.path] = f
        self.hashes[f.path] = xet_hash(f.data, self.scratch)

    def entry(self, path: str) -> dict[str, Any]:
        f = self.files[path]
        return {"type": "file", "path": path, "size": len(f.data), "xetHash": self.hashes[path], "mtime": f.uploaded_at, "uploadedAt": f.uploaded_at}

    def tree(self, path: str, query: dict[str, list[str]], headers: Mapping[str, str]) -> Answer:
        prefix = path.removeprefix(f"/api/buckets/{self.bucket_id}/tree").strip("/")
        from urllib.parse import unquote

        prefix = unquote(prefix)
        paths = sorted(p for p in self.files if not prefix or p.startswith(prefix + "/"))
        start = int(query.get("cursor", ["0"])[0])
        page = paths[start : start + self.page_size]
        headers_out = {"Content-Type": "application/json"}
        if start + self.page_size < len(paths):
            headers_out["Link"] = f'<{self.server.base}{path}?recursive=true&cursor={start + self.page_size}>; rel="next"'
        body = [self.entry(p) for p in page] + ([{"type": "directory", "path": prefix, "uploadedAt": "2026-07-01T00:00:00Z"}] if start == 0 and prefix else [])
        return Answer(200, json.dumps(body).encode(), headers_out)

    def resolve(self, path: str, query: dict[str, list[str]], headers: Mapping[str, str]) -> Answer:
        from urllib.parse import unquote

        name = unquote(path.removeprefix(f"/buckets/{self.bucket_id}/resolve/"))
        if name not in self.files:
            return Answer(404, b"entry not found", {"X-Error-Code": "EntryNotFound"})
        return Answer(302, b"", {"Location": f"{self.server.base}/xet-bridge/{self.hashes[name]}", "X-Xet-Hash": self.hashes[name]})

    def bridge(self, path: str, query: dict[str, list[str]], headers: Mapping[str, str]) -> Answer:
        digest = path.removeprefix("/xet-bridge/")
        for name, value in self.hashes.items():
            if value == digest:
                return Answer(200, self.files[name].data, {"Content-Type": "application/octet-stream"})
        return Answer(404, b"no such xorb")

    def fingerprint(self, paths: Sequence[str]) -> str:
        lines = "".join(f"{p}\t{len(self.files[p].data)}\t{self.hashes[p]}\n" for p in sorted(paths))
        return hashlib.sha256(lines.encode()).hexdigest()
