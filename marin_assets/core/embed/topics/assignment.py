"""Step 6, per embeddings shard: each document's nearest fine centroid and its topic (the model
loaded once per process)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from marin_assets.core.embed.embeddings import vectors_from_table
from marin_assets.core.embed.topics.model import TopicModel, load_topic_model
from marin_assets.core.runtime import storage


@dataclasses.dataclass(frozen=True)
class AssignParams:
    """Assignment of one embeddings shard to the topic model stored at ``topic_model_uri``."""

    topic_model_uri: str
    batch_rows: int = 4_096


@functools.lru_cache(maxsize=2)
def _cached_topic_model(uri: str) -> TopicModel:
    return load_topic_model(uri)


def assign_topics_shard(input_uris: list[str], output_uri: str, params: AssignParams) -> dict[str, Any]:
    """``id``, ``fine_cluster``, ``distance`` (squared L2) and ``topic`` for one embeddings shard."""
    if len(input_uris) != 1:
        raise ValueError(f"assign_topics_shard takes exactly one embeddings shard, got {len(input_uris)}: {input_uris}")
    model = _cached_topic_model(params.topic_model_uri)
    table = storage.read_parquet(input_uris[0], columns=["id", "embedding"])
    vectors = vectors_from_table(table)
    if len(table) and vectors.shape[1] != model.fine_centroids.shape[1]:
        raise ValueError(
            f"{input_uris[0]} has {vectors.shape[1]}-dimensional embeddings but the topic model at "
            f"{params.topic_model_uri} expects {model.fine_centroids.shape[1]}; retrain the topic model "
            "on embeddings from the same encoder"
        )
    fine, dist, topic = model.assign(vectors, params.batch_rows)
    out = pa.table(
        {
            "id": table.column("id"),
            "fine_cluster": pa.array(fine, type=pa.int32()),
            "distance": pa.array(dist, type=pa.float32()),
            "topic": pa.array(topic, type=pa.int16()),
        }
    )
    storage.write_parquet(out, output_uri)
    return {
        "rows": len(out),
        "mean_distance": float(dist.mean()) if len(dist) else 0.0,
        "topic_rows": np.bincount(topic.astype(np.int64), minlength=model.n_topics).tolist(),
    }


def topic_labels(model: TopicModel) -> Mapping[int, str]:
    """topic -> readable label, for reports."""
    return {t.topic: t.label for t in model.topics}
