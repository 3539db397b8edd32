"""``mixture_validation``: the published mixture's candidate and token-proportional sampling,
trained with several seeds (built-in trainer) or handed out as configs (external trainer), the
measured target against the prediction, and the verdict (see ``core.mixture.validation``)."""

import hashlib

import dagster as dg
import numpy as np
import polars as pl

from marin_assets.core.mixture import gates, launcher, proxy_trainer, results
from marin_assets.core.mixture import swarm as swarm_core
from marin_assets.core.mixture import validation as validation_core
from marin_assets.core.runtime import stages, storage
from marin_assets.core.specs import MIXTURE_SWARM, MIXTURE_VALIDATION, MIXTURE_WEIGHTS
from marin_assets.defs.metadata import markdown_table, materialized
from marin_assets.defs.partitions import study_partitions
from marin_assets.defs.mixture.study import (
    current_output,
    evaluation_texts,
    study_asset,
    study_params,
    target_name,
)
from marin_assets.defs.resources import MarinResource

VALIDATED_CHECK = "validated"


def _matrix(table: pl.DataFrame, column: str, phases: list[str]) -> np.ndarray:
    return np.stack([table.filter(pl.col("phase") == p).sort("group")[column].to_numpy() for p in phases])


def _target(metrics: dict, params: swarm_core.StudyParams) -> float:
    target = params.target()
    return float(sum(w * metrics[m] for m, w in target.items())) if all(m in metrics for m in target) else float("nan")


@study_asset(
    MIXTURE_VALIDATION,
    study_partitions,
    kinds={"parquet", "json"},
    check_specs=[dg.AssetCheckSpec(VALIDATED_CHECK, asset=MIXTURE_VALIDATION.name, description="the published mixture's measured gain over "
                                   "token-proportional exceeds the replicate noise (several seeds each)")],
    description="Trains the optimizer's candidate and the token-proportional mixture with several seeds each (built-in "
    "trainer) or writes their configs and reads their results (external trainer); measured against predicted with "
    "intervals; validated only when the measured gain exceeds the noise.",
)
def mixture_validation(context: dg.AssetExecutionContext, marin: MarinResource) -> dg.MaterializeResult:
    study = context.partition_key
    root, params = study_params(marin, study)
    swarm_uri, swarm_fp = current_output(marin, MIXTURE_SWARM, study)
    weights_uri, weights_fp = current_output(marin, MIXTURE_WEIGHTS, study)
    if storage.read_manifest(weights_uri)["inputs"].get("swarm") != swarm_fp:
        raise dg.Failure(f"study '{study}': mixture_weights was made for an earlier swarm; materialize mixture_model and mixture_weights again")
    weights_stats = storage.read_manifest(weights_uri)["stats"]
    gate = gates.Verdict.from_json(weights_stats["gate"])
    phases = [p.name for p in params.phases]
    table = pl.from_arrow(storage.read_parquet(storage.join(weights_uri, "weights.parquet")))
    group_table, _, _ = swarm_core.read_swarm(swarm_uri)
    pool_files = storage.read_json(storage.join(swarm_uri, "pool_files.json"))
    folder = swarm_core.results_dir(root, study)
    configs = validation_core.validation_configs(
        params, _matrix(table, "candidate_block_sequences", phases), _matrix(table, "proportional_weight", phases), group_table, pool_files, folder  # type: ignore[arg-type]
    )
    if params.trainer == "builtin":
        external, digest = None, ""
    else:
        found = results.read_results(folder)
        external = {rid: results.final_metrics(results.rows_for_run(found, rid, c["mixture_id"]).rows) for rid, c in configs.items()}
        digest = hashlib.sha256(repr(sorted((r, sorted(m.items())) for r, m in external.items())).encode()).hexdigest()[:16]

    def build(out: str) -> dict:
        for rid, config in configs.items():
            storage.write_json(storage.join(out, "configs", f"{rid}.json"), config)
        if external is None:
            texts = proxy_trainer.read_evaluation_texts(swarm_uri) or evaluation_texts(marin, root, study, params, pool_files)
            metrics = {rid: proxy_trainer.train_proxy(c, texts, params.proxy)["metrics"] for rid, c in configs.items()}
        else:
            metrics = external
        rows = [(rid, which, seed, _target(metrics[rid], params)) for which in validation_core.MIXTURES for seed in range(params.validation_seeds)
                for rid in [validation_core.validation_run_id(which, seed)]]
        storage.write_parquet(pl.DataFrame(rows, schema={"run_id": pl.Utf8, "mixture": pl.Utf8, "seed": pl.Int64, "target": pl.Float64}, orient="row"),
                              storage.join(out, "measured.parquet"))
        missing = [rid for rid, _, _, v in rows if not np.isfinite(v)]
        if missing:  # submitted once per validation output: a rerun with the same inputs reuses it
            launched = [launcher.launch(params.launcher, config=storage.join(out, "configs", f"{rid}.json"), run_id=rid, study=study, results=folder)
                        for rid in missing] if params.launcher else []
            return {"waiting": missing, "configs": storage.join(out, "configs"), "launched": launched}
        measured = {which: [v for _, w, _, v in rows if w == which] for which in validation_core.MIXTURES}
        predicted = {"optimized": weights_stats["predicted"]["optimized"], "proportional": weights_stats["predicted"]["proportional"]}
        return {"configs": storage.join(out, "configs"), **validation_core.verdict(measured, predicted, gate.passed, gate.facts.get("noise_sd"))}

    manifest = stages.run_study(
        MIXTURE_VALIDATION, marin.layout(), study=study, decided_by={"study": params},
        inputs={"swarm": swarm_fp, "weights": weights_fp, "results": digest}, build=build,
    )
    return _validation_result(manifest, study, params, gate, storage.join(weights_uri, "mixture.json"))


def _validation_result(manifest: dict, study: str, params: swarm_core.StudyParams, gate: gates.Verdict, weights_json: str) -> dg.MaterializeResult:
    stats = manifest["stats"]
    if "waiting" in stats:
        launched = stats.get("launched") or []
        how = f"{sum(s['state'] == 'submitted' for s in launched)} of {len(launched)} submitted by the launcher" if launched else "train the configs"
        text = f"waiting: {len(stats['waiting'])} validation runs have no results yet ({how}); configs under {stats['configs']}, results to the study's results/"
        check = dg.AssetCheckResult(check_name=VALIDATED_CHECK, passed=False, severity=dg.AssetCheckSeverity.WARN, description=text)
        states = markdown_table([{"run": rid, "state": s["state"], "returncode": s["returncode"]} for rid, s in zip(stats["waiting"], launched)]) if launched else None
        return materialized(manifest, check_results=[check], verdict=text, validated=False, configs=dg.MetadataValue.path(stats["configs"]),
                            launch_states=states, summary=f"  study {study}: {text}")
    name = target_name(params)
    rows = []
    for which in validation_core.MIXTURES:
        m, pred = stats["measured"][which], stats["predicted"][which]
        label = "optimized (published)" if which == "optimized" and gate.passed else ("optimized (candidate, not published)" if which == "optimized" else "token-proportional")
        rows.append({"mixture": label, f"predicted {name}": f"{pred:.4f}" if pred is not None and np.isfinite(pred) else "n/a",
                     f"measured {name} (mean)": f"{m['mean']:.4f}", "90% interval": f"{m['low']:.4f} .. {m['high']:.4f}", "seeds": m["seeds"]})
    ladder = f", at {params.validation_budget_scale:g}x the proxy budget (predictions are for 1x)" if params.validation_budget_scale != 1 else ""
    lines = [f"  study {study}: validation, {params.validation_seeds} seeds per mixture ({name}; 90% intervals){ladder}"]
    lines += [f"    {r['mixture']}: predicted {r[f'predicted {name}']}, measured {r[f'measured {name} (mean)']} [{r['90% interval']}] over {r['seeds']} seeds" for r in rows]
    lines.append(f"    {stats['verdict']}")
    check = dg.AssetCheckResult(check_name=VALIDATED_CHECK, passed=bool(stats["validated"]), severity=dg.AssetCheckSeverity.WARN, description=stats["verdict"])
    gain = stats["measured_gain"]
    return materialized(
        manifest,
        rows=2 * params.validation_seeds,
        check_results=[check],
        verdict=stats["verdict"],
        validated=bool(stats["validated"]),
        published="optimized" if gate.passed else "token-proportional",
        gate=gate.describe(),
        measured_vs_predicted=markdown_table(rows),
        measured_gain=float(gain["mean"]),
        measured_gain_interval=f"{gain['low']:.4f} .. {gain['high']:.4f}",
        predicted_gain=float(stats["predicted_gain"]) if stats["predicted_gain"] is not None and np.isfinite(stats["predicted_gain"]) else None,
        replicate_noise_sd=stats["noise_sd"],
        published_weights=dg.MetadataValue.path(weights_json),
        configs=dg.MetadataValue.path(stats["configs"]),
        summary="\n".join(lines),
    )
