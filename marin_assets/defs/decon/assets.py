"""Decontamination: the eval n-gram and embedding indexes, boilerplate drop sets, per-document contamination."""

import dataclasses
import hashlib

import dagster as dg

from marin_assets.core.decon import eval_sources
from marin_assets.core.decon import rules as decon
from marin_assets.core.decon import semantic
from marin_assets.core.runtime import stages, storage
from marin_assets.core.specs import BOILERPLATE_NGRAMS, CONTAMINATION, EMBEDDINGS, EVAL_EMBEDDINGS, EVAL_NGRAMS, NORMALIZED
from marin_assets.defs.metadata import markdown_table, materialized
from marin_assets.defs.resources import CurationResource, EncoderResource, MarinResource, source_or_fail
from marin_assets.defs.stage_assets import stage_asset
from marin_assets.defs.ray import step_log

GLOBAL_DROP = "global_drop.parquet"
GLOBAL_COVERAGE_DROP = "global_coverage_drop.parquet"


@stage_asset(
    EVAL_NGRAMS,
    kinds={"numpy"},
    description="Exact sorted index of the pinned eval sets' 13-gram features (both rules), with attribution to eval "
    "set and row. Refuses to build when a mandatory set is missing or not pinned by the lock.",
    check_specs=[dg.AssetCheckSpec("eval_sets_available", asset=EVAL_NGRAMS.name,
                                   description="every best-effort eval set was fetched and read (non-blocking)")],
)
def eval_ngrams(context: dg.AssetExecutionContext, marin: MarinResource) -> dg.MaterializeResult:
    layout = marin.layout()
    registry = marin.evals()
    params = decon.DeconParams()
    skipped: list[dict] = []
    inputs = {"registry": stages.StageInput(registry.lock_path or "packaged", eval_sources.registry_digest(registry))}

    def build(out: str) -> dict:
        rows = eval_sources.registry_rows(
            registry,
            lambda eval_set: eval_sources.fetch_eval_set(eval_set, registry, layout, marin.provider_access()),
            on_skip=lambda eval_set, exc: skipped.append({"eval set": eval_set.name, "reason": str(exc)[:200]}),
        )
        stats = decon.build_eval_index(rows, out, params, registry.expected_rows())
        return {**stats, "unavailable_sets": skipped}

    manifest = stages.run_global(
        EVAL_NGRAMS,
        layout,
        inputs=inputs,
        params=params.rule(),
        extra_fingerprint={"hash": decon.HASH_SCHEME},
        build=build,
    )
    stats = manifest["stats"]
    skipped = stats.get("unavailable_sets", skipped)
    for row in skipped:
        context.log.warning(f"best-effort eval set skipped: {row['eval set']}: {row['reason']}")
    check = dg.AssetCheckResult(
        check_name="eval_sets_available",
        passed=not skipped,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"unavailable": len(skipped),
                  "reasons": "; ".join(f"{r['eval set']}: {r['reason']}" for r in skipped)[:4000] or "none"},
    )
    return materialized(
        manifest,
        check_results=[check],
        rows=stats.get("rows") if isinstance(stats.get("rows"), int) else None,
        counters={k: v for k, v in stats.items() if isinstance(v, (int, float))},
        coverage_ngrams=stats.get("coverage", {}).get("ngrams"),
        coverage_field_units=stats.get("coverage", {}).get("field_units"),
        eval_sets=len(registry.sets),
        skipped_sets=markdown_table(skipped) if skipped else None,
    )


def eval_embeddings_key(encoder, params: semantic.SemanticParams) -> tuple[dict, dict]:
    """(parameters, extras) the eval embedding index is fingerprinted by beside its input, the
    registry's digest (the lock): the model and what decides the units; thresholds and policy do not."""
    return ({"min_field_words": params.min_field_words, "max_term_units": params.max_term_units,
             "max_term_fraction": params.max_term_fraction, "code_shingle_tokens": params.code_shingle_tokens},
            {"model": encoder.model, "revision": encoder.revision, "max_tokens": encoder.max_tokens})


@stage_asset(
    EVAL_EMBEDDINGS,
    kinds={"faiss", "pytorch"},
    description="Every eval row and long field encoded with the pool's embedding model (exact inner-product search), "
    "with each unit's distinctive words and code shapes; rebuilt only when the eval lock or the model changes.",
)
def eval_embeddings(context: dg.AssetExecutionContext, marin: MarinResource, encoder: EncoderResource) -> dg.MaterializeResult:
    layout = marin.layout()
    registry = marin.evals()
    params, model = semantic.SemanticParams(), encoder.params()
    fingerprint_params, extra = eval_embeddings_key(model, params)

    def build(out: str) -> dict:
        rows = eval_sources.registry_rows(
            registry, lambda eval_set: eval_sources.fetch_eval_set(eval_set, registry, layout, marin.provider_access()),
            on_skip=lambda eval_set, exc: context.log.warning(f"best-effort eval set skipped: {eval_set.name}: {exc}"))
        return semantic.build_eval_embeddings(rows, out, model, params)

    manifest = stages.run_global(
        EVAL_EMBEDDINGS,
        layout,
        inputs={"registry": stages.StageInput(registry.lock_path or "packaged", eval_sources.registry_digest(registry))},
        params=fingerprint_params,
        extra_fingerprint=extra,
        build=build,
    )
    stats = manifest["stats"]
    calibrated = params.threshold(model.model)
    return materialized(
        manifest,
        rows=stats.get("rows"),
        units=stats.get("units"),
        model=stats.get("model", ""),
        calibrated_thresholds=f"document score {calibrated[0]}, window cosine {calibrated[1]}" if calibrated
        else f"none for {model.model}: the semantic tier flags nothing until SemanticParams.thresholds has this model",
        units_by_eval=markdown_table([{"eval set": k, "units": v} for k, v in stats.get("units_by_set", {}).items()]),
    )


def _file_digest(uri: str) -> str:
    return hashlib.sha256(storage.read_bytes(uri)).hexdigest()[:16]


def drop_sets(drops_uri: str, source: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The drop sets a source's contamination reads: its own and the global one, for each rule."""
    own = (storage.join(drops_uri, source, "drop.parquet"), storage.join(drops_uri, GLOBAL_DROP))
    coverage = (storage.join(drops_uri, source, "coverage_drop.parquet"), storage.join(drops_uri, GLOBAL_COVERAGE_DROP))
    return tuple(u for u in own if storage.exists(u)), tuple(u for u in coverage if storage.exists(u))


def drop_set_digests(drops_uri: str, source: str) -> list[str]:
    """What a source's contamination reads of ``boilerplate_ngrams``: its drop sets' bytes."""
    marin, coverage = drop_sets(drops_uri, source)
    return [_file_digest(u) for u in marin + coverage]


@stage_asset(
    BOILERPLATE_NGRAMS,
    kinds={"parquet"},
    description="Eval n-grams common in the corpus (per source: >= max(5, 0.5%) of its first 5,000 documents; "
    "global: >= 50 documents in >= 3 sources), left out of both numerator and denominator.",
)
def boilerplate_ngrams(context: dg.AssetExecutionContext, marin: MarinResource) -> dg.MaterializeResult:
    layout = marin.layout()
    index = stages.current_input(layout, EVAL_NGRAMS)
    found, missing = stages.current_inputs(layout, NORMALIZED, marin.catalog().names)
    if not found:
        raise dg.Failure("no source has a normalized output yet; materialize normalized for some partitions first")
    params = decon.DeconParams(index_uri=index.uri, index_cache_dir=marin.resolved("decon_cache_dir") or "")

    def build(out: str) -> dict:
        per_source = {}
        for name, inp in sorted(found.items()):
            freq = storage.join(out, name, "frequencies.parquet")
            decon.eval_ngram_frequencies(storage.list_shards(inp.uri), freq, params)
            per_source[name] = decon.source_drop_set(freq, storage.join(out, name, "drop.parquet"), params)
            cov = storage.join(out, name, "coverage_frequencies.parquet")
            decon.eval_ngram_frequencies(storage.list_shards(inp.uri), cov, params, rule="coverage")
            coverage = decon.source_drop_set(cov, storage.join(out, name, "coverage_drop.parquet"), params)
            per_source[name]["coverage_dropped_ngrams"] = coverage["dropped_ngrams"]
        overall = decon.global_drop_set(
            [storage.join(out, n, "frequencies.parquet") for n in sorted(found)], storage.join(out, GLOBAL_DROP), params
        )
        overall_coverage = decon.global_drop_set(
            [storage.join(out, n, "coverage_frequencies.parquet") for n in sorted(found)],
            storage.join(out, GLOBAL_COVERAGE_DROP), params,
        )
        return {"per_source": per_source, "global": overall, "global_coverage": overall_coverage}

    manifest = stages.run_global(
        BOILERPLATE_NGRAMS,
        layout,
        inputs={EVAL_NGRAMS.name: index, **found},
        params=params.rule(),
        build=build,
    )
    stats = manifest["stats"]
    rows = [
        {"source": s, "dropped n-grams (marin)": v["dropped_ngrams"],
         "dropped n-grams (coverage)": v.get("coverage_dropped_ngrams", 0), "head documents": v["head_documents"]}
        for s, v in stats["per_source"].items()
    ]
    slices = {name: storage.fingerprint("drop_sets", drop_set_digests(manifest["uri"], name)) for name in sorted(found)}
    return materialized(
        manifest,
        rows=None,
        per_source_digest=dg.MetadataValue.json(slices),
        decided=slices,
        global_dropped_ngrams=stats["global"]["dropped_ngrams"],
        global_coverage_dropped_ngrams=stats.get("global_coverage", {}).get("dropped_ngrams", 0),
        per_source=markdown_table(rows),
        sources_without_normalized=len(missing),
    )


@stage_asset(
    CONTAMINATION,
    kinds={"parquet"},
    description="Per document: contaminated, max overlap, matched eval sets and rows (co-partitioned evidence), and the "
    "semantic tier's flag, nearest eval row and cosine (dropped too under MARIN_SEMANTIC_POLICY=drop).",
)
def contamination(context: dg.AssetExecutionContext, marin: MarinResource, encoder: EncoderResource,
                  curation: CurationResource) -> dg.MaterializeResult:
    source = source_or_fail(marin, context.partition_key)
    layout = marin.layout()
    index = stages.current_input(layout, EVAL_NGRAMS)
    drops = stages.current_input(layout, BOILERPLATE_NGRAMS)
    drop_uris, coverage_uris = drop_sets(drops.uri, source.name)
    if storage.join(drops.uri, source.name, "drop.parquet") not in drop_uris:
        raise dg.Failure(
            f"boilerplate_ngrams has no drop set for '{source.name}' (it was built before this source was normalized); re-materialize boilerplate_ngrams"
        )
    tier = semantic.SemanticParams(policy=curation.resolved("semantic_policy") or "flag")
    tier.check()
    vectors = stages.current_input(layout, EVAL_EMBEDDINGS)
    params = decon.DeconParams(index_uri=index.uri, drop_set_uris=drop_uris, coverage_drop_set_uris=coverage_uris,
                                index_cache_dir=marin.resolved("decon_cache_dir") or "",
                                semantic=tier, semantic_index_uri=vectors.uri, encoder=encoder.params())
    manifest = stages.run_shards(
        CONTAMINATION,
        layout,
        source=source.name,
        inputs=[stages.current_input(layout, NORMALIZED, source.name), stages.current_input(layout, EMBEDDINGS, source.name)],
        shard_fn=decon.contamination_shard,
        params=params,
        fingerprint_params=params.rule(),
        extra_fingerprint={"index": index.fingerprint,
                           "drop_sets": drop_set_digests(drops.uri, source.name),
                           "semantic": {"index": vectors.fingerprint, **dataclasses.asdict(tier)}},
        runner=marin.runner(),
        progress=step_log(context),
    )
    summary = decon.summarize_contamination(manifest["per_shard"])
    rows = int(summary["documents"])
    flagged = summary["flagged_by_eval"]
    samples = [
        {
            "document": s["id"][:10],
            "eval rows": ", ".join(s["matched_rows"]),
            "overlap": s["max_overlap"],
            "excerpt": s["excerpt"][:200],
            "eval excerpt": (s["eval_excerpts"] or [""])[0][:160],
        }
        for s in summary["flagged_sample"]
    ]
    only = [
        {"only by": rule, "document": s["id"][:10], "eval rows": ", ".join(s["matched_rows"]),
         "excerpt": s["excerpt"][:200]}
        for rule in ("marin", "coverage") for s in summary[f"only_{rule}_sample"]
    ]
    return materialized(
        manifest,
        rows=rows,
        counters={k: v for k, v in summary.items() if isinstance(v, (int, float))},
        flagged_by_eval=markdown_table([{"eval set": k, "documents": v} for k, v in sorted(flagged.items())]),
        flagged_sample=markdown_table(samples),
        flagged_per_rule=markdown_table([{"rule": r, "documents": summary.get(f"flagged_{r}", 0),
                                          "only this rule": summary.get(f"flagged_only_{r}", 0)}
                                         for r in ("coverage", "marin")]),
        flagged_by_one_rule_only=markdown_table(only) if only else None,
        semantic_policy=tier.policy,
        semantic_by_eval=markdown_table([{"eval set": k, "documents": v} for k, v in summary["semantic_by_eval"].items()])
        if summary["semantic_by_eval"] else "none",
        summary=f"  {source.name}: {summary['contaminated']} of {rows} documents flagged"
        + (f" ({', '.join(f'{k}: {v}' for k, v in sorted(flagged.items()))})" if flagged else "")
        + f"; by rule: coverage {summary.get('flagged_coverage', 0)}, marin {summary.get('flagged_marin', 0)}"
        + f"; semantic ({tier.policy}): {summary.get('flagged_semantic', 0)}"
        + (f" ({', '.join(f'{k}: {v}' for k, v in summary['semantic_by_eval'].items())})" if summary["semantic_by_eval"] else ""),
    )
