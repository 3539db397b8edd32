"""Expected provider failures end a step as a ``dg.Failure``: the message and metadata a user
reads in the UI, not a stack trace."""

from __future__ import annotations

import dagster as dg

from marin_assets_tests.automation.sources import PEPS


def test_a_repo_the_hub_does_not_serve_fails_with_a_message_and_metadata(pipeline) -> None:
    result = pipeline.materialize(["raw_files"], partition=PEPS, raise_on_error=False)  # PEPS is not published
    assert not result.success
    failures = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    assert len(failures) == 1
    error = failures[0].step_failure_data.error
    user = failures[0].step_failure_data.user_failure_data
    assert error.cls_name == "Failure", "a dg.Failure, not the provider exception"
    assert user is not None and "was not found" in user.description
    meta = {k: getattr(v, "value", v) for k, v in user.metadata.items()}
    assert meta["source"] == PEPS and meta["error"] == "RepoNotFoundError" and meta["repo"] and meta["pin"]
