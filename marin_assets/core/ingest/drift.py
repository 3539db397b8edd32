"""Pin drift: what a provider says today about each pinned revision (no dagster here).

For a Hugging Face dataset pin the questions are: is the pinned revision still served, has the
moving branch advanced past it, is the repository now gated (when the catalog does not say
so), or is it gone. Other pins (buckets, web, API, pre-staged) are asked by
``core.ingest.providers.pins.check_pin``. The answer never changes a pin; it is reported, and a
person decides.

Endpoint, token, mirrors and staging come in as one ``ProviderAccess`` (the settings); a
missing token or an unreachable provider makes the answer ``unknown``, never an
exception: the drift sensor must keep running on a laptop without network.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from huggingface_hub import HfApi
from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

from marin_assets.core.ingest import hub
from marin_assets.core.ingest.providers import ProviderAccess

OK = "ok"
BRANCH_MOVED = "branch-moved"
GATED = "gated"
REVISION_GONE = "revision-gone"
REPO_GONE = "repo-gone"
UNKNOWN = "unknown"
NOT_CHECKED = "not-checked"

# Statuses that mean the pin can no longer be rebuilt as it is.
BROKEN = frozenset({REVISION_GONE, REPO_GONE})
# Statuses that ask for attention but do not stop a rebuild.
ATTENTION = frozenset({BRANCH_MOVED, GATED})

# Drift checks ask little of the provider: two tries, short waits, short timeouts. A tick
# that cannot reach it reports ``unknown`` and moves on.
QUICK_POLICY = hub.RetryPolicy(attempts=2, base_wait_s=0.5, min_wait_s=0.5, max_wait_s=2.0, max_jitter_s=0.2, rate_limit_margin_s=1.0, timeout_s=10.0)


@dataclasses.dataclass(frozen=True)
class PinReport:
    """One source's pin as the provider sees it now."""

    source: str
    pin: str
    status: str
    detail: str
    resolved: str | None = None
    branch: str = "main"
    branch_head: str | None = None
    gated: bool | None = None

    @property
    def network_failure(self) -> bool:
        return self.status == UNKNOWN and self.detail.startswith("provider unreachable")

    def as_record(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _has_token(token: str | None) -> bool:
    return bool(token)


def _repo_gating(repo_id: str, repo_type: str, endpoint: str | None, token: str | None, timeout_s: float) -> bool:
    """Whether the repo is gated (its metadata is public even when the files are not)."""
    api = HfApi(endpoint=hub.hub_endpoint(endpoint), token=token or None)
    info = api.repo_info(repo_id, repo_type=repo_type, timeout=timeout_s)
    return bool(getattr(info, "gated", False))


def is_hub_dataset(source: Any) -> bool:
    return source.provider.kind == "hf" and source.provider.repo_type == "dataset"


def check_source_pin(source: Any, *, layout: Any = None, branch: str = "main", access: ProviderAccess = ProviderAccess()) -> PinReport:
    """Ask the provider about ``source``'s pin. Never raises for provider or network trouble.

    ``layout`` (the storage layout) is needed for pins other than Hub datasets (pre-staged
    copies live under it); without it they are ``not-checked``. ``access`` says how to reach
    providers; its retry policy is replaced by the quick one of drift checks.
    """
    access = dataclasses.replace(access, policy=QUICK_POLICY)
    policy, endpoint, token = access.policy, access.hf_endpoint, access.hf_token
    p = source.provider
    report = dict(source=source.name, pin=p.pin, branch=branch)
    if not is_hub_dataset(source):
        if layout is None:
            return PinReport(**report, status=NOT_CHECKED, detail=f"no storage layout given to check a {p.kind} pin")
        from marin_assets.core.ingest.providers import pins  # noqa: PLC0415

        status, detail = pins.check_pin(source, layout, access=access)
        return PinReport(**report, status=status, detail=detail)
    try:
        gated = _repo_gating(p.repo_id, p.repo_type, endpoint, token, policy.timeout_s)
        status = hub.check_pin(p.repo_id, p.revision, branch, repo_type=p.repo_type, policy=policy, endpoint=endpoint, token=token)
    except hub.NotServedHere as err:  # the demo Hub serves only the demo's sources
        return PinReport(**report, status=UNKNOWN, detail=str(err))
    except (GatedRepoError, hub.HubAuthError):
        return PinReport(**report, status=GATED, gated=True, detail=f"{p.repo_id} refuses access ({'token refused' if _has_token(token) else 'no HF_TOKEN'}): accept its terms and set HF_TOKEN")
    except RepositoryNotFoundError as err:  # after GatedRepoError, its subclass
        if (here := hub.not_served(err, p.repo_id, p.repo_type, p.revision)) is not None:
            return PinReport(**report, status=UNKNOWN, detail=str(here))
        if not _has_token(token):
            return PinReport(**report, status=UNKNOWN, detail=f"{p.repo_id} not found without HF_TOKEN: it is gone or private; set HF_TOKEN to tell")
        return PinReport(**report, status=REPO_GONE, detail=f"{p.repo_id} no longer exists at {hub.hub_endpoint(endpoint)}: pick another provider or remove the entry")
    except hub.RepoNotFoundError as err:  # raised by check_pin's resolution
        return PinReport(**report, status=REPO_GONE, detail=str(err))
    except (hub.DownloadError, HfHubHTTPError, OSError) as err:
        return PinReport(**report, status=UNKNOWN, detail=f"provider unreachable or failing: {type(err).__name__}: {str(err)[:200]}")
    except Exception as err:  # transport errors of the HTTP client, malformed answers
        return PinReport(**report, status=UNKNOWN, detail=f"provider unreachable or failing: {type(err).__name__}: {str(err)[:200]}")
    found = dict(resolved=status.resolved, branch_head=status.branch_head, gated=gated)
    if not status.served:
        return PinReport(**report, **found, status=REVISION_GONE,
                         detail=f"{p.repo_id} no longer serves {p.revision}: choose a served revision (branch {branch} is at {(status.branch_head or '?')[:12]}) and update the pin")  # fmt: skip
    if gated and not source.gated:
        return PinReport(**report, **found, status=GATED,
                         detail=f"{p.repo_id} is now gated but the catalog says it is not: accept its terms, set HF_TOKEN and mark the entry gated = true")  # fmt: skip
    if status.branch_moved:
        return PinReport(**report, **found, status=BRANCH_MOVED,
                         detail=f"pin {p.revision} is still served; {branch} moved to {status.branch_head[:12]}: review and bump the pin if wanted")  # fmt: skip
    return PinReport(**report, **found, status=OK, detail=f"{p.revision} served" + (f"; {branch} is at it" if status.branch_head else ""))
