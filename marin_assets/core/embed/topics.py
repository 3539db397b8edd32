"""Topics: 40 clusters of the document embeddings, each with a readable label.

A global model is trained once on a sample of all sources, then every document is assigned
shard by shard.

Training, in order:

1. **Sample** ``sample_size`` rows (10M) across sources in proportion to their row counts
   (largest-remainder rounding). A source with at most 1,000 rows contributes one row, its
   proportional share at production scale. Rows are drawn at random within each shard with a
   generator seeded from ``sha256(f"{seed}:{source}:{shard basename}")``, so a source's draw
   does not depend on the others, nor on where the data lives. When the corpus has no more rows
   than ``sample_size`` the sample is the whole corpus. Tasks draw it; the step never holds it.
2. **Fine k-means**: spherical FAISS k-means with many centroids (5,000; 20 iterations, best
   of 3 runs) on a source-stratified training subset of at most 512 rows per centroid.
   Many fine centroids first, because a direct k = 40 k-means lets a few dense regions grab
   most centroids and leaves tiny topics.
3. **Weights**: every sample row goes to its nearest fine centroid; the counts are the weights.
4. **Coarsening** the fine centroids into 40 topics by weighted divisive spherical 2-means
   (split the highest-loss cluster, best of 10 restarts, then repair so every cluster keeps at
   least 1% of the total weight), keeping the best of seeds 42/43/44, followed by
   hill-climbing that moves single fine centroids between topics while the total resultant
   norm grows and the 1% floor holds. Loss of a cluster = sum of weights - norm of the weighted
   sum of its unit vectors (a weighted cosine distance).
5. **Labels**: the top c-TF-IDF terms (1-2-grams, English stop-words removed) of each topic
   over a random subset of sample texts plus the documents nearest the topic's centroid, and
   500-character excerpts of those nearest documents.

Steps 2-4 and the choice of step 5's rows are one task (``fit_topics``) that reads the sample's
parts and holds the sample (10^7 x 1024 float16: 19 GiB, and the float32 training subset: 10 GiB),
reserving ``fit_memory_bytes`` and ``fit_cpus``; the step then holds only the 10^5 label rows
(where each came from, its topic), reads their texts by tasks and computes the labels.

Small corpora (the demo): when the sample has no more rows than ``k_fine``, the sample vectors
themselves serve as fine centroids (weight 1 each: k-means cannot be finer than one centroid per
row, and with a handful of rows per centroid it is noisy). With fewer than
``min_points_per_fine`` (4) rows per fine centroid, k_fine becomes ``n_sample // 4`` (and the
rows again when that is below the number of topics). The number of topics becomes
``min(n_topics, n_sample)``; the coarsening stops early, and says so in ``n_topics``, when the
1% floor leaves no cluster that can be split further. Fine centroids left empty by the final assignment carry no weight
and are dropped (counted in the stats) rather than failing: on small samples k-means can leave
one empty.

FAISS k-means is run single-threaded by default because it is not bit-stable across thread
counts or machines; a trained model is copied, not recomputed, to reproduce it elsewhere.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from marin_assets.core.embed.embeddings import vectors_from_table
from marin_assets.core.runtime import storage

FINE_CENTROIDS = "fine_centroids.npy"
FINE_TO_TOPIC = "fine_to_topic.npy"
FINE_WEIGHTS = "fine_weights.npy"
TOPICS_JSON = "topics.json"
TRAIN_STATS_JSON = "train_stats.json"


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
    threads: int = 1
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
    # rows (0.4 GiB), with room (make rehearse measures it: ~29 GiB); its CPUs assign the sample to
    # the fine centroids (k-means: ``threads``).
    fit_memory_bytes: int = 40 << 30
    fit_cpus: float = 16.0

    def model_params(self) -> dict[str, Any]:
        """What decides the model (its fingerprint, its ``topics.json``): all but the fit's reservation."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in ("fit_memory_bytes", "fit_cpus")}

    def fit_reservation(self, rows: int) -> tuple[float, int]:
        """(CPUs, memory bytes) the fit task reserves for a sample of ``rows``: the configured ones
        at ``sample_size`` rows, in proportion below it (at least 1 CPU and 1 GiB), so a small
        corpus on a small Ray (``local``) is not a task no node can take."""
        share = min(1.0, rows / self.sample_size)
        return max(1.0, round(self.fit_cpus * share)), max(1 << 30, int(self.fit_memory_bytes * share))


@dataclasses.dataclass(frozen=True)
class SourceShards:
    """One source's embedding shards and, for labels, its co-partitioned normalized shards."""

    source: str
    embeddings: tuple[str, ...]
    texts: tuple[str, ...] = ()
    rows: tuple[int, ...] = ()  # rows per embeddings shard, as the embedding tasks counted them (empty: read the footers)


# --------------------------------------------------------------------------- 1. sample


def largest_remainder(total: int, weights: Sequence[float], caps: Sequence[int] | None = None) -> list[int]:
    """Split ``total`` into integers proportional to ``weights``, each at most its cap.

    Floors first, then the leftover units go to the largest fractional parts (ties: lower
    index). A share cut by its cap is redistributed over the others.
    """
    n = len(weights)
    caps_arr = np.asarray(caps if caps is not None else [total] * n, dtype=np.int64)
    w = np.asarray(weights, dtype=np.float64)
    out = np.zeros(n, dtype=np.int64)
    free = np.ones(n, dtype=bool) & (w > 0) & (caps_arr > 0)
    budget = int(min(total, caps_arr[free].sum())) if free.any() else 0
    while budget > 0 and free.any():
        idx = np.flatnonzero(free)
        ideal = budget * w[idx] / w[idx].sum()
        share = np.floor(ideal).astype(np.int64)
        leftover = budget - int(share.sum())
        order = np.lexsort((idx, -(ideal - share)))[:leftover]
        share[order] += 1
        over = share > caps_arr[idx] - out[idx]
        if not over.any():
            out[idx] += share
            break
        capped = idx[over]
        budget -= int((caps_arr[capped] - out[capped]).sum())
        out[capped] = caps_arr[capped]
        free[capped] = False
    return out.tolist()


def source_quotas(row_counts: Mapping[str, int], sample_size: int, small_source_rows: int = 1_000) -> dict[str, int]:
    """Rows to sample per source: proportional to size, one row for a small source."""
    total = sum(row_counts.values())
    if total <= sample_size:
        return dict(row_counts)
    names = sorted(row_counts)
    small = [s for s in names if 0 < row_counts[s] <= small_source_rows]
    large = [s for s in names if row_counts[s] > small_source_rows]
    quotas = {s: 0 for s in names} | {s: 1 for s in small}
    budget = max(sample_size - len(small), 0)
    shares = largest_remainder(budget, [row_counts[s] for s in large], [row_counts[s] for s in large])
    quotas.update(zip(large, shares))
    return quotas


def shard_seed(seed: int, source: str, shard_uri: str) -> int:
    """Per-shard generator seed: independent of other shards and of the storage root."""
    digest = hashlib.sha256(f"{seed}:{source}:{storage.basename(shard_uri)}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def read_rows(uri: str, rows: np.ndarray, columns: Sequence[str]) -> pa.Table:
    """Rows ``rows`` (sorted positions) of a Parquet file, reading only the row groups that hold them.

    A 10M-row sample out of 10^10 documents touches a small part of each shard; reading whole
    shards would make the sample cost the corpus.
    """
    import pyarrow.parquet as pq  # noqa: PLC0415

    rows = np.asarray(rows, dtype=np.int64)
    fs, path = storage.filesystem(uri)
    with fs.open(path, "rb") as handle:
        parquet = storage.parquet_file(handle)
        meta = parquet.metadata
        sizes = np.array([meta.row_group(g).num_rows for g in range(meta.num_row_groups)], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(sizes)])
        group_of = np.searchsorted(starts, rows, side="right") - 1
        groups = np.unique(group_of).tolist()
        if not groups:
            return parquet.schema_arrow.empty_table().select(list(columns))
        table = parquet.read_row_groups(groups, columns=list(columns))
    offsets = np.concatenate([[0], np.cumsum(sizes[groups])])
    local = offsets[np.searchsorted(groups, group_of)] + (rows - starts[group_of])
    return table.take(pa.array(local, pa.int64()))


@dataclasses.dataclass
class EmbeddingSample:
    """Sampled rows: unit vectors (float16 to halve memory), where each row came from, its id."""

    vectors: np.ndarray
    ids: np.ndarray  # bytes (S32)
    source: np.ndarray  # index into sources
    shard: np.ndarray  # index into shards
    row: np.ndarray  # row within its shard
    sources: list[SourceShards]
    shards: list[tuple[int, str, str | None]]  # (source index, embeddings uri, text uri)

    def __len__(self) -> int:
        return len(self.row)


def float32_batches(vectors: np.ndarray, batch_rows: int):
    """float32 batches of ``vectors``, so memory stays bounded."""
    for start in range(0, len(vectors), batch_rows):
        yield np.ascontiguousarray(vectors[start : start + batch_rows], dtype=np.float32)


SHARDS_PER_SAMPLE_TASK = 128  # a sample task's spec names its shards: ~15 KiB


@dataclasses.dataclass(frozen=True)
class SampleParams:
    seed: int
    picks: tuple[tuple[str, int, int], ...]  # per input shard: its source, its rows, rows to draw


def sample_shards(input_uris: list[str], output_uri: str, params: SampleParams) -> dict[str, Any]:
    """A task: the sampled rows of a chunk of embedding shards (each read only in the row groups
    that hold them), stored as ``.npz`` (float16 vectors, ids, row numbers) at ``output_uri``."""
    vectors, ids, rows_drawn = [], [], []
    for uri, (source, n, q) in zip(input_uris, params.picks, strict=True):
        rng = np.random.default_rng(shard_seed(params.seed, source, uri))
        rows = np.sort(rng.choice(n, size=q, replace=False))
        table = read_rows(uri, rows, ["id", "embedding"])
        vectors.append(vectors_from_table(table).astype(np.float16))
        ids.append(np.asarray(table.column("id").to_pylist(), dtype="S32"))
        rows_drawn.append(rows.astype(np.int64))
    buf = io.BytesIO()
    np.savez(buf, vectors=np.concatenate(vectors), ids=np.concatenate(ids), rows=np.concatenate(rows_drawn))
    storage.write_bytes(output_uri, buf.getvalue())
    return {"rows": int(sum(len(r) for r in rows_drawn))}


PARTS_PER_COMBINE_TASK = 64  # the fit task reads ~1/64 of the sample's parts (~50 for the pool)


def concat_sample_parts(input_uris: list[str], output_uri: str, params: None = None) -> dict[str, Any]:
    """A task: sample parts (``.npz``) put together in order, stored at ``output_uri``."""
    parts = [np.load(io.BytesIO(storage.read_bytes(uri)), allow_pickle=False) for uri in input_uris]
    buf = io.BytesIO()
    np.savez(buf, **{key: np.concatenate([part[key] for part in parts]) for key in ("vectors", "ids", "rows")})
    storage.write_bytes(output_uri, buf.getvalue())
    return {"rows": int(sum(len(part["rows"]) for part in parts))}


def load_sample_parts(uris: Sequence[str], n_rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(vectors, ids, rows) of ``n_rows`` sample rows from their parts, in order: each part read
    into arrays made once, so the sample is held once, not once more while it is put together."""
    vectors = ids = rows = None
    at = 0
    for uri in uris:
        part = np.load(io.BytesIO(storage.read_bytes(uri)), allow_pickle=False)
        if vectors is None:
            vectors = np.empty((n_rows, part["vectors"].shape[1]), dtype=part["vectors"].dtype)
            ids, rows = np.empty(n_rows, dtype=part["ids"].dtype), np.empty(n_rows, dtype=np.int64)
        n = len(part["rows"])
        vectors[at : at + n], ids[at : at + n], rows[at : at + n] = part["vectors"], part["ids"], part["rows"]
        at += n
    if vectors is None or at != n_rows:
        raise ValueError(f"the sample's parts hold {at} rows, {n_rows} were drawn; rerun topic_model (its sample is redrawn)")
    return vectors, ids, rows


def _shards_and_rows(sources: Sequence[SourceShards]) -> tuple[list[tuple[int, str, str | None]], list[int]]:
    shard_list: list[tuple[int, str, str | None]] = []
    shard_rows: list[int] = []
    for si, src in enumerate(sources):
        if src.texts and len(src.texts) != len(src.embeddings):
            raise ValueError(
                f"source {src.source}: {len(src.embeddings)} embedding shards but {len(src.texts)} normalized "
                "shards; they must be co-partitioned (rebuild the embeddings for this source)"
            )
        text_by_name = {storage.basename(u): u for u in src.texts}
        for k, uri in enumerate(src.embeddings):
            text_uri = text_by_name.get(storage.basename(uri)) if src.texts else None
            if src.texts and text_uri is None:
                raise ValueError(
                    f"source {src.source}: embedding shard {uri} has no normalized shard of the same name; "
                    "rebuild the embeddings for this source"
                )
            shard_list.append((si, uri, text_uri))
            shard_rows.append(src.rows[k] if len(src.rows) == len(src.embeddings) else storage.parquet_num_rows(uri))
    return shard_list, shard_rows


@dataclasses.dataclass(frozen=True)
class SamplePlan:
    """Where the sample's rows come from, by runs: ``pick_rows[i]`` rows of shard ``pick_shard[i]``,
    in source order, then shard order (the order of the rows in the parts); nothing per row."""

    sources: list[SourceShards]
    shards: list[tuple[int, str, str | None]]  # (source index, embeddings uri, text uri)
    shard_rows: list[int]
    pick_shard: np.ndarray
    pick_rows: np.ndarray

    @property
    def rows(self) -> int:
        return int(self.pick_rows.sum())

    def source_rows(self) -> list[int]:
        """Rows drawn per source, in source order (each source's rows follow each other)."""
        of_pick = np.asarray([self.shards[k][0] for k in self.pick_shard.tolist()], dtype=np.int64)
        return np.bincount(of_pick, weights=self.pick_rows, minlength=len(self.sources)).astype(np.int64).tolist()

    def shard_of(self, index: np.ndarray) -> np.ndarray:
        """The shard (index into ``shards``) of sample rows ``index``."""
        return self.pick_shard[np.searchsorted(np.cumsum(self.pick_rows), index, side="right")]


def plan_sample(sources: Sequence[SourceShards], params: TopicParams) -> SamplePlan:
    """Rows to draw per shard (step 1): per source in proportion to its rows, per shard within it."""
    shard_list, shard_rows = _shards_and_rows(sources)
    per_source = {src.source: 0 for src in sources}
    for (si, _, _), n in zip(shard_list, shard_rows):
        per_source[sources[si].source] += n
    quotas = source_quotas(per_source, params.sample_size, params.small_source_rows)
    picks: list[tuple[int, int]] = []  # (shard index, rows to draw) in source order, then shard order
    for si, src in enumerate(sources):
        members = [k for k, (s, _, _) in enumerate(shard_list) if s == si]
        counts = [shard_rows[k] for k in members]
        picks += [(k, q) for k, q in zip(members, largest_remainder(quotas[src.source], counts, counts)) if q]
    if not picks:
        names = ", ".join(s.source for s in sources) or "none"
        raise ValueError(f"no embedded documents to train topics on (sources: {names}); materialize embeddings first")
    pick_shard, pick_rows = (np.asarray(column, dtype=np.int64) for column in zip(*picks))
    return SamplePlan(list(sources), shard_list, shard_rows, pick_shard, pick_rows)


def draw_sample(plan: SamplePlan, seed: int, runner: Any, work_uri: str) -> list[str]:
    """The sample's parts on storage, in row order: rows drawn by tasks of ``SHARDS_PER_SAMPLE_TASK``
    shards on ``runner``, their parts put together ``PARTS_PER_COMBINE_TASK`` at a time by tasks."""
    from marin_assets.core.runtime.runner import ShardTask, combined_by_tasks  # noqa: PLC0415

    picks, step = list(zip(plan.pick_shard.tolist(), plan.pick_rows.tolist())), SHARDS_PER_SAMPLE_TASK
    chunks = [picks[i:i + step] for i in range(0, len(picks), step)]
    tasks = [
        ShardTask(sample_shards, tuple(plan.shards[k][1] for k, _ in chunk), storage.join(work_uri, f"part-{c:06d}.npz"),
                  SampleParams(seed, tuple((plan.sources[plan.shards[k][0]].source, plan.shard_rows[k], q) for k, q in chunk)))
        for c, chunk in enumerate(chunks)
    ]  # fmt: skip
    parts = [r.output for r in runner.map(tasks)]
    return combined_by_tasks(parts, storage.join(work_uri, "combined"), concat_sample_parts, None, runner, PARTS_PER_COMBINE_TASK)


def sample_embeddings(sources: Sequence[SourceShards], params: TopicParams, runner: Any = None, work_uri: str = "") -> EmbeddingSample:
    """The whole training sample in this process, with where each row came from (tests and
    benchmarks; the step never holds it): drawn by tasks on ``runner`` (in this process when
    None), then read."""
    from marin_assets.core.runtime.runner import ShardRunner  # noqa: PLC0415

    plan = plan_sample(sources, params)
    work = work_uri or tempfile.mkdtemp(prefix="topic-sample-")
    vectors, ids, rows = load_sample_parts(draw_sample(plan, params.seed, runner or ShardRunner(), work), plan.rows)
    storage.remove(work, recursive=True)  # read: the parts are not needed again
    index = np.arange(plan.rows)
    return EmbeddingSample(
        vectors=vectors,
        ids=ids,
        source=np.repeat(np.arange(len(sources), dtype=np.int32), plan.source_rows()),
        shard=plan.shard_of(index).astype(np.int32),
        row=rows,
        sources=list(sources),
        shards=plan.shards,
    )


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


# --------------------------------------------------------------------------- 2-3. fine k-means and weights


def spherical_kmeans(
    vectors: np.ndarray, k: int, *, iterations: int, restarts: int, seed: int, threads: int = 1
) -> np.ndarray:
    """Unit-norm centroids of FAISS spherical k-means (best of ``restarts`` runs)."""
    import faiss  # noqa: PLC0415

    x = np.ascontiguousarray(vectors, dtype=np.float32)
    previous = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(threads)
    try:
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
    finally:
        faiss.omp_set_num_threads(previous)
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


# --------------------------------------------------------------------------- 4. coarsening


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


# --------------------------------------------------------------------------- the model


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


# --------------------------------------------------------------------------- 5. labels


def ctfidf_terms(texts: Sequence[str], topics: np.ndarray, n_topics: int, params: TopicParams) -> list[list[str]]:
    """Top class-based TF-IDF terms per topic: tf within the topic x log(1 + A / frequency overall)."""
    from scipy import sparse  # noqa: PLC0415
    from sklearn.feature_extraction.text import CountVectorizer  # noqa: PLC0415

    if not texts:
        return [[] for _ in range(n_topics)]
    vectorizer = CountVectorizer(
        ngram_range=(1, 2),
        stop_words="english",
        max_features=params.label_max_features,
        token_pattern=r"(?u)\b[^\W\d_]{2,}\b",
        lowercase=True,
    )
    try:
        counts = vectorizer.fit_transform(texts)
    except ValueError:  # nothing but stop-words and numbers
        return [[] for _ in range(n_topics)]
    n_docs = len(topics)
    membership = sparse.csr_matrix((np.ones(n_docs), (topics, np.arange(n_docs))), shape=(n_topics, n_docs))
    per_topic = np.asarray((membership @ counts).todense(), dtype=np.float64)
    words = per_topic.sum(axis=1, keepdims=True)
    tf = per_topic / np.maximum(words, 1.0)
    average_words = float(words.sum()) / max(int((words > 0).sum()), 1)
    idf = np.log1p(average_words / np.maximum(per_topic.sum(axis=0), 1.0))
    scores = tf * idf
    vocabulary = vectorizer.get_feature_names_out()
    out = []
    for t in range(n_topics):
        top = np.argsort(-scores[t], kind="stable")[: params.label_terms]
        out.append([str(vocabulary[i]) for i in top if scores[t, i] > 0])
    return out


def short_label(terms: Sequence[str], topic: int, n_terms: int = 3) -> str:
    """A few top terms, skipping one whose words an earlier (bigram) term already shows."""
    chosen: list[str] = []
    for term in terms:
        shown = {w for c in chosen for w in c.split()}
        if set(term.split()) <= shown:
            continue
        chosen.append(term)
        if len(chosen) == n_terms:
            break
    return ", ".join(chosen) if chosen else f"topic {topic:02d}"


@dataclasses.dataclass(frozen=True)
class TextParams:
    picks: tuple[tuple[str, str, tuple[int, ...], tuple[bytes, ...]], ...]  # per input shard: source, embeddings shard, rows, their ids
    max_chars: int | None


def read_texts(input_uris: list[str], output_uri: str, params: TextParams) -> dict[str, Any]:
    """A task: the texts of sample rows (cut to ``max_chars``) from a chunk of normalized shards,
    ids checked against the embeddings', stored in order as a JSON list at ``output_uri``."""
    texts: list[str] = []
    for text_uri, (source, emb_uri, rows, ids) in zip(input_uris, params.picks, strict=True):
        table = read_rows(text_uri, np.asarray(rows, dtype=np.int64), ["id", "text"])
        got = np.asarray(table.column("id").to_pylist(), dtype="S32")
        if not np.array_equal(got, np.asarray(ids, dtype="S32")):
            raise ValueError(
                f"source {source}: ids of {emb_uri} do not match {text_uri} row for row; "
                "the embeddings are stale, rebuild them for this source"
            )
        texts += [(text or "")[:params.max_chars] if params.max_chars else (text or "") for text in table.column("text").to_pylist()]
    storage.write_json(output_uri, texts)
    return {"rows": len(texts)}


def concat_text_parts(input_uris: list[str], output_uri: str, params: None = None) -> dict[str, Any]:
    """A task: text parts (JSON lists) put together in order, stored at ``output_uri``."""
    texts = [text for uri in input_uris for text in storage.read_json(uri)]
    storage.write_json(output_uri, texts)
    return {"rows": len(texts)}


def _read_texts(sample: EmbeddingSample | LabelRows, rows: np.ndarray, max_chars: int | None = None, runner: Any = None, work_uri: str = "") -> dict[int, str]:
    """Texts of sample rows (cut to ``max_chars``), read from the co-partitioned normalized shards
    (ids checked) by tasks of ``SHARDS_PER_SAMPLE_TASK`` shards, their parts put together by tasks.

    Cutting as they are read caps the label step at rows x ``max_chars`` characters; the ~10^5
    shards that hold the label rows are read by tasks, not one after another by the step.
    """
    from marin_assets.core.runtime.runner import (  # noqa: PLC0415
        ShardRunner,
        ShardTask,
        combined_by_tasks,
    )

    shard_of = sample.shard[rows]
    order = np.argsort(shard_of, kind="stable")  # rows by shard, in row order within one: no pass over all rows per shard
    keys, starts = np.unique(shard_of[order], return_index=True)
    held = [(int(k), mine) for k, mine in zip(keys, np.split(rows[order], starts[1:])) if sample.shards[int(k)][2] is not None]
    if not held:
        return {}
    step, work = SHARDS_PER_SAMPLE_TASK, work_uri or tempfile.mkdtemp(prefix="topic-texts-")
    chunks = [held[i:i + step] for i in range(0, len(held), step)]
    tasks = [
        ShardTask(read_texts, tuple(sample.shards[k][2] for k, _ in chunk), storage.join(work, f"part-{c:06d}.json"),
                  TextParams(tuple((sample.sources[sample.shards[k][0]].source, sample.shards[k][1], tuple(sample.row[mine].tolist()),
                                    tuple(sample.ids[mine].tolist())) for k, mine in chunk), max_chars))
        for c, chunk in enumerate(chunks)
    ]  # fmt: skip
    runner = runner or ShardRunner()
    parts = [r.output for r in runner.map(tasks)]
    combined = combined_by_tasks(parts, storage.join(work, "combined"), concat_text_parts, None, runner, PARTS_PER_COMBINE_TASK)
    texts = [text for uri in combined for text in storage.read_json(uri)]
    storage.remove(work, recursive=True)  # put together: the parts are not needed again
    return dict(zip(np.concatenate([mine for _, mine in held]).tolist(), texts, strict=True))


@dataclasses.dataclass
class LabelRows:
    """The sample rows the labels read (10^5 of the 10^7), as the fit task chose them: where each
    came from (the fields ``_read_texts`` reads, as an ``EmbeddingSample`` has them), its topic,
    and per topic its nearest rows (positions here, nearest first)."""

    ids: np.ndarray
    shard: np.ndarray
    row: np.ndarray
    topic: np.ndarray
    nearest: list[np.ndarray]
    sources: list[SourceShards]
    shards: list[tuple[int, str, str | None]]

    def __len__(self) -> int:
        return len(self.row)


def topic_labels_of(labels: LabelRows, texts: Mapping[int, str], model: TopicModel, params: TopicParams) -> list[TopicLabel]:
    """Step 5: c-TF-IDF terms over the label rows' texts (``texts``: by position in ``labels``)
    and each topic's nearest excerpts."""
    n_topics = model.n_topics
    have = np.asarray([r for r in range(len(labels)) if r in texts], dtype=np.int64)
    terms = ctfidf_terms([texts[int(r)][: params.label_text_chars] for r in have], labels.topic[have], n_topics, params)
    total = float(model.fine_weights.sum())
    out = []
    for t in range(n_topics):
        members = model.fine_to_topic == t
        weight = float(model.fine_weights[members].sum())
        excerpts = tuple(texts[int(r)][: params.excerpt_chars] for r in labels.nearest[t] if int(r) in texts)
        out.append(
            TopicLabel(
                topic=t,
                label=short_label(terms[t], t),
                terms=tuple(terms[t]),
                excerpts=excerpts,
                weight=weight,
                weight_fraction=weight / total,
                fine_clusters=int(members.sum()),
            )
        )
    return out


# --------------------------------------------------------------------------- training (global)


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


def choose_label_rows(vectors: np.ndarray, topic_of_row: np.ndarray, centroids: np.ndarray, params: TopicParams) -> tuple[np.ndarray, list[np.ndarray]]:
    """Step 5's rows: a random ``label_sample_size`` of the sample plus each topic's
    ``label_excerpts`` rows nearest its centroid (``centroids``: the topics'). Returns the sorted
    row numbers and, per topic, its nearest rows, nearest first."""
    n, n_topics = len(vectors), len(centroids)
    similarity = np.empty(n, dtype=np.float32)
    for start, batch in zip(range(0, n, params.batch_rows), float32_batches(vectors, params.batch_rows)):
        part = slice(start, start + len(batch))
        similarity[part] = np.sum(batch * centroids[topic_of_row[part]], axis=1)
    rows = np.arange(n)
    order = np.lexsort((rows, -similarity, topic_of_row))
    first = np.searchsorted(topic_of_row[order], np.arange(n_topics))
    nearest = [order[first[t] : first[t] + params.label_excerpts] for t in range(n_topics)]
    nearest = [m[topic_of_row[m] == t] for t, m in enumerate(nearest)]
    rng = np.random.default_rng(params.seed)
    subset = rows if n <= params.label_sample_size else np.sort(rng.choice(rows, params.label_sample_size, replace=False))
    nearest_rows = np.concatenate(nearest) if nearest else np.zeros(0, dtype=np.int64)
    return np.union1d(subset, nearest_rows).astype(np.int64), nearest


LABEL_ROWS = "label_rows.npz"


@dataclasses.dataclass(frozen=True)
class FitParams:
    topic: TopicParams
    rows: int  # sample rows in the parts
    source_rows: tuple[int, ...]  # rows per source, in source order (the parts hold each source's rows together)


def fit_topics(input_uris: list[str], output_uri: str, params: FitParams) -> dict[str, Any]:
    """A task: steps 2-4 on the sample's parts and the choice of step 5's rows, stored under
    ``output_uri`` (the model's arrays; ``label_rows.npz``: those rows' numbers, topics, ids and
    rows in their shards, each topic's nearest). It holds the sample: ``fit_memory_bytes``."""
    vectors, ids, rows = load_sample_parts(input_uris, params.rows)
    source = np.repeat(np.arange(len(params.source_rows), dtype=np.int32), params.source_rows)
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


def train_topic_model(sources: Sequence[SourceShards], output_uri: str, params: TopicParams, runner: Any = None) -> dict[str, Any]:
    """Sample (by shard tasks on ``runner``, in this process when None), fit (one task that holds
    the sample, reserving ``fit_reservation``), label (texts read by tasks) and
    save the topic model under ``output_uri``; returns training stats. This process holds the
    label rows, never the sample's rows.

    The caller writes the output's manifest once this returns (files here are written first).
    """
    from marin_assets.core.runtime.runner import ShardRunner, ShardTask, TaskResources  # noqa: PLC0415

    runner = runner or ShardRunner()
    started = time.perf_counter()
    plan = plan_sample(sources, params)
    sample_work, fit_work = storage.join(output_uri, "_sample"), storage.join(output_uri, "_fit")
    parts = draw_sample(plan, params.seed, runner, sample_work)
    source_rows = plan.source_rows()
    stats = {"sample_seconds": round(time.perf_counter() - started, 3), "sample_rows_per_source": dict(zip([s.source for s in sources], source_rows))}
    cpus, memory = params.fit_reservation(plan.rows)
    fit = ShardTask(fit_topics, tuple(parts), storage.join(fit_work, "fit"), FitParams(params, plan.rows, tuple(source_rows)),
                    TaskResources(cpus=cpus, memory_bytes=memory))  # fmt: skip
    stats.update(runner.map([fit])[0].stats)
    model, labels = read_fit(fit.output, plan)
    started = time.perf_counter()
    texts = _read_texts(labels, np.arange(len(labels)), max(params.label_text_chars, params.excerpt_chars), runner, storage.join(output_uri, "_labels"))
    model.topics = topic_labels_of(labels, texts, model, params)
    stats["label_seconds"] = round(time.perf_counter() - started, 3)
    fractions = [t.weight_fraction for t in model.topics]
    stats["min_topic_fraction"] = min(fractions)
    stats["max_topic_fraction"] = max(fractions)
    model.meta = {"n_topics": model.n_topics, "k_fine": stats["k_fine"], "dim": int(model.fine_centroids.shape[1]), "params": params.model_params()}
    save_topic_model(model, output_uri)
    storage.write_json(storage.join(output_uri, TRAIN_STATS_JSON), stats)
    for work in (sample_work, fit_work):  # the model is saved: the sample and the fit's output are not needed again
        storage.remove(work, recursive=True)
    return stats


# --------------------------------------------------------------------------- 6. assignment (per shard)


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

