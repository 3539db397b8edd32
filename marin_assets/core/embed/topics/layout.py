"""What the steps share: the model's file names, the training parameters, the sources' shards
and how many inputs a task takes (module attributes, so a run can scale them down)."""

from __future__ import annotations

import dataclasses
from typing import Any


FINE_CENTROIDS = "fine_centroids.npy"
FINE_TO_TOPIC = "fine_to_topic.npy"
FINE_WEIGHTS = "fine_weights.npy"
TOPICS_JSON = "topics.json"
TRAIN_STATS_JSON = "train_stats.json"
LABEL_ROWS = "label_rows.npz"

SHARDS_PER_SAMPLE_TASK = 128  # a sample task's spec names its shards: ~15 KiB
PARTS_PER_COMBINE_TASK = 64  # the fit task reads ~1/64 of the sample's parts (~50 for the pool)


@dataclasses.dataclass(frozen=True)
class TopicParams:
    """Topic model training; defaults are the production values."""

    n_topics: int = 40
    method: str = "coarsen"  # "coarsen": fine k-means then coarsening; "direct": k-means with k = n_topics
    sample_size: int = 10_000_000
    small_source_rows: int = 1_000
    seed: int = 42
    k_fine: int = 5_000
    points_per_centroid: int = 512  # training subset: k_fine x 512 rows (2,560,000)
    min_points_per_fine: int = 4
    kmeans_iterations: int = 20
    kmeans_restarts: int = 3
    # FAISS threads of the fit (k-means, assigning the sample) and the CPUs its task reserves; a
    # sample smaller than ``sample_size`` gets them in proportion (``fit_threads``).
    threads: int = 16
    min_topic_fraction: float = 0.01
    coarsen_seeds: tuple[int, ...] = (42, 43, 44)
    split_iterations: int = 20
    split_restarts: int = 10
    max_hill_climb_sweeps: int = 100
    label_terms: int = 10
    label_sample_size: int = 100_000
    label_text_chars: int = 10_000
    label_max_features: int = 50_000
    label_excerpts: int = 5
    excerpt_chars: int = 500
    batch_rows: int = 4_096
    # The fit task's reservation for a full sample of 1,024 dimensions (no part of the model):
    # 10^7 float16 rows (19 GiB), the float32 training subset (k_fine x 512 rows: 10 GiB), ids and
    # rows (0.4 GiB), with room (make rehearse measures it: ~29 GiB).
    fit_memory_bytes: int = 40 << 30

    def model_params(self) -> dict[str, Any]:
        """What decides the model (its fingerprint, its ``topics.json``): all but the fit's memory."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "fit_memory_bytes"}

    def fit_threads(self, rows: int) -> int:
        """The fit's threads (and CPUs) for a sample of ``rows``: ``threads`` at ``sample_size`` rows,
        in proportion below it (at least 1), so a small corpus on a small Ray (``local``) is not a
        task no node can take. A function of the parameters and the sample: the same inputs and
        parameters fit with the same threads."""
        return max(1, round(self.threads * min(1.0, rows / self.sample_size)))

    def fit_reservation(self, rows: int) -> tuple[int, int]:
        """(CPUs, memory bytes) the fit task reserves for a sample of ``rows``: its threads, and the
        configured memory in proportion to the sample (at least 1 GiB)."""
        return self.fit_threads(rows), max(1 << 30, int(self.fit_memory_bytes * min(1.0, rows / self.sample_size)))


@dataclasses.dataclass(frozen=True)
class SourceShards:
    """One source's embedding shards and, for labels, its co-partitioned normalized shards."""

    source: str
    embeddings: tuple[str, ...]
    texts: tuple[str, ...] = ()
    rows: tuple[int, ...] = ()  # rows per embeddings shard, as the embedding tasks counted them (empty: read the footers)
