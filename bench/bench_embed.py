"""Embedding throughput against a bare ``SentenceTransformer.encode``, and k-means times.

The project's path (``embed_shard``: read a Parquet shard, cap, token-bounded micro-batches,
encode, int8 quantization with fidelity, write) runs against a plain
``encode(texts, batch_size=32, normalize_embeddings=True)`` of the same texts with the same
model, each in its own child process (model loaded and warmed up before the timed part),
interleaved over rounds. Device from ``MARIN_EMBED_DEVICE`` (default auto).

Then FAISS spherical k-means (the fine topic step) at two sample sizes and the coarsening step,
each in a child process.

Goals: ``embed_shard`` >= 0.9x the bare encoder's documents per second (the bookkeeping around
the model must cost little next to the model); k-means CPU time per point at 4x the sample
within 1.3x (it scales linearly, as the topic step's sizing assumes).
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile

import numpy as np

from bench import harness

DIM, K, ITERATIONS = 384, 200, 20


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


def _params():
    from marin_assets.core.embed import embeddings as embed

    device = os.environ.get("MARIN_EMBED_DEVICE", "auto")
    return embed.EmbedParams(encoder=embed.offline_encoder_params(device=device, dtype="auto"))


# --------------------------------------------------------------------------- cases (in the child)


def bare(shard: str) -> dict:
    from marin_assets.core.embed import embeddings as embed
    from marin_assets.core.runtime import storage

    model = embed.load_encoder(_params().encoder)
    texts = storage.read_parquet(shard, columns=["text"]).column("text").to_pylist()
    model.encode(texts[:16], normalize_embeddings=True, show_progress_bar=False)  # warm-up
    with harness.timed():
        model.encode(texts, batch_size=32, normalize_embeddings=True, show_progress_bar=False)
    return {"items": len(texts), "device": str(model.device)}


def ours(shard: str, out: str) -> dict:
    from marin_assets.core.embed import embeddings as embed
    from marin_assets.core.runtime import storage

    params = _params()
    model = embed.load_encoder(params.encoder)
    texts = storage.read_parquet(shard, columns=["text"]).column("text").to_pylist()
    model.encode(texts[:16], normalize_embeddings=True, show_progress_bar=False)  # warm-up (load_encoder caches the model)
    with harness.timed():
        stats = embed.embed_shard([shard], out, params)
    storage.remove(out)
    return {
        "items": len(texts),
        "tokens": stats["tokens"],
        "padded": stats["padded_tokens"],
        "micro_batches": stats["micro_batches"],
        "fidelity_mean": stats["fidelity_mean_cosine"],
        "fidelity_min": stats["fidelity_min_cosine"],
    }


def clustered(n: int, dim: int, centers: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    c = rng.normal(size=(centers, dim))
    x = c[rng.integers(0, centers, n)] + 0.7 * rng.normal(size=(n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def kmeans(n: int, threads: int = 1) -> dict:
    from marin_assets.core.embed import topics

    x = clustered(n, DIM, 300)
    with harness.timed():
        centroids = topics.spherical_kmeans(x, K, iterations=ITERATIONS, restarts=1, seed=42, threads=threads)
    return {"items": n, "model": hashlib.sha256(centroids.tobytes()).hexdigest()[:16]}


def coarsen(fine: int, topics_wanted: int) -> dict:
    from marin_assets.core.embed import topics

    centroids = clustered(fine, DIM, 60, seed=1)
    weights = np.random.default_rng(2).integers(1, 500, len(centroids)).astype(np.float64)
    with harness.timed():
        lookup, info = topics.coarsen(centroids, weights, topics_wanted, topics.TopicParams())
    share = np.bincount(lookup, weights=weights) / weights.sum()
    return {"items": fine, "topics": int(lookup.max() + 1), "moves": int(info["hill_climb_moves"]), "smallest": float(share.min())}


# --------------------------------------------------------------------------- 8,192 tokens vs 512


LONG_POSITIONS = 8192
LONG_BATCH_TOKENS = 16_384  # the configured micro-batch budget of both runs (32 x 512 tokens)


def extended_model(directory: str, positions: int = LONG_POSITIONS) -> str:
    """A copy of the offline MiniLM whose 512 position embeddings are tiled to ``positions`` rows.

    Generated here, never committed or downloaded: the bundled model stops at 512 positions, and
    what the comparison needs is the real encoder's compute and memory at 8,192 tokens (the
    production limit), not good vectors past 512.
    """
    import torch
    from sentence_transformers import SentenceTransformer

    from marin_assets.core.embed import embeddings as embed

    source, _ = embed._model_location(embed.OFFLINE_MODEL)
    model = SentenceTransformer(source, device="cpu", local_files_only=True)
    bert = model[0].auto_model
    old = bert.embeddings.position_embeddings.weight.detach()
    table = torch.nn.Embedding(positions, old.shape[1])
    with torch.no_grad():
        table.weight.copy_(old.repeat(-(-positions // old.shape[0]), 1)[:positions])
    bert.embeddings.position_embeddings = table
    bert.embeddings.register_buffer("position_ids", torch.arange(positions).expand((1, -1)), persistent=False)
    bert.embeddings.register_buffer("token_type_ids", torch.zeros((1, positions), dtype=torch.long), persistent=False)
    bert.config.max_position_embeddings = positions
    model.max_seq_length = positions
    model.tokenizer.model_max_length = positions
    model.save(directory)
    return directory


def long_texts(n: int, long_every: int = 8, seed: int = 3) -> list[str]:
    """Whole vocabulary words (one token each): every ``long_every``-th text is past 8,192 tokens,
    the rest 500-1,500 tokens (the mix a web corpus has at the top of its length range)."""
    words = harness.model_vocabulary()
    rng = np.random.default_rng(seed)
    sizes = [9_000 if i % long_every == 0 else int(rng.integers(500, 1_500)) for i in range(n)]
    return [" ".join(words[rng.integers(0, 20_000, size=k)].tolist()) for k in sizes]


def long_case(shard: str, model_dir: str, max_tokens: int, out: str) -> dict:
    from marin_assets.core.embed import embeddings as embed
    from marin_assets.core.runtime import storage

    params = embed.EmbedParams(
        encoder=embed.offline_encoder_params(model=model_dir, revision=None, max_tokens=max_tokens, max_batch_tokens=LONG_BATCH_TOKENS)
    )
    embed.load_encoder(params.encoder)  # the weights are the same for both runs
    with harness.timed():
        stats = embed.embed_shard([shard], out, params)
    storage.remove(out)
    return {"items": stats["rows"], "tokens": stats["tokens"], "padded": stats["padded_tokens"], "micro_batches": stats["micro_batches"], "at_limit": stats["texts_at_token_limit"]}


def bench_long(n_docs: int, rounds: int) -> bool:
    """Peak memory of ``embed_shard`` at ``max_seq_length`` 8,192 against 512 on the same documents."""
    import pyarrow as pa

    from marin_assets.core.runtime import storage

    texts = long_texts(n_docs)
    ids = [hashlib.md5(t.encode() + str(i).encode()).hexdigest() for i, t in enumerate(texts)]
    with tempfile.TemporaryDirectory(prefix="bench-embed-long-") as tmp:
        model_dir = extended_model(os.path.join(tmp, "minilm-8192"))
        shard = storage.join(tmp, "normalized", storage.shard_name(0, 1))
        storage.write_parquet(pa.table({"id": ids, "text": texts}), shard)
        cases = [
            harness.Case(f"max_seq_length {n}", "bench.bench_embed:long_case",
                         {"shard": shard, "model_dir": model_dir, "max_tokens": n, "out": storage.join(tmp, f"emb{n}", storage.shard_name(0, 1))})
            for n in (512, LONG_POSITIONS)
        ]
        result = harness.compare(
            f"embeddings at 8,192 vs 512 tokens: MiniLM with positions tiled to {LONG_POSITIONS}, {n_docs} docs "
            f"({sum(len(t.split()) >= LONG_POSITIONS for t in texts)} past 8,192 tokens), micro-batch budget {LONG_BATCH_TOKENS:,} tokens",
            cases, rounds=rounds, unit="docs",
        )
    for case in cases:
        run = result[case.label].runs[-1]
        print(f"  {case.label}: tokens {run['tokens']:,}, padded {run['padded']:,}, micro-batches {run['micro_batches']}, texts at the limit {run['at_limit']}, "
              f"peak {result[case.label].peak_mib():.0f} MiB (base {result[case.label].base_mib():.0f})")
    return harness.memory_goal(cases[1].label, cases[0].label, 1.3, "embed_shard peak RSS at max_seq_length 8,192 <= 1.3x the 512-token run").check(result)


# --------------------------------------------------------------------------- the bench (in the parent)


def bench_encode(n_docs: int) -> None:
    import pyarrow as pa

    from marin_assets.core.runtime import storage

    texts = make_texts(n_docs)
    ids = [hashlib.md5(t.encode() + str(i).encode()).hexdigest() for i, t in enumerate(texts)]
    with tempfile.TemporaryDirectory(prefix="bench-embed-") as tmp:
        shard = storage.join(tmp, "normalized", storage.shard_name(0, 1))
        storage.write_parquet(pa.table({"id": ids, "text": texts}), shard)
        one_thread = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        cases = [
            harness.Case("bare SentenceTransformer.encode", "bench.bench_embed:bare", {"shard": shard}, one_thread),
            harness.Case("embed_shard (read..write, int8)", "bench.bench_embed:ours", {"shard": shard, "out": storage.join(tmp, "emb", storage.shard_name(0, 1))}, one_thread),
        ]
        result = harness.compare(f"embeddings: {_params().encoder.model}, {n_docs} docs, one thread", cases, rounds=harness.pick(3, 2), unit="docs")
    run = result["embed_shard (read..write, int8)"].runs[-1]
    print(
        f"  tokens {run['tokens']}, padded {run['padded']} ({run['padded'] / max(run['tokens'], 1):.2f}x), "
        f"micro-batches {run['micro_batches']}, int8 fidelity mean {run['fidelity_mean']:.5f} min {run['fidelity_min']:.5f}"
    )
    harness.speed_goal("embed_shard (read..write, int8)", "bare SentenceTransformer.encode", 0.9, "embed_shard >= 0.9x the docs per CPU second of a bare SentenceTransformer.encode", "cpu").check(result)


def bench_topics() -> None:
    small, large = harness.pick((20_000, 80_000), (10_000, 40_000))
    cases = [harness.Case(f"k-means n={n:,}", "bench.bench_embed:kmeans", {"n": n}, {"OMP_NUM_THREADS": "1"}) for n in (small, large)]
    result = harness.compare(f"spherical k-means (FAISS, 1 thread, k={K}, dim={DIM}, {ITERATIONS} iterations, 1 restart)", cases, rounds=harness.pick(3, 2), unit="points")
    for case in cases:
        seconds = result[case.label].median("cpu_s")
        n = case.kwargs["n"]
        print(f"  {case.label}: {n * K * ITERATIONS / seconds / 1e9:.2f} G point-centroid pairs per CPU second")
    harness.cost_growth_goal(cases[0].label, cases[1].label, 1.3, f"k-means CPU time per point at {large:,} <= 1.3x that at {small:,}").check(result)
    coarse = harness.compare("coarsening 2,000 fine centroids to 40 topics (3 seeds x 10 restarts)", [harness.Case("coarsen", "bench.bench_embed:coarsen", {"fine": 2000, "topics_wanted": 40})], rounds=harness.pick(3, 1), unit="centroids")
    run = coarse["coarsen"].runs[-1]
    print(f"  {run['topics']} topics, {run['moves']} hill-climbing moves, smallest topic {run['smallest']:.3f}")
    seconds = coarse["coarsen"].median("cpu_s")
    harness.absolute_goal("coarsening 2,000 centroids within 60 CPU seconds (it runs once per pool build)", f"{seconds:.1f} CPU s", seconds <= 60)


def bench_topic_threads() -> None:
    """The fit's k-means at 1, 2 and this machine's cores (the fit runs FAISS on the CPUs it reserves):
    wall time per thread count, and whether every thread count gives the same centroids."""
    n = harness.pick(80_000, 40_000)
    counts = sorted({1, 2, os.cpu_count() or 1})
    cases = [harness.Case(f"k-means {t} thread(s)", "bench.bench_embed:kmeans", {"n": n, "threads": t}) for t in counts]
    result = harness.compare(f"spherical k-means by FAISS threads (n={n:,}, k={K}, dim={DIM}, {ITERATIONS} iterations; {os.cpu_count()} cores here)",
                             cases, rounds=harness.pick(3, 2), unit="points")  # fmt: skip
    one = result[cases[0].label].median("seconds")
    for case in cases:
        wall = result[case.label].median("seconds")
        print(f"  {case.label}: wall {wall:.2f} s median ({one / wall:.2f}x of 1 thread), CPU {result[case.label].median('cpu_s'):.2f} s")
    models = {run["model"] for case in cases for run in result[case.label].runs}
    print(f"  centroids: {'identical' if len(models) == 1 else 'DIFFERENT'} across every run and thread count ({len(models)} distinct)")


def main() -> None:
    bench_encode(harness.pick(256, 64))
    bench_long(harness.pick(24, 12), rounds=harness.pick(2, 1))
    bench_topics()
    bench_topic_threads()


if __name__ == "__main__":
    sys.exit(harness.exit_status(main()))
