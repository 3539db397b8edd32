"""One retry loop for every provider request (the Hub client and plain HTTP alike).

A request is an ``attempt`` callable; it raises ``Retryable`` for a transient failure (a
status in ``RETRY_STATUS``, a dropped connection, a short read, a corrupted body) and any
other error to stop at once. ``retrying`` waits per ``RetryPolicy`` between attempts, at
least the server's rate-limit reset after a 429 but never longer than ``max_wait_s``, and
gives up with ``RetriesExhausted`` (or ``IntegrityError`` when a body stays corrupt).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from marin_assets.errors import IntegrityFailure, ProviderRefused

log = logging.getLogger(__name__)

T = TypeVar("T")

# Statuses worth retrying, for the Hub and plain HTTP alike.
RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
_RATELIMIT = re.compile(r'"(?P<kind>\w+)"\s*;\s*r\s*=\s*(?P<r>\d+)\s*;\s*t\s*=\s*(?P<t>\d+)')


class DownloadError(ProviderRefused):
    """Retries ran out, or the provider answered something unusable."""


class IntegrityError(DownloadError, IntegrityFailure):
    """A body does not match its promised size or hash, even after fetching it again."""


class Retryable(Exception):
    """A transient failure: wait (at least ``reset_s``) and try again."""

    def __init__(self, reason: str, reset_s: float | None = None, corrupt: bool = False):
        super().__init__(reason)
        self.reason, self.reset_s, self.corrupt = reason, reset_s, corrupt


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How long to keep trying one request, and how long to wait between tries.

    The wait before retry ``n`` (0-based) is ``max(min_wait_s, base_wait_s * 2**n)`` plus a
    random jitter of up to ``min(jitter_fraction * that, max_jitter_s)``, capped at
    ``max_wait_s``; after a 429 it is at least the server's reset time plus
    ``rate_limit_margin_s``, but never more than ``max_reset_wait_s`` (a server announcing a
    reset in a year is asked again after 15 minutes, not after a year). Corrupted bodies are fetched
    again at most ``integrity_attempts`` times in all. ``sleep`` is how waits happen (tests
    pass a recorder).
    """

    attempts: int = 20
    base_wait_s: float = 5.0
    min_wait_s: float = 5.0
    max_wait_s: float = 15 * 60.0
    jitter_fraction: float = 0.25
    max_jitter_s: float = 30.0
    rate_limit_margin_s: float = 10.0
    max_reset_wait_s: float = 15 * 60.0
    integrity_attempts: int = 3
    timeout_s: float = 60.0
    sleep: Callable[[float], None] = dataclasses.field(default=time.sleep, compare=False, repr=False)

    def wait_s(self, retry: int, rate_limit_reset_s: float | None = None, rng: random.Random | None = None) -> float:
        base = min(max(self.min_wait_s, self.base_wait_s * 2.0 ** min(retry, 60)), self.max_wait_s)
        jitter = (rng or random).uniform(0.0, min(self.jitter_fraction * base, self.max_jitter_s))
        wait = min(base + jitter, self.max_wait_s)
        if rate_limit_reset_s is not None:
            wait = max(wait, min(rate_limit_reset_s + self.rate_limit_margin_s, self.max_reset_wait_s))
        return wait


DEFAULT_POLICY = RetryPolicy()


@dataclasses.dataclass
class Counters:
    """Totals over many requests (thread-safe): what a raw manifest reports."""

    retries: int = 0
    requests: int = 0
    fetched: int = 0
    reused: int = 0
    bytes_fetched: int = 0
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **deltas: int) -> None:
        with self.lock:
            for key, value in deltas.items():
                setattr(self, key, getattr(self, key) + value)

    def as_dict(self) -> dict[str, int]:
        return {"retries": self.retries, "requests": self.requests, "bytes_fetched": self.bytes_fetched}


def rate_limit_reset(headers: Mapping[str, str] | Any) -> float | None:
    """Seconds until the server's rate-limit window resets (``RateLimit`` or ``Retry-After``)."""
    if headers is None:
        return None
    value = headers.get("RateLimit")
    if value and (match := _RATELIMIT.search(value)) and int(match.group("r")) == 0:
        return float(match.group("t"))
    retry_after = (headers.get("Retry-After") or "").strip()
    return float(retry_after) if retry_after.replace(".", "", 1).isdigit() else None


def retry_for_status(status: int, headers: Any) -> Retryable | None:
    """``Retryable`` for a status worth retrying (with the 429 reset), else None."""
    if status in RETRY_STATUS:
        return Retryable(f"HTTP {status}", rate_limit_reset(headers) if status in (429, 503) else None)
    return None


def retrying(policy: RetryPolicy, what: str, attempt: Callable[[], T], counters: Any = None) -> T:
    """Run ``attempt`` until it succeeds, waiting per ``policy`` after each ``Retryable``."""
    corrupt = 0
    last = "no attempt made"
    for n in range(max(1, policy.attempts)):
        try:
            return attempt()
        except Retryable as err:
            last = err.reason
            if err.corrupt:
                corrupt += 1
                if corrupt >= policy.integrity_attempts:
                    raise IntegrityError(
                        f"{what}: {err.reason} on {corrupt} fetches; the provider serves bytes that do not "
                        f"match what it promised: report it upstream or pin another revision"
                    ) from None
            if n + 1 >= policy.attempts:
                break
            wait = policy.wait_s(n, err.reset_s)
            if counters is not None:
                counters.add(retries=1)
            log.warning("%s: %s; retry %d/%d in %.1fs", what, err.reason, n + 1, policy.attempts - 1, wait)
            policy.sleep(wait)
    raise DownloadError(
        f"{what}: gave up after {policy.attempts} attempts (last error: {last}); "
        f"rerun later: files already copied are kept and not fetched again"
    )
