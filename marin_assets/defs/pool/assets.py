"""The curated pool per source and the 200 sampling groups."""

import dagster as dg

from marin_assets.core.dedup import decisions as dedup
from marin_assets.core.embed import topics as topic_core
from marin_assets.core.pool import curated as pool_core
from marin_assets.core.pool import groups as mixture
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
    TOPIC_MODEL,
    TOPICS,
)
from marin_assets.defs import report
from marin_assets.defs.metadata import markdown_table, materialized
from marin_assets.defs.resources import CurationResource, MarinResource, source_or_fail
from marin_assets.defs.stage_assets import stage_asset
from marin_assets.defs.ray import step_log


@stage_asset(
    POOL,
    kinds={"parquet"},
    description="The source's surviving documents (contaminated, then near-duplicate, then exact-duplicate documents "
    "dropped), each filed under its group c00q0..c39q4 with its token count.",
)
def pool(context: dg.AssetExecutionContext, marin: MarinResource, curation: CurationResource) -> dg.MaterializeResult:
    source = source_or_fail(marin, context.partition_key)
    layout = marin.layout()
    name = source.name
    upstream = [stages.current_input(layout, stage, name) for stage in (NORMALIZED, TOPICS, QUALITY_SCORES, CONTAMINATION)]
    bands = stages.current_input(layout, QUALITY_BANDS)
    exact = stages.current_input(layout, EXACT_DUPLICATES)
    fuzzy = stages.current_input(layout, FUZZY_DUPLICATES)
    tokenizer = curation.tokenizer_params()
    # The source's pool depends on the global decisions only through its own removal lists, so
    # a dedup change elsewhere leaves this source's pool (and its fingerprint) as it was.
    extra = {
        "bands": bands.fingerprint,
        "exact": stages.stats_of(exact)["removed_ids_digest"].get(name, ""),
        "fuzzy": stages.stats_of(fuzzy)["removed_ids_digest"].get(name, ""),
        "exempt": source.fuzzy_exempt,
        "tokenizer": tokenizer,
    }
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
            band_edges_uri=bands.uri,
            exact_removed_uri=dedup.removed_uri(exact.uri, name),
            fuzzy_removed_uri=dedup.removed_uri(fuzzy.uri, name),
            fuzzy_exempt=source.fuzzy_exempt,
            tokenizer=tokenizer,
        ),
        fingerprint_params={},
        extra_fingerprint=extra,
        runner=marin.runner(),
        progress=step_log(context),
        # a bounded number of files per group for the source, not one per group per shard
        finish=lambda out, results: pool_core.compact_pool(
            [r.output for r in results], out.uri, out.data_uri, name, pool_core.CompactParams(), marin.runner()
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
    description="Documents and tokens per sampling group (and per source within each), with token-proportional mixture weights.",
)
def sampling_groups(context: dg.AssetExecutionContext, marin: MarinResource, curation: CurationResource) -> dg.MaterializeResult:
    layout = marin.layout()
    found, missing = stages.current_inputs(layout, POOL, marin.catalog().names)
    if not found:
        raise dg.Failure("no source has a curated pool yet; materialize pool first")
    model = stages.current_input(layout, TOPIC_MODEL)
    params = curation.mixture_params()
    labels = topic_core.topic_labels(topic_core.load_topic_model(model.uri))

    def build(out: str) -> dict:
        per_source = [
            (source, pool_core.pool_index_uris(inp.uri), inp.data_uri)
            for source, inp in sorted(found.items())
        ]
        counts = pool_core.group_counts_and_files(per_source, storage.join(out, "pool_files.parquet"))
        result = mixture.sampling_groups(counts, labels, params)
        written = mixture.write_sampling_groups(result, out)
        return {**result.summary, **written}

    manifest = stages.run_global(
        SAMPLING_GROUPS,
        layout,
        inputs={**found, TOPIC_MODEL.name: model},
        params=params,
        build=build,
    )
    groups, group_sources = mixture.read_sampling_groups(manifest["uri"])
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
        groups_table=markdown_table(table.select("group", "topic_label", "documents", "tokens", "weight").to_dicts()),
        **{k: dg.MetadataValue.md(v) for k, v in images.items()},
        summary="\n".join(summary_lines),
    )
