"""``mixture_validation``: the published mixture's candidate and token-proportional sampling,
trained with several seeds (built-in trainer) or handed out as configs (external trainer), the
measured target against the prediction, and the verdict (see ``core.mixture.validation``)."""

import hashlib

import dagster as dg
import numpy as np
import polars as pl

from marin_assets.core.mixture import gates, launcher, results
from marin_assets.core.mixture import swarm as swarm_core
from marin_assets.core.mixture import validation as validation_core
from marin_assets.core.runtime import stages, storage
from marin_assets.core.specs import MIXTURE_SWARM, MIXTURE_VALIDATION, MIXTURE_WEIGHTS
from marin_assets.defs.metadata import markdown_table, materialized
from marin_assets.defs.mixture.jobs import builtin_job_config, follow_launched, train_builtin
from marin_assets.defs.partitions import study_partitions
from marin_assets.defs.mixture.study import (
    current_output,
    evaluation_dir,
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
    plan = validation_core.validation_plan(params)

    def external_metrics() -> dict[str, dict[str, float]]:
        found = results.read_results(folder)
        conflicts = [found.conflicts[rid] for rid in configs if rid in found.conflicts]
        if conflicts:
            raise dg.Failure(f"study '{study}': " + "; ".join(conflicts))
        return {rid: results.final_metrics(results.rows_for_run(found, rid, c["mixture_id"]).rows) for rid, c in configs.items()}

    if params.trainer == "builtin":
        external, digest = None, ""
    else:
        external = external_metrics()
        digest = hashlib.sha256(repr(sorted((r, sorted(m.items())) for r, m in external.items())).encode()).hexdigest()[:16]

    def build(out: str) -> dict:
        config_uris = {rid: storage.join(out, "configs", f"{rid}.json") for rid in configs}
        for rid, config in configs.items():
            storage.write_json(config_uris[rid], config)
        if external is None:
            eval_dir = evaluation_dir(marin, root, study, params, swarm_uri, out)
            metrics = train_builtin(context, marin, study, params, {rid: builtin_job_config(c, params, eval_dir) for rid, c in configs.items()}, folder)
        elif params.launcher_status and any(not m for m in external.values()):  # submitted and followed to their end
            follow_launched(context, study, params, {rid: config_uris[rid] for rid, m in external.items() if not m}, folder)
            metrics = external_metrics()
        else:
            metrics = external
        rows = [(rid, size, which, seed, _target(metrics[rid], params)) for rid, size, which, seed in plan]
        storage.write_parquet(pl.DataFrame(rows, schema={"run_id": pl.Utf8, "size": pl.Utf8, "mixture": pl.Utf8, "seed": pl.Int64, "target": pl.Float64}, orient="row"),
                              storage.join(out, "measured.parquet"))
        published = storage.read_json(storage.join(weights_uri, "mixture.json"))
        missing = [rid for rid, _, _, _, v in rows if not np.isfinite(v)]
        if missing:  # submitted once per validation output: a rerun with the same inputs reuses it
            launched = [launcher.launch(params.launcher, config=config_uris[rid], run_id=rid, study=study, results=folder)
                        for rid in missing] if params.launcher else []
            _publish(out, root, study, validation_core.consumer_mixture(published, published, None))
            return {"waiting": missing, "configs": storage.join(out, "configs"), "launched": launched}
        measured = {size: {which: [v for _, s, w, _, v in rows if s == size and w == which] for which in validation_core.MIXTURES}
                    for size in dict.fromkeys(s for _, s, _, _, _ in rows)}
        predicted = {"optimized": weights_stats["predicted"]["optimized"], "proportional": weights_stats["predicted"]["proportional"]}
        result = validation_core.verdict(measured, predicted, gate.passed, gate.facts.get("noise_sd"), params.gate.min_gain)
        consumer = validation_core.consumer_mixture(published, validation_core.proportional_mixture(table, params, pool_files), result)
        _publish(out, root, study, consumer)
        return {"configs": storage.join(out, "configs"), **result, "consumer": {"published": consumer["published"], "why": consumer["why"]}}

    manifest = stages.run_study(
        MIXTURE_VALIDATION, marin.layout(), study=study, decided_by={"study": params},
        inputs={"swarm": swarm_fp, "weights": weights_fp, "results": digest}, build=build,
    )
    return _validation_result(manifest, study, params, gate, validation_core.consumer_uri(root, study))


def _publish(out: str, root: str, study: str, consumer: dict) -> None:
    """The mixture consumers train on, in the validation's output and at the study's published path."""
    storage.write_json(storage.join(out, "mixture.json"), consumer)
    validation_core.write_consumer_mixture(root, study, consumer)


def _validation_result(manifest: dict, study: str, params: swarm_core.StudyParams, gate: gates.Verdict, consumer_uri: str) -> dg.MaterializeResult:
    stats = manifest["stats"]
    if "waiting" in stats:
        launched = stats.get("launched") or []
        how = f"{sum(s['state'] == 'submitted' for s in launched)} of {len(launched)} submitted by the launcher" if launched else "train the configs"
        text = f"waiting: {len(stats['waiting'])} validation runs have no results yet ({how}); configs under {stats['configs']}, results to the study's results/"
        check = dg.AssetCheckResult(check_name=VALIDATED_CHECK, passed=False, severity=dg.AssetCheckSeverity.WARN, description=text)
        states = markdown_table([{"run": rid, "state": s["state"], "returncode": s["returncode"]} for rid, s in zip(stats["waiting"], launched)]) if launched else None
        return materialized(manifest, check_results=[check], verdict=text, validated=False, configs=dg.MetadataValue.path(stats["configs"]),
                            launch_states=states, published_mixture=dg.MetadataValue.path(consumer_uri), summary=f"  study {study}: {text}")
    name = target_name(params)
    rows, gains = [], []
    for size, at in stats["sizes"].items():
        for which in validation_core.MIXTURES:
            m, pred = at["measured"][which], stats["predicted"][which]
            label = "optimized (published)" if which == "optimized" and gate.passed else ("optimized (candidate, not published)" if which == "optimized" else "token-proportional")
            rows.append({"size": size or "proxy", "mixture": label, f"predicted {name}": f"{pred:.4f}" if pred is not None and np.isfinite(pred) else "n/a",
                         f"measured {name} (mean)": f"{m['mean']:.4f}", "90% interval": f"{m['low']:.4f} .. {m['high']:.4f}", "seeds": m["seeds"]})
        g = at["measured_gain"]
        gains.append({"size": size or "proxy", "measured gain": f"{g['mean']:.4f}", "90% interval": f"{g['low']:.4f} .. {g['high']:.4f}"})
    ladder = f", at {params.validation_budget_scale:g}x the proxy budget" if params.validation_budget_scale != 1 else ""
    sizes = ", ".join(s or "the proxy's own size" for s in params.sizes_to_validate())
    lines = [f"  study {study}: validation with {params.train_run if params.trainer == 'builtin' else 'the external trainer'} at {sizes}{ladder}, "
             f"{params.validation_seeds} seeds per mixture ({name}; 90% intervals; predictions are for the proxy)"]
    lines += [f"    {r['size']}: {r['mixture']}: predicted {r[f'predicted {name}']}, measured {r[f'measured {name} (mean)']} [{r['90% interval']}] over {r['seeds']} seeds" for r in rows]
    lines.append(f"    {stats['verdict']}")
    consumer = stats["consumer"]
    lines.append(f"    consumers train on: {consumer['published']} ({consumer['why']}), {consumer_uri}")
    check = dg.AssetCheckResult(check_name=VALIDATED_CHECK, passed=bool(stats["validated"]),
                                severity=dg.AssetCheckSeverity.ERROR if stats["worse"] else dg.AssetCheckSeverity.WARN, description=stats["verdict"])
    gain = stats["measured_gain"]
    return materialized(
        manifest,
        rows=len(rows) * params.validation_seeds,
        check_results=[check],
        verdict=stats["verdict"],
        validated=bool(stats["validated"]),
        published=consumer["published"],
        published_why=consumer["why"],
        gate=gate.describe(),
        measured_vs_predicted=markdown_table(rows),
        measured_gain_per_size=markdown_table(gains),
        measured_gain=float(gain["mean"]),
        measured_gain_interval=f"{gain['low']:.4f} .. {gain['high']:.4f}",
        predicted_gain=float(stats["predicted_gain"]) if stats["predicted_gain"] is not None and np.isfinite(stats["predicted_gain"]) else None,
        replicate_noise_sd=stats["noise_sd"],
        published_mixture=dg.MetadataValue.path(consumer_uri),
        configs=dg.MetadataValue.path(stats["configs"]),
        summary="\n".join(lines),
    )
