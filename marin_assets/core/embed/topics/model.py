"""The topic model: fine centroids, their topic, their weights and the labels; how it is stored
and read back, and how it assigns vectors to topics."""

from __future__ import annotations

import dataclasses
import io
from typing import Any

import numpy as np

from marin_assets.core.embed.topics.kmeans import _flat_index, _unit, nearest_centroids
from marin_assets.core.embed.topics.layout import FINE_CENTROIDS, FINE_TO_TOPIC, FINE_WEIGHTS, TOPICS_JSON
from marin_assets.core.runtime import storage


@dataclasses.dataclass(frozen=True)
class TopicLabel:
    topic: int
    label: str
    terms: tuple[str, ...]
    excerpts: tuple[str, ...]
    weight: float
    weight_fraction: float
    fine_clusters: int


@dataclasses.dataclass
class TopicModel:
    fine_centroids: np.ndarray  # (k_fine, dim) float32, unit norm
    fine_to_topic: np.ndarray  # (k_fine,) int16
    fine_weights: np.ndarray  # (k_fine,) int64
    topics: list[TopicLabel]
    meta: dict[str, Any]
    _index: Any = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def n_topics(self) -> int:
        return int(self.fine_to_topic.max()) + 1 if len(self.fine_to_topic) else 0

    def topic_centroids(self) -> np.ndarray:
        """Unit direction of each topic: the normalized weighted sum of its fine centroids."""
        out = np.zeros((self.n_topics, self.fine_centroids.shape[1]), dtype=np.float64)
        np.add.at(out, self.fine_to_topic.astype(np.int64), self.fine_weights[:, None] * self.fine_centroids)
        return _unit(out)

    def assign(self, vectors: np.ndarray, batch_rows: int = 4_096) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Nearest fine centroid (int32), its squared L2 distance (float32) and the topic (int16)."""
        if self._index is None:
            self._index = _flat_index(self.fine_centroids)
        fine = np.empty(len(vectors), dtype=np.int32)
        dist = np.empty(len(vectors), dtype=np.float32)
        for start in range(0, len(vectors), batch_rows):
            part = slice(start, start + batch_rows)
            fine[part], dist[part] = nearest_centroids(vectors[part], self.fine_centroids, self._index)
        return fine, dist, self.fine_to_topic[fine].astype(np.int16)


def _save_npy(uri: str, array: np.ndarray) -> None:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    storage.write_bytes(uri, buf.getvalue())


def _load_npy(uri: str) -> np.ndarray:
    return np.load(io.BytesIO(storage.read_bytes(uri)), allow_pickle=False)


def save_topic_arrays(model: TopicModel, output_uri: str) -> None:
    _save_npy(storage.join(output_uri, FINE_CENTROIDS), model.fine_centroids)
    _save_npy(storage.join(output_uri, FINE_TO_TOPIC), model.fine_to_topic)
    _save_npy(storage.join(output_uri, FINE_WEIGHTS), model.fine_weights)


def load_topic_arrays(uri: str) -> TopicModel:
    """The model's arrays (no labels, no meta)."""
    return TopicModel(
        fine_centroids=_load_npy(storage.join(uri, FINE_CENTROIDS)),
        fine_to_topic=_load_npy(storage.join(uri, FINE_TO_TOPIC)),
        fine_weights=_load_npy(storage.join(uri, FINE_WEIGHTS)),
        topics=[],
        meta={},
    )


def save_topic_model(model: TopicModel, output_uri: str) -> None:
    save_topic_arrays(model, output_uri)
    payload = {**model.meta, "topics": [dataclasses.asdict(t) for t in model.topics]}
    storage.write_json(storage.join(output_uri, TOPICS_JSON), payload)


def load_topic_model(uri: str) -> TopicModel:
    payload = storage.read_json(storage.join(uri, TOPICS_JSON))
    topics = [
        TopicLabel(**{**t, "terms": tuple(t["terms"]), "excerpts": tuple(t["excerpts"])}) for t in payload.pop("topics")
    ]
    return dataclasses.replace(load_topic_arrays(uri), topics=topics, meta=payload)
