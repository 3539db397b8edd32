"""Hugging Face downloads: resolve a pinned revision, list its files, copy them verified.

Built on ``huggingface_hub`` (its ``HfApi`` for metadata, its URL builder, headers and HTTP
session for file bodies) so the same code talks to huggingface.co, a mirror or the local Hub
server (``HF_ENDPOINT``). What this module adds on top:

* the project's one retry loop (``marin_assets.core.runtime.retry``) for every request: exponential
  backoff with jitter on 408/425/429/5xx, dropped connections and short reads, waiting at least
  the server's rate-limit reset (at most 15 minutes). ``huggingface_hub``'s own retries, which
  wait whatever ``Retry-After`` says, are turned off: each of its calls is one request;
* nothing the Hub lists is trusted: a path that would leave the destination fails the
  download naming the entry, and a body longer than listed is cut off at once;
* no retries where retrying cannot help: gated repos (401/403) and revisions the provider no
  longer serves fail at once with a message that says what to do;
* verification of every file against the Hub's metadata (size, and sha256 for LFS files or the
  git blob sha1 otherwise); a corrupted body is fetched again, then reported;
* resumable, shareable copies: each finished file leaves a marker, a rerun fetches only what is
  missing, and the stage runner writes ``_manifest.json`` last (``stages.commit_copy``). A
  complete destination makes a repeated call a no-op that returns the stored manifest.

The token (the ``HF_TOKEN`` setting) is passed in by the caller and only ever sent as a
header: it never appears in logs, errors or manifests. Nothing here imports dagster or reads
the environment.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import dataclasses
import hashlib
import logging
import os
import re
import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar
from urllib.parse import quote

from fsspec.utils import glob_translate
from huggingface_hub import HfApi, hf_hub_download, hf_hub_url
from huggingface_hub import constants as hf_constants
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import build_hf_headers, get_session

from marin_assets.core.runtime import storage, trust
from marin_assets.errors import NotServedHere, ProviderRefused, not_served_here
from marin_assets.core.runtime.retry import (  # noqa: F401 - the one retry loop, re-exported for callers
    DEFAULT_POLICY,
    RETRY_STATUS,
    Counters,
    DownloadError,
    IntegrityError,
    Retryable,
    RetryPolicy,
    rate_limit_reset,
    retry_for_status,
    retrying,
)

try:  # the HTTP library under huggingface_hub: httpx2 from 2.x, httpx before
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx  # type: ignore[no-redef]

log = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "https://huggingface.co"
PARTIAL_DIR = storage.PARTIAL_DIR  # per-file completion markers, removed once the manifest is written
MANIFEST_KIND = "hf_snapshot"
_HEX_PIN = re.compile(r"^[0-9a-f]{7,40}$")

T = TypeVar("T")


# --------------------------------------------------------------------------- errors


class HubError(ProviderRefused):
    """Base of the refusals this module raises (the provider said no, or the pin is gone)."""


class HubAuthError(HubError):
    """401/403: the repo is gated or private and the token (if any) has no access. Never retried."""


class RevisionGoneError(HubError):
    """The provider no longer serves the pinned revision (history rewritten or repo removed)."""


class RepoNotFoundError(RevisionGoneError):
    """The repo itself is gone (or private and invisible without a token)."""


_Counters = Counters


# --------------------------------------------------------------------------- endpoint, token, errors


def _library_retries_off() -> None:
    """Make every ``huggingface_hub`` request path (metadata, tree pages, file heads and bodies) one request.

    Its ``http_backoff`` retries 429s and 5xx itself, sleeping for whatever ``Retry-After`` a server
    sends (a year, from a hostile mirror) outside any cap; with no retries of its own it raises the
    status instead, and the caller's ``retrying`` decides the wait under the ``RetryPolicy`` caps.
    """
    from huggingface_hub.utils import _http  # the library's retry defaults live there

    for backoff in (_http.http_backoff, _http.http_stream_backoff.__wrapped__):  # the latter is a context manager
        backoff.__kwdefaults__["max_retries"] = 0


_library_retries_off()


def hub_endpoint(endpoint: str | None = None) -> str:
    """The Hub to talk to: the argument (the ``HF_ENDPOINT`` setting), else the Hub client's default."""
    return (endpoint or hf_constants.ENDPOINT or DEFAULT_ENDPOINT).rstrip("/")


def _token(token: str | None) -> str | None:
    return token or None


def _api(endpoint: str | None, token: str | None) -> HfApi:
    return HfApi(endpoint=hub_endpoint(endpoint), token=_token(token))


def repo_page(repo_id: str, repo_type: str = "dataset", endpoint: str | None = None) -> str:
    prefix = {"dataset": "datasets/", "space": "spaces/"}.get(repo_type, "")
    return f"{hub_endpoint(endpoint)}/{prefix}{repo_id}"


def _gated_message(repo_id: str, repo_type: str, endpoint: str | None, token: str | None) -> str:
    why = "the token in HF_TOKEN was refused" if _token(token) else "no HF_TOKEN is set"
    return (
        f"{repo_type} {repo_id} is gated or its terms are not accepted ({why}): "
        f"accept them at {repo_page(repo_id, repo_type, endpoint)} and set HF_TOKEN to a token of that account"
    )


def _classify_status(status: int, headers: Any, what: str, repo_id: str, repo_type: str, revision: str,
                     endpoint: str | None, token: str | None, error_code: str | None) -> Exception:  # fmt: skip
    """Map an HTTP failure to our error (or ``_Retryable``)."""
    if status == 404 and (here := not_served_here(headers, f"{repo_type} {repo_id}@{revision}")) is not None:
        return here
    if error_code == "GatedRepo" or status in (401, 403):
        return HubAuthError(_gated_message(repo_id, repo_type, endpoint, token))
    if error_code == "RevisionNotFound":
        return _revision_gone(repo_id, repo_type, revision, endpoint)
    if error_code == "RepoNotFound":
        return _repo_gone(repo_id, repo_type, endpoint)
    if (retry := retry_for_status(status, headers)) is not None:
        return retry
    return DownloadError(f"{what}: unexpected HTTP {status} ({error_code or 'no error code'}) from {hub_endpoint(endpoint)}")


def _revision_gone(repo_id: str, repo_type: str, revision: str, endpoint: str | None) -> RevisionGoneError:
    return RevisionGoneError(
        f"{repo_type} {repo_id} no longer serves revision {revision!r} at {hub_endpoint(endpoint)} "
        f"(the history was rewritten or the commit removed): pick a revision it serves "
        f"(see {repo_page(repo_id, repo_type, endpoint)}) and update the pin in the catalog"
    )


def _repo_gone(repo_id: str, repo_type: str, endpoint: str | None) -> RepoNotFoundError:
    return RepoNotFoundError(
        f"{repo_type} {repo_id} was not found at {hub_endpoint(endpoint)}: check the repo id in the catalog; "
        f"if the repo is private, set HF_TOKEN to a token that can read it"
    )


def not_served(err: Exception, repo_id: str, repo_type: str, revision: str) -> NotServedHere | None:
    response = getattr(err, "response", None)
    return not_served_here(getattr(response, "headers", None), f"{repo_type} {repo_id}@{revision}")


# The Hub whose token the current call carries; requests elsewhere go without it.
_HOME: contextvars.ContextVar[str | None] = contextvars.ContextVar("marin_hub_home", default=None)


def _credential_guard(request: Any) -> None:
    """httpx request hook: drop ``Authorization`` on any request that leaves the configured Hub.

    ``huggingface_hub`` follows a listing's pagination ``Link`` with the token attached,
    whatever host it names; this hook is what keeps the token at home.
    """
    home = _HOME.get()
    if home and "authorization" in request.headers and not trust.same_origin(str(request.url), home):
        del request.headers["authorization"]


def _guarded_session() -> Any:
    """``huggingface_hub``'s shared HTTP client, with the credential guard installed (and its retries off)."""
    _library_retries_off()
    session = get_session()
    hooks = list(session.event_hooks.get("request", []))
    if _credential_guard not in hooks:
        session.event_hooks = {**session.event_hooks, "request": [*hooks, _credential_guard]}
    return session


@contextlib.contextmanager
def _at_home(endpoint: str | None) -> Iterator[None]:
    _guarded_session()
    reset = _HOME.set(hub_endpoint(endpoint))
    try:
        yield
    finally:
        _HOME.reset(reset)


def _call_api(what: str, fn: Callable[[], T], *, repo_id: str, repo_type: str, revision: str,
              endpoint: str | None, token: str | None) -> T:  # fmt: skip
    """One metadata call through ``huggingface_hub``, its errors mapped to ours."""
    try:
        with _at_home(endpoint):
            return fn()
    except GatedRepoError:
        raise HubAuthError(_gated_message(repo_id, repo_type, endpoint, token)) from None
    except RevisionNotFoundError as err:
        raise not_served(err, repo_id, repo_type, revision) or _revision_gone(repo_id, repo_type, revision, endpoint) from None
    except RemoteEntryNotFoundError:
        raise DownloadError(f"{what}: no such path in {repo_id}@{revision}; check the file selection") from None
    except RepositoryNotFoundError as err:
        raise not_served(err, repo_id, repo_type, revision) or _repo_gone(repo_id, repo_type, endpoint) from None
    except HfHubHTTPError as err:
        response = getattr(err, "response", None)
        status = response.status_code if response is not None else 0
        headers = response.headers if response is not None else None
        code = headers.get("X-Error-Code") if headers is not None else None
        raise _classify_status(status, headers, what, repo_id, repo_type, revision, endpoint, token, code) from None
    except httpx.TransportError as err:
        if _unresolvable(err):
            raise DownloadError(f"{what}: the host of {hub_endpoint(endpoint)} cannot be resolved (offline, or a wrong HF_ENDPOINT); not retried") from None
        raise Retryable(f"{type(err).__name__}: {err}") from None


def _unresolvable(err: BaseException | None) -> bool:
    """Whether a transport error is a failed host-name lookup (retrying cannot help)."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, socket.gaierror):
            return True
        err = err.__cause__ or err.__context__
    return False


# --------------------------------------------------------------------------- metadata


@dataclasses.dataclass(frozen=True)
class RemoteFile:
    """A file of a repo at a commit, as the Hub describes it.

    ``sha256`` is known for LFS files; ``etag`` is the Hub's ETag for the content (the sha256
    for LFS files, the git blob sha1 otherwise), so every file can be verified.
    """

    path: str
    size: int
    sha256: str | None
    etag: str


def resolve_revision(
    repo_id: str,
    revision: str,
    repo_type: str = "dataset",
    *,
    policy: RetryPolicy = DEFAULT_POLICY,
    endpoint: str | None = None,
    token: str | None = None,
    _counters: _Counters | None = None,
) -> str:
    """The full 40-hex commit sha of ``revision`` (a branch, tag, full or short sha)."""
    what = f"resolving {repo_type} {repo_id}@{revision}"

    def attempt() -> str:
        info = _call_api(
            what,
            lambda: _api(endpoint, token).repo_info(repo_id, revision=revision, repo_type=repo_type),
            repo_id=repo_id, repo_type=repo_type, revision=revision, endpoint=endpoint, token=token,
        )  # fmt: skip
        return str(info.sha or "")

    sha = retrying(policy, what, attempt, _counters)
    if not re.fullmatch(r"[0-9a-f]{40}", sha):
        raise DownloadError(f"{what}: the provider answered no commit sha (got {sha!r})")
    if _HEX_PIN.match(revision) and not sha.startswith(revision):
        raise DownloadError(f"{what}: the provider resolved the pin to {sha}, which does not start with it")
    return sha


def _glob_regexes(patterns: str | Sequence[str] | None) -> list[re.Pattern[str]] | None:
    if patterns is None:
        return None
    items = [patterns] if isinstance(patterns, str) else list(patterns)
    out = []
    for pattern in items:
        pattern = pattern.lstrip("/")
        if pattern.endswith("/"):
            pattern += "**"
        out.append(re.compile(glob_translate(pattern)))
    return out


def select_paths(paths: Iterable[str], allow: str | Sequence[str] | None = None,
                 exclude: str | Sequence[str] | None = None) -> list[str]:  # fmt: skip
    """Paths matching any ``allow`` glob and no ``exclude`` glob.

    Globs are relative to the repo root with fsspec/``HfFileSystem`` semantics: ``*`` stays
    within a folder, ``**`` spans any number of folders (zero included), a trailing ``/``
    selects a whole folder. ``allow=None`` selects everything.
    """
    allowed, excluded = _glob_regexes(allow), _glob_regexes(exclude) or []
    return [
        p for p in paths
        if (allowed is None or any(r.match(p) for r in allowed)) and not any(r.match(p) for r in excluded)
    ]  # fmt: skip


def hub_file(
    repo_id: str,
    filename: str,
    revision: str | None,
    *,
    repo_type: str = "model",
    policy: RetryPolicy = DEFAULT_POLICY,
    endpoint: str | None = None,
    token: str | None = None,
) -> str:
    """The local path of one file of a repo at a full commit or the main branch (the Hub client's cache), under the retry caps."""
    what = f"fetching {filename} of {repo_type} {repo_id}@{(revision or 'main')[:12]}"

    def fetch() -> str:
        try:
            return hf_hub_download(repo_id, filename, revision=revision, repo_type=repo_type,
                                   endpoint=hub_endpoint(endpoint), token=_token(token))  # fmt: skip
        except LocalEntryNotFoundError as err:  # the client's wrapper of a failed request: its cause says which
            if isinstance(err.__cause__, (HfHubHTTPError, httpx.TransportError)):
                raise err.__cause__ from None
            raise

    def attempt() -> str:
        return _call_api(what, fetch, repo_id=repo_id, repo_type=repo_type, revision=revision or "main", endpoint=endpoint, token=token)

    return retrying(policy, what, attempt)


def list_files(
    repo_id: str,
    sha: str,
    allow: str | Sequence[str] | None = None,
    exclude: str | Sequence[str] | None = None,
    subdir: str | None = None,
    *,
    repo_type: str = "dataset",
    policy: RetryPolicy = DEFAULT_POLICY,
    endpoint: str | None = None,
    token: str | None = None,
    _counters: _Counters | None = None,
) -> list[RemoteFile]:
    """The files of ``repo_id`` at ``sha`` (under ``subdir`` if given) selected by the globs, by path."""
    what = f"listing {repo_type} {repo_id}@{sha[:12]}" + (f"/{subdir}" if subdir else "")

    def attempt() -> list[Any]:
        return _call_api(
            what,
            lambda: list(
                _api(endpoint, token).list_repo_tree(
                    repo_id, path_in_repo=subdir.strip("/") if subdir else None, recursive=True,
                    revision=sha, repo_type=repo_type,
                )
            ),
            repo_id=repo_id, repo_type=repo_type, revision=sha, endpoint=endpoint, token=token,
        )  # fmt: skip

    entries = [e for e in retrying(policy, what, attempt, _counters) if hasattr(e, "blob_id")]
    by_path = {e.path: e for e in entries}
    files = []
    for path in sorted(select_paths(by_path, allow, exclude)):
        trust.safe_relpath(path, what)
        entry = by_path[path]
        sha256 = entry.lfs.sha256 if entry.lfs is not None else None
        files.append(RemoteFile(path=path, size=int(entry.size), sha256=sha256, etag=sha256 or entry.blob_id))
    return files


@dataclasses.dataclass(frozen=True)
class PinStatus:
    """What the provider says about a pin today (for drift checks)."""

    served: bool
    resolved: str | None
    branch: str
    branch_head: str | None

    @property
    def branch_moved(self) -> bool:
        return self.resolved is not None and self.branch_head is not None and self.branch_head != self.resolved


def check_pin(
    repo_id: str,
    revision: str,
    branch: str = "main",
    *,
    repo_type: str = "dataset",
    policy: RetryPolicy = DEFAULT_POLICY,
    endpoint: str | None = None,
    token: str | None = None,
) -> PinStatus:
    """Is ``revision`` still served, and where is ``branch`` now? Never raises for a gone pin."""
    kwargs = dict(repo_type=repo_type, policy=policy, endpoint=endpoint, token=token)
    try:
        resolved: str | None = resolve_revision(repo_id, revision, **kwargs)
    except RevisionGoneError:
        resolved = None
    try:
        head: str | None = resolve_revision(repo_id, branch, **kwargs)
    except RevisionGoneError:
        head = None
    return PinStatus(served=resolved is not None, resolved=resolved, branch=branch, branch_head=head)


# --------------------------------------------------------------------------- one file


def _git_blob_hasher(size: int) -> Any:
    hasher = hashlib.sha1()
    hasher.update(b"blob %d\0" % size)
    return hasher


def _fetch_file(
    repo_id: str,
    repo_type: str,
    sha: str,
    remote: RemoteFile,
    local_path: str,
    *,
    policy: RetryPolicy,
    endpoint: str | None,
    token: str | None,
    counters: _Counters,
) -> str:
    """Download ``remote`` to ``local_path`` verified; returns its sha256.

    A dropped connection resumes with a ``Range`` request; the hashes run over the bytes as
    they arrive, so a resumed file is verified as a whole.
    """
    url = hf_hub_url(repo_id, remote.path, repo_type=repo_type, revision=sha, endpoint=hub_endpoint(endpoint))
    what = f"{repo_type} {repo_id}@{sha[:12]}: {remote.path}"
    state: dict[str, Any] = {}

    def restart() -> None:
        state.update(written=0, sha256=hashlib.sha256(), git=_git_blob_hasher(remote.size))
        with open(local_path, "wb"):
            pass

    restart()

    def attempt() -> str:
        headers = build_hf_headers(token=_token(token))
        headers["Accept-Encoding"] = "identity"
        if state["written"]:
            headers["Range"] = f"bytes={state['written']}-"
        try:
            with _at_home(endpoint), _guarded_session().stream(
                "GET", url, headers=headers, timeout=policy.timeout_s, follow_redirects=True
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    raise _classify_status(
                        response.status_code, response.headers, what, repo_id, repo_type, sha, endpoint, token,
                        response.headers.get("X-Error-Code"),
                    )  # fmt: skip
                served = response.headers.get("X-Repo-Commit")
                if served and served != sha:
                    raise DownloadError(f"{what}: the provider served commit {served} instead of {sha}")
                if state["written"] and response.status_code != 206:
                    restart()  # the server ignored our Range: start over
                with open(local_path, "ab") as out:
                    for chunk in response.iter_bytes():  # as received: a cut keeps what arrived
                        if state["written"] + len(chunk) > remote.size:  # more than listed: stop reading now
                            restart()
                            raise Retryable(f"body exceeds the listed size of {remote.size} bytes", corrupt=True)
                        out.write(chunk)
                        state["sha256"].update(chunk)
                        state["git"].update(chunk)
                        state["written"] += len(chunk)
                        counters.add(bytes_fetched=len(chunk))
        except httpx.TransportError as err:
            raise Retryable(f"connection dropped after {state['written']} of {remote.size} bytes ({type(err).__name__})") from None
        written = state["written"]
        if written < remote.size:
            raise Retryable(f"short read: {written} of {remote.size} bytes")
        sha256 = state["sha256"].hexdigest()
        expected = remote.sha256 or remote.etag
        actual = sha256 if remote.sha256 else state["git"].hexdigest()
        if written != remote.size or actual != expected:
            restart()
            kind = "sha256" if remote.sha256 else "git blob sha1"
            raise Retryable(f"{kind} or size mismatch ({written} bytes, expected {remote.size})", corrupt=True)
        return sha256

    return retrying(policy, f"downloading {what}", attempt, counters)


# --------------------------------------------------------------------------- snapshots


def _marker_uri(dest_uri: str, path: str) -> str:
    return storage.join(dest_uri, PARTIAL_DIR, quote(path, safe="") + ".json")


def _existing_sizes(dest_uri: str) -> dict[str, int]:
    """Relative path -> size of every file already under ``dest_uri`` (one listing call)."""
    fs, root = storage.filesystem(dest_uri)
    if not fs.exists(root):
        return {}
    root = root.rstrip("/")
    out = {}
    for name, info in fs.find(root, detail=True).items():
        rel = name[len(root) :].lstrip("/") if name.startswith(root) else name
        out[rel] = int(info.get("size") or 0)
    return out


def _finished_records(dest_uri: str, manifest: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Files a previous run finished: per-file markers, plus the files of an older manifest."""
    records: dict[str, dict[str, Any]] = {}
    if manifest:
        for record in manifest.get("files", []):
            records[record["path"]] = record
    for uri in storage.listdir(storage.join(dest_uri, PARTIAL_DIR)):
        if uri.endswith(".json"):
            try:
                record = storage.read_json(uri)
            except (ValueError, OSError):
                continue  # a torn marker: the file is simply fetched again
            records[record["path"]] = record
    return records


def _selection(allow: Any, exclude: Any, subdir: str | None) -> dict[str, Any]:
    def norm(value: Any) -> list[str] | None:
        if value is None:
            return None
        return sorted([value] if isinstance(value, str) else value)

    return {"allow": norm(allow), "exclude": norm(exclude) or [], "subdir": subdir.strip("/") if subdir else None}


def _reusable(manifest: dict[str, Any] | None, repo_id: str, repo_type: str, revision: str,
              selection: dict[str, Any]) -> bool:  # fmt: skip
    """A complete copy answers the same request when repo, selection and commit agree.

    The commit is known without asking the provider when ``revision`` is the resolved sha or
    the same hex pin as before; a branch name always needs resolving.
    """
    if not manifest or manifest.get("kind") != MANIFEST_KIND:
        return False
    if (manifest.get("repo_id"), manifest.get("repo_type")) != (repo_id, repo_type):
        return False
    if manifest.get("selection") != selection:
        return False
    pinned = manifest.get("requested_revision") == revision and bool(_HEX_PIN.match(revision))
    return revision == manifest.get("resolved_revision") or pinned


def _reused_copy(manifest: dict[str, Any]) -> dict[str, Any]:
    counters = dict(manifest.get("counters", {}))
    counters.update(fetched=0, reused=len(manifest.get("files", [])), retries=0, bytes_fetched=0)
    return manifest | {"counters": counters, "reused": True}


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def download_snapshot(
    repo_id: str,
    revision: str,
    allow: str | Sequence[str] | None,
    exclude: str | Sequence[str] | None,
    dest_uri: str,
    policy: RetryPolicy = DEFAULT_POLICY,
    on_progress: Callable[[str], None] | None = None,
    *,
    subdir: str | None = None,
    repo_type: str = "dataset",
    endpoint: str | None = None,
    token: str | None = None,
    workers: int = 4,
    staging_dir: str | None = None,
) -> dict[str, Any]:
    """Copy the selected files of ``repo_id@revision`` to ``dest_uri`` and return its manifest.

    ``dest_uri`` is any fsspec URI, chosen by the caller (``Layout.raw(key, sha)``), so sources
    asking for the same repo, revision and files share one copy. Files keep their repo paths
    under it. Each file is staged in a local temp dir, verified, then stored atomically; a
    marker under ``_partial/`` records it, so a rerun after a crash fetches only the rest.
    The caller records the copy (``stages.commit_copy`` writes ``_manifest.json`` last); once
    recorded, calling again with the same arguments returns it (``"reused": True``) without
    fetching anything. ``on_progress`` gets one line per file.

    Raises ``HubAuthError`` (gated, 401/403) and ``RevisionGoneError`` at once,
    ``IntegrityError`` when a file stays corrupt, ``DownloadError`` when retries run out.
    """
    selection = _selection(allow, exclude, subdir)
    existing_manifest = storage.read_manifest(dest_uri)
    if _reusable(existing_manifest, repo_id, repo_type, revision, selection):
        return _reused_copy(existing_manifest)  # type: ignore[arg-type]

    counters = _Counters()
    call = dict(repo_type=repo_type, policy=policy, endpoint=endpoint, token=token, _counters=counters)
    sha = resolve_revision(repo_id, revision, **call)  # type: ignore[arg-type]
    if existing_manifest and _reusable(existing_manifest, repo_id, repo_type, sha, selection):
        return _reused_copy(existing_manifest) | {"requested_revision": revision}
    files = list_files(repo_id, sha, allow, exclude, subdir, **call)  # type: ignore[arg-type]
    if not files:
        raise DownloadError(
            f"{repo_type} {repo_id}@{sha[:12]}: no file matches allow={selection['allow']} "
            f"exclude={selection['exclude']} subdir={selection['subdir']}; fix the file selection in the catalog"
        )

    same_commit = existing_manifest if existing_manifest and existing_manifest.get("resolved_revision") == sha else None
    finished = _finished_records(dest_uri, same_commit)
    present = _existing_sizes(dest_uri) if finished else {}
    done: dict[str, dict[str, Any]] = {}
    todo: list[RemoteFile] = []
    for remote in files:
        record = finished.get(remote.path)
        if (
            record is not None
            and record.get("size") == remote.size
            and record.get("etag") == remote.etag
            and (remote.sha256 is None or record.get("sha256") == remote.sha256)
            and present.get(remote.path) == remote.size
        ):
            done[remote.path] = record
        else:
            todo.append(remote)
    counters.add(reused=len(done))

    total_bytes = sum(f.size for f in files)
    progress_lock = threading.Lock()
    progress = {"files": len(done), "bytes": sum(r["size"] for r in done.values())}

    def report(remote: RemoteFile) -> None:
        with progress_lock:
            progress["files"] += 1
            progress["bytes"] += remote.size
            line = (
                f"{repo_id}@{sha[:7]}: {progress['files']}/{len(files)} files, "
                f"{_human_bytes(progress['bytes'])}/{_human_bytes(total_bytes)}: {remote.path}"
            )
        if on_progress is not None:
            on_progress(line)

    if done and on_progress is not None:
        on_progress(f"{repo_id}@{sha[:7]}: {len(done)}/{len(files)} files already copied, fetching {len(todo)}")

    stop = threading.Event()
    errors: list[Exception] = []

    def fetch(index: int, remote: RemoteFile) -> None:
        if stop.is_set():
            return
        local = os.path.join(staging, f"{index:06d}.part")
        try:
            sha256 = _fetch_file(
                repo_id, repo_type, sha, remote, local, policy=policy, endpoint=endpoint, token=token, counters=counters
            )
            storage.move_file(local, trust.child_uri(dest_uri, remote.path, f"{repo_type} {repo_id}@{sha[:12]}"))
            record = {"path": remote.path, "size": remote.size, "sha256": sha256, "etag": remote.etag}
            storage.write_json(_marker_uri(dest_uri, remote.path), record)
            with progress_lock:
                done[remote.path] = record
            counters.add(fetched=1)
            report(remote)
        except (HubAuthError, RevisionGoneError) as err:
            stop.set()  # nothing else can succeed: stop early
            errors.append(err)
        except Exception as err:  # keep copying the other files; the rerun resumes
            errors.append(err)
        finally:
            if os.path.exists(local):
                os.remove(local)

    with trust.staging_area(staging_dir, "marin-hf-") as staging:
        if workers <= 1 or len(todo) <= 1:
            for i, remote in enumerate(todo):
                fetch(i, remote)
        else:
            with concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hf-download") as pool:
                list(pool.map(lambda item: fetch(*item), enumerate(todo)))

    if errors:
        fatal = [e for e in errors if isinstance(e, (HubAuthError, RevisionGoneError))]
        first = fatal[0] if fatal else errors[0]
        if fatal or not isinstance(first, (HubError, DownloadError)):
            raise first
        raise type(first)(
            f"{first} [{len(errors)} of {len(files)} files failed; {len(done)} are stored under {dest_uri} "
            f"and will not be fetched again]"
        ) from first

    manifest = {
        "kind": MANIFEST_KIND,
        "repo_id": repo_id,
        "repo_type": repo_type,
        "endpoint": hub_endpoint(endpoint),
        "requested_revision": revision,
        "resolved_revision": sha,
        "selection": selection,
        "files": [
            {k: done[f.path][k] for k in ("path", "size", "sha256", "etag")} for f in files
        ],
        "counters": {
            "files": len(files),
            "bytes": total_bytes,
            "fetched": counters.fetched,
            "reused": counters.reused,
            "retries": counters.retries,
            "bytes_fetched": counters.bytes_fetched,
        },
        "reused": False,
    }
    return manifest  # recorded (manifest written last, markers dropped) by stages.commit_copy
