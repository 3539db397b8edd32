"""Mixture search as assets: propose proxy mixtures, collect or train proxies, fit, optimize.

``mixture_swarm`` (per study) -> ``proxy_results`` (per study and run) -> ``mixture_model`` (per
study) -> ``mixture_weights`` (per study) -> ``mixture_validation`` (per study, its own module).
The model carries the gates' verdict; the weights publish the optimized mixture only when it
passed, token-proportional otherwise, with a failing ``mixture_gate`` check saying why. Every
output lives under ``<root>/mixture/<study>/``, fingerprinted like the pipeline's other stages,
so re-running an unchanged study reuses it.
"""

import hashlib

import dagster as dg
import numpy as np
import polars as pl

from marin_assets.core.mixture import fit, gates, launcher, proxy_trainer, results
from marin_assets.core.mixture import swarm as swarm_core
from marin_assets.core.mixture import validation as validation_core
from marin_assets.core.pool import curated as pool_core
from marin_assets.core.pool.groups import MixtureError, read_sampling_groups
from marin_assets.core.runtime import stages, storage
from marin_assets.core.specs import (
    MIXTURE_MODEL,
    MIXTURE_SWARM,
    MIXTURE_WEIGHTS,
    PROXY_RESULTS,
)
from marin_assets.core.specs import SAMPLING_GROUPS as SAMPLING_GROUPS_SPEC
from marin_assets.defs import mixture_report, report
from marin_assets.defs.metadata import markdown_table, materialized
from marin_assets.defs.mixture.jobs import builtin_job_config, follow_launched, train_builtin
from marin_assets.defs.partitions import (
    RUNS,
    proxy_run_partitions,
    study_partitions,
)
from marin_assets.defs.mixture.study import (
    current_output,
    eval_set_input,
    evaluation_dir,
    evaluation_texts,
    study_asset,
    study_params,
    target_name,
)
from marin_assets.defs.mixture.validation import mixture_validation  # noqa: F401 -- found here by stage_assets, like every stage of the group
from marin_assets.defs.resources import MarinResource


@study_asset(
    MIXTURE_SWARM,
    study_partitions,
    kinds={"parquet", "json", "yaml"},
    description="Proposed proxy mixtures of a study (RegMix-style around the token-proportional mix), each with its "
    "simulated-epoching truncation per group and a trainer config (JSON and YAML).",
)
def mixture_swarm(context: dg.AssetExecutionContext, marin: MarinResource) -> dg.MaterializeResult:
    study = context.partition_key
    root, params = study_params(marin, study)
    try:
        groups_in = stages.current_input(marin.layout(), SAMPLING_GROUPS_SPEC)
    except stages.MissingInput as exc:
        raise dg.Failure(str(exc)) from exc
    groups, _ = read_sampling_groups(groups_in.uri)
    pool_files = pool_core.read_pool_files(storage.join(groups_in.uri, "pool_files.parquet"))
    results_uri = swarm_core.results_dir(root, study)

    def build(out: str) -> dict:
        try:
            swarm = swarm_core.build_swarm(groups, pool_files, params, results_uri)
        except MixtureError as exc:
            raise dg.Failure(f"study '{study}': {exc}") from exc
        written = swarm_core.write_swarm(swarm, out, pool_files)
        if params.trainer == "builtin":  # the built-in proxies share one evaluation text
            proxy_trainer.write_evaluation_texts(evaluation_texts(marin, root, study, params, pool_files), out)
        return {**swarm.summary, **written}

    manifest = stages.run_study(
        MIXTURE_SWARM, marin.layout(), study=study, decided_by=params,
        inputs={SAMPLING_GROUPS_SPEC.name: groups_in.fingerprint, **eval_set_input(marin, root, study, params)}, build=build
    )
    known = set(context.instance.get_dynamic_partitions(RUNS))
    new_runs = [r for r in params.run_ids() if r not in known]
    if new_runs:
        context.instance.add_dynamic_partitions(RUNS, new_runs)
    stats = manifest["stats"]
    group_table, mixtures, runs = swarm_core.read_swarm(manifest["uri"])
    zero = group_table.filter(pl.col("zero_sequences")).select("group", "topic_label", "tokens", "sequences", "proxy_tokens", "proxy_sequences")
    summary = (
        f"  study {study}: {params.n_runs} proxy mixtures + {stats['replicate_runs']} replicate runs (other seeds) over {stats['groups_with_tokens']} groups, {len(params.phases)} phase(s), "
        f"proxy/target {stats['proxy_to_target']:.3g}; {stats['groups_zero_sequences_in_proxy']} groups shrink to 0 sequences in a proxy"
    )
    return materialized(
        manifest,
        rows=mixtures.height,
        runs=len(params.run_ids()),
        replicate_runs=stats["replicate_runs"],
        trainer=params.trainer,
        phases=", ".join(f"{p.name} {p.share:g}" for p in params.phases),
        target_budget=params.target_budget,
        proxy_budget=params.proxy_budget,
        groups_with_tokens=stats["groups_with_tokens"],
        groups_zero_sequences_in_proxy=stats["groups_zero_sequences_in_proxy"],
        runs_with_zero_sequence_groups=stats["runs_with_zero_sequence_groups"],
        runs_with_vanished_groups=stats["runs_with_vanished_groups"],
        max_full_run_epochs=stats["max_full_run_epochs"],
        configs=dg.MetadataValue.path(stats["configs"]),
        results_folder=dg.MetadataValue.path(results_uri),
        zero_sequence_groups=markdown_table(zero.to_dicts()),
        runs_table=markdown_table(runs.head(64).to_dicts()),
        proposals=dg.MetadataValue.md(report.markdown_image(mixture_report.proposals_png(mixtures, group_table), "proposed weights")),
        summary=summary,
    )


@study_asset(
    PROXY_RESULTS,
    proxy_run_partitions,
    kinds={"parquet"},
    description="One proxy run's evaluation metrics: the external trainer's results from the study folder, or the "
    "built-in byte n-gram proxy trained on the run's truncated mixture (bits per byte per domain).",
)
def proxy_results(context: dg.AssetExecutionContext, marin: MarinResource) -> dg.MaterializeResult:
    key = context.partition_key.keys_by_dimension  # type: ignore[attr-defined]
    study, run = key["study"], key["run"]
    root, params = study_params(marin, study)
    if run not in params.run_ids():
        raise dg.Failure(f"study '{study}' has {len(params.run_ids())} runs (r0000..{params.run_ids()[-1]}); {run} is not one of them")
    swarm_uri, swarm_fp = current_output(marin, MIXTURE_SWARM, study)
    config = swarm_core.read_config(swarm_uri, run)
    folder = swarm_core.results_dir(root, study)
    found = results.read_results(folder)
    mine = results.rows_for_run(found, run, config["mixture_id"])
    broken = found.errors_for(run, has_rows=mine.rows.height > 0)
    if broken:
        raise dg.Failure(f"run {run} of study '{study}': " + "; ".join(broken))
    if params.trainer == "builtin":  # trained as a job; its results file is its own
        kind, digest = "builtin", ""
    elif mine.rows.height:
        kind = "external"
        digest = hashlib.sha256(mine.rows.drop("file").write_csv().encode()).hexdigest()[:16]
    elif params.launcher:
        kind, digest = "launched", ""
    else:
        raise dg.Failure(
            f"no results for run {run} (mixture {config['mixture_id']}) of study '{study}' in {folder}; the external trainer "
            f"writes JSONL or Parquet rows with {list(swarm_core.RESULT_COLUMNS)} there (README 'Choosing the mixture')"
        )
    config_uri = storage.join(swarm_uri, "configs", f"{run}.json")

    def read_back() -> pl.DataFrame:
        found_now = results.read_results(folder)
        errors = found_now.errors_for(run, has_rows=True)
        if errors:
            raise dg.Failure(f"run {run} of study '{study}': " + "; ".join(errors))
        return results.rows_for_run(found_now, run, config["mixture_id"]).rows

    def build(out: str) -> dict:
        extra: dict = {}
        if kind == "launched" and params.launcher_status:  # submitted and followed to its end: results are in
            follow_launched(context, study, params, {run: config_uri}, folder)
            rows = read_back()
        elif kind == "launched":  # submitted once: the output records the launch; results arrive later
            state = launcher.launch(params.launcher, config=config_uri, run_id=run, study=study, results=folder)
            if state["state"] != "submitted":
                raise dg.Failure(f"run {run} of study '{study}': the launcher exited with {state['returncode']}: {state['output'][-500:]}")
            storage.write_json(storage.join(out, "launch.json"), state)
            rows, extra = pl.DataFrame(schema={**results.RESULT_SCHEMA, "file": pl.Utf8}), {"launch": state}
        elif kind == "external":
            rows = mine.rows
        else:
            eval_dir = evaluation_dir(marin, root, study, params, swarm_uri, out)
            train_builtin(context, marin, study, params, {run: builtin_job_config(config, params, eval_dir)}, folder)
            rows = read_back()
            extra = {"groups_without_proxy_tokens": sorted(g for g, c in config["components"].items() if int(c["proxy_tokens"]) <= 0), "trainer": params.train_run}
        storage.write_parquet(rows, storage.join(out, "results.parquet"))
        return {"source": kind, "rows": rows.height, "metrics": results.final_metrics(rows), **extra}

    proxy_params = {"trainer": kind, "proxy": params.proxy if kind == "builtin" else None, "launcher": params.launcher if kind == "launched" else None,
                    "train_run": params.train_run if kind == "builtin" else None, "lm": params.lm if kind == "builtin" else None}
    manifest = stages.run_study(
        PROXY_RESULTS, marin.layout(), study=study, run=run, decided_by=proxy_params, inputs={"swarm": swarm_fp, "results": digest}, build=build
    )
    stats = manifest["stats"]
    metrics = stats["metrics"]
    target = sum(w * metrics[m] for m, w in params.target().items()) if all(m in metrics for m in params.target()) else None
    return materialized(
        manifest,
        rows=stats["rows"],
        study=study,
        run=run,
        mixture_id=config["mixture_id"],
        source=stats["source"],
        target_metric=target_name(params),
        target_value=float(target) if target is not None else None,
        metrics=markdown_table([{"metric": m, "value": f"{v:.4f}"} for m, v in sorted(metrics.items())]),
        bad_result_rows=found.bad_rows + mine.bad_rows,
        bad_result_examples="\n".join(found.bad_examples + mine.bad_examples) or None,
        seed=config.get("seed", 0),
        unreadable_results_files=len(found.unreadable),
        trainer=stats.get("trainer"),
        launch_state=stats["launch"]["state"] if "launch" in stats else None,
        launch_command=" ".join(stats["launch"]["command"]) if "launch" in stats else None,
        launch_output=stats["launch"]["output"] or None if "launch" in stats else None,
        groups_without_proxy_tokens=", ".join(stats.get("groups_without_proxy_tokens") or []) or None,
    )


def _training_set(layout: storage.Layout, study: str, params: swarm_core.StudyParams, swarm_uri: str, swarm_fp: str) -> dict:
    """Weights and target metrics of every run that has results for the current swarm; runs
    without results, or with results of an earlier swarm (stale), are counted, never used."""
    group_table, mixtures, runs_table = swarm_core.read_swarm(swarm_uri)
    active = np.flatnonzero(group_table["tokens"].to_numpy() > 0)
    names = group_table["group"].to_list()
    mixture_of = dict(runs_table.select("run_id", "mixture_id").iter_rows())
    finals: dict[str, dict[str, float]] = {}
    inputs: dict[str, str] = {}
    stale: list[str] = []
    for rid in params.run_ids():
        found = stages.current_study_output(layout, PROXY_RESULTS, study, rid)
        if found is None:
            continue
        manifest = storage.read_manifest(found.uri)
        if manifest["inputs"].get("swarm") != swarm_fp:
            stale.append(rid)
            continue
        finals[rid] = manifest["stats"]["metrics"]
        inputs[rid] = found.fingerprint
    target = params.target()
    domains = sorted({m for f in finals.values() for m in f if m.startswith("bpb/")})
    if target == {"macro_bpb": 1.0} and domains and all(all(d in f for d in domains) for f in finals.values()):
        components, component_weights = domains, [1.0 / len(domains)] * len(domains)
    else:
        components, component_weights = list(target), list(target.values())
    usable = [r for r in finals if all(c in finals[r] for c in components)]
    weights = swarm_core.weight_matrix(mixtures, usable, [p.name for p in params.phases], names)[:, :, active]
    y = np.array([[finals[r][c] for c in components] for r in usable], dtype=np.float64).reshape(len(usable), len(components))
    return {"runs": usable, "weights": weights, "targets": y, "components": components, "component_weights": component_weights, "inputs": inputs,
            "active": active, "tokens": group_table["tokens"].to_numpy().astype(np.float64)[active], "mixture_ids": [mixture_of[r] for r in usable],
            "groups": [names[i] for i in active], "missing": [r for r in params.run_ids() if r not in finals and r not in stale], "stale": stale,
            "without_target": sorted(set(finals) - set(usable))}


@study_asset(
    MIXTURE_MODEL,
    study_partitions,
    kinds={"lightgbm", "json"},
    description="Surrogates predicting the study's target from the mixture weights and each group's full-run epochs "
    "(gradient-boosted trees and the log-linear mixing law), k-fold cross-validated against a KL-to-proportional "
    "baseline, and the gates' verdict (runs, replicate noise, fit, baseline).",
)
def mixture_model(context: dg.AssetExecutionContext, marin: MarinResource) -> dg.MaterializeResult:
    study = context.partition_key
    _, params = study_params(marin, study)
    swarm_uri, swarm_fp = current_output(marin, MIXTURE_SWARM, study)
    data = _training_set(marin.layout(), study, params, swarm_uri, swarm_fp)
    if not data["runs"]:
        raise dg.Failure(
            f"study '{study}': {len(data['runs'])} runs have '{target_name(params)}' results for the current swarm "
            f"({len(data['missing'])} have none, {len(data['stale'])} only for an earlier swarm); "
            "nothing to fit: materialize proxy_results partitions"
        )
    fit_params = fit.FitParams(seed=params.seed)

    def build(out: str) -> dict:
        try:
            found = gates.assess(data["weights"], data["targets"], data["runs"], data["mixture_ids"], params, data["tokens"], fit_params,
                                 data["components"], data["component_weights"])
        except MixtureError as exc:
            raise dg.Failure(f"study '{study}': {exc}") from exc
        storage.write_json(storage.join(out, "gate.json"), {"verdict": found.verdict.to_json(), "baseline": found.baseline})
        target = data["targets"] @ np.asarray(data["component_weights"])
        stats = {"runs": len(data["runs"]), "components": data["components"], "gate": found.verdict.to_json(), "baseline": found.baseline, "fitted": found.model is not None}
        if found.model is None:
            return stats
        model = found.model
        fit.save_fit(model, out, {"groups": data["groups"], "phases": [p.name for p in params.phases], "target": params.target(), "runs": data["runs"]})
        predictions = pl.DataFrame(
            {"run_id": data["runs"], "actual": target, **{f"cv_{n}": model.oof[n] for n in fit.SURROGATES},
             **{f"fit_{n}": model.predict(data["weights"], n) for n in fit.SURROGATES}}
        )
        storage.write_parquet(predictions, storage.join(out, "predictions.parquet"))
        return {**stats, "chosen": model.chosen, "cv": model.cv}

    manifest = stages.run_study(
        MIXTURE_MODEL, marin.layout(), study=study, decided_by={"fit": fit_params, "gate": params.gate, "target": params.target()},
        inputs={"swarm": swarm_fp, **{f"run/{r}": fp for r, fp in data["inputs"].items() if r in data["runs"]}}, build=build,
    )
    stats = manifest["stats"]
    verdict = gates.Verdict.from_json(stats["gate"])
    extra: dict = {}
    summary = f"  study {study}: {stats['runs']} runs"
    if stats["fitted"]:
        cv, chosen = stats["cv"], stats["chosen"]
        preds = pl.from_arrow(storage.read_parquet(storage.join(manifest["uri"], "predictions.parquet")))
        picture = mixture_report.predicted_vs_actual_png(
            preds["actual"].to_numpy(), {n: preds[f"cv_{n}"].to_numpy() for n in fit.SURROGATES}, chosen, target_name(params)  # type: ignore[index]
        )
        base = stats["baseline"].get("spearman", float("nan"))
        summary += f", surrogate {chosen}, cross-validated Spearman {cv[chosen]['spearman']:.3f} (KL-only baseline {base:.3f}), R^2 {cv[chosen]['r2']:.3f}, MAE {cv[chosen]['mae']:.4f}"
        extra = {
            "surrogate": chosen, "cv_spearman": float(cv[chosen]["spearman"]), "cv_r2": float(cv[chosen]["r2"]), "cv_mae": float(cv[chosen]["mae"]),
            "baseline_spearman": float(base),
            "cv_scores": markdown_table([{"surrogate": n, **{k: f"{v:.4f}" if isinstance(v, float) else v for k, v in cv[n].items()}} for n in fit.SURROGATES]),
            "predicted_vs_actual": dg.MetadataValue.md(report.markdown_image(picture, "predicted vs actual")),
        }
    noise = verdict.facts.get("noise_sd")
    summary += f"; replicate noise sd {noise:.4f}, spread across mixtures sd {verdict.facts['spread_sd']:.4f}" if noise is not None else "; no replicate runs"
    summary += f"\n  gate: {'passed' if verdict.passed else 'refused: ' + verdict.describe()}"
    return materialized(
        manifest,
        rows=stats["runs"],
        target_metric=target_name(params),
        target_components=len(stats["components"]),
        gate_passed=verdict.passed,
        gate=verdict.describe(),
        replicate_noise_sd=noise,
        runs_without_results=len(data["missing"]),
        runs_with_stale_results=len(data["stale"]),
        runs_without_target=len(data["without_target"]),
        summary=summary,
        **extra,
    )


GATE_CHECK = "mixture_gate"


def _measured_proportional(marin: MarinResource, study: str, params: swarm_core.StudyParams, runs: pl.DataFrame) -> list[float]:
    """The target of every run of the proportional mix (r0000 and its replicates)."""
    values = []
    for rid in runs.filter(pl.col("mixture_id") == runs["mixture_id"][0])["run_id"].to_list():
        found = stages.current_study_output(marin.layout(), PROXY_RESULTS, study, rid)
        metrics = storage.read_manifest(found.uri)["stats"]["metrics"] if found is not None else {}
        if all(m in metrics for m in params.target()):
            values.append(sum(w * metrics[m] for m, w in params.target().items()))
    return values


@study_asset(
    MIXTURE_WEIGHTS,
    study_partitions,
    kinds={"parquet", "json", "yaml"},
    check_specs=[dg.AssetCheckSpec(GATE_CHECK, asset=MIXTURE_WEIGHTS.name, description="the optimized mixture passed every gate (fit, KL baseline, "
                                   "runs, replicate noise, predicted gain); when it fails the study publishes token-proportional weights")],
    description="Optimized sampling weights for one or two phases under the epoch cap, the KL pull to the token-proportional "
    "mix and the mixture block (RegMix top-k by default), published only when the gates pass (token-proportional "
    "otherwise); predicted gain with its bootstrap interval; trainer-ready JSON/YAML.",
)
def mixture_weights(context: dg.AssetExecutionContext, marin: MarinResource) -> dg.MaterializeResult:
    import yaml

    study = context.partition_key
    root, params = study_params(marin, study)
    swarm_uri, swarm_fp = current_output(marin, MIXTURE_SWARM, study)
    model_uri, model_fp = current_output(marin, MIXTURE_MODEL, study)
    model_manifest = storage.read_manifest(model_uri)
    if model_manifest["inputs"].get("swarm") != swarm_fp:
        raise dg.Failure(f"study '{study}': mixture_model was fitted on an earlier swarm; materialize proxy_results and mixture_model again")
    group_table, mixtures, runs = swarm_core.read_swarm(swarm_uri)
    names = group_table["group"].to_list()
    model, meta = fit.load_fit(model_uri, fit.FitParams(seed=params.seed)) if model_manifest["stats"]["fitted"] else (None, {})
    index = {g: i for i, g in enumerate(names)}
    active = [index[g] for g in meta["groups"]] if model is not None else list(np.flatnonzero(group_table["tokens"].to_numpy() > 0))
    tokens = group_table["tokens"].to_numpy().astype(np.float64)[active]
    seeds = swarm_core.weight_matrix(mixtures, meta["runs"], [p.name for p in params.phases], names)[:, :, active] if model is not None else None
    measured_prop = _measured_proportional(marin, study, params, runs)

    def build(out: str) -> dict:
        try:
            published, candidate, verdict, gain = gates.publish(model, gates.Verdict.from_json(model_manifest["stats"]["gate"]), tokens, params, seeds)
        except MixtureError as exc:
            raise dg.Failure(f"study '{study}': {exc}") from exc
        table = fit.weights_table(group_table, published, params, active, candidate)
        storage.write_parquet(table, storage.join(out, "weights.parquet"))
        pool_files = storage.read_json(storage.join(swarm_uri, "pool_files.json"))
        checks = fit.constraint_report(published.weights, tokens, params)
        predicted = {"metric": target_name(params), "optimized": candidate.predicted, "proportional": candidate.proportional_predicted,
                     "surrogate": model.chosen if model is not None else None, "gain": gain}
        trainer = fit.trainer_mixture(table, pool_files, params, {"published": "optimized" if verdict.passed else "proportional", "predicted": predicted, "gate": verdict.describe()})
        storage.write_json(storage.join(out, "mixture.json"), trainer)
        storage.write_bytes(storage.join(out, "mixture.yaml"), yaml.safe_dump(trainer, sort_keys=False).encode())
        validation_core.write_consumer_mixture(root, study, validation_core.consumer_mixture(trainer, trainer, None))  # not validated yet, and says so
        return {"predicted": predicted, "gate": verdict.to_json(), "kl_to_proportional": published.kl, "candidate_kl_to_proportional": candidate.kl,
                "constraints": checks, "vanished_groups": [names[active[g]] for g in published.vanished], "groups_weighted": int((published.weights.sum(axis=0) > 0).sum())}

    manifest = stages.run_study(
        MIXTURE_WEIGHTS, marin.layout(), study=study, decided_by={"study": params},
        inputs={"swarm": swarm_fp, "model": model_fp}, build=build,
    )
    return _weights_result(manifest, study, params, measured_prop)


def _weights_result(manifest: dict, study: str, params: swarm_core.StudyParams, measured_prop: list[float]) -> dg.MaterializeResult:
    stats = manifest["stats"]
    verdict = gates.Verdict.from_json(stats["gate"])
    table = pl.from_arrow(storage.read_parquet(storage.join(manifest["uri"], "weights.parquet")))
    pred, gain = stats["predicted"], stats["predicted"]["gain"]
    fmt4 = lambda v: "" if v is None or not np.isfinite(v) else f"{v:.4f}"  # noqa: E731
    measured = f"{np.mean(measured_prop):.4f} ({len(measured_prop)} seeds)" if measured_prop else ""
    side = [{"mixture": "optimized (candidate)", f"predicted {pred['metric']}": fmt4(pred["optimized"]), "measured": "see mixture_validation",
             "KL to proportional": f"{stats['candidate_kl_to_proportional']:.4f}", "published": "yes" if verdict.passed else "no"},
            {"mixture": "token-proportional", f"predicted {pred['metric']}": fmt4(pred["proportional"]), "measured": measured, "KL to proportional": "0",
             "published": "no" if verdict.passed else "yes"}]
    per_group = table.group_by("group", "topic_label", "band", "tokens", "epochs", "proportional_epochs").agg(
        (pl.col("change").abs() * pl.col("phase_share")).sum().alias("abs_change"),
        (pl.col("change") * pl.col("phase_share")).sum().alias("change"),
        *[pl.col("weight").filter(pl.col("phase") == p.name).first().alias(f"w_{p.name}") for p in params.phases],
        pl.col("proportional_weight").first().alias("w_proportional"),
    )
    changes = per_group.sort("abs_change", descending=True).head(15)
    fmt = lambda rows: [{k: (f"{v:.5f}" if isinstance(v, float) else v) for k, v in r.items()} for r in rows]  # noqa: E731
    picture = mixture_report.weights_grid_png(table, [p.name for p in params.phases])  # type: ignore[arg-type]
    checks = stats["constraints"]
    gain_text = _gain_text(gain) if gain else ""
    summary = (
        f"  study {study}: predicted {pred['metric']} optimized {fmt4(pred['optimized']) or 'n/a'} vs token-proportional {fmt4(pred['proportional']) or 'n/a'}{gain_text}\n"
        f"  published: {'optimized' if verdict.passed else 'token-proportional'} ({'gate passed' if verdict.passed else 'gates refused: ' + ', '.join(r['gate'] for r in verdict.reasons) + '; the mixture_gate check says why'}); "
        f"max epochs {checks['max_epochs_seen']:.2f} (cap {params.max_epochs:g}); {stats['groups_weighted']} groups weighted, "
        f"{len(stats['vanished_groups'])} rounded away in the {params.block_size:,}-sequence block"
    )
    check = dg.AssetCheckResult(
        check_name=GATE_CHECK, passed=verdict.passed, severity=dg.AssetCheckSeverity.ERROR,
        description=("optimized mixture published: " if verdict.passed else "token-proportional published: ") + verdict.describe(),
        metadata={"reasons": markdown_table(verdict.reasons) if verdict.reasons else "none"},
    )
    return materialized(
        manifest,
        rows=table.height,
        check_results=[check],
        published="optimized" if verdict.passed else "token-proportional",
        gate=verdict.describe(),
        predicted_optimized=pred["optimized"] if np.isfinite(pred["optimized"]) else None,  # no fit: nothing predicted
        predicted_proportional=pred["proportional"] if np.isfinite(pred["proportional"]) else None,
        predicted_gain=gain["point"] if gain else None,
        predicted_gain_interval=f"{gain['low']:.4f} .. {gain['high']:.4f} (90%, {gain['refits']} bootstrap refits)" if gain else None,
        measured_proportional=float(np.mean(measured_prop)) if measured_prop else None,
        side_by_side=markdown_table(side),
        surrogate=pred["surrogate"],
        kl_to_proportional=float(stats["kl_to_proportional"]),
        max_epochs_seen=float(checks["max_epochs_seen"]),
        constraints_met=bool(checks["within_epoch_cap"] and checks["rows_sum_to_one"] and checks["block_multiples"] and checks["non_negative"]),
        groups_weighted=stats["groups_weighted"],
        vanished_groups=", ".join(stats["vanished_groups"]) or "none",
        largest_changes=markdown_table(fmt(changes.drop("abs_change").to_dicts())),
        epochs_per_group=markdown_table(fmt(per_group.sort("epochs", descending=True).select("group", "topic_label", "band", "tokens", "epochs", "proportional_epochs").head(20).to_dicts())),
        trainer_json=dg.MetadataValue.path(storage.join(manifest["uri"], "mixture.json")),
        weights_grid=dg.MetadataValue.md(report.markdown_image(picture, "weights per topic and band")),
        summary=summary,
    )


def _gain_text(gain: dict) -> str:
    """The fit's predicted gain beside its refits' interval. The optimizer chose the mixture on the
    fit itself, so refits usually predict less: where the point lies outside, the line says so."""
    outside = ""
    if gain["point"] > gain["high"]:
        outside = "; the fit's own figure lies above it: the fit is optimistic about the mixture it chose"
    elif gain["point"] < gain["low"]:
        outside = "; the fit's own figure lies below it"
    return (f", predicted gain {gain['point']:.4f} (90% interval of that difference over {gain['refits']} bootstrap refits: "
            f"{gain['low']:.4f} .. {gain['high']:.4f}{outside})")
