"""Plain HTTP(S) for the web and API providers, under the same rules as the Hub client.

* Retries: the one retry loop of ``marin_assets.core.runtime.retry``, shared with the Hub client.
  408/425/429/5xx, dropped connections and short reads are retried with exponential backoff
  and jitter, waiting at least the server's ``Retry-After`` (at most 15 minutes); a cut body
  resumes with a ``Range`` request and is hashed as a whole; a body longer than promised is
  cut off at once.
* No retries where retrying cannot help: 401/403 (``ProviderAccessError``) and 404/410
  (``ProviderGoneError``) fail at once with a message that says what to do.
* Verification: the body must match ``Content-Length``, and the size and sha256 a pin gives;
  a caller's ``validate`` hook (zstd/zip integrity) can reject a body too. A bad body is
  fetched again, at most ``policy.integrity_attempts`` times, then ``IntegrityError``.
* Mirrors: the ``MARIN_WEB_MIRROR`` setting (passed in as ``mirrors``, parsed by
  ``parse_mirrors``) rewrites provider URLs before they are fetched, so tests, air-gapped
  sites and mirrors serve the same recipes. Its value is a list of
  ``<origin prefix>=<replacement prefix>`` pairs separated by ``;`` or newlines, e.g.
  ``https://data.hplt-project.org=http://mirror.internal/hplt``; the longest matching
  prefix wins; URLs that match nothing are fetched as they are. Links found inside
  provider answers (manifests, presigned listings) go through the same mapping.
* Secrets: query strings (presigned signatures) and user-info never appear in logs, errors
  or manifests (``display_url``). Credentials go only to their own origin
  (``trust.credentials_for``); redirects to another host drop ``Authorization``.

Tests keep the retry rules but not the production waits: the ``MARIN_RETRY_WAIT_S`` setting
gives a policy whose every wait is that many seconds (``policy_with_wait``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, BinaryIO
from urllib.parse import urlsplit, urlunsplit

import requests

from marin_assets.errors import IntegrityFailure, not_served_here
from marin_assets.core.runtime.retry import (  # noqa: F401 - the one retry loop, shared with the Hub client
    DEFAULT_POLICY,
    RETRY_STATUS,
    Counters,
    DownloadError,
    IntegrityError,
    Retryable,
    RetryPolicy,
    retry_for_status,
    retrying,
)

log = logging.getLogger(__name__)

MIRROR_ENV = "MARIN_WEB_MIRROR"  # the setting named in messages
USER_AGENT = "marin-assets/0.1 (+data pipeline; plain HTTP provider client)"
CHUNK_BYTES = 1 << 20


class ProviderAccessError(DownloadError):
    """401/403: the provider refuses the request (expired link, missing credentials). Never retried."""


class ProviderGoneError(DownloadError):
    """404/410: the pinned file is no longer served at that address. Never retried."""


class ProviderUnreachable(DownloadError):
    """The provider's host name does not resolve: no network, or a mirror is needed. Never retried."""


class CorruptBody(IntegrityFailure):
    """Raised by a ``validate`` hook: the bytes arrived but are not what the provider promised."""


_Retry = Retryable
FetchCounters = Counters


# --------------------------------------------------------------------------- URLs


def parse_mirrors(value: str) -> tuple[tuple[str, str], ...]:
    """The pairs of a ``MARIN_WEB_MIRROR`` value, longest origin first."""
    pairs = []
    for item in value.replace("\n", ";").split(";"):
        item = item.strip()
        if not item:
            continue
        origin, sep, replacement = item.partition("=")
        if not sep or not origin.strip() or not replacement.strip():
            raise ValueError(f"{MIRROR_ENV}: entry {item!r} is not '<origin prefix>=<replacement prefix>'")
        pairs.append((origin.strip(), replacement.strip()))
    return tuple(sorted(pairs, key=lambda p: len(p[0]), reverse=True))


def mirror_url(url: str, mirrors: Sequence[tuple[str, str]] = ()) -> str:
    """``url`` as this site fetches it (rewritten by the longest matching mirror prefix)."""
    for origin, replacement in sorted(mirrors, key=lambda p: len(p[0]), reverse=True):
        if url.startswith(origin):
            return replacement + url[len(origin) :]
    return url


def display_url(url: str) -> str:
    """``url`` without query string, fragment or user-info: safe for logs, errors and manifests."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def policy_with_wait(wait_s: float | None, default: RetryPolicy = DEFAULT_POLICY) -> RetryPolicy:
    """``default``, or with every wait set to ``wait_s`` seconds when given (tests, mirrors)."""
    if wait_s is None:
        return default
    wait = max(0.0, float(wait_s))
    return dataclasses.replace(default, base_wait_s=wait, min_wait_s=wait, max_jitter_s=wait, rate_limit_margin_s=wait)


def _unresolvable(err: BaseException) -> bool:
    """Whether a connection error is a failed host-name lookup (retrying cannot help)."""
    seen: set[int] = set()
    stack: list[Any] = [err]
    while stack:
        current = stack.pop()
        if not isinstance(current, BaseException) or id(current) in seen:
            continue
        seen.add(id(current))
        if type(current).__name__ == "NameResolutionError" or isinstance(current, socket.gaierror):
            return True
        stack.extend([getattr(current, "reason", None), current.__cause__, current.__context__, *getattr(current, "args", ())[:1]])
    return False


def _status_error(status: int, headers: Mapping[str, str], what: str, url: str, hint: str) -> Exception:
    shown = display_url(url)
    if status in (401, 403):
        return ProviderAccessError(
            f"{what}: {shown} refused access (HTTP {status}); {hint or 'check the credentials or the link'}"
        )
    if status == 404 and (here := not_served_here(headers, f"{what}: {shown}")) is not None:
        return here
    if status in (404, 410):
        return ProviderGoneError(
            f"{what}: {shown} is not served (HTTP {status}); the provider moved or removed it: point "
            f"{MIRROR_ENV} at a copy, or update the pin in the catalog"
        )
    if (retry := retry_for_status(status, headers)) is not None:
        return retry
    return DownloadError(f"{what}: unexpected HTTP {status} from {shown}")


_local = threading.local()


def session() -> requests.Session:
    """One connection pool per thread (requests sessions are not shared across threads)."""
    current = getattr(_local, "session", None)
    if current is None:
        current = requests.Session()
        current.headers["User-Agent"] = USER_AGENT
        _local.session = current
    return current


# --------------------------------------------------------------------------- fetching


@dataclasses.dataclass(frozen=True)
class Fetched:
    """What arrived: the final size and sha256 of the whole body."""

    size: int
    sha256: str


def fetch_into(
    url: str,
    out: BinaryIO,
    *,
    what: str,
    policy: RetryPolicy | None = None,
    headers: Mapping[str, str] | None = None,
    expected_size: int | None = None,
    expected_sha256: str | None = None,
    validate: Callable[[BinaryIO], None] | None = None,
    access_hint: str = "",
    counters: FetchCounters | None = None,
    mirror: bool = True,
    mirrors: Sequence[tuple[str, str]] = (),
    headers_out: dict[str, str] | None = None,
) -> Fetched:
    """Stream ``url`` (through the mirror map) into ``out`` (a seekable ``w+b`` file), verified.

    A cut connection resumes where it stopped; a server that ignores ``Range`` starts over.
    ``validate(out)`` runs on the finished body and raises ``CorruptBody`` to reject it.
    ``headers_out`` receives the headers of the answer (pagination links).
    """
    policy = policy or DEFAULT_POLICY
    target = mirror_url(url, mirrors) if mirror else url
    state: dict[str, Any] = {}

    def restart() -> None:
        out.seek(0)
        out.truncate()
        state.update(written=0, sha256=hashlib.sha256(), total=None)

    restart()

    def attempt() -> Fetched:
        request_headers = dict(headers or {})
        request_headers["Accept-Encoding"] = "identity"
        if state["written"]:
            request_headers["Range"] = f"bytes={state['written']}-"
        if counters is not None:
            counters.add(requests=1)
        try:
            with session().get(target, headers=request_headers, stream=True, timeout=(30, policy.timeout_s)) as response:
                if response.status_code == 416 and state["written"]:
                    restart()
                    raise _Retry("the server refused to resume (HTTP 416)")
                if response.status_code >= 400:
                    raise _status_error(response.status_code, response.headers, what, target, access_hint)
                if state["written"] and response.status_code != 206:
                    restart()  # the server ignored our Range: start over
                if headers_out is not None:
                    headers_out.clear()
                    headers_out.update(response.headers)
                length = response.headers.get("Content-Length")
                if length is not None and length.isdigit():
                    state["total"] = state["written"] + int(length)
                limit = expected_size if expected_size is not None else state["total"]
                for chunk in response.raw.stream(CHUNK_BYTES, decode_content=False):
                    if limit is not None and state["written"] + len(chunk) > limit:  # longer than promised: stop now
                        restart()
                        raise _Retry(f"body exceeds its promised size of {limit} bytes", corrupt=True)
                    out.write(chunk)
                    state["sha256"].update(chunk)
                    state["written"] += len(chunk)
                    if counters is not None:
                        counters.add(bytes_fetched=len(chunk))
        except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError) as err:
            if _unresolvable(err):
                host = urlsplit(target).hostname
                fix = (f"point {MIRROR_ENV} at a reachable copy (e.g. {MIRROR_ENV}='{urlsplit(url).scheme}://{urlsplit(url).hostname}=<mirror url>')"
                       if mirror else "set HF_ENDPOINT to a reachable Hub mirror")  # fmt: skip
                raise ProviderUnreachable(f"{what}: cannot resolve host {host!r}: this machine cannot reach the provider; run where it can, or {fix}") from None
            raise _Retry(f"connection dropped after {state['written']} bytes ({type(err).__name__})") from None
        except Exception as err:  # urllib3 protocol errors surface under several names
            if isinstance(err, (_Retry, DownloadError)):
                raise
            if type(err).__module__.startswith(("urllib3", "http.client")):
                raise _Retry(f"connection dropped after {state['written']} bytes ({type(err).__name__})") from None
            if isinstance(err, requests.RequestException):  # its message may hold a presigned query: drop it
                raise DownloadError(f"{what}: {type(err).__name__} requesting {display_url(target)}") from None
            raise
        written = state["written"]
        if state["total"] is not None and written < state["total"]:
            raise _Retry(f"short read: {written} of {state['total']} bytes")
        digest = state["sha256"].hexdigest()
        problem = None
        if expected_size is not None and written != expected_size:
            problem = f"size mismatch ({written} bytes, the pin says {expected_size})"
        elif expected_sha256 and digest != expected_sha256:
            problem = f"sha256 mismatch (got {digest}, the pin says {expected_sha256})"
        elif validate is not None:
            out.flush()
            out.seek(0)
            try:
                validate(out)
            except CorruptBody as err:
                problem = f"corrupt body ({err})"
            out.seek(0, os.SEEK_END)
        if problem:
            restart()
            raise _Retry(problem, corrupt=True)
        return Fetched(size=written, sha256=digest)

    return retrying(policy, f"{what}: {display_url(target)}", attempt, counters)


def fetch_bytes(url: str, **kwargs: Any) -> tuple[bytes, Fetched]:
    """A small body (listing, manifest) in memory, under the same rules as ``fetch_into``."""
    import io  # noqa: PLC0415

    buffer = io.BytesIO()
    fetched = fetch_into(url, buffer, **kwargs)
    return buffer.getvalue(), fetched


def fetch_json(url: str, **kwargs: Any) -> Any:
    import json  # noqa: PLC0415

    data, _ = fetch_bytes(url, **kwargs)
    try:
        return json.loads(data)
    except ValueError:
        raise DownloadError(f"{kwargs.get('what', 'request')}: {display_url(mirror_url(url, kwargs.get('mirrors', ())))} did not answer JSON") from None
