"""The executor a deployment runs steps with, chosen by ``MARIN_EXECUTOR`` when the code loads.

``in_process`` (the default) runs a run's steps one after another inside the run worker: a
partition whose output is reused re-runs in seconds (a subprocess per step costs ~2-5 s of
imports each); shards still use the ShardRunner's pool (``MARIN_SHARD_PROCESSES``) or Ray.
``multiprocess`` runs each step in a subprocess of the run worker (steps of one run in
parallel; pays only when a run's independent steps are long). ``k8s`` runs each step in its own pod (``dagster_k8s.k8s_job_executor``), so the
``embeddings`` step gets the GPU its ``dagster-k8s/config`` op tag requests while the other
steps run on CPU nodes; its namespace, image and env come from the instance's
``K8sRunLauncher`` (deploy/dagster.production.yaml).
"""

from __future__ import annotations

import dagster as dg

from marin_assets.defs.settings import defs_setting

EXECUTOR_ENV = "MARIN_EXECUTOR"


def executor_from_env(value: str | None = None) -> dg.ExecutorDefinition | None:
    """The executor for ``Definitions(executor=...)``."""
    choice = (value if value is not None else defs_setting(EXECUTOR_ENV) or "").strip().lower() or "in_process"
    if choice == "multiprocess":
        return dg.multiprocess_executor
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
