"""Following a study's runs from a Dagster step: built-in runs as Ray tasks on the configured
cluster (``MARIN_RAY_ADDRESS``; in the step's process without one), external runs through the
study's launcher and status templates. Each start, failed attempt and finish is logged with its
run id; runs that failed for good fail the step, naming each run and the cause of every attempt."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import dagster as dg

from marin_assets.core.mixture import jobs, launcher
from marin_assets.core.mixture import swarm as swarm_core
from marin_assets.core.mixture.lm_params import lm_params_to_mapping
from marin_assets.core.runtime.runner import TaskResources
from marin_assets.defs.resources import MarinResource


def _logger(context: dg.AssetExecutionContext, total: int) -> jobs.Event:
    done = {"finished": 0}

    def log(kind: str, rid: str, attempt: int, detail: str) -> None:
        if kind == "finished":
            done["finished"] += 1
            context.log.info(f"run {rid} finished (attempt {attempt}); {done['finished']} of {total} runs done")
        elif kind == "failed":
            context.log.warning(f"run {rid} attempt {attempt} failed: {detail}")
        elif kind == "gave_up":
            context.log.error(f"run {rid} failed for good after {attempt} attempt(s): {detail}")
        else:
            context.log.info(f"run {rid} attempt {attempt} started ({detail})")

    return log


def _fail_on(report: jobs.FollowReport, study: str) -> None:
    if report.failed:
        raise dg.Failure(f"study '{study}': {len(report.failed)} run(s) failed for good: {report.describe_failures()}",
                         metadata={"failed_runs": dg.MetadataValue.json({r: c for r, c in sorted(report.failed.items())})})


def builtin_job_config(config: Mapping[str, Any], params: swarm_core.StudyParams, evaluation_dir: str) -> dict[str, Any]:
    """A run's config as the built-in trainer gets it: its trainer settings and evaluation text beside it."""
    return {**config, "proxy": dataclasses.asdict(params.proxy), "lm": lm_params_to_mapping(params.lm), "evaluation_dir": evaluation_dir}


def train_builtin(context: dg.AssetExecutionContext, marin: MarinResource, study: str, params: swarm_core.StudyParams,
                  configs: Mapping[str, Mapping[str, Any]], results_dir: str) -> dict[str, dict[str, float]]:
    """Train every config with ``params.train_run`` as jobs; their final metrics by run id."""
    runner = marin.runner()
    resources = TaskResources(cpus=params.job_cpus, gpus=params.job_gpus)
    todo = [jobs.ProxyJob(rid, c, str(c.get("size", "")), int(c.get("seed", 0)), resources) for rid, c in configs.items()]
    where = f"Ray at {runner.ray_address}" if runner.ray_address else "this process"
    context.log.info(f"study '{study}': training {len(todo)} run(s) with {params.train_run} on {where}, up to {params.job_retries} retries each")
    try:
        report = jobs.follow(todo, params.train_run, results_dir, ray_address=runner.ray_address, retries=params.job_retries,
                             on_event=_logger(context, len(todo)), local_cpus=runner.local_cpus)
    except jobs.TrainerError as exc:
        raise dg.Failure(f"study '{study}': {exc}") from exc
    _fail_on(report, study)
    return report.finished


def follow_launched(context: dg.AssetExecutionContext, study: str, params: swarm_core.StudyParams, config_paths: Mapping[str, str], results_dir: str) -> None:
    """Submit every run with the study's launcher and follow it with its status template to the end."""
    context.log.info(f"study '{study}': submitting {len(config_paths)} run(s), state polled every {params.job_poll_s:g} s, up to {params.job_retries} retries each")
    report = launcher.follow(params.launcher, params.launcher_status, config_paths, study=study, results=results_dir, retries=params.job_retries,
                             poll_s=params.job_poll_s, on_event=_logger(context, len(config_paths)))
    _fail_on(report, study)
