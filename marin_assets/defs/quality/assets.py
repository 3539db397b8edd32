"""Quality: the scorer, calibrated scores per document, and 5 bands per topic."""

import dagster as dg

from marin_assets.core.embed import embeddings as embed
from marin_assets.core.embed import quality
from marin_assets.core.ingest import hub
from marin_assets.core.runtime import stages, storage
from marin_assets.core.specs import (
    EMBEDDINGS,
    QUALITY_BANDS,
    QUALITY_MODEL,
    QUALITY_SCORES,
    TOPICS,
)
from marin_assets.defs.metadata import markdown_table, materialized
from marin_assets.defs.resources import CurationResource, EncoderResource, MarinResource, source_or_fail
from marin_assets.defs.stage_assets import stage_asset
from marin_assets.defs.ray import step_log


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
        progress=step_log(context),
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
    pairs = {
        s: [(storage.join(topic_inputs[s].uri, storage.basename(u)), u) for u in stages.shards_of(score_inputs[s])[0]]
        for s in sources
    }
    inputs = {f"{s}/topics": topic_inputs[s] for s in sources} | {f"{s}/quality": score_inputs[s] for s in sources}

    def build(out: str) -> dict:
        hist, counters, topics_of = quality.score_histogram_by_tasks(pairs, storage.join(out, "_histograms"), params, marin.runner())
        edges = quality.band_edges(hist, params)
        quality.save_band_edges(edges, out)
        topic_digest = {str(t): storage.fingerprint("band_edges", [edges.method, list(row)]) for t, row in enumerate(edges.edges)}
        return {**counters, "band_summary": quality.band_summary(hist, edges), "topics_per_source": topics_of, "per_topic_digest": topic_digest}

    manifest = stages.run_global(QUALITY_BANDS, layout, inputs=inputs, params=params, build=build)
    summary = manifest["stats"].get("band_summary", {})
    rows = summary.get("rows", []) if isinstance(summary, dict) else []
    return materialized(
        manifest,
        rows=None,
        method=params.method,
        sources=len(sources),
        band_sizes=markdown_table(rows[:200]) if rows else None,
        per_topic_digest=dg.MetadataValue.json(manifest["stats"].get("per_topic_digest", {})),
        per_source_digest=_json_or_none(quality.band_slices(manifest["stats"])),
        decided=[manifest["stats"].get("per_topic_digest"), quality.band_slices(manifest["stats"])] if "per_topic_digest" in manifest["stats"] else None,
    )


def _json_or_none(value: dict | None) -> dg.MetadataValue | None:
    return None if value is None else dg.MetadataValue.json(value)

