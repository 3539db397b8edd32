"""A local server that speaks the part of the Hugging Face Hub HTTP API our downloads use.

It serves a directory of repos at revisions, so the real ``huggingface_hub`` client (and our
own download code) runs unchanged against it through ``HF_ENDPOINT``: the offline demo, the
tests and air-gapped mirrors all use it.

Routes (what ``huggingface_hub`` 2.x calls):

* ``GET  /api/{type}s/{repo}[/revision/{rev}]``      repo info (``?blobs=True`` adds sizes, LFS)
* ``GET  /api/{type}s/{repo}/tree/{rev}[/{path}]``   listing, ``recursive``, ``expand``, paged by
  a ``Link: <...>; rel="next"`` header
* ``POST /api/{type}s/{repo}/paths-info/{rev}``      ``paths`` and ``expand`` form fields
* ``GET  /api/{type}s/{repo}/refs`` and ``/commits/{rev}``
* ``HEAD|GET /[datasets/]{repo}/resolve/{rev}/{path}`` file content with ``X-Repo-Commit``,
  ``ETag``, ``X-Linked-Etag``/``X-Linked-Size`` (LFS files) and byte ranges (206)
* ``GET  /api/whoami-v2``

Files are never announced as Xet-stored (no ``X-Xet-*`` headers, no ``xetHash``), so clients
fall back to plain HTTP downloads. Errors carry the Hub's ``X-Error-Code`` (``RepoNotFound``,
``RevisionNotFound``, ``EntryNotFound``, ``GatedRepo``) so the client raises its usual types.

On disk (``root``)::

    blobs/<sha256[:2]>/<sha256>                       file contents, shared by every repo
    repos/<type>s/<namespace>/<name>/repo.json        refs, gating, removed commits
    repos/<type>s/<namespace>/<name>/commits/<sha>.json   the commit's full file table

``HubRepoStore`` builds and edits that tree; ``LocalHubServer`` serves it and re-reads it on
every request, so changes made while it runs (a moved branch, a removed revision, gating) are
seen at once, from this process or another one. ``server.faults`` injects rate limits, server
errors, cut connections and corrupted bodies for tests.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import fnmatch
import hashlib
import json
import os
import re
import signal
import socket
import threading
import uuid
from collections.abc import Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

from marin_assets.errors import NOT_SERVED_HEADER

REPO_TYPES = ("dataset", "model", "space")
DEFAULT_BRANCH = "main"
DEFAULT_PAGE_SIZE = 1000
EXPAND_PAGE_SIZE = 50
LFS_THRESHOLD_BYTES = 10 * 1024 * 1024
# Suffixes the Hub's default .gitattributes stores with LFS.
LFS_SUFFIXES = (
    ".parquet", ".arrow", ".gz", ".zst", ".bz2", ".xz", ".lz4", ".zip", ".tar", ".tgz", ".7z",
    ".bin", ".npy", ".npz", ".pt", ".pth", ".pkl", ".safetensors", ".h5", ".onnx", ".msgpack",
)  # fmt: skip
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_HEX_PREFIX = re.compile(r"^[0-9a-f]{4,40}$")
_CHUNK = 1 << 16


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a file's contents: what the Hub reports as ``oid`` / ``ETag``."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def _write_json_atomic(path: Path, payload: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    tmp.write_text(json.dumps(payload, indent=1, sort_keys=True))
    os.replace(tmp, path)


class HubStoreError(ValueError):
    """A repo store edit that cannot be done (unknown repo, sha clash, ...)."""


@dataclasses.dataclass(frozen=True)
class StoredFile:
    """One file of a commit: content address, git oid and LFS-ness."""

    path: str
    size: int
    sha256: str
    blob_id: str  # git oid of what git stores: the content, or the LFS pointer
    lfs: bool

    @property
    def etag(self) -> str:
        """The Hub's ETag for the content: sha256 for LFS files, the git blob oid otherwise."""
        return self.sha256 if self.lfs else self.blob_id

    def tree_entry(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"type": "file", "oid": self.blob_id, "size": self.size, "path": self.path}
        if self.lfs:
            entry["lfs"] = {"oid": self.sha256, "size": self.size, "pointerSize": len(lfs_pointer(self.sha256, self.size))}
        return entry


@dataclasses.dataclass(frozen=True)
class Commit:
    sha: str
    parent: str | None
    title: str
    date: str
    files: dict[str, StoredFile]

    def directories(self) -> set[str]:
        dirs: set[str] = set()
        for path in self.files:
            parts = path.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                dirs.add("/".join(parts[:i]))
        return dirs

    def tree_oid(self, directory: str) -> str:
        prefix = directory + "/"
        members = sorted(f"{p}:{f.blob_id}" for p, f in self.files.items() if p.startswith(prefix))
        return hashlib.sha1("\n".join(members).encode()).hexdigest()


# --------------------------------------------------------------------------- repo store


class HubRepoStore:
    """Builds and edits the served tree: repos, commits, branches, gating.

    ``publish`` records a commit whose file table is ``files`` (or the branch head's table
    updated by ``files`` when ``keep_existing``), stores the contents by sha256 and moves
    ``branch`` to it. ``commit`` picks the sha: a full 40-hex sha, or a short pin such as
    ``"060fca9"`` that the generated sha will start with, so catalog pins resolve as upstream.
    """

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._cache: dict[Path, tuple[tuple[int, int], Any]] = {}

    # -- paths
    def repo_dir(self, repo_id: str, repo_type: str = "dataset") -> Path:
        _check_repo(repo_id, repo_type)
        return self.root / "repos" / f"{repo_type}s" / repo_id

    def blob_path(self, sha256: str) -> Path:
        return self.root / "blobs" / sha256[:2] / sha256

    # -- reading (cached on mtime, so edits from another process are seen)
    def _read_json(self, path: Path) -> Any:
        try:
            stat = path.stat()
        except FileNotFoundError:
            return None
        key = (stat.st_mtime_ns, stat.st_size)
        with self._lock:
            hit = self._cache.get(path)
            if hit is not None and hit[0] == key:
                return hit[1]
        value = json.loads(path.read_text())
        with self._lock:
            self._cache[path] = (key, value)
        return value

    def repo_meta(self, repo_id: str, repo_type: str = "dataset") -> dict[str, Any] | None:
        return self._read_json(self.repo_dir(repo_id, repo_type) / "repo.json")

    def exists(self, repo_id: str, repo_type: str = "dataset") -> bool:
        return self.repo_meta(repo_id, repo_type) is not None

    def repos(self, repo_type: str = "dataset") -> list[str]:
        base = self.root / "repos" / f"{repo_type}s"
        return sorted(str(p.parent.relative_to(base)) for p in base.glob("**/repo.json"))

    def commit(self, repo_id: str, sha: str, repo_type: str = "dataset") -> Commit | None:
        raw = self._read_json(self.repo_dir(repo_id, repo_type) / "commits" / f"{sha}.json")
        if raw is None:
            return None
        files = {p: StoredFile(path=p, **f) for p, f in raw["files"].items()}
        return Commit(sha=raw["sha"], parent=raw.get("parent"), title=raw["title"], date=raw["date"], files=files)

    def _commit_shas(self, repo_id: str, repo_type: str) -> list[str]:
        return sorted(p.stem for p in (self.repo_dir(repo_id, repo_type) / "commits").glob("*.json"))

    def branches(self, repo_id: str, repo_type: str = "dataset") -> dict[str, str]:
        meta = self._meta_or_raise(repo_id, repo_type)
        return dict(meta["refs"])

    def resolve(self, repo_id: str, revision: str | None, repo_type: str = "dataset") -> str | None:
        """The full sha ``revision`` names (branch, full sha or unique short sha), or None.

        Removed commits resolve to None, as on a Hub whose history was rewritten.
        """
        meta = self.repo_meta(repo_id, repo_type)
        if meta is None:
            return None
        revision = revision or DEFAULT_BRANCH
        refs = meta["refs"]
        for name in (revision, revision.removeprefix("refs/heads/")):
            if name in refs:
                return refs[name]
        if not _HEX_PREFIX.match(revision):
            return None
        removed = set(meta.get("removed", []))
        matches = [s for s in self._commit_shas(repo_id, repo_type) if s.startswith(revision) and s not in removed]
        return matches[0] if len(matches) == 1 else None

    def history(self, repo_id: str, sha: str, repo_type: str = "dataset") -> list[Commit]:
        out: list[Commit] = []
        current: str | None = sha
        while current:
            commit = self.commit(repo_id, current, repo_type)
            if commit is None:
                break
            out.append(commit)
            current = commit.parent
        return out

    # -- editing
    def _meta_or_raise(self, repo_id: str, repo_type: str) -> dict[str, Any]:
        meta = self.repo_meta(repo_id, repo_type)
        if meta is None:
            raise HubStoreError(f"no {repo_type} repo {repo_id!r} in the hub store at {self.root}")
        return meta

    def _write_meta(self, repo_id: str, repo_type: str, meta: dict[str, Any]) -> None:
        _write_json_atomic(self.repo_dir(repo_id, repo_type) / "repo.json", meta)

    def _store_blob(self, data: bytes) -> str:
        sha256 = hashlib.sha256(data).hexdigest()
        path = self.blob_path(sha256)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{sha256}.tmp-{uuid.uuid4().hex[:8]}")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        return sha256

    def publish(
        self,
        repo_id: str,
        files: Mapping[str, bytes | str | os.PathLike[str] | None],
        branch: str | None = DEFAULT_BRANCH,
        commit: str | None = None,
        gated: bool | None = None,
        *,
        repo_type: str = "dataset",
        message: str | None = None,
        keep_existing: bool = False,
        lfs: bool | None = None,
    ) -> str:
        """Record a commit and move ``branch`` to it; returns the full 40-hex sha.

        ``files`` maps repo paths to contents (bytes, or a local file path to copy); with
        ``keep_existing`` the commit starts from the branch head and a ``None`` value deletes a
        path. ``branch=None`` leaves the commit reachable by sha only. ``lfs`` forces LFS
        on or off; by default big files and binary suffixes are LFS, as with the Hub's
        default ``.gitattributes``. ``gated`` (when not None) also sets the repo's gating.
        """
        _check_repo(repo_id, repo_type)
        with self._lock:
            meta = self.repo_meta(repo_id, repo_type) or {
                "refs": {}, "gated": False, "allowed_tokens": [], "removed": [], "created_at": _now(),
            }  # fmt: skip
            parent = meta["refs"].get(branch) if branch else None
            table: dict[str, StoredFile] = {}
            if keep_existing and parent:
                base = self.commit(repo_id, parent, repo_type)
                table = dict(base.files) if base else {}
            for path, content in files.items():
                path = _check_path(path)
                if content is None:
                    table.pop(path, None)
                    continue
                data = content if isinstance(content, bytes) else Path(content).read_bytes()
                sha256 = self._store_blob(data)
                is_lfs = lfs if lfs is not None else (len(data) >= LFS_THRESHOLD_BYTES or path.endswith(LFS_SUFFIXES))
                blob_id = git_blob_sha1(lfs_pointer(sha256, len(data))) if is_lfs else git_blob_sha1(data)
                table[path] = StoredFile(path=path, size=len(data), sha256=sha256, blob_id=blob_id, lfs=is_lfs)
            existing = set(self._commit_shas(repo_id, repo_type))
            sha = self._new_sha(repo_id, parent, table, commit, existing)
            title = message or f"Publish {len(table)} files"
            record = {
                "sha": sha,
                "parent": parent,
                "title": title,
                "date": _now(),
                "files": {
                    p: {"size": f.size, "sha256": f.sha256, "blob_id": f.blob_id, "lfs": f.lfs}
                    for p, f in sorted(table.items())
                },
            }
            _write_json_atomic(self.repo_dir(repo_id, repo_type) / "commits" / f"{sha}.json", record)
            if branch:
                meta["refs"][branch] = sha
            if gated is not None:
                meta["gated"] = bool(gated)
            meta["removed"] = [s for s in meta.get("removed", []) if s != sha]
            self._write_meta(repo_id, repo_type, meta)
            return sha

    @staticmethod
    def _new_sha(
        repo_id: str, parent: str | None, table: Mapping[str, StoredFile], commit: str | None, existing: set[str]
    ) -> str:
        if commit is not None:
            commit = commit.lower()
            if not _HEX_PREFIX.match(commit) and commit:
                raise HubStoreError(f"commit must be hex (a full sha or a short pin), got {commit!r}")
        for salt in range(1000):
            digest = hashlib.sha1(
                json.dumps([repo_id, parent, sorted((p, f.sha256) for p, f in table.items()), salt, uuid.uuid4().hex])
                .encode()
            ).hexdigest()
            sha = (commit or "") + digest[len(commit or "") :]
            if sha not in existing:
                return sha
            if commit and len(commit) == 40:
                break
        raise HubStoreError(f"commit {commit} already exists in {repo_id}")

    def move_branch(self, repo_id: str, branch: str, sha: str, *, repo_type: str = "dataset") -> None:
        with self._lock:
            meta = self._meta_or_raise(repo_id, repo_type)
            full = self.resolve(repo_id, sha, repo_type)
            if full is None:
                raise HubStoreError(f"{repo_id} has no commit {sha}")
            meta["refs"][branch] = full
            self._write_meta(repo_id, repo_type, meta)

    def delete_branch(self, repo_id: str, branch: str, *, repo_type: str = "dataset") -> None:
        with self._lock:
            meta = self._meta_or_raise(repo_id, repo_type)
            meta["refs"].pop(branch, None)
            self._write_meta(repo_id, repo_type, meta)

    def remove_revision(self, repo_id: str, revision: str, *, repo_type: str = "dataset") -> str:
        """Stop serving a commit (history rewritten upstream); returns its full sha.

        A commit a branch still points to cannot be removed: move the branch first.
        """
        with self._lock:
            meta = self._meta_or_raise(repo_id, repo_type)
            sha = self.resolve(repo_id, revision, repo_type)
            if sha is None:
                raise HubStoreError(f"{repo_id} serves no revision {revision!r}")
            holders = [b for b, s in meta["refs"].items() if s == sha]
            if holders:
                raise HubStoreError(f"{repo_id}@{sha[:7]} is the head of {holders}: move the branch before removing it")
            meta["removed"] = sorted(set(meta.get("removed", [])) | {sha})
            self._write_meta(repo_id, repo_type, meta)
            return sha

    def set_gated(
        self, repo_id: str, gated: bool = True, allowed_tokens: Iterable[str] = (), *, repo_type: str = "dataset"
    ) -> None:
        """Gate a repo: file downloads need a token from ``allowed_tokens`` (401 without one, 403 otherwise)."""
        with self._lock:
            meta = self._meta_or_raise(repo_id, repo_type)
            meta["gated"] = bool(gated)
            meta["allowed_tokens"] = sorted(set(allowed_tokens))
            self._write_meta(repo_id, repo_type, meta)

    def delete_repo(self, repo_id: str, *, repo_type: str = "dataset") -> None:
        """Forget a repo (its blobs stay: they may be shared)."""
        import shutil

        with self._lock:
            shutil.rmtree(self.repo_dir(repo_id, repo_type), ignore_errors=True)


def _check_repo(repo_id: str, repo_type: str) -> None:
    if repo_type not in REPO_TYPES:
        raise HubStoreError(f"repo_type must be one of {REPO_TYPES}, got {repo_type!r}")
    parts = repo_id.split("/")
    if not 1 <= len(parts) <= 2 or any(not p or p in (".", "..") for p in parts):
        raise HubStoreError(f"repo id must look like 'namespace/name', got {repo_id!r}")


def _check_path(path: str) -> str:
    clean = path.strip("/")
    if not clean or any(p in ("", ".", "..") for p in clean.split("/")):
        raise HubStoreError(f"bad file path in repo: {path!r}")
    return clean


# --------------------------------------------------------------------------- faults

STATUS_FAULTS = {"408", "429", "500", "502", "503", "504"}
BODY_FAULTS = {"cut", "corrupt"}


@dataclasses.dataclass
class Fault:
    """One injected failure. ``times=None`` fails forever; ``hits`` counts what it did."""

    kind: str
    path_glob: str = "*"
    times: int | None = 1
    methods: tuple[str, ...] | None = None
    reset_s: int = 0
    cut_fraction: float = 0.5
    hits: int = 0

    @property
    def active(self) -> bool:
        return self.times is None or self.hits < self.times

    def matches(self, method: str, path: str) -> bool:
        if self.methods is not None and method not in self.methods:
            return False
        return fnmatch.fnmatchcase(path, self.path_glob)


class FaultPlan:
    """Failures to inject, matched in order against ``METHOD`` and the decoded request path.

    Kinds: ``"429"`` (with ``RateLimit: "api";r=0;t=<reset_s>`` and ``Retry-After``),
    ``"408"``/``"500"``/``"502"``/``"503"``/``"504"``, ``"cut"`` (full ``Content-Length``,
    part of the body, then the connection closes) and ``"corrupt"`` (bytes flipped, length
    kept). Body faults only fire on file content (GET on ``resolve/``).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []

    def add(
        self,
        kind: str | int,
        path_glob: str = "*",
        times: int | None = 1,
        *,
        methods: Iterable[str] | None = None,
        reset_s: int = 0,
        cut_fraction: float = 0.5,
    ) -> Fault:
        kind = str(kind)
        if kind not in STATUS_FAULTS | BODY_FAULTS:
            raise ValueError(f"unknown fault kind {kind!r}; use one of {sorted(STATUS_FAULTS | BODY_FAULTS)}")
        fault = Fault(
            kind=kind,
            path_glob=path_glob,
            times=times,
            methods=tuple(m.upper() for m in methods) if methods is not None else None,
            reset_s=reset_s,
            cut_fraction=cut_fraction,
        )
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    def take(self, method: str, path: str, body: bool) -> Fault | None:
        """The first active fault for this request (status faults, or body faults if ``body``)."""
        kinds = BODY_FAULTS if body else STATUS_FAULTS
        with self._lock:
            for fault in self._faults:
                if fault.kind in kinds and fault.active and fault.matches(method, path):
                    fault.hits += 1
                    return fault
        return None

    def __iter__(self):
        with self._lock:
            return iter(list(self._faults))


@dataclasses.dataclass(frozen=True)
class RequestRecord:
    method: str
    path: str
    status: int
    range: str | None = None
    fault: str | None = None


# --------------------------------------------------------------------------- HTTP


class _HubError(Exception):
    def __init__(self, status: int, code: str | None, message: str, headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.headers = dict(headers or {})


_API_ACTIONS = ("revision", "tree", "paths-info", "refs", "commits")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "marin-local-hub/1"
    server: _HubHTTPServer

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the hub keeps its own log
        return

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    # -- plumbing
    @property
    def hub(self) -> LocalHubServer:
        return self.server.hub

    def _record(self, status: int, fault: str | None = None) -> None:
        self.hub._log(RequestRecord(self._method, self._path, status, self.headers.get("Range"), fault))

    def _send(self, status: int, body: bytes, headers: Mapping[str, str] | None = None, content_type: str = "application/json") -> None:
        # Logged before the client can see the answer, so a test that counts requests right
        # after its call returns never races the server thread.
        self._record(status)
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Request-Id", uuid.uuid4().hex[:16])
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self._method != "HEAD":
            self.wfile.write(body)

    def _send_json(self, payload: Any, headers: Mapping[str, str] | None = None) -> None:
        self._send(200, json.dumps(payload).encode(), headers)

    def _send_error(self, err: _HubError) -> None:
        headers = dict(err.headers)
        # A Hub that serves part of the catalog says which part, and where the rest is; a repo it
        # serves at a revision it does not have is answered with that (the client names the revision).
        note = self.hub.served_note if err.status == 404 and err.code not in ("RevisionNotFound", "EntryNotFound") else None
        if note:
            err.message = f"{err.message}. {note}"
            headers[NOT_SERVED_HEADER] = note.encode("ascii", "replace").decode()
        headers["X-Error-Message"] = err.message.encode("ascii", "replace").decode()
        if err.code:
            headers["X-Error-Code"] = err.code
        self._send(err.status, json.dumps({"error": err.message}).encode(), headers)

    def _token(self) -> str | None:
        auth = self.headers.get("Authorization") or ""
        if not auth.lower().startswith("bearer "):
            return None
        return auth[7:].strip() or None

    def _base_url(self) -> str:
        return f"http://{self.headers.get('Host') or self.hub.host_port}"

    def _dispatch(self, method: str) -> None:
        self._method = method
        split = urlsplit(self.path)
        self._raw_segments = [s for s in split.path.split("/") if s]
        self._segments = [unquote(s) for s in self._raw_segments]
        self._path = "/" + "/".join(self._segments)
        self._query = parse_qs(split.query)
        body = b""
        if method == "POST":
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
        try:
            fault = self.hub.faults.take(method, self._path, body=False)
            if fault is not None:
                self._send_status_fault(fault)
                return
            self._route(method, body)
        except _HubError as err:
            self._send_error(err)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # a bug in the server: say so like the Hub would
            self._send_error(_HubError(500, None, f"internal error in local hub: {type(exc).__name__}: {exc}"))

    def _send_status_fault(self, fault: Fault) -> None:
        status = int(fault.kind)
        headers: dict[str, str] = {}
        message = {429: "You have been rate-limited; retry later.", 408: "Request timeout"}.get(
            status, "Internal Error - We're working hard to fix this as soon as possible!"
        )
        if status == 429:
            headers["RateLimit"] = f'"api";r=0;t={fault.reset_s}'
            headers["RateLimit-Policy"] = '"fixed window";"api";q=500;w=300'
            headers["Retry-After"] = str(fault.reset_s)
        headers["X-Error-Message"] = message
        body = json.dumps({"error": message}).encode()
        self._record(status, fault=fault.kind)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if self._method != "HEAD":
            self.wfile.write(body)

    def _route(self, method: str, body: bytes) -> None:
        segs = self._segments
        if segs[:2] == ["api", "whoami-v2"] and method == "GET":
            return self._whoami()
        if len(segs) >= 3 and segs[0] == "api" and segs[1].endswith("s") and segs[1][:-1] in REPO_TYPES:
            return self._api(method, segs[1][:-1], segs[2:], body)
        if "resolve" in segs and method in ("GET", "HEAD"):
            i = segs.index("resolve")
            repo_type = "model"
            repo_segs = segs[:i]
            if repo_segs and repo_segs[0] in ("datasets", "spaces"):
                repo_type, repo_segs = repo_segs[0][:-1], repo_segs[1:]
            if 1 <= len(repo_segs) <= 2 and len(segs) > i + 2:
                return self._resolve(repo_type, "/".join(repo_segs), segs[i + 1], "/".join(segs[i + 2 :]))
        raise _HubError(404, None, f"Not Found: {self._path}")

    # -- repo + revision lookups shared by routes
    def _repo(self, repo_type: str, repo_id: str) -> dict[str, Any]:
        meta = self.hub.store.repo_meta(repo_id, repo_type) if _valid_repo(repo_id) else None
        if meta is None:
            raise _HubError(404, "RepoNotFound", "Repository not found")
        return meta

    def _commit(self, repo_type: str, repo_id: str, revision: str | None) -> Commit:
        self._repo(repo_type, repo_id)
        sha = self.hub.store.resolve(repo_id, revision, repo_type)
        commit = self.hub.store.commit(repo_id, sha, repo_type) if sha else None
        if commit is None:
            raise _HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return commit

    # -- API routes
    def _api(self, method: str, repo_type: str, rest: list[str], body: bytes) -> None:
        split = 2 if len(rest) >= 2 and rest[1] not in _API_ACTIONS else 1
        repo_id, tail = "/".join(rest[:split]), rest[split:]
        action = tail[0] if tail else None
        if method == "GET" and action is None:
            return self._repo_info(repo_type, repo_id, None)
        if method == "GET" and action == "revision" and len(tail) >= 2:
            return self._repo_info(repo_type, repo_id, "/".join(tail[1:]))
        if method == "GET" and action == "tree" and len(tail) >= 2:
            return self._tree(repo_type, repo_id, tail[1], "/".join(tail[2:]))
        if method == "POST" and action == "paths-info" and len(tail) >= 2:
            return self._paths_info(repo_type, repo_id, "/".join(tail[1:]), body)
        if method == "GET" and action == "refs":
            return self._refs(repo_type, repo_id)
        if method == "GET" and action == "commits" and len(tail) >= 2:
            return self._commits(repo_type, repo_id, "/".join(tail[1:]))
        raise _HubError(404, None, f"Not Found: {self._path}")

    def _flag(self, name: str) -> bool:
        return (self._query.get(name) or ["false"])[-1].lower() in ("1", "true")

    def _repo_info(self, repo_type: str, repo_id: str, revision: str | None) -> None:
        meta = self._repo(repo_type, repo_id)
        commit = self._commit(repo_type, repo_id, revision)
        blobs = self._flag("blobs")
        siblings = []
        for f in sorted(commit.files.values(), key=lambda f: f.path):
            sib: dict[str, Any] = {"rfilename": f.path}
            if blobs:
                sib.update(size=f.size, blobId=f.blob_id)
                if f.lfs:
                    sib["lfs"] = f.tree_entry()["lfs"] | {"sha256": f.sha256}
            siblings.append(sib)
        self._send_json(
            {
                "_id": hashlib.sha1(f"{repo_type}/{repo_id}".encode()).hexdigest()[:24],
                "id": repo_id,
                "author": repo_id.split("/")[0] if "/" in repo_id else None,
                "sha": commit.sha,
                "lastModified": commit.date,
                "createdAt": meta.get("created_at", commit.date),
                "private": False,
                "gated": "manual" if meta.get("gated") else False,
                "disabled": False,
                "downloads": 0,
                "likes": 0,
                "tags": [],
                "siblings": siblings,
                "usedStorage": sum(f.size for f in commit.files.values()),
            }
        )

    def _entry(self, commit: Commit, path: str, expand: bool) -> dict[str, Any]:
        if path in commit.files:
            entry = commit.files[path].tree_entry()
        else:
            entry = {"type": "directory", "oid": commit.tree_oid(path), "size": 0, "path": path}
        if expand:
            entry["lastCommit"] = {"id": commit.sha, "title": commit.title, "date": commit.date}
        return entry

    def _tree(self, repo_type: str, repo_id: str, revision: str, path: str) -> None:
        commit = self._commit(repo_type, repo_id, revision)
        path = path.strip("/")
        dirs = commit.directories()
        if path and path not in dirs:
            raise _HubError(404, "EntryNotFound", f"{path} does not exist on \"{revision}\"", {"X-Repo-Commit": commit.sha})
        recursive, expand = self._flag("recursive"), self._flag("expand")
        prefix = path + "/" if path else ""
        names = sorted(p for p in list(commit.files) + list(dirs) if p.startswith(prefix))
        if not recursive:
            names = [p for p in names if "/" not in p[len(prefix) :]]
        page_size = min(self.hub.page_size, EXPAND_PAGE_SIZE) if expand else self.hub.page_size
        start = _decode_cursor((self._query.get("cursor") or [""])[-1])
        page = names[start : start + page_size]
        headers = {}
        if start + page_size < len(names):
            query = {k: v[-1] for k, v in self._query.items() if k != "cursor"}
            query["cursor"] = _encode_cursor(start + page_size)
            headers["Link"] = f'<{self._base_url()}/{"/".join(self._raw_segments)}?{urlencode(query)}>; rel="next"'
        self._send_json([self._entry(commit, p, expand) for p in page], headers)

    def _paths_info(self, repo_type: str, repo_id: str, revision: str, body: bytes) -> None:
        commit = self._commit(repo_type, repo_id, revision)
        form = parse_qs(body.decode(), keep_blank_values=True)
        expand = (form.get("expand") or ["false"])[-1].lower() in ("1", "true")
        dirs = commit.directories()
        out = [
            self._entry(commit, p.strip("/"), expand)
            for p in form.get("paths", [])
            if p.strip("/") in commit.files or p.strip("/") in dirs
        ]
        self._send_json(out)

    def _refs(self, repo_type: str, repo_id: str) -> None:
        meta = self._repo(repo_type, repo_id)
        branches = [
            {"name": name, "ref": f"refs/heads/{name}", "targetCommit": sha} for name, sha in sorted(meta["refs"].items())
        ]
        self._send_json({"branches": branches, "tags": [], "converts": [], "pullRequests": []})

    def _commits(self, repo_type: str, repo_id: str, revision: str) -> None:
        commit = self._commit(repo_type, repo_id, revision)
        history = self.hub.store.history(repo_id, commit.sha, repo_type)
        self._send_json(
            [
                {"id": c.sha, "title": c.title, "message": "", "authors": [{"user": "local"}], "date": c.date}
                for c in history
            ]
        )

    def _whoami(self) -> None:
        token = self._token()
        if not token:
            raise _HubError(401, None, "Invalid credentials in Authorization header")
        self._send_json(
            {
                "type": "user",
                "id": hashlib.sha1(token.encode()).hexdigest()[:24],
                "name": "local-user",
                "fullname": "Local Hub user",
                "orgs": [],
                "auth": {"type": "access_token", "accessToken": {"displayName": "local", "role": "read"}},
            }
        )

    # -- file content
    def _resolve(self, repo_type: str, repo_id: str, revision: str, path: str) -> None:
        meta = self._repo(repo_type, repo_id)
        commit = self._commit(repo_type, repo_id, revision)
        if meta.get("gated"):
            token = self._token()
            kind = "dataset" if repo_type == "dataset" else repo_type
            page = f"{self._base_url()}/{'datasets/' if repo_type == 'dataset' else ''}{repo_id}"
            if token is None:
                raise _HubError(
                    401, "GatedRepo",
                    f"Access to {kind} {repo_id} is restricted. You must have access to it and be authenticated to access it. Please log in.",
                )  # fmt: skip
            if token not in meta.get("allowed_tokens", []):
                raise _HubError(
                    403, "GatedRepo",
                    f"Access to {kind} {repo_id} is restricted and you are not in the authorized list. Visit {page} to ask for access.",
                )  # fmt: skip
        stored = commit.files.get(path)
        if stored is None:
            raise _HubError(404, "EntryNotFound", f"Entry not found: {path}", {"X-Repo-Commit": commit.sha})
        headers = {
            "X-Repo-Commit": commit.sha,
            "ETag": f'"{stored.etag}"',
            "Accept-Ranges": "bytes",
            "Content-Disposition": f'inline; filename="{path.rsplit("/", 1)[-1]}"',
        }
        if stored.lfs:
            headers["X-Linked-Etag"] = f'"{stored.sha256}"'
            headers["X-Linked-Size"] = str(stored.size)
        start, end = 0, stored.size  # [start, end)
        status = 200
        range_header = self.headers.get("Range")
        if range_header:
            parsed = _parse_range(range_header, stored.size)
            if parsed is None:
                raise _HubError(416, None, "Requested Range Not Satisfiable", {"Content-Range": f"bytes */{stored.size}"})
            start, end = parsed
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{stored.size}"
        fault = self.hub.faults.take(self._method, self._path, body=True) if self._method == "GET" else None
        self._record(status, fault=fault.kind if fault else None)
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if self._method == "HEAD":
            return
        length = end - start
        limit = int(length * fault.cut_fraction) if fault and fault.kind == "cut" else length
        flip_at = length // 2 if fault and fault.kind == "corrupt" else -1
        sent = 0
        with open(self.hub.store.blob_path(stored.sha256), "rb") as handle:
            handle.seek(start)
            while sent < limit:
                chunk = handle.read(min(_CHUNK, limit - sent))
                if not chunk:
                    break
                if sent <= flip_at < sent + len(chunk):
                    buf = bytearray(chunk)
                    buf[flip_at - sent] ^= 0xFF
                    chunk = bytes(buf)
                self.wfile.write(chunk)
                sent += len(chunk)
        if fault and fault.kind == "cut":
            self.wfile.flush()
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _valid_repo(repo_id: str) -> bool:
    parts = repo_id.split("/")
    return 1 <= len(parts) <= 2 and all(p and p not in (".", "..") for p in parts)


def _parse_range(header: str, size: int) -> tuple[int, int] | None:
    """``bytes=a-b``, ``bytes=a-`` or ``bytes=-n`` as ``[start, end)``; None if unsatisfiable."""
    match = re.fullmatch(r"\s*bytes=(\d*)-(\d*)\s*", header)
    if not match or (not match.group(1) and not match.group(2)):
        return None
    first, last = match.group(1), match.group(2)
    if not first:
        n = int(last)
        return (max(0, size - n), size) if n > 0 and size > 0 else None
    start = int(first)
    end = min(size, int(last) + 1) if last else size
    return (start, end) if start < size and start < end else None


def _encode_cursor(offset: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"offset": offset}).encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> int:
    if not cursor:
        return 0
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        return int(json.loads(base64.urlsafe_b64decode(padded))["offset"])
    except (ValueError, KeyError, TypeError):
        raise _HubError(400, None, f"bad cursor {cursor!r}") from None


class _HubHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    hub: LocalHubServer


class LocalHubServer:
    """Serves a ``HubRepoStore`` directory over HTTP on loopback (``port=0``: any free port).

    Use as a context manager or with ``start()``/``stop()``; point clients at ``endpoint``
    (``HF_ENDPOINT``). ``faults`` injects failures at runtime; ``requests`` records what was
    asked (method, decoded path, status, range, fault) so tests can count fetches.
    ``served_note``: said on every 404 (message and ``X-Marin-Not-Served``), for a Hub that
    serves only part of the catalog (the demo's): which sources, and how to get the others.
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | HubRepoStore,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        page_size: int = DEFAULT_PAGE_SIZE,
        served_note: str | None = None,
    ):
        self.store = root if isinstance(root, HubRepoStore) else HubRepoStore(root)
        self.served_note = " ".join(served_note.split()) if served_note else None
        self.host, self.port = host, port
        self.page_size = page_size
        self.faults = FaultPlan()
        self._requests: list[RequestRecord] = []
        self._log_lock = threading.Lock()
        self._httpd: _HubHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def root(self) -> Path:
        return self.store.root

    @property
    def host_port(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def endpoint(self) -> str:
        if self._httpd is None:
            raise RuntimeError("the local hub is not started")
        return f"http://{self.host_port}"

    def _bind(self) -> _HubHTTPServer:
        httpd = _HubHTTPServer((self.host, self.port), _Handler)
        httpd.hub = self
        self.port = httpd.server_address[1]
        self._httpd = httpd
        return httpd

    def start(self) -> LocalHubServer:
        """Serve from a background thread (returns at once)."""
        if self._httpd is not None:
            return self
        httpd = self._bind()
        self._thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), name="local-hub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd, self._thread = None, None

    def __enter__(self) -> LocalHubServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- request log
    def _log(self, record: RequestRecord) -> None:
        with self._log_lock:
            self._requests.append(record)

    @property
    def requests(self) -> list[RequestRecord]:
        with self._log_lock:
            return list(self._requests)

    def clear_requests(self) -> None:
        with self._log_lock:
            self._requests.clear()

    def count(self, method: str | None = None, path_glob: str = "*", status: int | None = None) -> int:
        """How many logged requests match ``method``, ``path_glob`` (decoded path) and ``status``."""
        return sum(
            1
            for r in self.requests
            if (method is None or r.method == method.upper())
            and fnmatch.fnmatchcase(r.path, path_glob)
            and (status is None or r.status == status)
        )

    def file_url(self, repo_id: str, revision: str, path: str, repo_type: str = "dataset") -> str:
        prefix = {"dataset": "datasets/", "space": "spaces/"}.get(repo_type, "")
        return f"{self.endpoint}/{prefix}{repo_id}/resolve/{quote(revision, safe='')}/{quote(path)}"


def serve(root: str | os.PathLike[str], port: int = 8765, host: str = "127.0.0.1") -> None:
    """Serve ``root`` in the foreground until interrupted (``marin-assets serve-hub``).

    Prints the ``HF_ENDPOINT`` to export for clients. SIGTERM stops it cleanly, even when the
    parent process ignores SIGTERM (an ignored signal is inherited by a child).
    """

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    server = LocalHubServer(root, host=host, port=port)
    httpd = server._bind()
    repos = server.store.repos("dataset")
    print(f"local hub: {len(repos)} dataset repos from {server.root}", flush=True)
    print(f"HF_ENDPOINT={server.endpoint}", flush=True)
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
        server._httpd = None
