"""The executor a deployment runs steps with, chosen by ``MARIN_EXECUTOR`` when the code loads.

``in_process`` (the default) runs a run's steps one after another inside the run worker: a
partition whose output is reused re-runs in seconds (a subprocess per step costs ~2-5 s of
imports each); shards still use the ShardRunner's pool (``MARIN_SHARD_PROCESSES``) or Ray. Its
steps wait for pool slots with ``PoolWait``: a slot a dead run holds is freed by the waiting run,
the wait sleeps, and SIGTERM ends it.
``multiprocess`` runs each step in a subprocess of the run worker (steps of one run in
parallel; pays only when a run's independent steps are long). ``k8s`` runs each step in its own pod (``dagster_k8s.k8s_job_executor``), so the
``embeddings`` step gets the GPU its ``dagster-k8s/config`` op tag requests while the other
steps run on CPU nodes; its namespace, image and env come from the instance's
``K8sRunLauncher`` (deploy/dagster.production.yaml).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from typing import Any

import dagster as dg
from dagster._core.definitions.executor_definition import IN_PROC_CONFIG
from dagster._core.errors import DagsterExecutionInterruptedError
from dagster._core.events import EngineEventData
from dagster._core.execution.api import ExecuteRunWithPlanIterable
from dagster._core.execution.context_creation_job import PlanExecutionContextManager
from dagster._core.execution.plan.execute_plan import inner_plan_execution_iterator
from dagster._core.execution.plan.instance_concurrency_context import InstanceConcurrencyContext
from dagster._core.execution.retries import RetryMode
from dagster._core.execution.step_dependency_config import StepDependencyConfig
from dagster._core.executor import in_process as dagster_in_process
from dagster._utils.interrupts import pop_captured_interrupt

from marin_assets.defs import runs
from marin_assets.defs.settings import defs_setting

EXECUTOR_ENV = "MARIN_EXECUTOR"


def executor_from_env(value: str | None = None) -> dg.ExecutorDefinition | None:
    """The executor for ``Definitions(executor=...)``."""
    choice = (value if value is not None else defs_setting(EXECUTOR_ENV) or "").strip().lower() or "in_process"
    if choice == "multiprocess":
        return dg.multiprocess_executor
    if choice == "in_process":
        return in_process_executor
    if choice == "k8s":
        from dagster_k8s import k8s_job_executor

        # Steps of one run in parallel; the gpu and hf_download pools still cap their steps.
        from marin_assets.defs.k8s_resources import STEP_K8S_CONFIG

        return k8s_job_executor.configured(
            {"max_concurrent": 16, "per_step_k8s_config": STEP_K8S_CONFIG}, name="k8s_job_executor"
        )
    raise ValueError(f"{EXECUTOR_ENV}={choice!r} is not understood: use 'multiprocess', 'in_process' or 'k8s'")


# --------------------------------------------------------------------------- the in-process executor

WAKE_S = 1.0  # a step waiting for a pool slot looks for an interrupt this often (the slot check keeps Dagster's pace)


class PoolWait(InstanceConcurrencyContext):
    """Dagster's wait for pool slots, made safe on the embedded default (no daemon).

    * a slot held by a run whose process is gone (``kill -9``) is freed by the waiting run
      itself (``runs.free_dead_holders``), so a rerun never waits for ``marin-assets runs --free``;
    * the wait sleeps between checks: Dagster's own interval is never positive, which spins a core;
    * an interrupt (SIGTERM, SIGINT) received while waiting ends the run, as it does inside a step.
    """

    def claim(self, concurrency_key: str, step_key: str, step_priority: int = 0) -> bool:
        if pop_captured_interrupt():
            raise DagsterExecutionInterruptedError()
        checks = self._pending_claim_counts[step_key]
        if super().claim(concurrency_key, step_key, step_priority):
            return True
        if self._pending_claim_counts[step_key] == checks:  # not checked again yet
            return False
        freed = runs.free_dead_holders(self._instance, concurrency_key, self._run_id)
        for stuck in freed:
            logging.getLogger(__name__).warning("pool '%s': freed the slots of run %s (%s)", concurrency_key, stuck.run_id, stuck.reason)
        if freed:
            self._pending_timeouts[step_key] = 0.0
            return super().claim(concurrency_key, step_key, step_priority)
        return False

    def interval_to_next_pending_claim_check(self) -> float:
        if not self.has_pending_claims():
            return 0.0
        now = time.time()
        return max(0.0, min([WAKE_S, *(ready - now for ready in self._pending_timeouts.values())]))


def _steps_in_process(job_context: Any, execution_plan: Any, instance_concurrency_context: Any = None) -> Iterator[dg.DagsterEvent]:
    with PoolWait(job_context.instance, job_context.dagster_run) as waits:
        yield from inner_plan_execution_iterator(job_context, execution_plan, waits)


class InProcessExecutor(dagster_in_process.InProcessExecutor):
    """Dagster's in-process executor with ``PoolWait`` for its pool slots."""

    def execute(self, plan_context: Any, execution_plan: Any) -> Iterator[dg.DagsterEvent]:
        steps = execution_plan.step_keys_to_execute
        yield dg.DagsterEvent.engine_event(plan_context, f"Executing steps in process (pid: {os.getpid()})",
                                           event_specific_data=EngineEventData.in_process(os.getpid(), steps))  # fmt: skip
        yield from ExecuteRunWithPlanIterable(
            execution_plan=plan_context.execution_plan,
            iterator=_steps_in_process,
            execution_context_manager=PlanExecutionContextManager(
                job=plan_context.job, retry_mode=plan_context.retry_mode, execution_plan=plan_context.execution_plan,
                run_config=plan_context.run_config, dagster_run=plan_context.dagster_run, instance=plan_context.instance,
                raise_on_error=plan_context.raise_on_error, output_capture=plan_context.output_capture,
                step_dependency_config=self.step_dependency_config,
            ),
        )  # fmt: skip
        yield dg.DagsterEvent.engine_event(plan_context, f"Finished steps in process (pid: {os.getpid()})",
                                           event_specific_data=EngineEventData.in_process(os.getpid(), steps))  # fmt: skip


@dg.executor(name="in_process", config_schema=IN_PROC_CONFIG)
def in_process_executor(init_context: Any) -> InProcessExecutor:
    """The in-process executor (its config as Dagster's), waiting for pool slots with ``PoolWait``."""
    config = init_context.executor_config
    return InProcessExecutor(retries=RetryMode.from_config(config["retries"]),  # type: ignore[arg-type]
                             step_dependency_config=StepDependencyConfig.from_config(config.get("step_dependency_config")))  # fmt: skip
