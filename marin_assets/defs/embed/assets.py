"""Document embeddings, the topic model learned over a sample of all sources, topic per document."""

import dagster as dg

from marin_assets.core.embed import embeddings as embed
from marin_assets.core.embed import topics as topic_core
from marin_assets.core.runtime import stages, storage
from marin_assets.core.specs import EMBEDDINGS, NORMALIZED, TOPIC_MODEL, TOPICS
from marin_assets.defs.metadata import markdown_table, materialized
from marin_assets.defs.resources import EncoderResource, MarinResource, source_or_fail
from marin_assets.defs.stage_assets import stage_asset
from marin_assets.defs.ray import step_log


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


@stage_asset(
    TOPICS,
    kinds={"parquet"},
    description="Nearest fine centroid, its squared distance and the topic (0-39) of every document, co-partitioned.",
)
def topics(context: dg.AssetExecutionContext, marin: MarinResource) -> dg.MaterializeResult:
    source = source_or_fail(marin, context.partition_key)
    layout = marin.layout()
    model = stages.current_input(layout, TOPIC_MODEL)
    manifest = stages.run_shards(
        TOPICS,
        layout,
        source=source.name,
        inputs=[stages.current_input(layout, EMBEDDINGS, source.name)],
        shard_fn=topic_core.assign_topics_shard,
        params=topic_core.AssignParams(model.uri),
        extra_fingerprint={TOPIC_MODEL.name: model.fingerprint},
        fingerprint_params={},
        runner=marin.runner(),
        progress=step_log(context),
    )
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
