"""Per-shard stages that had no row: contamination, pool and sampling_groups, each against a peer
used as its users use it, plus the map of every stage to the bench that holds it to a goal.

* ``contamination``: ``contamination_shard`` (read a normalized shard, mark it with both rules
  against the eval index, write the attribute shard) against the plain way to decontaminate: a
  Python set of the eval rows' 13-gram strings, every 13-gram of each ``str.split()`` document
  looked up, flags written as Parquet. Goal: >= 1x the peer's documents per CPU second (the
  project's rules do more: two rules, normalization, paragraph units), peak memory <= 1.5x.
* ``pool``: ``pool_shard`` (filter one shard by its attributes and the source's sparse removal
  lists, band, count tokens, write group files and the shard index) against polars used
  plainly: read the shard and its attribute shards, anti-join the whole removal lists, filter,
  band, count tokens with the same tokenizer, ``partition_by`` group and write. The removal lists
  cover the whole source (``LIST_SHARDS`` shards' worth of ids, 1 in 8 exact and 1 in 5 fuzzy
  duplicates), as in production. Goals: >= 0.8x
  the peer's documents per CPU second; peak memory <= 1x the peer's (the pool reads only the
  removal-list row groups that overlap the shard).
* ``sampling_groups``: documents and tokens per (group, source) from every pool shard index plus
  the streamed file list, against one polars ``group_by`` over all indexes. Goal: >= 0.5x the
  peer's index rows per CPU second, peak memory <= 1.5x.

Each case runs in its own child (``bench.harness``), interleaved, median and range, memory from
each child's own VmHWM reset after reading its input. ``STAGES`` below says which bench holds each
of the pipeline's stages to a goal; a stage without a peer says so and why.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

from bench import harness

# Every stage of core/specs.py -> the bench (module name) whose rows hold it to a goal, and how.
STAGES: dict[str, tuple[str, str]] = {
    "source_pins": ("rerun", "no peer: one provider listing per source; inside the rerun bench's no-change rerun time goal"),
    "raw_files": ("download", "the fetch (verified, resumable) vs huggingface_hub.snapshot_download from the local Hub, MiB/s"),
    "normalized": ("normalize", "vs plain polars read+hash+write, small files and one large file, memory growth"),
    "minhash_buckets": ("minhash", "vs datasketch update_batch, MinHash.bulk and rensa, per CPU second"),
    "exact_duplicates": ("dedup", "scale rows: time and memory per document at 1x..64x"),
    "fuzzy_duplicates": ("minhash", "peak memory growth 4k -> 16k documents (and the dedup bench's scale rows)"),
    "eval_ngrams": ("decon", "index build inside the marking rows (production index size)"),
    "boilerplate_ngrams": ("decon", "drop sets computed on the planted source"),
    "contamination": ("stages", "contamination_shard vs a Python set of 13-gram strings, per CPU second and memory"),
    "embeddings": ("embed", "embed_shard vs a bare SentenceTransformer.encode"),
    "topic_model": ("embed", "k-means CPU per point at 4x the sample"),
    "topics": ("", "NO ROW: nearest centroid per vector, a matrix product per shard, small next to the embeddings it reads"),
    "quality_model": ("", "NO ROW: a fit on a few hundred labelled vectors (seconds), once per label set"),
    "quality_scores": ("", "NO ROW: one matrix-vector product per shard, small next to the embeddings it reads"),
    "quality_bands": ("", "NO ROW: quantiles per topic from streamed score histograms, once over small inputs"),
    "pool": ("stages", "pool_shard vs polars anti-join on the removal lists, per CPU second and memory"),
    "sampling_groups": ("stages", "group counts and file list vs one polars group_by over every shard index"),
    "mixture_swarm": ("", "NO ROW: per study, not per document: proposes a few hundred mixtures in seconds"),
    "proxy_results": ("", "NO ROW: per proxy run; the external trainer's time, or the built-in toy proxy's seconds"),
    "mixture_model": ("", "NO ROW: per study, a fit on tens to hundreds of runs"),
    "mixture_weights": ("", "NO ROW: per study, a search over candidate mixtures"),
}

DOCS = harness.pick(20_000, 2_000)
LIST_SHARDS = 64  # the removal lists span 64 shards of the source: larger than the shard, as in production
INDEX_SHARDS = harness.pick(4_000, 400)
ROUNDS = harness.pick(3, 2)
NGRAM = 13


# --------------------------------------------------------------------------- inputs (in the parent)


def _vocabulary(rng: np.random.Generator, size: int = 20_000) -> np.ndarray:
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    return np.array(["".join(rng.choice(letters, size=int(rng.integers(2, 10)))) for _ in range(size)])


def make_texts(n: int, seed: int = 0) -> list[str]:
    """Documents of 1-6 paragraphs of 20-120 Zipfian words (a web page's shape, without markup)."""
    rng = np.random.default_rng(seed)
    vocab = _vocabulary(rng)
    p = 1.0 / np.arange(1, len(vocab) + 1)
    p /= p.sum()
    texts = []
    for _ in range(n):
        paragraphs = [" ".join(vocab[rng.choice(len(vocab), size=int(rng.integers(20, 120)), p=p)]) for _ in range(int(rng.integers(1, 7)))]
        texts.append("\n\n".join(paragraphs))
    return texts


def _ids(n: int, salt: str) -> list[str]:
    import hashlib

    return sorted(hashlib.sha256(f"{salt}:{i}".encode()).hexdigest()[:32] for i in range(n))


def write_shard(root: str, texts: list[str]) -> tuple[str, list[str]]:
    """A normalized shard (id-sorted, as normalize writes them)."""
    import pyarrow as pa

    from marin_assets.core import storage

    ids = _ids(len(texts), "doc")
    uri = os.path.join(root, "normalized", storage.shard_name(0, 1))
    storage.write_parquet(pa.table({"id": ids, "text": texts, "source_id": ids}), uri)
    return uri, ids


def write_eval_rows(root: str, texts: list[str], every: int = 40) -> str:
    """Eval rows: 60-word excerpts of every ``every``-th document (so some documents are flagged),
    plus rows of their own; as JSON for both cases."""
    import json

    rows = [("bench_eval", f"r{i}", " ".join(t.split()[:60])) for i, t in enumerate(texts) if i % every == 0]
    rows += [("bench_eval", f"x{i}", t) for i, t in enumerate(make_texts(500, seed=9))]
    path = os.path.join(root, "eval_rows.json")
    with open(path, "w") as handle:
        json.dump(rows, handle)
    return path


def write_attributes(root: str, ids: list[str], every_removed: tuple[int, int]) -> dict[str, str]:
    """Topic, quality score and contamination shards for the shard, band edges, and the source's
    exact and fuzzy removal lists spanning ``LIST_SHARDS`` shards' worth of ids."""
    import pyarrow as pa

    from marin_assets.core import quality, storage

    n = len(ids)
    keys = np.array([int(i[:8], 16) for i in ids], dtype=np.int64)
    name = storage.shard_name(0, 1)
    out = {
        "topics": os.path.join(root, "topics", name),
        "quality": os.path.join(root, "quality", name),
        "contamination": os.path.join(root, "contamination", name),
    }
    storage.write_parquet(pa.table({"id": ids, "topic": pa.array(keys % 40, pa.int16())}), out["topics"])
    storage.write_parquet(pa.table({"id": ids, "score": pa.array((keys % 1000) / 1000.0, pa.float32())}), out["quality"])
    storage.write_parquet(pa.table({"id": ids, "contaminated": pa.array(keys % 101 == 0)}), out["contamination"])
    out["band_edges"] = quality.save_band_edges(quality.band_edges(None, quality.BandParams(method="fixed")), os.path.join(root, "bands"))
    others = _ids(n * (LIST_SHARDS - 1), "other")  # ids of the source's other shards
    for what, every in zip(("exact", "fuzzy"), every_removed):
        removed = sorted(ids[::every] + others[::every])
        uri = os.path.join(root, what, "removed.parquet")
        storage.write_parquet(pa.table({"id": pa.array(removed, pa.string()), "kept_source": pa.array(["other"] * len(removed), pa.string())}), uri, row_group_size=16_384)
        out[what] = uri
    return out


def write_indexes(root: str, shards: int, seed: int = 0) -> list[str]:
    """Pool shard indexes as ``pool_shard`` writes them: one row per non-empty group of a shard."""
    import pyarrow as pa

    from marin_assets.core import pool, quality, storage

    rng = np.random.default_rng(seed)
    uris = []
    for s in range(shards):
        groups = sorted(rng.choice(200, size=int(rng.integers(100, 200)), replace=False).tolist())
        names = [quality.group_name(g // 5, g % 5) for g in groups]
        base = storage.shard_name(s, shards)
        table = pa.table(
            [pa.array(names), pa.array([pool.pool_file(g, "bench", base) for g in names]), pa.array(["bench"] * len(names)),
             pa.array(rng.integers(1, 500, len(names))), pa.array(rng.integers(100, 500_000, len(names)))],
            schema=pool.INDEX_SCHEMA,
        )
        uri = os.path.join(root, "pool_index", base)
        storage.write_parquet(table, uri)
        uris.append(uri)
    return uris


# --------------------------------------------------------------------------- cases (in the child)


def contamination_ours(shard: str, eval_rows: str, work: str) -> dict:
    import json

    from marin_assets.core import decon, storage

    with open(eval_rows) as handle:
        rows = [tuple(r) for r in json.load(handle)]
    index = os.path.join(work, "index")
    decon.build_eval_index(rows, index)
    params = decon.DeconParams(index_uri=index)
    out = os.path.join(work, "ours.parquet")
    with harness.timed():
        stats = decon.contamination_shard([shard], out, params)
    storage.remove(out)
    return {"items": stats["documents"], "flagged": stats["contaminated"]}


def contamination_peer(shard: str, eval_rows: str, work: str) -> dict:
    """Decontamination written plainly: a set of the eval rows' 13-gram strings."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    with open(eval_rows) as handle:
        rows = json.load(handle)
    grams: set[str] = set()
    for _, _, text in rows:
        tokens = text.lower().split()
        grams.update(" ".join(tokens[i : i + NGRAM]) for i in range(len(tokens) - NGRAM + 1))
    out = os.path.join(work, "peer.parquet")
    with harness.timed():
        table = pq.read_table(shard, columns=["id", "text"])
        flags = []
        for text in table.column("text").to_pylist():
            tokens = (text or "").lower().split()
            flags.append(any(" ".join(tokens[i : i + NGRAM]) in grams for i in range(len(tokens) - NGRAM + 1)))
        pq.write_table(pa.table({"id": table.column("id"), "contaminated": pa.array(flags)}), out)
    os.remove(out)
    return {"items": table.num_rows, "flagged": sum(flags)}


def pool_ours(shard: str, attrs: dict, work: str) -> dict:
    from marin_assets.core import pool, storage

    params = pool.PoolParams(
        source="bench", pool_dir=os.path.join(work, "pool_ours"), band_edges_uri=attrs["band_edges"],
        exact_removed_uri=attrs["exact"], fuzzy_removed_uri=attrs["fuzzy"], tokenizer=pool.offline_tokenizer_params(),
    )
    pool.count_tokens(["warm up the tokenizer"], params.tokenizer)
    out = os.path.join(work, "pool_ours_index.parquet")
    with harness.timed():
        stats = pool.pool_shard([shard, attrs["topics"], attrs["quality"], attrs["contamination"]], out, params)
    storage.remove(params.pool_dir, recursive=True)
    storage.remove(out)
    return {"items": stats["documents"], "kept": stats["kept"]}


def pool_peer(shard: str, attrs: dict, work: str) -> dict:
    """The pool with polars: join the attributes, anti-join the removal lists, filter, band,
    count tokens (same tokenizer), write one file per group."""
    import shutil

    import polars as pl

    from marin_assets.core import pool, quality

    tokenizer = pool.offline_tokenizer_params()
    pool.count_tokens(["warm up the tokenizer"], tokenizer)
    edges = quality.load_band_edges(attrs["band_edges"])
    out_dir = os.path.join(work, "pool_peer")
    with harness.timed():
        docs = pl.read_parquet(shard, columns=["id", "text", "source_id"])
        frame = pl.concat(
            [docs, pl.read_parquet(attrs["topics"], columns=["topic"]), pl.read_parquet(attrs["quality"], columns=["score"]),
             pl.read_parquet(attrs["contamination"], columns=["contaminated"])],
            how="horizontal",
        )
        for what in ("fuzzy", "exact"):
            frame = frame.join(pl.read_parquet(attrs[what], columns=["id"]), on="id", how="anti")
        frame = frame.filter(~pl.col("contaminated") & pl.col("text").is_not_null())
        topic = frame["topic"].to_numpy().astype(np.int64)
        band = quality.band_of(frame["score"].to_numpy().astype(np.float64), topic, edges)
        tokens, _ = pool.count_tokens(frame["text"].to_list(), tokenizer)
        frame = frame.with_columns(pl.Series("band", band, pl.Int8), pl.Series("tokens", tokens, pl.Int32))
        frame = frame.with_columns(group=pl.format("c{}q{}", pl.col("topic").cast(pl.Utf8).str.zfill(2), pl.col("band")))
        for (group,), part in frame.partition_by("group", as_dict=True).items():
            path = os.path.join(out_dir, str(group), "part.parquet")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            part.drop("group").write_parquet(path)
    kept = frame.height
    shutil.rmtree(out_dir, ignore_errors=True)
    return {"items": docs.height, "kept": kept}


def groups_ours(index_uris: list[str], work: str) -> dict:
    from marin_assets.core import mixture, pool

    with harness.timed():
        counts = pool.group_counts_and_files([("bench", index_uris, os.path.join(work, "pool"))], os.path.join(work, "ours_files.parquet"))
        result = mixture.sampling_groups(counts, {}, mixture.MixtureParams())
        mixture.write_sampling_groups(result, os.path.join(work, "ours_groups"))
    return {"items": len(index_uris), "groups": result.summary.get("groups_with_documents", 0)}


def groups_peer(index_uris: list[str], work: str) -> dict:
    import polars as pl

    with harness.timed():
        index = pl.read_parquet(index_uris)
        counts = index.group_by("group", "source").agg(pl.col("documents").sum(), pl.col("tokens").sum()).sort("group", "source")
        counts.write_parquet(os.path.join(work, "peer_groups.parquet"))
        index.select("group", "source", pl.concat_str(pl.lit(os.path.join(work, "pool") + "/"), pl.col("file")).alias("file")).write_parquet(
            os.path.join(work, "peer_files.parquet")
        )
    return {"items": len(index_uris), "groups": counts.height}


# --------------------------------------------------------------------------- main


def contamination(work: str, texts: list[str], shard: str) -> None:
    eval_rows = write_eval_rows(work, texts)
    cases = [
        harness.Case("python set of 13-grams", "bench.bench_stages:contamination_peer", {"shard": shard, "eval_rows": eval_rows, "work": work}),
        harness.Case("contamination_shard", "bench.bench_stages:contamination_ours", {"shard": shard, "eval_rows": eval_rows, "work": work}),
    ]
    result = harness.compare(f"contamination: one normalized shard of {len(texts):,} documents, both rules vs a plain 13-gram set", cases, ROUNDS)
    harness.speed_goal("contamination_shard", "python set of 13-grams", 1.0, "contamination >= 1x a Python 13-gram set, documents per CPU second", "cpu").check(result)
    harness.memory_goal("contamination_shard", "python set of 13-grams", 1.5, "contamination peak memory <= 1.5x the 13-gram set's").check(result)


def pool_rows(work: str, texts: list[str], shard: str, ids: list[str]) -> None:
    attrs = write_attributes(work, ids, (8, 5))  # exact: 1 id in 8 removed, fuzzy: 1 in 5
    cases = [
        harness.Case("polars anti-join", "bench.bench_stages:pool_peer", {"shard": shard, "attrs": attrs, "work": work}),
        harness.Case("pool_shard", "bench.bench_stages:pool_ours", {"shard": shard, "attrs": attrs, "work": work}),
    ]
    title = f"pool: one shard of {len(texts):,} documents, removal lists of the whole source ({LIST_SHARDS} shards' ids)"
    result = harness.compare(title, cases, ROUNDS)
    harness.speed_goal("pool_shard", "polars anti-join", 0.8, "pool >= 0.8x polars with anti-joins, documents per CPU second", "cpu").check(result)
    harness.memory_goal("pool_shard", "polars anti-join", 1.0, "pool peak memory <= 1x the polars anti-join's").check(result)


def sampling_groups_rows(work: str) -> None:
    uris = write_indexes(work, INDEX_SHARDS)
    cases = [
        harness.Case("polars group_by", "bench.bench_stages:groups_peer", {"index_uris": uris, "work": work}),
        harness.Case("sampling_groups", "bench.bench_stages:groups_ours", {"index_uris": uris, "work": work}),
    ]
    result = harness.compare(f"sampling_groups: {INDEX_SHARDS:,} pool shard indexes", cases, ROUNDS, unit="shards")
    harness.speed_goal("sampling_groups", "polars group_by", 0.5, "sampling_groups >= 0.5x one polars group_by, shard indexes per CPU second", "cpu").check(result)
    harness.memory_goal("sampling_groups", "polars group_by", 1.5, "sampling_groups peak memory <= 1.5x the polars group_by's").check(result)


def main() -> None:
    print("stage -> bench that holds it to a goal:")
    for stage, (bench, how) in STAGES.items():
        print(f"  {stage:<20} {'bench_' + bench if bench else '-':<16} {how}")
    only = {r for r in os.environ.get("BENCH_STAGES", "").split(",") if r}  # e.g. BENCH_STAGES=pool
    with tempfile.TemporaryDirectory(prefix="bench-stages-") as work:
        texts = make_texts(DOCS)
        shard, ids = write_shard(work, texts)
        if not only or "contamination" in only:
            contamination(work, texts, shard)
        if not only or "pool" in only:
            pool_rows(work, texts, shard, ids)
        if not only or "sampling_groups" in only:
            sampling_groups_rows(work)


if __name__ == "__main__":
    main()
