"""Mixture search as assets: propose proxy mixtures, collect or train proxies, fit, optimize.

``mixture_swarm`` (per study) -> ``proxy_results`` (per study and run) -> ``mixture_model`` (per
study) -> ``mixture_weights`` (per study). Every output lives under ``<root>/mixture/<study>/``,
fingerprinted like the pipeline's other stages, so re-running an unchanged study reuses it.
"""

import hashlib

import dagster as dg
import numpy as np
import polars as pl

from marin_assets.core.mixture import fit, proxy_trainer, results
from marin_assets.core.mixture import swarm as swarm_core
from marin_assets.core.pool import curated as pool_core
from marin_assets.core.pool import groups as mixture
from marin_assets.core.runtime import stages, storage
from marin_assets.core.runtime.stages import StageSpec
from marin_assets.core.specs import MIXTURE_MODEL, MIXTURE_SWARM, MIXTURE_WEIGHTS, PROXY_RESULTS
from marin_assets.core.specs import SAMPLING_GROUPS as SAMPLING_GROUPS_SPEC
from marin_assets.defs import mixture_report, report
from marin_assets.defs.metadata import markdown_table, materialized
from marin_assets.defs.mixture.partitions import RUNS, proxy_run_partitions, study_partitions
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


def _study(marin: MarinResource, study: str) -> tuple[str, swarm_core.StudyParams]:
    root = marin.layout().root
    try:
        return root, swarm_core.load_study(root, study)
    except swarm_core.StudyError as exc:
        raise dg.Failure(str(exc)) from exc


def _current(marin: MarinResource, spec: StageSpec, study: str, run: str | None = None) -> tuple[str, str]:
    found = stages.current_study_output(marin.layout(), spec, study, run)
    if found is None:
        raise dg.Failure(f"study '{study}' has no {spec.study_stage} output{f' for run {run}' if run else ''} yet; materialize {spec.name} for it first")
    return found.uri, found.fingerprint


@study_asset(
    MIXTURE_SWARM,
    study_partitions,
    kinds={"parquet", "json", "yaml"},
    description="Proposed proxy mixtures of a study (RegMix-style around the token-proportional mix), each with its "
    "simulated-epoching truncation per group and a trainer config (JSON and YAML).",
)
def mixture_swarm(context: dg.AssetExecutionContext, marin: MarinResource) -> dg.MaterializeResult:
    study = context.partition_key
    root, params = _study(marin, study)
    try:
        groups_in = stages.current_input(marin.layout(), SAMPLING_GROUPS_SPEC)
    except stages.MissingInput as exc:
        raise dg.Failure(str(exc)) from exc
    groups, _ = mixture.read_sampling_groups(groups_in.uri)
    pool_files = pool_core.read_pool_files(storage.join(groups_in.uri, "pool_files.parquet"))
    results_uri = swarm_core.results_dir(root, study)

    def build(out: str) -> dict:
        try:
            swarm = swarm_core.build_swarm(groups, pool_files, params, results_uri)
        except mixture.MixtureError as exc:
            raise dg.Failure(f"study '{study}': {exc}") from exc
        written = swarm_core.write_swarm(swarm, out, pool_files)
        if params.trainer == "builtin":  # the built-in proxies share one evaluation text
            proxy_trainer.write_evaluation_texts(proxy_trainer.evaluation_texts(pool_files, params.proxy), out)
        return {**swarm.summary, **written}

    manifest = stages.run_study(
        MIXTURE_SWARM, marin.layout(), study=study, decided_by=params, inputs={SAMPLING_GROUPS_SPEC.name: groups_in.fingerprint}, build=build
    )
    known = set(context.instance.get_dynamic_partitions(RUNS))
    new_runs = [r for r in params.run_ids() if r not in known]
    if new_runs:
        context.instance.add_dynamic_partitions(RUNS, new_runs)
    stats = manifest["stats"]
    group_table, mixtures, runs = swarm_core.read_swarm(manifest["uri"])
    zero = group_table.filter(pl.col("zero_sequences")).select("group", "topic_label", "tokens", "sequences", "proxy_tokens", "proxy_sequences")
    summary = (
        f"  study {study}: {params.n_runs} proxy runs over {stats['groups_with_tokens']} groups, {len(params.phases)} phase(s), "
        f"proxy/target {stats['proxy_to_target']:.3g}; {stats['groups_zero_sequences_in_proxy']} groups shrink to 0 sequences in a proxy"
    )
    return materialized(
        manifest,
        rows=mixtures.height,
        runs=params.n_runs,
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
    root, params = _study(marin, study)
    if run not in params.run_ids():
        raise dg.Failure(f"study '{study}' has {params.n_runs} runs (r0000..{params.run_ids()[-1]}); {run} is not one of them")
    swarm_uri, swarm_fp = _current(marin, MIXTURE_SWARM, study)
    config = swarm_core.read_config(swarm_uri, run)
    folder = swarm_core.results_dir(root, study)
    try:
        found = results.read_results(folder)
    except results.ResultsError as exc:
        raise dg.Failure(str(exc)) from exc
    mine = results.rows_for_run(found, run, config["mixture_id"])
    if mine.rows.height:
        kind = "external"
        digest = hashlib.sha256(mine.rows.drop("file").write_csv().encode()).hexdigest()[:16]
    elif params.trainer == "builtin":
        kind, digest = "builtin", ""
    else:
        raise dg.Failure(
            f"no results for run {run} (mixture {config['mixture_id']}) of study '{study}' in {folder}; the external trainer "
            f"writes JSONL or Parquet rows with {list(swarm_core.RESULT_COLUMNS)} there (README 'Choosing the mixture')"
        )

    def build(out: str) -> dict:
        if kind == "external":
            rows = mine.rows
            extra: dict = {}
        else:
            eval_texts = proxy_trainer.read_evaluation_texts(swarm_uri)
            if eval_texts is None:
                eval_texts = proxy_trainer.evaluation_texts(storage.read_json(storage.join(swarm_uri, "pool_files.json")), params.proxy)
            trained = proxy_trainer.train_proxy(config, eval_texts, params.proxy)
            rows = pl.DataFrame(trained["rows"], schema=results.RESULT_SCHEMA).with_columns(pl.lit("builtin").alias("file"))
            extra = {"train_bytes": trained["train_bytes"], "groups_trained": trained["groups_trained"], "groups_without_proxy_tokens": trained["groups_without_proxy_tokens"]}
        storage.write_parquet(rows, storage.join(out, "results.parquet"))
        return {"source": kind, "rows": rows.height, "metrics": results.final_metrics(rows), **extra}

    proxy_params = {"trainer": kind, "proxy": params.proxy if kind == "builtin" else None}
    manifest = stages.run_study(
        PROXY_RESULTS, marin.layout(), study=study, run=run, decided_by=proxy_params, inputs={"swarm": swarm_fp, "results": digest}, build=build
    )
    stats = manifest["stats"]
    metrics = stats["metrics"]
    target = metrics.get(params.target_metric)
    return materialized(
        manifest,
        rows=stats["rows"],
        study=study,
        run=run,
        mixture_id=config["mixture_id"],
        source=stats["source"],
        target_metric=params.target_metric,
        target_value=float(target) if target is not None else None,
        metrics=markdown_table([{"metric": m, "value": f"{v:.4f}"} for m, v in sorted(metrics.items())]),
        bad_result_rows=found.bad_rows + mine.bad_rows,
        bad_result_examples="\n".join(found.bad_examples + mine.bad_examples) or None,
        train_bytes=stats.get("train_bytes"),
        groups_without_proxy_tokens=", ".join(stats.get("groups_without_proxy_tokens") or []) or None,
    )


def _training_set(layout: storage.Layout, study: str, params: swarm_core.StudyParams, swarm_uri: str, swarm_fp: str) -> dict:
    """Weights and target metrics of every run that has results for the current swarm; runs
    without results, or with results of an earlier swarm (stale), are counted, never used."""
    group_table, mixtures, _ = swarm_core.read_swarm(swarm_uri)
    active = np.flatnonzero(group_table["tokens"].to_numpy() > 0)
    names = group_table["group"].to_list()
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
    target = params.target_metric
    domains = sorted({m for f in finals.values() for m in f if m.startswith("bpb/")})
    components = domains if target == "macro_bpb" and domains and all(all(d in f for d in domains) for f in finals.values()) else [target]
    usable = [r for r in finals if all(c in finals[r] for c in components)]
    weights = swarm_core.weight_matrix(mixtures, usable, [p.name for p in params.phases], names)[:, :, active]
    y = np.array([[finals[r][c] for c in components] for r in usable], dtype=np.float64).reshape(len(usable), len(components))
    return {"runs": usable, "weights": weights, "targets": y, "components": components, "inputs": inputs, "active": active,
            "groups": [names[i] for i in active], "missing": [r for r in params.run_ids() if r not in finals and r not in stale], "stale": stale, "without_target": sorted(set(finals) - set(usable)),
            "actual": {r: finals[r].get(target) for r in usable}}


@study_asset(
    MIXTURE_MODEL,
    study_partitions,
    kinds={"lightgbm", "json"},
    description="Surrogates predicting the study's target metric from the mixture weights (gradient-boosted trees and "
    "the log-linear mixing law), with k-fold cross-validated Spearman, R^2 and MAE.",
)
def mixture_model(context: dg.AssetExecutionContext, marin: MarinResource) -> dg.MaterializeResult:
    study = context.partition_key
    _, params = _study(marin, study)
    swarm_uri, swarm_fp = _current(marin, MIXTURE_SWARM, study)
    data = _training_set(marin.layout(), study, params, swarm_uri, swarm_fp)
    if len(data["runs"]) < 3:
        raise dg.Failure(
            f"study '{study}': {len(data['runs'])} runs have '{params.target_metric}' results for the current swarm "
            f"({len(data['missing'])} have none, {len(data['stale'])} only for an earlier swarm); "
            "a fit needs at least 3: materialize more proxy_results partitions"
        )
    fit_params = fit.FitParams(seed=params.seed)

    def build(out: str) -> dict:
        model = fit.fit_surrogates(data["weights"], data["targets"], fit_params, data["components"])
        fit.save_fit(model, out, {"groups": data["groups"], "phases": [p.name for p in params.phases], "target_metric": params.target_metric, "runs": data["runs"]})
        predictions = pl.DataFrame(
            {"run_id": data["runs"], "actual": data["targets"].mean(axis=1), **{f"cv_{n}": model.oof[n] for n in fit.SURROGATES},
             **{f"fit_{n}": model.predict(data["weights"], n) for n in fit.SURROGATES}}
        )
        storage.write_parquet(predictions, storage.join(out, "predictions.parquet"))
        return {"chosen": model.chosen, "cv": model.cv, "runs": len(data["runs"]), "components": data["components"]}

    manifest = stages.run_study(
        MIXTURE_MODEL, marin.layout(), study=study, decided_by=fit_params,
        inputs={"swarm": swarm_fp, **{f"run/{r}": fp for r, fp in data["inputs"].items() if r in data["runs"]}}, build=build,
    )
    stats = manifest["stats"]
    cv, chosen = stats["cv"], stats["chosen"]
    preds = pl.from_arrow(storage.read_parquet(storage.join(manifest["uri"], "predictions.parquet")))
    picture = mixture_report.predicted_vs_actual_png(
        preds["actual"].to_numpy(), {n: preds[f"cv_{n}"].to_numpy() for n in fit.SURROGATES}, chosen, params.target_metric  # type: ignore[index]
    )
    summary = f"  study {study}: {stats['runs']} runs, surrogate {chosen}, cross-validated Spearman {cv[chosen]['spearman']:.3f}, R^2 {cv[chosen]['r2']:.3f}, MAE {cv[chosen]['mae']:.4f}"
    return materialized(
        manifest,
        rows=stats["runs"],
        target_metric=params.target_metric,
        target_components=len(stats["components"]),
        surrogate=chosen,
        cv_spearman=float(cv[chosen]["spearman"]),
        cv_r2=float(cv[chosen]["r2"]),
        cv_mae=float(cv[chosen]["mae"]),
        cv_scores=markdown_table([{"surrogate": n, **{k: f"{v:.4f}" if isinstance(v, float) else v for k, v in cv[n].items()}} for n in fit.SURROGATES]),
        runs_without_results=len(data["missing"]),
        runs_with_stale_results=len(data["stale"]),
        runs_without_target=len(data["without_target"]),
        predicted_vs_actual=dg.MetadataValue.md(report.markdown_image(picture, "predicted vs actual")),
        summary=summary,
    )


@study_asset(
    MIXTURE_WEIGHTS,
    study_partitions,
    kinds={"parquet", "json", "yaml"},
    description="Optimized sampling weights for one or two phases under the epoch cap, the KL pull to the "
    "token-proportional mix and the mixture block, against token-proportional sampling; trainer-ready JSON/YAML.",
)
def mixture_weights(context: dg.AssetExecutionContext, marin: MarinResource) -> dg.MaterializeResult:
    import yaml

    study = context.partition_key
    _, params = _study(marin, study)
    swarm_uri, swarm_fp = _current(marin, MIXTURE_SWARM, study)
    model_uri, model_fp = _current(marin, MIXTURE_MODEL, study)
    if storage.read_manifest(model_uri)["inputs"].get("swarm") != swarm_fp:
        raise dg.Failure(f"study '{study}': mixture_model was fitted on an earlier swarm; materialize proxy_results and mixture_model again")
    model, meta = fit.load_fit(model_uri, fit.FitParams(seed=params.seed))
    group_table, mixtures, _ = swarm_core.read_swarm(swarm_uri)
    index = {g: i for i, g in enumerate(group_table["group"].to_list())}
    active = [index[g] for g in meta["groups"]]
    tokens = group_table["tokens"].to_numpy().astype(np.float64)[active]
    opt_params = fit.OptimizeParams(candidates=params.search_candidates, rounds=params.search_rounds, seed=params.seed)
    seeds = swarm_core.weight_matrix(mixtures, meta["runs"], [p.name for p in params.phases], group_table["group"].to_list())[:, :, active]
    actual_prop = None
    found = stages.current_study_output(marin.layout(), PROXY_RESULTS, study, "r0000")
    if found is not None:
        actual_prop = storage.read_manifest(found.uri)["stats"]["metrics"].get(params.target_metric)

    def build(out: str) -> dict:
        try:
            opt = fit.optimize_mixture(lambda w: model.predict(w), tokens, params, opt_params, seeds=seeds)
        except mixture.MixtureError as exc:
            raise dg.Failure(f"study '{study}': {exc}") from exc
        table = fit.weights_table(group_table, opt, params, active)
        storage.write_parquet(table, storage.join(out, "weights.parquet"))
        pool_files = storage.read_json(storage.join(swarm_uri, "pool_files.json"))
        checks = fit.constraint_report(opt.weights, tokens, params)
        predicted = {"metric": params.target_metric, "optimized": opt.predicted, "proportional": opt.proportional_predicted, "surrogate": model.chosen}
        trainer = fit.trainer_mixture(table, pool_files, params, {"predicted": predicted})
        storage.write_json(storage.join(out, "mixture.json"), trainer)
        storage.write_bytes(storage.join(out, "mixture.yaml"), yaml.safe_dump(trainer, sort_keys=False).encode())
        names = group_table["group"].to_list()
        return {"predicted": predicted, "kl_to_proportional": opt.kl, "objective": opt.objective, "constraints": checks,
                "vanished_groups": [names[active[g]] for g in opt.vanished], "groups_weighted": int((opt.weights.sum(axis=0) > 0).sum())}

    manifest = stages.run_study(
        MIXTURE_WEIGHTS, marin.layout(), study=study, decided_by={"optimize": opt_params, "study": params},
        inputs={"swarm": swarm_fp, "model": model_fp}, build=build,
    )
    stats = manifest["stats"]
    table = pl.from_arrow(storage.read_parquet(storage.join(manifest["uri"], "weights.parquet")))
    pred = stats["predicted"]
    side = [{"mixture": "optimized", f"predicted {pred['metric']}": f"{pred['optimized']:.4f}", "measured": "", "KL to proportional": f"{stats['kl_to_proportional']:.4f}"},
            {"mixture": "token-proportional", f"predicted {pred['metric']}": f"{pred['proportional']:.4f}", "measured": f"{actual_prop:.4f}" if actual_prop is not None else "", "KL to proportional": "0"}]
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
    summary = (
        f"  study {study}: predicted {pred['metric']} optimized {pred['optimized']:.4f} vs token-proportional {pred['proportional']:.4f} "
        f"({model.chosen}); max epochs {checks['max_epochs_seen']:.2f} (cap {params.max_epochs:g}); {stats['groups_weighted']} groups weighted, "
        f"{len(stats['vanished_groups'])} rounded away in the {params.block_size:,}-sequence block"
    )
    return materialized(
        manifest,
        rows=table.height,
        predicted_optimized=float(pred["optimized"]),
        predicted_proportional=float(pred["proportional"]),
        measured_proportional=float(actual_prop) if actual_prop is not None else None,
        side_by_side=markdown_table(side),
        surrogate=model.chosen,
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

