"""The curated pool per source and the 200 sampling groups."""

import dataclasses
from collections import Counter

import dagster as dg

from marin_assets.core.dedup import decisions as dedup
from marin_assets.core.embed import quality
from marin_assets.core.embed import topics as topic_core
from marin_assets.core.pool import curated as pool_core
from marin_assets.core.pool import groups as pool_groups
from marin_assets.core.pool import rebuild, tokens
from marin_assets.core.runtime import stages, storage
from marin_assets.core.specs import (
    CONTAMINATION,
    EXACT_DUPLICATES,
    FUZZY_DUPLICATES,
    NORMALIZED,
    POOL,
    QUALITY_BANDS,
    QUALITY_SCORES,
    SAMPLING_GROUPS,
    TOKEN_COUNTS,
    TOPIC_MODEL,
    TOPICS,
)
from marin_assets.defs import report
from marin_assets.defs.metadata import markdown_table, materialized
from marin_assets.defs.resources import CurationResource, MarinResource, source_or_fail
from marin_assets.defs.stage_assets import stage_asset
from marin_assets.defs.ray import step_log


@dataclasses.dataclass(frozen=True)
class Decisions:
    """The current global decisions a pool reads (band edges, exact and fuzzy removals) and
    their per-source digests, read once for any number of sources."""

    bands: stages.StageInput
    exact: stages.StageInput
    fuzzy: stages.StageInput
    band_slices: dict
    exact_slices: dict
    fuzzy_slices: dict

    @classmethod
    def current(cls, layout: storage.Layout) -> "Decisions":
        bands, exact, fuzzy = (stages.current_input(layout, s) for s in (QUALITY_BANDS, EXACT_DUPLICATES, FUZZY_DUPLICATES))
        return cls(bands, exact, fuzzy, quality.band_slices(stages.stats_of(bands)) or {},
                   stages.stats_of(exact)["removed_ids_digest"], stages.stats_of(fuzzy)["removed_ids_digest"])  # fmt: skip

    def slices(self, name: str) -> dict:
        """The source's part of each decision: a change elsewhere leaves its pool as it was."""
        return {"bands": self.band_slices.get(name, self.bands.fingerprint), "exact": self.exact_slices.get(name, ""), "fuzzy": self.fuzzy_slices.get(name, "")}


def pool_fingerprint(layout: storage.Layout, name: str, fuzzy_exempt: bool, decisions: Decisions) -> tuple[list[stages.StageInput], dict, str]:
    """The source's per-source inputs (its token counts, and so their tokenizer, among them), what
    else decides its pool, and the fingerprint the pool gets if built now."""
    upstream = [stages.current_input(layout, stage, name) for stage in (NORMALIZED, TOPICS, QUALITY_SCORES, CONTAMINATION, TOKEN_COUNTS)]
    extra = {**decisions.slices(name), "exempt": fuzzy_exempt}
    return upstream, extra, stages.fingerprint_of(POOL, stages.key({}, extra), upstream)


def stale_pools(layout: storage.Layout, pools: dict[str, stages.StageInput], catalog) -> dict[str, str]:
    """The pools read whose inputs moved since they were built: source -> why."""
    decisions = Decisions.current(layout)
    stale = {}
    for name, inp in sorted(pools.items()):
        try:
            expected = pool_fingerprint(layout, name, catalog.by_name(name).fuzzy_exempt, decisions)[2]
        except stages.MissingInput as exc:
            stale[name] = str(exc)
            continue
        if expected != inp.fingerprint:
            stale[name] = f"built as {inp.fingerprint}; its inputs now give {expected}"
    return stale


@stage_asset(
    TOKEN_COUNTS,
    kinds={"parquet"},
    description="Tokens per document under the pinned tokenizer (id, tokens), co-partitioned with normalized: "
    "counted once, summed by the pool on every rebuild.",
)
def token_counts(context: dg.AssetExecutionContext, marin: MarinResource, curation: CurationResource) -> dg.MaterializeResult:
    source = source_or_fail(marin, context.partition_key)
    layout = marin.layout()
    manifest = stages.run_shards(
        TOKEN_COUNTS,
        layout,
        source=source.name,
        inputs=[stages.current_input(layout, NORMALIZED, source.name)],
        shard_fn=tokens.token_counts_shard,
        params=tokens.TokenCountParams(tokenizer=curation.tokenizer_params()),
        runner=marin.runner(),
        progress=step_log(context),
    )
    totals = manifest["totals"]
    per_shard = manifest["per_shard"]
    return materialized(manifest, rows=int(totals.get("documents", 0)), counters=totals,
                        tokenizer=per_shard[0].get("tokenizer", "") if per_shard else "")  # fmt: skip


@stage_asset(
    POOL,
    kinds={"parquet"},
    description="The source's surviving documents (contaminated, then near-duplicate, then exact-duplicate documents "
    "dropped), each filed under its group c00q0..c39q4 with its token count.",
)
def pool(context: dg.AssetExecutionContext, marin: MarinResource) -> dg.MaterializeResult:
    source = source_or_fail(marin, context.partition_key)
    layout = marin.layout()
    name = source.name
    decisions = Decisions.current(layout)
    upstream, extra, _ = pool_fingerprint(layout, name, source.fuzzy_exempt, decisions)
    exact_removed, fuzzy_removed = dedup.removal_files(decisions.exact.uri, decisions.fuzzy.uri, name)
    manifest = stages.run_shards(
        POOL,
        layout,
        source=name,
        inputs=upstream,
        shard_fn=pool_core.pool_shard,
        params=None,
        bind_params=lambda out: pool_core.PoolParams(
            source=name,
            pool_dir=out.data_uri,
            band_edges_uri=decisions.bands.uri,
            exact_removed_uri=exact_removed,
            fuzzy_removed_uri=fuzzy_removed,
            fuzzy_exempt=source.fuzzy_exempt,
        ),
        fingerprint_params={},
        extra_fingerprint=extra,
        runner=marin.runner(),
        progress=step_log(context),
        # a bounded number of files per group for the source, not one per group per shard
        finish=lambda out, results: pool_core.compact_pool(
            results, out.uri, out.data_uri, name, pool_core.group_names(decisions.bands.uri), pool_core.CompactParams(), marin.runner()
        ),
    )
    totals = manifest["totals"]
    per_shard = manifest["per_shard"]
    return materialized(
        manifest,
        uri=manifest["data_uri"],
        rows=int(totals.get("kept", 0)),
        counters=totals,
        tokenizer=per_shard[0].get("tokenizer", "") if per_shard else "",
        index=dg.MetadataValue.path(manifest["uri"]),
    )


@stage_asset(
    SAMPLING_GROUPS,
    kinds={"parquet", "csv"},
    check_specs=[dg.AssetCheckSpec("pools_current", asset=SAMPLING_GROUPS.name, blocking=True,
                                   description="every pool read was built from its current inputs (names the stale ones)"),
                 dg.AssetCheckSpec("matches_published", asset=SAMPLING_GROUPS.name,
                                   description="rebuild report: tokens per source vs the catalog and the last build, dedup share vs the published 8.5%")],  # fmt: skip
    description="Documents and tokens per sampling group (and per source within each), with token-proportional mixture weights.",
)
def sampling_groups(context: dg.AssetExecutionContext, marin: MarinResource, curation: CurationResource) -> dg.MaterializeResult:
    layout = marin.layout()
    found, missing = stages.current_inputs(layout, POOL, marin.catalog().names)
    if not found:
        raise dg.Failure("no source has a curated pool yet; materialize pool first")
    model = stages.current_input(layout, TOPIC_MODEL)
    stale = stale_pools(layout, found, marin.catalog())
    if stale:
        context.log.warning(f"{len(stale)} pools are stale (re-materialize pool for them): {', '.join(stale)}")
    params = curation.mixture_params()
    labels = topic_core.topic_labels(topic_core.load_topic_model(model.uri))

    figures = source_figures(layout, found)
    previous = storage.read_current(SAMPLING_GROUPS.group_uri(layout))  # the last published build: what a rebuild is set against
    published = ((storage.read_manifest(previous["uri"]) or {}).get("stats") or {}).get("source_figures") if previous else None

    def build(out: str) -> dict:
        per_source = [
            (source, pool_core.pool_index_uris(inp.uri), inp.data_uri)
            for source, inp in sorted(found.items())
        ]
        counts = pool_core.group_counts_and_files(per_source, storage.join(out, "pool_files.parquet"))
        result = pool_groups.sampling_groups(counts, labels, params)
        written = pool_groups.write_sampling_groups(result, out)
        return {**result.summary, **written, "source_figures": figures, "published_figures": published or {}}

    manifest = stages.run_global(
        SAMPLING_GROUPS,
        layout,
        inputs={**found, TOPIC_MODEL.name: model},
        params=params,
        build=build,
    )
    groups, group_sources = pool_groups.read_sampling_groups(manifest["uri"])
    rebuilt, report_meta = rebuild_report_metadata(figures, manifest["stats"].get("published_figures"), marin.catalog(), curation.report_params(), _tokenizer_of(found))
    table = groups.filter(groups["documents"] > 0).sort("group")
    images = {
        "tokens_heatmap": report.markdown_image(report.token_heatmap_png(groups), "tokens per topic and band"),
        "topic_composition": report.markdown_image(report.topic_sources_png(group_sources, groups), "sources in each topic"),
        "band_sizes": report.markdown_image(report.band_sizes_png(groups), "band size per topic"),
    }
    summary_lines = [f"  {'group':6s} {'documents':>9s} {'tokens':>9s} {'weight':>7s}  topic"]
    for row in table.iter_rows(named=True):
        summary_lines.append(
            f"  {row['group']:6s} {row['documents']:>9,} {row['tokens']:>9,} {row['weight']:>7.4f}  {str(row.get('topic_label', ''))[:40]}"
        )
    return materialized(
        manifest,
        rows=int(groups["documents"].sum()),
        groups_with_documents=table.height,
        total_tokens=int(groups["tokens"].sum()),
        weight_sum=float(groups["weight"].sum()),
        sources=len(found),
        sources_without_pool=len(missing),
        # the pictures first, then the long tables (194 groups at full scale)
        **{k: dg.MetadataValue.md(v) for k, v in images.items()},
        **report_meta,
        summary="\n".join(summary_lines),
        groups_table=markdown_table(table.select("group", "topic_label", "documents", "tokens", "weight").to_dicts()),
        check_results=[pools_current(stale, len(found)), report_check(rebuilt)],
    )


def _tokenizer_of(pools: dict[str, stages.StageInput]) -> str:
    for inp in pools.values():
        per_shard = (storage.read_manifest(inp.uri) or {}).get("per_shard") or []
        if per_shard and per_shard[0].get("tokenizer"):
            return str(per_shard[0]["tokenizer"])
    return "unknown tokenizer"


def _semantic_flags(layout: storage.Layout, name: str) -> dict[str, int]:
    """The source's semantic decontamination flags per eval set (its current contamination)."""
    try:
        _, per_shard = stages.shards_of(stages.current_input(layout, CONTAMINATION, name))
    except stages.MissingInput:
        return {}
    found: Counter = Counter()
    for stats in per_shard:
        found.update(stats.get("semantic_by_eval", {}))
    return dict(sorted(found.items()))


def source_figures(layout: storage.Layout, pools: dict[str, stages.StageInput]) -> dict[str, dict]:
    """What each source's rebuild measured: its pool's counters and its dedup removals (tokens
    estimated from the removed characters)."""
    exact, fuzzy = (stages.stats_of(stages.current_input(layout, s)) for s in (EXACT_DUPLICATES, FUZZY_DUPLICATES))
    out = {}
    for name, inp in sorted(pools.items()):
        totals = (storage.read_manifest(inp.uri) or {}).get("totals") or {}
        chars = sum(stats.get("removed_chars_per_source", {}).get(name, 0) for stats in (exact, fuzzy))
        out[name] = rebuild.SourceFigures(
            name, documents=int(totals.get("kept", 0)), tokens=int(totals.get("tokens", 0)),
            dedup_removed_documents=int(totals.get("dropped_exact_duplicate", 0) + totals.get("dropped_fuzzy_duplicate", 0)),
            dedup_removed_tokens_est=int(chars / stages.CHARS_PER_TOKEN), decon_removed_documents=int(totals.get("dropped_contaminated", 0)),
            semantic_flagged=_semantic_flags(layout, name),
        ).to_json()  # fmt: skip
    return out


def rebuild_report_metadata(measured: dict, published: dict | None, catalog, params, tokenizer: str) -> tuple[dict, dict]:
    """The rebuild report and its metadata (a table, a picture, the printed lines): ``measured``
    per source now, ``published`` in the build before this output (``source_figures`` JSON)."""
    figures = [rebuild.SourceFigures.from_json(f) for f in measured.values()]
    published = {n: rebuild.SourceFigures.from_json(f) for n, f in (published or {}).items()}
    tokens_b = {f.source: catalog.by_name(f.source).rough_tokens_b for f in figures if f.source in catalog.names}
    rebuilt = rebuild.rebuild_report(figures, tokens_b, params, published, catalog_size=len(catalog.names))
    lines = rebuild.report_lines(rebuilt, tokenizer)
    rows = sorted(rebuilt["rows"], key=lambda r: (not r["flagged"], r["source"]))  # flagged first
    return rebuilt, {
        "rebuild_report_picture": dg.MetadataValue.md(report_picture(rebuilt)),
        "rebuild_report_summary": dg.MetadataValue.md("```\n" + "\n".join(lines) + "\n```"),
        "rebuild_report": markdown_table([{k: v for k, v in r.items() if k != "flagged"} for r in rows]),
        "rebuild_tokenizer": tokenizer,
        "rebuild_flagged": ", ".join(rebuilt["flagged"]) or "none",
    }


def report_picture(rebuilt: dict) -> str:
    return report.markdown_image(report.rebuild_png(rebuilt["rows"], rebuilt["scale"], rebuilt["fitted"]), "measured vs expected tokens per source")


def report_check(rebuilt: dict) -> dg.AssetCheckResult:
    """Warn (never block): the figures are for a person to judge."""
    flagged = [r for r in rebuilt["rows"] if r["flagged"]]
    unchecked = sum(r["flags"] == rebuild.NOT_CHECKED for r in rebuilt["rows"])
    total_flag = rebuilt["totals"]["flag"]
    within = (f"{len(rebuilt['rows']) - unchecked} sources within tolerance of an independent figure"
              + (f"; {unchecked} {rebuild.NOT_CHECKED}" if unchecked else ""))  # fmt: skip
    return dg.AssetCheckResult(
        check_name="matches_published", passed=not flagged and not total_flag, severity=dg.AssetCheckSeverity.WARN,
        description="; ".join([f"{r['source']}: {r['flags']}" for r in flagged] + ([total_flag] if total_flag else [])) or within,
        metadata={"flagged_sources": len(flagged), "not_checked_sources": unchecked},
    )  # fmt: skip


def pools_current(stale: dict[str, str], read: int) -> dg.AssetCheckResult:
    """Blocking: a mixture built from a pool whose inputs moved would publish stale groups."""
    return dg.AssetCheckResult(
        check_name="pools_current",
        passed=not stale,
        severity=dg.AssetCheckSeverity.ERROR,
        description=f"all {read} pools read are current" if not stale else f"{len(stale)} of {read} pools are stale: {', '.join(stale)}; re-materialize pool for them",
        metadata={"stale_pools": markdown_table([{"source": k, "why": v} for k, v in stale.items()]), "pools_read": read},
    )
