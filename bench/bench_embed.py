"""Embedding throughput against a bare ``SentenceTransformer.encode``, and k-means timings.

The project's path (``embed_shard``: read a Parquet shard, cap, token-bounded micro-batches,
encode, int8 quantization with fidelity, write) runs side by side with a plain
``encode(texts, normalize_embeddings=True)`` over the same texts with the same loaded model,
alternating, best of ``ROUNDS``. The ratio of documents per second should be >= 0.9: the
bookkeeping around the model must cost little next to the model itself.

Then FAISS spherical k-means (the fine step) at two sample sizes and the coarsening step.
Usage: ``python bench/bench_embed.py [n_docs]`` (device from MARIN_EMBED_DEVICE, default auto).
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

from marin_assets.core import embed, storage, topics

ROUNDS = 2


def make_texts(n: int, seed: int = 0) -> list[str]:
    """Documents of 10-400 words from a Zipfian vocabulary: a mix of short and truncated ones."""
    rng = np.random.default_rng(seed)
    vocab = np.array(
        "the of and to in a is that for it as was with be by on not he this are or his from at which "
        "court contract oven flour theorem proof match goal patient dose function return class module "
        "river valley railway station history museum garden season market price energy water system".split()
    )
    p = 1.0 / np.arange(1, len(vocab) + 1)
    p /= p.sum()
    return [" ".join(vocab[rng.choice(len(vocab), size=int(rng.integers(10, 400)), p=p)]) for _ in range(n)]


def bench_encode(n_docs: int) -> None:
    device = os.environ.get("MARIN_EMBED_DEVICE", "auto")
    params = embed.EmbedParams(encoder=embed.offline_encoder_params(device=device, dtype="auto"))
    model = embed.load_encoder(params.encoder)
    texts = make_texts(n_docs)
    ids = [hashlib.md5(t.encode() + str(i).encode()).hexdigest() for i, t in enumerate(texts)]
    with tempfile.TemporaryDirectory() as tmp:
        shard = storage.join(tmp, "normalized", storage.shard_name(0, 1))
        storage.write_parquet(pa.table({"id": ids, "text": texts}), shard)
        model.encode(texts[:16], normalize_embeddings=True)  # warm-up
        bare, ours, stats = [], [], {}
        for r in range(ROUNDS):
            started = time.perf_counter()
            model.encode(texts, batch_size=32, normalize_embeddings=True, show_progress_bar=False)
            bare.append(time.perf_counter() - started)
            started = time.perf_counter()
            stats = embed.embed_shard([shard], storage.join(tmp, f"emb{r}", storage.shard_name(0, 1)), params)
            ours.append(time.perf_counter() - started)
    bare_dps, ours_dps = n_docs / min(bare), n_docs / min(ours)
    print(f"encoder: {params.encoder.model} on {model.device}, {n_docs} docs, best of {ROUNDS}")
    print(f"  bare SentenceTransformer.encode : {bare_dps:8.1f} docs/s")
    print(f"  embed_shard (read..write, int8) : {ours_dps:8.1f} docs/s")
    print(f"  ratio embed_shard / bare        : {ours_dps / bare_dps:8.3f}   (expected >= 0.9)")
    print(
        f"  tokens {stats['tokens']}, padded {stats['padded_tokens']} "
        f"({stats['padded_tokens'] / max(stats['tokens'], 1):.2f}x), micro-batches {stats['micro_batches']}, "
        f"int8 fidelity mean {stats['fidelity_mean_cosine']:.5f} min {stats['fidelity_min_cosine']:.5f}"
    )


def clustered(n: int, dim: int, centers: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    c = rng.normal(size=(centers, dim))
    x = c[rng.integers(0, centers, n)] + 0.7 * rng.normal(size=(n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def bench_kmeans() -> None:
    dim, k = 384, 200
    print(f"spherical k-means (FAISS, 1 thread, k={k}, dim={dim}, 20 iterations, 1 run)")
    for n in (20_000, 80_000):
        x = clustered(n, dim, 300)
        started = time.perf_counter()
        topics.spherical_kmeans(x, k, iterations=20, restarts=1, seed=42, threads=1)
        seconds = time.perf_counter() - started
        print(f"  n={n:>7,}: {seconds:6.2f} s  ({n * k * 20 / seconds / 1e9:.2f} G point-centroid pairs/s)")
    fine = clustered(2_000, dim, 60, seed=1)
    weights = np.random.default_rng(2).integers(1, 500, len(fine)).astype(np.float64)
    started = time.perf_counter()
    lookup, info = topics.coarsen(fine, weights, 40, topics.TopicParams())
    seconds = time.perf_counter() - started
    share = np.bincount(lookup, weights=weights) / weights.sum()
    print(
        f"coarsening 2,000 fine centroids -> {lookup.max() + 1} topics: {seconds:.2f} s "
        f"(3 seeds x 10 restarts, {info['hill_climb_moves']} hill-climbing moves, smallest topic {share.min():.3f})"
    )


def main() -> int:
    n_docs = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    bench_encode(n_docs)
    bench_kmeans()
    return 0


if __name__ == "__main__":
    sys.exit(main())
