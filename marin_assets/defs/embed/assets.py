"""Document embeddings, the topic model learned over a sample of all sources, topic per document."""

import dagster as dg

from marin_assets.core import embed, stages, storage
from marin_assets.core import topics as topic_core
from marin_assets.defs.metadata import markdown_table, materialized
from marin_assets.defs.normalize.assets import normalized
from marin_assets.defs.partitions import source_partitions
from marin_assets.defs.resources import EncoderResource, MarinResource, source_or_fail

EMBED_CODE_VERSION = "1"
TOPICS_CODE_VERSION = "1"


@dg.asset(
    partitions_def=source_partitions,
    deps=[normalized],
    group_name="embed",
    pool="gpu",
    kinds={"pytorch", "parquet"},
    code_version=EMBED_CODE_VERSION,
    op_tags={"dagster-k8s/config": {"container_config": {"resources": {"limits": {"nvidia.com/gpu": "1"}}}}},
    description="One L2-normalized vector per document (int8 with range +-0.3 by default), co-partitioned; resumable per shard.",
)
def embeddings(context: dg.AssetExecutionContext, marin: MarinResource, encoder: EncoderResource) -> dg.MaterializeResult:
    source = source_or_fail(marin, context.partition_key)
    layout = marin.layout()
    params = embed.EmbedParams(encoder=encoder.params())
    manifest = stages.run_attribute_stage(
        stage="embeddings",
        source=source.name,
        layout=layout,
        inputs=[stages.current_input(layout, "normalized", source.name)],
        shard_fn=embed.embed_shard,
        params=params,
        code_version=EMBED_CODE_VERSION,
        runner=marin.runner(),
        progress=context.log.info,
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


@dg.asset(
    deps=[embeddings, normalized],
    group_name="embed",
    kinds={"faiss"},
    code_version=TOPICS_CODE_VERSION,
    description="Spherical k-means over a sample proportional to the sources' rows, coarsened to 40 topics of >= 1% weight, with labels.",
)
def topic_model(context: dg.AssetExecutionContext, marin: MarinResource) -> dg.MaterializeResult:
    layout = marin.layout()
    found, missing = stages.current_inputs(layout, "embeddings", marin.catalog().names)
    if not found:
        raise dg.Failure("no source has embeddings yet; materialize embeddings for some partitions first")
    params = topic_core.TopicParams()
    shards = []
    for name, inp in sorted(found.items()):
        texts_dir = stages.current_input(layout, "normalized", name).uri
        emb = storage.list_shards(inp.uri)
        shards.append(topic_core.SourceShards(name, tuple(emb), tuple(storage.join(texts_dir, storage.basename(u)) for u in emb)))
    manifest = stages.run_global_stage(
        stage="topic_model",
        layout=layout,
        inputs=found,
        params=params,
        code_version=TOPICS_CODE_VERSION,
        build=lambda out: topic_core.train_topic_model(shards, out, params),
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


@dg.asset(
    partitions_def=source_partitions,
    deps=[embeddings, topic_model],
    group_name="embed",
    kinds={"parquet"},
    code_version=TOPICS_CODE_VERSION,
    description="Nearest fine centroid, its squared distance and the topic (0-39) of every document, co-partitioned.",
)
def topics(context: dg.AssetExecutionContext, marin: MarinResource) -> dg.MaterializeResult:
    source = source_or_fail(marin, context.partition_key)
    layout = marin.layout()
    model = stages.current_input(layout, "topic_model")
    manifest = stages.run_attribute_stage(
        stage="topics",
        source=source.name,
        layout=layout,
        inputs=[stages.current_input(layout, "embeddings", source.name)],
        shard_fn=topic_core.assign_topics_shard,
        params=topic_core.AssignParams(model.uri),
        code_version=TOPICS_CODE_VERSION,
        extra_fingerprint={"topic_model": model.fingerprint},
        fingerprint_params={},
        runner=marin.runner(),
        progress=context.log.info,
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
