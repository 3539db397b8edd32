"""Step 4, the fine centroids coarsened into topics: weighted divisive spherical 2-means, then
hill-climbing, every topic keeping ``min_topic_fraction`` of the weight (a direct k = 40 k-means
lets a few dense regions take most topics)."""

from __future__ import annotations

from typing import Any

import numpy as np

from marin_assets.core.embed.topics.layout import TopicParams


def cluster_loss(centroids: np.ndarray, weights: np.ndarray) -> float:
    """Sum of weights minus the norm of the weighted resultant: 0 for identical directions."""
    return float(weights.sum() - np.linalg.norm((weights[:, None] * centroids).sum(axis=0)))


def total_loss(centroids: np.ndarray, weights: np.ndarray, labels: np.ndarray) -> float:
    return sum(cluster_loss(centroids[labels == c], weights[labels == c]) for c in np.unique(labels))


def _repair(
    x: np.ndarray, w: np.ndarray, side: np.ndarray, centers: np.ndarray, min_weight: float
) -> np.ndarray | None:
    """Move members from the heavier side until both sides hold ``min_weight`` (None if impossible)."""
    side = side.copy()
    weight = np.array([w[side == 0].sum(), w[side == 1].sum()])
    if weight.min() >= min_weight:
        return side
    small = int(np.argmin(weight))
    big = 1 - small
    candidates = np.flatnonzero(side == big)
    preference = x[candidates] @ centers[small] - x[candidates] @ centers[big]
    for i in candidates[np.argsort(-preference, kind="stable")]:
        if weight[big] - w[i] < min_weight:
            continue
        side[i] = small
        weight[small] += w[i]
        weight[big] -= w[i]
        if weight[small] >= min_weight:
            return side
    return None


def split_in_two(
    x: np.ndarray, w: np.ndarray, rng: np.random.Generator, *, iterations: int, restarts: int, min_weight: float
) -> np.ndarray | None:
    """Weighted spherical 2-means with k-means++ seeding; the lowest-loss split that keeps the floor."""
    best, best_loss = None, np.inf
    p = w / w.sum()
    for _ in range(restarts):
        first = rng.choice(len(x), p=p)
        spread = np.clip(w * (1.0 - x @ x[first]), 0.0, None)
        if spread.sum() <= 1e-12:
            return None  # all members point the same way: nothing to split
        second = rng.choice(len(x), p=spread / spread.sum())
        centers = x[[first, second]].copy()
        side = np.full(len(x), -1)
        for _ in range(iterations):
            new_side = np.argmax(x @ centers.T, axis=1)
            if np.array_equal(new_side, side):
                break
            side = new_side
            for c in (0, 1):
                resultant = (w[side == c, None] * x[side == c]).sum(axis=0)
                norm = np.linalg.norm(resultant)
                if norm > 0:
                    centers[c] = resultant / norm
        repaired = _repair(x, w, side, centers, min_weight)
        if repaired is None or repaired.min() == repaired.max():
            continue
        loss = cluster_loss(x[repaired == 0], w[repaired == 0]) + cluster_loss(x[repaired == 1], w[repaired == 1])
        if loss < best_loss - 1e-12:
            best, best_loss = repaired, loss
    return best


def divisive_split(
    centroids: np.ndarray,
    weights: np.ndarray,
    n_topics: int,
    min_weight: float,
    seed: int,
    *,
    iterations: int,
    restarts: int,
) -> np.ndarray:
    """Split the highest-loss splittable cluster until there are ``n_topics`` (or none can be split)."""
    rng = np.random.default_rng(seed)
    clusters = [np.arange(len(centroids))]
    frozen = [False]
    while len(clusters) < n_topics:
        losses = [cluster_loss(centroids[m], weights[m]) for m in clusters]
        candidates = [
            c for c in np.argsort(-np.asarray(losses), kind="stable")
            if not frozen[c] and len(clusters[c]) >= 2 and weights[clusters[c]].sum() >= 2 * min_weight
        ]
        for c in candidates:
            members = clusters[c]
            side = split_in_two(
                centroids[members],
                weights[members],
                rng,
                iterations=iterations,
                restarts=restarts,
                min_weight=min_weight,
            )
            if side is None:
                frozen[c] = True
                continue
            clusters[c] = members[side == 0]
            clusters.append(members[side == 1])
            frozen[c] = False
            frozen.append(False)
            break
        else:
            break
    labels = np.empty(len(centroids), dtype=np.int64)
    for c, members in enumerate(clusters):
        labels[members] = c
    return labels


def hill_climb(
    centroids: np.ndarray, weights: np.ndarray, labels: np.ndarray, min_weight: float, max_sweeps: int
) -> tuple[np.ndarray, int]:
    """Move single fine centroids between topics while the total resultant norm grows; keep the floor."""
    labels = labels.copy()
    k = int(labels.max()) + 1
    vec = weights[:, None] * centroids
    resultant = np.stack([vec[labels == c].sum(axis=0) for c in range(k)]).astype(np.float64)
    norms = np.linalg.norm(resultant, axis=1)
    topic_weight = np.array([weights[labels == c].sum() for c in range(k)], dtype=np.float64)
    tolerance = 1e-9 * float(weights.sum())
    moves = 0
    for _ in range(max_sweeps):
        moved = 0
        for i in range(len(centroids)):
            a = labels[i]
            if topic_weight[a] - weights[i] < min_weight:
                continue
            removed = np.linalg.norm(resultant[a] - vec[i])
            gains = np.linalg.norm(resultant + vec[i], axis=1) - norms
            gains[a] = -np.inf
            b = int(np.argmax(gains))
            if removed - norms[a] + gains[b] <= tolerance:
                continue
            resultant[a] -= vec[i]
            resultant[b] += vec[i]
            norms[a], norms[b] = removed, np.linalg.norm(resultant[b])
            topic_weight[a] -= weights[i]
            topic_weight[b] += weights[i]
            labels[i] = b
            moved += 1
        moves += moved
        if moved == 0:
            break
    return labels, moves


def coarsen(
    centroids: np.ndarray, weights: np.ndarray, n_topics: int, params: TopicParams
) -> tuple[np.ndarray, dict[str, Any]]:
    """Fine centroid -> topic lookup with every topic holding ``min_topic_fraction`` of the weight.

    Topics are numbered by decreasing weight. (``method="direct"`` skips this step and therefore
    does not guarantee the floor.)
    """
    weights = np.asarray(weights, dtype=np.float64)
    min_weight = params.min_topic_fraction * float(weights.sum())
    best, best_loss, best_seed = None, np.inf, None
    for seed in params.coarsen_seeds:
        labels = divisive_split(
            centroids, weights, n_topics, min_weight, seed,
            iterations=params.split_iterations, restarts=params.split_restarts,
        )
        loss = total_loss(centroids, weights, labels)
        if loss < best_loss - 1e-12:
            best, best_loss, best_seed = labels, loss, seed
    labels, moves = hill_climb(centroids, weights, best, min_weight, params.max_hill_climb_sweeps)
    final_loss = total_loss(centroids, weights, labels)
    return _by_weight(labels, weights), {
        "coarsen_seed": best_seed,
        "split_loss": best_loss,
        "hill_climb_moves": moves,
        "loss": final_loss,
        "loss_fraction": final_loss / float(weights.sum()),
    }


def _by_weight(labels: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Renumber clusters 0.. by decreasing weight (ties: the lowest member index first)."""
    clusters = np.unique(labels)
    keys = [(-weights[labels == c].sum(), int(np.flatnonzero(labels == c)[0])) for c in clusters]
    order = [clusters[i] for i in sorted(range(len(clusters)), key=lambda i: keys[i])]
    remap = np.empty(int(labels.max()) + 1, dtype=np.int16)
    for new, old in enumerate(order):
        remap[old] = new
    return remap[labels]
