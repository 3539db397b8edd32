"""Steps 2-4 as one task that holds the sample (``fit_memory_bytes``): the training subset, the
fine k-means, the weights, the coarsening, and the choice of step 5's rows."""

from __future__ import annotations

import dataclasses
import io
import time
from typing import Any

import numpy as np

from marin_assets.core.embed.topics.coarsening import _by_weight, coarsen, total_loss
from marin_assets.core.embed.topics.kmeans import _flat_index, _unit, faiss_threads, nearest_centroids, spherical_kmeans
from marin_assets.core.embed.topics.labels import LabelRows, choose_label_rows
from marin_assets.core.embed.topics.layout import LABEL_ROWS, TopicParams
from marin_assets.core.embed.topics.model import TopicModel, load_topic_arrays, save_topic_arrays
from marin_assets.core.embed.topics.sampling import SamplePlan, float32_batches, largest_remainder, load_sample_parts
from marin_assets.core.runtime import storage


def training_rows(source: np.ndarray, n_train: int, seed: int) -> np.ndarray:
    """A source-stratified subset of sample rows (step 2; ``source``: each row's source): one row
    per source, the rest proportional."""
    if n_train >= len(source):
        return np.arange(len(source))
    present = np.unique(source)
    counts = np.array([(source == s).sum() for s in present])
    floor = np.minimum(counts, 1)
    extra = largest_remainder(max(n_train - int(floor.sum()), 0), counts - floor, counts - floor)
    rng = np.random.default_rng(seed)
    picked = []
    for s, q in zip(present, floor + np.asarray(extra)):
        members = np.flatnonzero(source == s)
        picked.append(np.sort(rng.choice(members, size=int(q), replace=False)))
    return np.sort(np.concatenate(picked))


def effective_sizes(n_sample: int, params: TopicParams) -> tuple[int, int]:
    """(k_fine, n_topics) for a sample of ``n_sample`` rows; k_fine = n_sample means 'the rows themselves'."""
    n_topics = min(params.n_topics, n_sample)
    if params.method == "direct":
        return n_topics, n_topics
    if n_sample <= params.k_fine:
        return n_sample, n_topics
    k_fine = min(params.k_fine, n_sample // params.min_points_per_fine)
    if k_fine < n_topics:
        return n_sample, n_topics
    return k_fine, n_topics


def float32_rows(vectors: np.ndarray, rows: np.ndarray, batch_rows: int) -> np.ndarray:
    """``vectors[rows]`` as float32, converted batch by batch (no float16 copy of them all first)."""
    out = np.empty((len(rows), vectors.shape[1]), dtype=np.float32)
    for start in range(0, len(rows), batch_rows):
        out[start : start + batch_rows] = vectors[rows[start : start + batch_rows]]
    return out


def fit_fine_topics(vectors: np.ndarray, source: np.ndarray, params: TopicParams) -> tuple[TopicModel, np.ndarray, dict[str, Any]]:
    """Steps 2-4 on the sample's vectors (``source``: each row's source): the model without its
    labels, each row's topic, the stats."""
    if params.method not in ("coarsen", "direct"):
        raise ValueError(f"unknown topic method {params.method!r}: use 'coarsen' or 'direct'")
    n = len(vectors)
    k_fine, n_topics = effective_sizes(n, params)
    stats: dict[str, Any] = {"sample_rows": n, "method": params.method}
    started = time.perf_counter()
    if k_fine == n and params.method == "coarsen":
        centroids = _unit(vectors.astype(np.float32))
        stats["train_rows"] = n
        stats["fine_centroids_are_rows"] = True
    else:
        train = training_rows(source, k_fine * params.points_per_centroid, params.seed)
        stats["train_rows"] = len(train)
        centroids = spherical_kmeans(
            float32_rows(vectors, train, params.batch_rows), k_fine,
            iterations=params.kmeans_iterations, restarts=params.kmeans_restarts,
            seed=params.seed, threads=params.threads,
        )
        stats["fine_centroids_are_rows"] = False
    stats["kmeans_seconds"] = round(time.perf_counter() - started, 3)

    index = _flat_index(centroids)
    fine_of_row = np.concatenate([nearest_centroids(batch, centroids, index)[0] for batch in float32_batches(vectors, params.batch_rows)])
    weights = np.bincount(fine_of_row, minlength=len(centroids)).astype(np.int64)
    kept = np.flatnonzero(weights > 0)
    stats["empty_fine_dropped"] = int(len(centroids) - len(kept))
    remap = np.full(len(centroids), -1, dtype=np.int64)
    remap[kept] = np.arange(len(kept))
    centroids, weights, fine_of_row = centroids[kept], weights[kept], remap[fine_of_row]
    n_topics = min(n_topics, len(kept))

    started = time.perf_counter()
    if params.method == "direct" or len(kept) == n_topics:
        lookup = _by_weight(np.arange(len(kept)), weights.astype(np.float64))
        stats["loss_fraction"] = total_loss(centroids, weights.astype(np.float64), lookup) / float(weights.sum())
    else:
        lookup, info = coarsen(centroids, weights, n_topics, params)
        stats.update(info)
    stats["coarsen_seconds"] = round(time.perf_counter() - started, 3)
    stats["k_fine"] = int(len(kept))
    stats["n_topics"] = int(lookup.max()) + 1
    model = TopicModel(fine_centroids=centroids.astype(np.float32), fine_to_topic=lookup.astype(np.int16), fine_weights=weights, topics=[], meta={})
    return model, lookup[fine_of_row].astype(np.int64), stats


@dataclasses.dataclass(frozen=True)
class FitParams:
    topic: TopicParams
    rows: int  # sample rows in the parts
    source_rows: tuple[int, ...]  # rows per source, in source order (the parts hold each source's rows together)


def fit_topics(input_uris: list[str], output_uri: str, params: FitParams) -> dict[str, Any]:
    """A task: steps 2-4 on the sample's parts and the choice of step 5's rows, stored under
    ``output_uri`` (the model's arrays; ``label_rows.npz``: those rows' numbers, topics, ids and
    rows in their shards, each topic's nearest). It holds the sample (``fit_memory_bytes``) and runs
    FAISS on ``threads`` threads."""
    vectors, ids, rows = load_sample_parts(input_uris, params.rows)
    source = np.repeat(np.arange(len(params.source_rows), dtype=np.int32), params.source_rows)
    with faiss_threads(params.topic.threads):  # k-means and every search: the CPUs the task reserves
        model, topic_of_row, stats = fit_fine_topics(vectors, source, params.topic)
        chosen, nearest = choose_label_rows(vectors, topic_of_row, model.topic_centroids(), params.topic)
    save_topic_arrays(model, output_uri)
    buf = io.BytesIO()
    np.savez(buf, index=chosen, topic=topic_of_row[chosen], ids=ids[chosen], rows=rows[chosen],
             nearest=np.concatenate(nearest), nearest_counts=np.asarray([len(m) for m in nearest], dtype=np.int64))  # fmt: skip
    storage.write_bytes(storage.join(output_uri, LABEL_ROWS), buf.getvalue())
    return stats


def read_fit(uri: str, plan: SamplePlan) -> tuple[TopicModel, LabelRows]:
    """The fit task's model (no labels yet) and label rows, each row's shard from the sample's plan."""
    model = load_topic_arrays(uri)
    part = np.load(io.BytesIO(storage.read_bytes(storage.join(uri, LABEL_ROWS))), allow_pickle=False)
    index = part["index"]
    nearest = np.split(np.searchsorted(index, part["nearest"]), np.cumsum(part["nearest_counts"])[:-1])
    labels = LabelRows(ids=part["ids"], shard=plan.shard_of(index), row=part["rows"], topic=part["topic"], nearest=nearest,
                       sources=plan.sources, shards=plan.shards)  # fmt: skip
    return model, labels
