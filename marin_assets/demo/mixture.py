"""The demo's mixture study: a handful of built-in proxies on the demo pool, fitted, gated,
optimized and validated.

The proxies are scored on the locked eval sets (the demo's registry), replicates of two
mixtures give the run-to-run noise, and ``mixture_validation`` trains the optimizer's candidate
and token-proportional sampling with three seeds each, so the demo prints predicted and
measured figures side by side and the gates' verdict. The study spec is written once under
``<root>/mixture/demo/study.yaml``; every stage is fingerprinted, so a second ``make demo``
reuses the swarm, the proxies, the model, the weights and the validation.
"""

from __future__ import annotations

from typing import Any

from marin_assets.core.mixture import swarm as swarm_core
from marin_assets.core.runtime import storage

DEMO_STUDY = swarm_core.StudyParams(
    name="demo",
    target_budget=1.0e6,  # about 3 epochs of the demo pool's ~340k tokens
    proxy_budget=1.0e5,
    n_runs=12,
    seed=0,
    phases=(swarm_core.TrainingPhase("main", 1.0),),
    seq_len=64,  # the demo's groups are small: short sequences keep most of them in a proxy
    search_candidates=4_000,
    search_rounds=4,
    train_run=swarm_core.NGRAM_TRAINER,  # seconds per proxy; a real study trains the language-model proxy (the default)
    proxy=swarm_core.ProxyTrainerParams(order=3, eval_set="locked"),
)

QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def _metadata(result: Any, asset: str) -> dict[str, Any]:
    for event in result.all_events:
        if event.event_type_value == "ASSET_MATERIALIZATION":
            mat = event.event_specific_data.materialization
            if mat.asset_key.to_user_string() == asset:
                return {k: getattr(v, "value", v) for k, v in mat.metadata.items()}
    return {}


def run_mixture_demo(defs: Any, instance: Any, study: swarm_core.StudyParams = DEMO_STUDY) -> dict[str, Any]:
    """Propose, train every proxy, fit, gate, optimize and validate the demo study; print what each step found."""
    from marin_assets.defs.partitions import add_study, proxy_run_key

    root = defs.resources["marin"].layout().root  # the MARIN_PREFIX setting, as the assets see it
    if not storage.exists(storage.join(swarm_core.study_dir(root, study.name), swarm_core.STUDY_FILE)):
        swarm_core.write_study(root, study)  # an edited spec is kept
    add_study(instance, study.name)
    trainer = swarm_core.load_study(root, study.name).train_run
    what = "a byte n-gram model, the fast stand-in; not a language model" if trainer == swarm_core.NGRAM_TRAINER else "as the study names it"
    print(f"\n== mixture study '{study.name}' ==\n  trainer: {trainer} ({what})", flush=True)
    swarm = defs.resolve_job_def("mixture_proposal").execute_in_process(partition_key=study.name, instance=instance, run_config=QUIET)
    print(str(_metadata(swarm, "mixture_swarm").get("summary", "")).replace("```", "").strip("\n"), flush=True)
    proxies = defs.resolve_job_def("mixture_proxies")
    values = []
    for run in study.run_ids():
        result = proxies.execute_in_process(partition_key=proxy_run_key(study.name, run), instance=instance, run_config=QUIET)
        meta = _metadata(result, "proxy_results")
        values.append(f"{run}{'/s' + str(meta['seed']) if meta.get('seed') else ''} {meta.get('target_value', float('nan')):.4f}")
    print(f"  proxies ({study.target_metric}): " + ", ".join(values), flush=True)
    fitted = defs.resolve_job_def("mixture_fit").execute_in_process(partition_key=study.name, instance=instance, run_config=QUIET)
    model, weights = _metadata(fitted, "mixture_model"), _metadata(fitted, "mixture_weights")
    validated = defs.resolve_job_def("mixture_validate").execute_in_process(partition_key=study.name, instance=instance, run_config=QUIET)
    validation = _metadata(validated, "mixture_validation")
    for meta in (model, weights, validation):
        print(str(meta.get("summary", "")).replace("```", "").strip("\n"), flush=True)
    return {"model": model, "weights": weights, "validation": validation}
