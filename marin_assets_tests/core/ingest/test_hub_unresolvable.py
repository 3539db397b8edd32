"""An unresolvable Hub host fails at once (like the web providers), instead of retrying for hours."""

from __future__ import annotations

import dataclasses

import pytest

from marin_assets.core.ingest import hub


def test_an_unresolvable_hub_host_is_not_retried() -> None:
    waits: list[float] = []
    policy = dataclasses.replace(hub.DEFAULT_POLICY, sleep=waits.append)  # the production policy, waits recorded
    with pytest.raises(hub.DownloadError, match="cannot be resolved"):
        hub.resolve_revision("org/repo", "main", policy=policy, endpoint="http://marin-no-such-host.invalid")
    assert waits == [], "no retry wait: a failed name lookup cannot get better by waiting"
