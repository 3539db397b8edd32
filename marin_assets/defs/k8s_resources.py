"""Kubernetes resources of the steps that need more than the default pod (``MARIN_EXECUTOR=k8s``).

Per-shard work runs as Ray tasks (``MARIN_RAY_ADDRESS``), so most step pods only plan shards
and report: the default pod (1 CPU, 2 GiB) is enough. These steps hold more themselves:

* the global decisions (dedup, eval n-grams, topic model, bands, sampling groups) run in the step
  pod over partitioned files, bounded by their configured batch sizes;
* ``embeddings`` asks for a GPU for the case it runs without Ray (with Ray the tasks ask for it).

The numbers follow the capacity table in docs/scale.md (measured bytes per task).
"""

from __future__ import annotations

from typing import Any


def _pod(cpu: str, memory: str, *, gpu: int = 0, scratch: str = "") -> dict[str, Any]:
    limits: dict[str, Any] = {"cpu": cpu, "memory": memory}
    if gpu:
        limits["nvidia.com/gpu"] = str(gpu)
    if scratch:
        limits["ephemeral-storage"] = scratch
    return {"container_config": {"resources": {"requests": dict(limits), "limits": limits}}}


STEP_K8S_CONFIG: dict[str, dict[str, Any]] = {
    "normalized": _pod("2", "4Gi", scratch="64Gi"),
    "exact_duplicates": _pod("4", "16Gi", scratch="200Gi"),
    "fuzzy_duplicates": _pod("8", "32Gi", scratch="500Gi"),
    "eval_ngrams": _pod("2", "8Gi"),
    "topic_model": _pod("16", "64Gi"),
    "quality_bands": _pod("2", "8Gi"),
    "sampling_groups": _pod("2", "8Gi"),
    "embeddings": _pod("8", "32Gi", gpu=1),
}
