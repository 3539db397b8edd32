"""The executor a deployment runs steps with, chosen by ``MARIN_EXECUTOR`` when the code loads.

``multiprocess`` (default; the embedded default) runs each step in a subprocess of the run
worker. ``in_process`` runs the steps one after another inside the run worker (fewer
processes: tests and small machines; shards still use the ShardRunner's pool). ``k8s`` runs each step in its own pod (``dagster_k8s.k8s_job_executor``), so the
``embeddings`` step gets the GPU its ``dagster-k8s/config`` op tag requests while the other
steps run on CPU nodes; its namespace, image and env come from the instance's
``K8sRunLauncher`` (deploy/dagster.production.yaml).
"""

from __future__ import annotations

import dagster as dg

from marin_assets.defs.settings import defs_setting

EXECUTOR_ENV = "MARIN_EXECUTOR"


def executor_from_env(value: str | None = None) -> dg.ExecutorDefinition | None:
    """The executor for ``Definitions(executor=...)``; ``None`` keeps Dagster's multiprocess default."""
    choice = (value if value is not None else defs_setting(EXECUTOR_ENV) or "").strip().lower() or "multiprocess"
    if choice == "multiprocess":
        return None
    if choice == "in_process":
        return dg.in_process_executor
    if choice == "k8s":
        from dagster_k8s import k8s_job_executor

        # Steps of one run in parallel; the gpu and hf_download pools still cap their steps.
        from marin_assets.defs.k8s_resources import STEP_K8S_CONFIG

        return k8s_job_executor.configured(
            {"max_concurrent": 16, "per_step_k8s_config": STEP_K8S_CONFIG}, name="k8s_job_executor"
        )
    raise ValueError(f"{EXECUTOR_ENV}={choice!r} is not understood: use 'multiprocess', 'in_process' or 'k8s'")
