"""What every mixture-study asset shares: the asset decorator from a spec, the study's spec,
a stage's current output, the target's name, and the built-in proxy's evaluation text."""

import hashlib

import dagster as dg

from marin_assets.core.decon import eval_sources
from marin_assets.core.mixture import proxy_trainer
from marin_assets.core.mixture import swarm as swarm_core
from marin_assets.core.runtime import stages, storage
from marin_assets.core.runtime.stages import StageSpec
from marin_assets.core.specs import MIXTURE_SWARM, PROXY_RESULTS
from marin_assets.defs.partitions import proxy_run_partitions
from marin_assets.defs.resources import MarinResource

BY_STUDY = dg.MultiToSingleDimensionPartitionMapping(partition_dimension_name="study")


def study_asset(spec: StageSpec, partitions_def: dg.PartitionsDefinition, **kwargs):
    """``@dg.asset`` for a mixture stage: name, group, code version and dependencies from its spec;
    a dependency on a per-run stage from a per-study one (or back) maps by the study dimension."""
    by_run = partitions_def is proxy_run_partitions
    ins = {
        i.name: dg.AssetIn(partition_mapping=BY_STUDY, dagster_type=dg.Nothing)
        for i in spec.inputs
        if i.name in (MIXTURE_SWARM.name, PROXY_RESULTS.name) and (by_run or i.name == PROXY_RESULTS.name)
    }
    return dg.asset(
        name=spec.name,
        ins=ins,
        deps=[dg.AssetKey(i.name) for i in spec.inputs if i.name not in ins],
        partitions_def=partitions_def,
        group_name=spec.group,
        code_version=spec.code_version,
        **kwargs,
    )


def study_params(marin: MarinResource, study: str) -> tuple[str, swarm_core.StudyParams]:
    root = marin.layout().root
    try:
        return root, swarm_core.load_study(root, study)
    except swarm_core.StudyError as exc:
        raise dg.Failure(str(exc)) from exc


def target_name(params: swarm_core.StudyParams) -> str:
    """The target as shown: the metric, or the weighted sum of metrics."""
    target = params.target()
    return params.target_metric if list(target) == [params.target_metric] else " + ".join(f"{w:g} x {m}" for m, w in target.items())


def eval_set_uri(root: str, study: str, params: swarm_core.StudyParams) -> str:
    """A configured eval set's URI: as given when it names a scheme or an absolute path, else inside the study folder."""
    name = params.proxy.eval_set
    return name if "://" in name or name.startswith("/") else storage.join(swarm_core.study_dir(root, study), name)


def eval_set_input(marin: MarinResource, root: str, study: str, params: swarm_core.StudyParams) -> dict[str, str]:
    """Fingerprint input of the built-in proxy's evaluation text: the locked registry or the file's bytes."""
    name = params.proxy.eval_set
    if params.trainer != "builtin" or not name:
        return {}
    if name == "locked":
        return {"eval_set": eval_sources.registry_digest(marin.evals())}
    uri = eval_set_uri(root, study, params)
    return {"eval_set": hashlib.sha256(storage.read_bytes(uri)).hexdigest()[:16] if storage.exists(uri) else "absent"}


def evaluation_texts(marin: MarinResource, root: str, study: str, params: swarm_core.StudyParams, pool_files: dict) -> dict[str, bytes]:
    """The built-in proxy's evaluation text: the locked eval sets (one domain per set), a
    configured file, or the held-out pool documents."""
    name = params.proxy.eval_set
    try:
        if name == "locked":
            registry = marin.evals()
            rows = eval_sources.registry_rows(registry, lambda s: eval_sources.fetch_eval_set(s, registry, marin.layout(), marin.provider_access()))
            return proxy_trainer.capped_texts(((row.eval_set, row.text) for row in rows if row.text), params.proxy.max_eval_bytes_per_domain)
        if name:
            return proxy_trainer.read_eval_set(eval_set_uri(root, study, params), params.proxy)
    except (ValueError, eval_sources.EvalIndexError) as exc:
        raise dg.Failure(f"study '{study}': {exc}") from exc
    return proxy_trainer.evaluation_texts(pool_files, params.proxy)


def evaluation_dir(marin: MarinResource, root: str, study: str, params: swarm_core.StudyParams, swarm_uri: str, out: str) -> str:
    """The folder holding the built-in trainer's evaluation text: the swarm's, or (a swarm written
    without it) ``out``, where it is written now."""
    if proxy_trainer.read_evaluation_texts(swarm_uri) is not None:
        return swarm_uri
    proxy_trainer.write_evaluation_texts(evaluation_texts(marin, root, study, params, storage.read_json(storage.join(swarm_uri, "pool_files.json"))), out)
    return out


def current_output(marin: MarinResource, spec: StageSpec, study: str, run: str | None = None) -> tuple[str, str]:
    found = stages.current_study_output(marin.layout(), spec, study, run)
    if found is None:
        raise dg.Failure(f"study '{study}' has no {spec.study_stage} output{f' for run {run}' if run else ''} yet; materialize {spec.name} for it first")
    return found.uri, found.fingerprint
