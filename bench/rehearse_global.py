"""`make rehearse`, the global stages: each one's step code at the full pool's counts inside a real
Dagster step, its tasks answered by a dry runner (``bench/rehearse_kit.py``) with the counters such
a task returns, and the small metadata the step reads back (per-shard manifests, sample parts)
written where the step looks for it, uncounted, as the upstream steps and the tasks would write it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench import slow_store
from bench.rehearse_kit import DOCS_PER_SHARD, SourceSize
from marin_assets.core.runtime import stages, storage


def local_path(uri: str) -> Path:
    """Where the counting store keeps ``uri``: what an upstream step or a task wrote is put there directly (uncounted)."""
    path = Path(slow_store.SlowStore._strip_protocol(uri))
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def per_shard_output(root: str, stage: str, src: SourceSize, stats: dict[str, Any] | None = None) -> stages.StageInput:
    """A per-shard stage's finished output for ``src`` as ``run_shards`` records it: a manifest
    naming every shard with its counters (``rows`` by default)."""
    uri = storage.join(root, stage, src.name)
    names = [storage.shard_name(i, src.shards) for i in range(src.shards)]
    per_shard = [stats or {"rows": DOCS_PER_SHARD}] * src.shards
    local_path(storage.manifest_uri(uri)).write_text(json.dumps({"stage": stage, "shards": names, "per_shard": per_shard}))
    return stages.StageInput(uri, "0" * 16, stage)


def uncounted(answer: Any) -> Any:
    """``answer`` for a task that the dry runner runs for real in the step's process: its requests
    are the task's own, not the step's, so the store's counts are put back as they were."""

    def run(task: Any) -> Any:
        before = slow_store.SlowStore.requests.copy()
        try:
            return answer(task)
        finally:
            slow_store.SlowStore.requests.clear()
            slow_store.SlowStore.requests.update(before)

    return run
