"""Global deduplication: exact and fuzzy decisions (the per-source MinHash buckets are generated from their spec)."""

import dagster as dg

from marin_assets.catalog.sources import DEFAULT_MAX_DUP_REMOVAL
from marin_assets.core.dedup import decisions as dedup
from marin_assets.core.dedup.exact import find_exact_duplicates
from marin_assets.core.dedup.fuzzy import find_fuzzy_duplicates
from marin_assets.core.runtime import stages, storage
from marin_assets.core.specs import EXACT_DUPLICATES, FUZZY_DUPLICATES, MINHASH_BUCKETS, NORMALIZED
from marin_assets.defs.metadata import markdown_table, materialized
from marin_assets.defs.resources import DedupResource, MarinResource
from marin_assets.defs.stage_assets import stage_asset



def _normalized_inputs(marin: MarinResource, context) -> dict[str, stages.StageInput]:
    found, missing = stages.current_inputs(marin.layout(), NORMALIZED, marin.catalog().names)
    if missing:
        context.log.info(f"{len(missing)} catalog sources have no normalized output yet and are not part of this decision")
    if not found:
        raise dg.Failure("no source has a normalized output yet; materialize normalized for some partitions first")
    return found


def _removal_rows(stats: dict, docs: dict[str, int], chars: dict[str, int]) -> list[dict]:
    per_source = stats.get("removed_per_source", {})
    return [
        {
            "source": s,
            "documents": docs.get(s, 0),
            "removed": n,
            "ratio": f"{(n / docs[s]) if docs.get(s) else 0:.1%}",
            "removed_tokens_est": int(chars.get(s, 0) / stages.CHARS_PER_TOKEN),
        }
        for s, n in sorted(per_source.items())
    ]


def removal_limits(marin: MarinResource) -> dict[str, float]:
    """Each catalog source's removal limit (``max_dup_removal``)."""
    return {s.name: s.max_dup_removal for s in marin.catalog()}


def removal_check(check_name: str, asset: str, rows: list[dict], limits: dict[str, float]) -> dg.AssetCheckResult:
    """Fails while a source would lose more than its ``max_dup_removal`` (catalog; default 50%)
    of its documents, naming each such source, its share and how to accept it."""
    limit_of = lambda s: limits.get(s, DEFAULT_MAX_DUP_REMOVAL)
    over = [r for r in rows if r["documents"] and r["removed"] / r["documents"] > limit_of(r["source"])]
    raised = {s: v for s, v in sorted(limits.items()) if v != DEFAULT_MAX_DUP_REMOVAL}
    if over:
        named = "; ".join(f"{r['source']} would lose {r['removed']:,} of {r['documents']:,} documents ({r['ratio']}, its limit {limit_of(r['source']):.0%})" for r in over)
        description = (f"{named}. If a source is legitimately mostly duplicates, set max_dup_removal (a share from 0 to 1, "
                       f"e.g. max_dup_removal = 0.9) on its [[source]] entry in the catalog and re-run this check; otherwise look at its removals")  # fmt: skip
    else:
        description = f"no source loses more than its limit ({DEFAULT_MAX_DUP_REMOVAL:.0%} unless its catalog entry sets max_dup_removal)"
    return dg.AssetCheckResult(
        check_name=check_name,
        asset_key=asset,
        passed=not over,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={
            "sources_over_limit": markdown_table([{"source": r["source"], "removed": r["ratio"], "limit": f"{limit_of(r['source']):.0%}"} for r in over]),
            "default_limit": DEFAULT_MAX_DUP_REMOVAL,
            "raised_limits": dg.MetadataValue.json(raised),
        },
        description=description,
    )


def _summary(rows: list[dict]) -> str:
    return "\n".join(f"  {r['source']:28s} removed {r['removed']:>6} of {r['documents']:>7} ({r['ratio']})" for r in rows)


@stage_asset(
    EXACT_DUPLICATES,
    kinds={"parquet"},
    check_specs=[dg.AssetCheckSpec("removal_ratio", asset=EXACT_DUPLICATES.name, blocking=True)],
    description="Ids present in several sources; every source but the keeper (first in catalog-name order) lists them as removed.",
)
def exact_duplicates(context: dg.AssetExecutionContext, marin: MarinResource) -> dg.MaterializeResult:
    layout = marin.layout()
    inputs = _normalized_inputs(marin, context)
    params = dedup.ExactDedupParams()
    shards = {s: storage.list_shards(i.uri) for s, i in inputs.items()}
    manifest = stages.run_global(
        EXACT_DUPLICATES,
        layout,
        inputs=inputs,
        params=params,
        build=lambda out: find_exact_duplicates(shards, out, params, runner=marin.runner()),
    )
    stats = manifest["stats"]
    docs = stats.get("docs_per_source") or {s: sum(storage.parquet_num_rows(u) for u in us) for s, us in shards.items()}  # footers: an output from before the maps counted them
    chars = stats.get("removed_chars_per_source", {})
    rows = _removal_rows(stats, docs, chars)
    check = removal_check("removal_ratio", EXACT_DUPLICATES.name, rows, removal_limits(marin))
    if not check.passed:
        context.log.warning(f"exact dedup: {check.description}")
    return materialized(
        manifest,
        rows=int(stats.get("removed", 0)),
        counters={k: v for k, v in stats.items() if isinstance(v, (int, float))},
        sources=len(inputs),
        removed_per_source=markdown_table(rows),
        summary=_summary(rows),
        per_source_digest=dg.MetadataValue.json(stats.get("removed_ids_digest", {})),
        decided=stats.get("removed_ids_digest"),
        check_results=[check],
    )


@stage_asset(
    FUZZY_DUPLICATES,
    kinds={"parquet"},
    check_specs=[dg.AssetCheckSpec("removal_ratio", asset=FUZZY_DUPLICATES.name, blocking=True)],
    description="Verified near-duplicates across all sources (word 3-gram containment >= 0.75 in a retained, at least as long copy).",
)
def fuzzy_duplicates(context: dg.AssetExecutionContext, marin: MarinResource, fuzzy_dedup: DedupResource) -> dg.MaterializeResult:
    layout = marin.layout()
    catalog = marin.catalog()
    buckets, missing = stages.current_inputs(layout, MINHASH_BUCKETS, catalog.names)
    if not buckets:
        raise dg.Failure("no source has minhash_buckets yet; materialize minhash_buckets for some partitions first")
    norm = {s: stages.current_input(layout, NORMALIZED, s) for s in buckets}
    exempt = sorted(s.name for s in catalog if s.fuzzy_exempt and s.name in buckets)
    params = fuzzy_dedup.fuzzy_rule()
    group = FUZZY_DUPLICATES.group_uri(layout)
    previous = storage.read_current(group)  # its verdicts are reused where clusters did not change
    listed = {s: stages.shards_of(i) for s, i in buckets.items()}  # the shards and their rows, from each map's manifest
    manifest = stages.run_global(
        FUZZY_DUPLICATES,
        layout,
        inputs=buckets,
        params=params,
        extra_fingerprint={"exempt": exempt},
        build=lambda out: find_fuzzy_duplicates(
            {s: names or storage.list_shards(buckets[s].uri) for s, (names, _) in listed.items()},
            {s: storage.list_shards(i.uri) for s, i in norm.items()},
            exempt,
            out,
            params,
            scale=fuzzy_dedup.fuzzy_scale(),
            runner=marin.runner(),
            cache_uri=storage.join(group, "_cache"),
            fingerprints={s: i.fingerprint for s, i in buckets.items()},
            previous_uri=previous["uri"] if previous else None,
            bucket_rows={s: [int(c["docs"]) for c in counters] for s, (_, counters) in listed.items() if counters and all("docs" in c for c in counters)},
        ),
    )
    stats = manifest["stats"]
    docs = stats.get("docs_per_source", {})
    chars = stats.get("removed_chars_per_source", {})
    rows = _removal_rows(stats, docs, chars)
    check = removal_check("removal_ratio", FUZZY_DUPLICATES.name, rows, removal_limits(marin))
    if not check.passed:
        context.log.warning(f"fuzzy dedup: {check.description}")
    examples = [
        {
            "removed": f"{e['source']}:{e['id'][:8]}",
            "kept": f"{e['representative_source']}:{e['representative_id'][:8]}",
            "containment": e["containment"],
            "jaccard": e["jaccard"],
            "excerpt": e["excerpt"][:160],
        }
        for e in stats.get("examples", [])
    ]
    return materialized(
        manifest,
        rows=int(stats.get("removed", 0)),
        counters={k: v for k, v in stats.items() if isinstance(v, (int, float))},
        sources=len(buckets),
        sources_without_buckets=len(missing),
        exempt_sources=", ".join(exempt) or "none",
        removed_per_source=markdown_table(rows),
        cluster_size_histogram=markdown_table(
            [{"size": k, "clusters": v} for k, v in stats.get("cluster_size_histogram", {}).items()]
        ),
        example_pairs=markdown_table(examples),
        summary=_summary(rows),
        per_source_digest=dg.MetadataValue.json(stats.get("removed_ids_digest", {})),
        decided=stats.get("removed_ids_digest"),
        check_results=[check],
    )
