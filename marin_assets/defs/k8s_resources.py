"""Kubernetes resources of the steps that need more than the default pod (``MARIN_EXECUTOR=k8s``).

Per-shard work runs as Ray tasks (``MARIN_RAY_ADDRESS``), so most step pods only plan shards
and report: the default pod (1 CPU, 2 GiB) is enough. A stage whose step holds more names its
size in its spec (``StageSpec.step``): the global decisions (dedup, eval n-grams, topic model,
bands, sampling groups) run in the step pod over partitioned files, bounded by their configured
batch sizes; ``embeddings`` asks for a GPU for the case it runs without Ray. The sizes follow the
capacity table in docs/scale.md (measured bytes per task).
"""

from __future__ import annotations

from typing import Any

from marin_assets.core import specs
from marin_assets.core.runtime.stages import StepSize


def pod_config(size: StepSize) -> dict[str, Any]:
    limits: dict[str, Any] = {"cpu": size.cpu, "memory": size.memory}
    if size.gpu:
        limits["nvidia.com/gpu"] = str(size.gpu)
    if size.scratch:
        limits["ephemeral-storage"] = size.scratch
    return {"container_config": {"resources": {"requests": dict(limits), "limits": limits}}}


STEP_K8S_CONFIG: dict[str, dict[str, Any]] = {s.name: pod_config(s.step) for s in specs.ALL if s.step}
