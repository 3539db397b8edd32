"""Document embeddings, the topic model learned over a sample of all sources, topic per document; the quality scorer, calibrated scores per document, and 5 bands per topic."""

from collections.abc import Callable
from typing import Any

import dagster as dg

from marin_assets.core.embed import embeddings as embed
from marin_assets.core.embed import quality
from marin_assets.core.embed import topics as topic_core
from marin_assets.core.ingest import hub
from marin_assets.core.runtime import stages, storage
from marin_assets.core.runtime.runner import ShardFn
from marin_assets.core.runtime.stages import StageSpec
from marin_assets.core.specs import EMBEDDINGS, NORMALIZED, QUALITY_BANDS, QUALITY_MODEL, QUALITY_SCORES, TOPIC_MODEL, TOPICS
from marin_assets.defs.metadata import markdown_table, materialized
from marin_assets.defs.ray import step_log
from marin_assets.defs.resources import CurationResource, EncoderResource, MarinResource, source_or_fail
from marin_assets.defs.stage_assets import stage_asset


@stage_asset(
    EMBEDDINGS,
    pool="gpu",
    kinds={"pytorch", "parquet"},
    op_tags={"dagster-k8s/config": {"container_config": {"resources": {"limits": {"nvidia.com/gpu": "1"}}}}},
    description="One L2-normalized vector per document (int8 with range +-0.3 by default), co-partitioned; resumable per shard.",
)
def embeddings(context: dg.AssetExecutionContext, marin: MarinResource, encoder: EncoderResource) -> dg.MaterializeResult:
    source = source_or_fail(marin, context.partition_key)
    layout = marin.layout()
    params = embed.EmbedParams(encoder=encoder.params())
    manifest = stages.run_shards(
        EMBEDDINGS,
        layout,
        source=source.name,
        inputs=[stages.current_input(layout, NORMALIZED, source.name)],
        shard_fn=embed.embed_shard,
        params=params,
        runner=marin.runner(),
        progress=step_log(context),
    )
    shards = manifest["per_shard"]
    rows = int(manifest["totals"].get("rows", 0))
    fidelity_mean = sum(s.get("fidelity_mean_cosine", 0) * s.get("rows", 0) for s in shards) / max(1, rows)
    fidelity_min = min((s.get("fidelity_min_cosine", 1.0) for s in shards), default=1.0)
    return materialized(
        manifest,
        rows=rows,
        counters={
            k: v for k, v in manifest["totals"].items() if not k.startswith("fidelity") and k not in ("docs_per_second", "dim")
        },
        model=params.encoder.model,
        revision=params.encoder.revision or "",
        storage=params.storage,
        dim=int(shards[0].get("dim", 0)) if shards else 0,
        int8_fidelity_mean_cosine=round(fidelity_mean, 6),
        int8_fidelity_min_cosine=round(fidelity_min, 6),
        resumed_shards=manifest.get("resumed_shards", 0),
    )


def _labels_table(model_uri: str) -> list[dict]:
    model = topic_core.load_topic_model(model_uri)
    return [
        {
            "topic": t.topic,
            "label": t.label,
            "weight": f"{t.weight_fraction:.1%}",
            "terms": ", ".join(t.terms[:8]),
            "nearest excerpt": (t.excerpts[0] if t.excerpts else "")[:140],
        }
        for t in model.topics
    ]


@stage_asset(
    TOPIC_MODEL,
    kinds={"faiss"},
    description="Spherical k-means over a sample proportional to the sources' rows, coarsened to 40 topics of >= 1% weight, with labels.",
)
def topic_model(context: dg.AssetExecutionContext, marin: MarinResource) -> dg.MaterializeResult:
    layout = marin.layout()
    found, missing = stages.current_inputs(layout, EMBEDDINGS, marin.catalog().names)
    if not found:
        raise dg.Failure("no source has embeddings yet; materialize embeddings for some partitions first")
    threads = marin.resolved("topic_threads")
    params = topic_core.TopicParams(**({"threads": threads} if threads else {}))
    shards = []
    for name, inp in sorted(found.items()):
        texts_dir = stages.current_input(layout, NORMALIZED, name).uri
        emb, per_shard = stages.shards_of(inp)
        rows = tuple(stats.get("rows") for stats in per_shard)  # the embedding tasks' row counts
        shards.append(topic_core.SourceShards(name, tuple(emb), tuple(storage.join(texts_dir, storage.basename(u)) for u in emb),
                                              rows=rows if all(isinstance(r, int) for r in rows) else ()))
    manifest = stages.run_global(
        TOPIC_MODEL,
        layout,
        inputs=found,
        params=params.model_params(),  # the fit's reservation decides nothing
        build=lambda out: topic_core.train_topic_model(shards, out, params, marin.runner()),
    )
    labels = _labels_table(manifest["uri"])
    stats = manifest["stats"]
    return materialized(
        manifest,
        rows=None,
        counters={k: v for k, v in stats.items() if isinstance(v, (int, float))},
        topics=len(labels),
        sources=len(found),
        sources_without_embeddings=len(missing),
        topic_labels=markdown_table(labels),
        summary="\n".join(f"  {r['topic']:>2} {r['weight']:>6}  {r['label']}" for r in labels),
    )


def _map_embeddings_with(
    context: dg.AssetExecutionContext, marin: MarinResource, step: StageSpec, model_step: StageSpec, shard_fn: ShardFn, params_for: Callable[[str], Any]
) -> dict:
    """One source's embeddings through a global model (topics, quality scores). The parameters only
    name the model's file, so the model's own fingerprint stands for them."""
    source = source_or_fail(marin, context.partition_key)
    layout = marin.layout()
    model = stages.current_input(layout, model_step)
    return stages.run_shards(
        step,
        layout,
        source=source.name,
        inputs=[stages.current_input(layout, EMBEDDINGS, source.name)],
        shard_fn=shard_fn,
        params=params_for(model.uri),
        fingerprint_params={},
        extra_fingerprint={model_step.name: model.fingerprint},
        runner=marin.runner(),
        progress=step_log(context),
    )


@stage_asset(
    TOPICS,
    kinds={"parquet"},
    description="Nearest fine centroid, its squared distance and the topic (0-39) of every document, co-partitioned.",
)
def topics(context: dg.AssetExecutionContext, marin: MarinResource) -> dg.MaterializeResult:
    manifest = _map_embeddings_with(context, marin, TOPICS, TOPIC_MODEL, topic_core.assign_topics_shard, topic_core.AssignParams)
    counts: dict[int, int] = {}
    for shard in manifest["per_shard"]:
        for topic, n in enumerate(shard.get("topic_rows", [])):
            counts[topic] = counts.get(topic, 0) + int(n)
    return materialized(
        manifest,
        rows=int(manifest["totals"].get("rows", 0)),
        counters={"mean_distance": manifest["totals"].get("mean_distance", 0) / max(1, len(manifest["per_shard"]))},
        documents_per_topic=markdown_table([{"topic": t, "documents": n} for t, n in sorted(counts.items()) if n]),
    )


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
    manifest = _map_embeddings_with(context, marin, QUALITY_SCORES, QUALITY_MODEL, quality.quality_scores_shard, quality.QualityScoreParams)
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

