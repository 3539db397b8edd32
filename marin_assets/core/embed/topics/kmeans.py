"""Steps 2-3, spherical k-means and nearest centroids (FAISS, exact search): the fine centroids
and the weights they get from the sample; FAISS is imported only when a model is fitted or used."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np


@contextlib.contextmanager
def faiss_threads(threads: int) -> Iterator[None]:
    """FAISS's OpenMP threads set to ``threads`` inside the block (restored after)."""
    import faiss  # noqa: PLC0415

    previous = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(threads)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(previous)


def spherical_kmeans(
    vectors: np.ndarray, k: int, *, iterations: int, restarts: int, seed: int, threads: int = 1
) -> np.ndarray:
    """Unit-norm centroids of FAISS spherical k-means (best of ``restarts`` runs)."""
    import faiss  # noqa: PLC0415

    x = np.ascontiguousarray(vectors, dtype=np.float32)
    with faiss_threads(threads):
        kmeans = faiss.Kmeans(
            x.shape[1],
            k,
            niter=iterations,
            nredo=restarts,
            seed=seed,
            spherical=True,
            max_points_per_centroid=max(512, -(-len(x) // k)),
            min_points_per_centroid=1,
            verbose=False,
        )
        kmeans.train(x)
    return _unit(kmeans.centroids)


def _flat_index(centroids: np.ndarray) -> Any:
    import faiss  # noqa: PLC0415

    index = faiss.IndexFlatL2(centroids.shape[1])
    index.add(np.ascontiguousarray(centroids, dtype=np.float32))
    return index


def nearest_centroids(vectors: np.ndarray, centroids: np.ndarray, index: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """Index and squared L2 distance of each vector's nearest centroid (exact search)."""
    index = index if index is not None else _flat_index(centroids)
    dist, idx = index.search(np.ascontiguousarray(vectors, dtype=np.float32), 1)
    return idx[:, 0].astype(np.int32), dist[:, 0].astype(np.float32)


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
