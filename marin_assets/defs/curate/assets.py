"""Quality scores and bands, the curated pool per source, and the 200 sampling groups."""

import dagster as dg

from marin_assets.core import dedup, embed, hub, mixture, quality, stages, storage
from marin_assets.core import pool as pool_core
from marin_assets.core import topics as topic_core
from marin_assets.core.specs import (
    CONTAMINATION,
    EMBEDDINGS,
    EXACT_DUPLICATES,
    FUZZY_DUPLICATES,
    NORMALIZED,
    POOL,
    QUALITY_BANDS,
    QUALITY_MODEL,
    QUALITY_SCORES,
    SAMPLING_GROUPS,
    TOPIC_MODEL,
    TOPICS,
)
from marin_assets.defs import report
from marin_assets.defs.metadata import markdown_table, materialized
from marin_assets.defs.resources import CurationResource, EncoderResource, MarinResource, source_or_fail
from marin_assets.defs.stage_assets import stage_asset


def _annotation_files(curation: CurationResource, marin: MarinResource, params: quality.QualityParams) -> tuple[list[str], str]:
    """Local annotation files, or the pinned Hub annotation set downloaded under raw/."""
    local = curation.annotations_path()
    if local:
        return [local], f"file:{local}"
    dest = marin.layout().raw("annotations__" + params.annotations_repo.replace("/", "__"), params.annotations_revision)
    manifest = stages.commit_copy(
        dest,
        lambda: hub.download_snapshot(
            params.annotations_repo, params.annotations_revision, ["**/*.parquet", "*.parquet"], None, dest, marin.retry_policy(),
            staging_dir=marin.provider_access().staging_dir, **marin.hub_kwargs(),
        ),
    )
    return [storage.join(dest, f["path"]) for f in manifest["files"]], f"{params.annotations_repo}@{params.annotations_revision}"


@stage_asset(
    QUALITY_MODEL,
    kinds={"scikitlearn"},
    description="A regression head over document embeddings trained on a pinned annotation set, calibrated to [0, 1].",
)
def quality_model(
    context: dg.AssetExecutionContext, marin: MarinResource, encoder: EncoderResource, curation: CurationResource
) -> dg.MaterializeResult:
    layout = marin.layout()
    params = quality.QualityParams()
    encoder_params = encoder.params()
    files, label_source = _annotation_files(curation, marin, params)
    # a local file is described by its bytes, a Hub set by its pin: never by where the checkout lies
    described_by = [storage.content_sha256(f) for f in files] if label_source.startswith("file:") else [storage.size(f) for f in files] + [label_source]
    inputs = {"annotations": stages.external_input("annotations", label_source, described_by)}

    def build(out: str) -> dict:
        texts, labels, bad = quality.read_annotations(files, params)
        metrics = quality.train_quality_model(
            texts, labels, lambda batch: embed.encode_texts(batch, encoder_params)[0], out, params
        )
        return metrics | {"bad_annotation_rows": bad}

    manifest = stages.run_global(
        QUALITY_MODEL,
        layout,
        inputs=inputs,
        params=params,
        extra_fingerprint={"encoder": encoder_params},
        build=build,
    )
    stats = manifest["stats"]
    held = stats.get("heldout", {})
    return materialized(
        manifest,
        rows=stats.get("n_labels"),
        annotations=label_source,
        encoder=encoder_params.model,
        scorer=stats.get("scorer"),
        heldout_spearman=held.get("spearman"),
        heldout_f1_at_3=held.get("f1"),
        heldout_mae=held.get("mae"),
        n_train=stats.get("n_train"),
        n_heldout=stats.get("n_heldout"),
        summary=f"  trained on {stats.get('n_train')} labels from {label_source}; held-out Spearman {held.get('spearman', 0):.3f}, F1@3 {held.get('f1', 0):.3f}",
    )


@stage_asset(
    QUALITY_SCORES,
    kinds={"parquet"},
    description="Raw and calibrated quality score per document, co-partitioned.",
)
def quality_scores(context: dg.AssetExecutionContext, marin: MarinResource) -> dg.MaterializeResult:
    source = source_or_fail(marin, context.partition_key)
    layout = marin.layout()
    model = stages.current_input(layout, QUALITY_MODEL)
    manifest = stages.run_shards(
        QUALITY_SCORES,
        layout,
        source=source.name,
        inputs=[stages.current_input(layout, EMBEDDINGS, source.name)],
        shard_fn=quality.quality_scores_shard,
        params=quality.QualityScoreParams(model.uri),
        fingerprint_params={},
        extra_fingerprint={QUALITY_MODEL.name: model.fingerprint},
        runner=marin.runner(),
        progress=context.log.info,
    )
    totals = manifest["totals"]
    return materialized(manifest, rows=int(totals.get("rows", 0)), counters=totals)


@stage_asset(
    QUALITY_BANDS,
    kinds={"json"},
    description="Band edges: quintiles of the calibrated score within each topic over all sources (or fixed 0.2/0.4/0.6/0.8).",
)
def quality_bands(context: dg.AssetExecutionContext, marin: MarinResource, curation: CurationResource) -> dg.MaterializeResult:
    layout = marin.layout()
    names = marin.catalog().names
    topic_inputs, _ = stages.current_inputs(layout, TOPICS, names)
    score_inputs, _ = stages.current_inputs(layout, QUALITY_SCORES, names)
    sources = sorted(set(topic_inputs) & set(score_inputs))
    if not sources:
        raise dg.Failure("no source has both topics and quality_scores yet; materialize them first")
    params = curation.band_params()
    pairs = [
        (storage.join(topic_inputs[s].uri, storage.basename(u)), u)
        for s in sources
        for u in storage.list_shards(score_inputs[s].uri)
    ]
    inputs = {f"{s}/topics": topic_inputs[s] for s in sources} | {f"{s}/quality": score_inputs[s] for s in sources}

    def build(out: str) -> dict:
        hist, counters = quality.score_histogram(pairs, params)
        edges = quality.band_edges(hist, params)
        quality.save_band_edges(edges, out)
        return {**counters, "band_summary": quality.band_summary(hist, edges)}

    manifest = stages.run_global(QUALITY_BANDS, layout, inputs=inputs, params=params, build=build)
    summary = manifest["stats"].get("band_summary", {})
    rows = summary.get("rows", []) if isinstance(summary, dict) else []
    return materialized(
        manifest,
        rows=None,
        method=params.method,
        sources=len(sources),
        band_sizes=markdown_table(rows[:200]) if rows else None,
    )


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
        progress=context.log.info,
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
