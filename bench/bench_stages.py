"""Per-shard stages that had no row: contamination, pool and sampling_groups, each against a peer
used as its users use it, plus the map of every stage to the bench that holds it to a goal.

* ``contamination``: ``contamination_shard`` (read a normalized shard, mark it with both rules
  against the eval index, write the attribute shard) against the plain way to decontaminate: a
  Python set of the eval rows' 13-gram strings, every 13-gram of each ``str.split()`` document
  looked up, flags written as Parquet. The eval index (built once, before the runs, as the
  ``eval_ngrams`` stage does) holds ~1-2M 13-grams (production: 21.78M): large enough that the
  memory compared is the index's and the shard's, not the fixed numba runtime. Goal: >= 1x the
  peer's documents per CPU second (the project's rules do more: two rules, normalization,
  paragraph units), peak memory <= 1.5x.
* ``pool``: ``pool_shard`` (filter one shard by its attributes and the source's sparse removal
  lists, band, take the survivors' token counts from the token_counts attribute, write group
  files and the shard index) against polars used plainly: read the shard and its attribute
  shards (the token counts among them), anti-join the whole removal lists, filter, band,
  ``partition_by`` group and write. The
  shard is one of ``LIST_SHARDS`` (512) and, as ``normalize`` routes ids, one contiguous id range;
  the removal lists cover the whole source (1 in 8 exact and 1 in 5 fuzzy duplicates of every
  shard), as in production where a source has thousands of shards. Goals: >= 0.8x
  the peer's documents per CPU second; peak memory <= 1x the peer's (the pool reads only the
  removal-list row groups that overlap the shard).
* ``sampling_groups``: documents and tokens per (group, source) from every pool shard index plus
  the streamed file list, against one polars ``group_by`` over all indexes. Goal: >= 0.5x the
  peer's index rows per CPU second, peak memory <= 1.5x.
* ``topics``: ``assign_topics_shard`` (one int8 embeddings shard at the production dimension
  against the fine centroids) vs faiss used plainly: the shard's vectors, one ``IndexFlatL2``
  search, Parquet out. Goal: >= 0.9x per CPU second, peak memory <= 1.2x.
* ``quality_scores``: ``quality_scores_shard`` vs the same ridge weights and calibration as one
  numpy product and ``np.interp``. Goal: >= 0.8x per CPU second, peak memory <= 1.2x.
* ``quality_bands``: the streamed per-topic histograms and their edges vs polars: every topics
  and scores shard read, joined on ``id``, quintiles per topic. Goal: >= 0.5x rows per CPU
  second, peak memory <= 1x (the peer holds every row; at the pool's size it cannot).
* ``quality_model``: ``train_quality_model`` on labelled vectors (the encoding is the embed
  bench's) vs scikit-learn ``RidgeCV`` on the same 90/10 split. Goal: >= 0.7x per CPU second
  (it also calibrates and scores both splits), peak memory <= 1.5x.
* ``mixture`` (``mixture_model``): ``fit_surrogates`` vs LightGBM used as RegMix uses it, one
  regressor per domain metric, 5-fold out-of-fold predictions and a final fit. Goal: >= 0.4x runs
  per CPU second (it also fits and cross-validates the log-linear law), peak memory <= 1.5x.
  ``mixture_swarm`` and ``mixture_weights`` have no peer (no library proposes or searches
  mixtures under epoch caps and blocks): absolute goals, CPU seconds per study and peak memory.
* ``proxy_results``: one run of the built-in trainer (the language-model proxy) on a generated
  pool, cut to ``LM_TOKENS`` training tokens (a default study's run trains ``proxy_budget``,
  1e9, hours on a CPU: the row projects it from the training rate, labelled predicted). Absolute
  goals: CPU seconds per run, peak memory; an external trainer's time is its own.

Each case runs in its own child (``bench.harness``), interleaved, median and range, memory from
each child's own VmHWM reset after reading its input. ``STAGES`` below says which bench holds each
of the pipeline's stages to a goal; a stage without a peer says so and why.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile

import numpy as np

from bench import harness
from marin_assets.core import specs

# Every stage -> the bench (module name) whose rows hold it to a goal, and how: from its spec.
STAGES: dict[str, tuple[str, str]] = {s.name: (s.bench.module, s.bench.how) if s.bench else ("", "NO ROW") for s in specs.ALL}

# Stages held by this module -> the row (``BENCH_STAGES=name``) that measures them.
ROWS: dict[str, str] = {s.name: s.bench.row or s.name for s in specs.ALL if s.bench and s.bench.module == "stages"}

DOCS = harness.pick(20_000, 2_000)
# The source has LIST_SHARDS shards; the measured one is shard LIST_SHARD, a contiguous slice of
# the id space as normalize routes ids (``normalize.shard_of``); the removal lists span every
# shard's ids (a production source has thousands of shards).
LIST_SHARDS = 512
LIST_SHARD = LIST_SHARDS // 2
# The eval index: rows of generated text, ~0.8-0.9M (quick) / ~1.7-1.9M distinct 13-grams per rule (production: 21.78M,
# see bench_decon): what the memory goal weighs is the index (two rules' hashes vs one set of
# strings), so it must outweigh the fixed numba runtime (~115 MiB) that a toy index would not.
EVAL_ROWS = harness.pick(8_000, 4_000)
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


def _slice_of(doc_id: str) -> int:
    """The shard of LIST_SHARDS that holds an id (``normalize.shard_of``)."""
    return (int(doc_id[:8], 16) * LIST_SHARDS) >> 32


def _shard_ids(n: int, salt: str) -> list[str]:
    """``n`` sorted ids inside shard LIST_SHARD's slice of the id space (hashes, re-based)."""
    width = (1 << 32) // LIST_SHARDS
    return sorted(f"{LIST_SHARD * width + int(h[:8], 16) % width:08x}{h[8:]}" for h in _ids(n, salt))


def write_shard(root: str, texts: list[str]) -> tuple[str, list[str]]:
    """A normalized shard (id-sorted, as normalize writes them)."""
    import pyarrow as pa

    from marin_assets.core.runtime import storage

    ids = _shard_ids(len(texts), "doc")
    uri = os.path.join(root, "normalized", storage.shard_name(0, 1))
    storage.write_parquet(pa.table({"id": ids, "text": texts, "source_id": ids}), uri)
    return uri, ids


def write_eval_rows(root: str, texts: list[str], every: int = 40) -> tuple[str, str]:
    """Eval rows: 60-word excerpts of every ``every``-th document (so some documents are flagged),
    plus EVAL_ROWS rows of their own; as JSON (the peer builds its set from them) and as the
    eval index, built here once as the eval_ngrams stage does (a contamination task loads it)."""
    import json

    from marin_assets.core.decon import rules as decon

    rows = [("bench_eval", f"r{i}", " ".join(t.split()[:60])) for i, t in enumerate(texts) if i % every == 0]
    rows += [("bench_eval", f"x{i}", t) for i, t in enumerate(make_texts(EVAL_ROWS, seed=9))]
    path = os.path.join(root, "eval_rows.json")
    with open(path, "w") as handle:
        json.dump(rows, handle)
    index = os.path.join(root, "eval_index")
    decon.build_eval_index(rows, index)
    return path, index


def write_attributes(root: str, ids: list[str], every_removed: tuple[int, int]) -> dict[str, str]:
    """Topic, quality score and contamination shards for the shard, band edges, and the source's
    exact and fuzzy removal lists spanning ``LIST_SHARDS`` shards' worth of ids."""
    import pyarrow as pa

    from marin_assets.core.embed import quality
    from marin_assets.core.runtime import storage

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
    for what, every in zip(("exact", "fuzzy"), every_removed):
        # 1 in ``every`` ids of the source's other shards (outside this shard's slice), and of this one
        others = [i for i in _ids(n * LIST_SHARDS // every, f"other-{what}") if _slice_of(i) != LIST_SHARD]
        removed = sorted(ids[::every] + others)
        uri = os.path.join(root, what, "removed.parquet")
        storage.write_parquet(pa.table({"id": pa.array(removed, pa.string()), "kept_source": pa.array(["other"] * len(removed), pa.string())}), uri, row_group_size=16_384)
        out[what] = uri
    return out


def write_indexes(root: str, shards: int, seed: int = 0) -> list[str]:
    """Pool shard indexes as ``pool_shard`` writes them: one row per non-empty group of a shard."""
    import pyarrow as pa

    from marin_assets.core.embed import quality
    from marin_assets.core.pool import curated as pool
    from marin_assets.core.runtime import storage

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


def contamination_ours(shard: str, eval_rows: str, index: str, work: str) -> dict:
    import pyarrow.parquet as pq

    from marin_assets.core.decon import rules as decon
    from marin_assets.core.runtime import storage

    params = decon.DeconParams(index_uri=index)
    # A worker loads the index once (it is cached per process) and marks shard after shard: it is
    # loaded and warmed here, outside the measured part, as the peer builds its set outside it.
    sample = next(pq.ParquetFile(shard).iter_batches(batch_size=100, columns=["text"])).column(0)
    for rule in decon.RULES:
        decon.mark_documents(sample, decon.load_eval_index(index, rule), None, params, rule)
    out = os.path.join(work, "ours.parquet")
    with harness.timed():
        stats = decon.contamination_shard([shard], out, params)
    storage.remove(out)
    return {"items": stats["documents"], "flagged": stats["contaminated"]}


def contamination_peer(shard: str, eval_rows: str, index: str, work: str) -> dict:
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
    from marin_assets.core.pool import curated as pool
    from marin_assets.core.runtime import storage

    params = pool.PoolParams(
        source="bench", pool_dir=os.path.join(work, "pool_ours"), band_edges_uri=attrs["band_edges"],
        exact_removed_uri=attrs["exact"], fuzzy_removed_uri=attrs["fuzzy"],
    )
    out = os.path.join(work, "pool_ours_index.parquet")
    with harness.timed():
        stats = pool.pool_shard([shard, attrs["topics"], attrs["quality"], attrs["contamination"], attrs["tokens"]], out, params)
    storage.remove(params.pool_dir, recursive=True)
    storage.remove(out)
    return {"items": stats["documents"], "kept": stats["kept"]}


def pool_peer(shard: str, attrs: dict, work: str) -> dict:
    """The pool with polars: join the attributes (the token counts among them), anti-join the
    removal lists, filter, band, write one file per group."""
    import shutil

    import polars as pl

    from marin_assets.core.embed import quality

    edges = quality.load_band_edges(attrs["band_edges"])
    out_dir = os.path.join(work, "pool_peer")
    with harness.timed():
        docs = pl.read_parquet(shard, columns=["id", "text", "source_id"])
        frame = pl.concat(
            [docs, pl.read_parquet(attrs["topics"], columns=["topic"]), pl.read_parquet(attrs["quality"], columns=["score"]),
             pl.read_parquet(attrs["contamination"], columns=["contaminated"]), pl.read_parquet(attrs["tokens"], columns=["tokens"])],
            how="horizontal",
        )
        for what in ("fuzzy", "exact"):
            frame = frame.join(pl.read_parquet(attrs[what], columns=["id"]), on="id", how="anti")
        frame = frame.filter(~pl.col("contaminated") & pl.col("text").is_not_null())
        topic = frame["topic"].to_numpy().astype(np.int64)
        band = quality.band_of(frame["score"].to_numpy().astype(np.float64), topic, edges)
        frame = frame.with_columns(pl.Series("band", band, pl.Int8))
        frame = frame.with_columns(group=pl.format("c{}q{}", pl.col("topic").cast(pl.Utf8).str.zfill(2), pl.col("band")))
        for (group,), part in frame.partition_by("group", as_dict=True).items():
            path = os.path.join(out_dir, str(group), "part.parquet")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            part.drop("group").write_parquet(path)
    kept = frame.height
    shutil.rmtree(out_dir, ignore_errors=True)
    return {"items": docs.height, "kept": kept}


def groups_ours(index_uris: list[str], work: str) -> dict:
    from marin_assets.core.pool import curated as pool
    from marin_assets.core.pool.groups import MixtureParams, sampling_groups, write_sampling_groups

    with harness.timed():
        counts = pool.group_counts_and_files([("bench", index_uris, os.path.join(work, "pool"))], os.path.join(work, "ours_files.parquet"))
        result = sampling_groups(counts, {}, MixtureParams())
        write_sampling_groups(result, os.path.join(work, "ours_groups"))
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


# --------------------------------------------------------------------------- curation and mixture stages

EMB_ROWS = harness.pick(20_000, 4_000)  # one embeddings shard
EMB_DIM = 1_024  # the production encoder's dimension
K_FINE = harness.pick(5_000, 1_000)  # fine centroids of the topic model (production: 5,000)
BAND_SHARDS = harness.pick(64, 16)  # (topics, quality scores) shard pairs read by quality_bands
BAND_ROWS = harness.pick(20_000, 10_000)
LABELS = harness.pick(20_000, 4_000)  # labelled vectors of the quality model
RUNS = harness.pick(64, 32)  # proxy runs of a study (the default study has 64)
SEARCH = harness.pick((20_000, 8), (5_000, 4))  # the optimizer's candidates and rounds (the default study's: 20,000 x 8)
GROUPS = 200  # 40 topics x 5 bands
POOL_DOCS = harness.pick(8_000, 2_000)  # documents in the pool the built-in proxy reads
LM_TOKENS = harness.pick(262_144, 65_536)  # training tokens of the timed proxy run
ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "POLARS_MAX_THREADS": "1"}


def _unit_rows(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def write_embeddings(root: str, rows: int, seed: int = 1) -> str:
    """An embeddings shard as ``embed_shard`` writes it (int8, production encoder metadata):
    vectors near 200 random directions, so nearest centroids are not ties."""
    from marin_assets.core.embed import embeddings as embed
    from marin_assets.core.runtime import storage

    rng = np.random.default_rng(seed)
    centres = _unit_rows(rng, 200, EMB_DIM)
    vectors = centres[rng.integers(0, 200, rows)] + 0.05 * rng.standard_normal((rows, EMB_DIM)).astype(np.float32)
    table, _ = embed.embeddings_table(_ids(rows, "emb"), vectors, embed.EmbedParams())
    uri = os.path.join(root, "embeddings", storage.shard_name(0, 1))
    storage.write_parquet(table, uri)
    return uri


def write_topic_model(root: str, seed: int = 2, fine: int = K_FINE, dim: int = EMB_DIM) -> str:
    """A topic model of ``fine`` unit fine centroids of ``dim`` dimensions mapped to 40 topics."""
    from marin_assets.core.embed import topics

    rng = np.random.default_rng(seed)
    fine_to_topic = (np.arange(fine) % 40).astype(np.int16)
    labels = [topics.TopicLabel(t, f"t{t}", (), (), 1.0, 1 / 40, fine // 40) for t in range(40)]
    model = topics.TopicModel(_unit_rows(rng, fine, dim), fine_to_topic, np.ones(fine, np.int64), labels, {})
    uri = os.path.join(root, "topic_model")
    topics.save_topic_model(model, uri)
    return uri


def write_quality_model(root: str, seed: int = 3, dim: int = EMB_DIM) -> str:
    """A ridge quality model over ``dim`` dimensions (the production encoder's), calibrated to five levels."""
    from marin_assets.core.embed import quality

    rng = np.random.default_rng(seed)
    scorer = quality.RidgeScorer((1.0,), (rng.standard_normal(dim) * 0.1).astype(np.float32), 2.5, 1.0)
    calibration = quality.fit_calibration(rng.normal(2.5, 1.0, 5_000), rng.integers(0, 5, 5_000), 5)
    uri = os.path.join(root, "quality_model")
    quality.save_quality_model(quality.QualityModel(scorer, calibration, {"feature_dim": dim}), uri)
    return uri


def write_band_inputs(root: str, shards: int, rows: int, seed: int = 4) -> list[list[str]]:
    """Co-partitioned (topics shard, quality scores shard) pairs as the two stages write them."""
    import pyarrow as pa

    from marin_assets.core.runtime import storage

    rng = np.random.default_rng(seed)
    pairs = []
    for s in range(shards):
        ids = _ids(rows, f"band{s}")
        topic = rng.integers(0, 40, rows)
        score = np.clip(rng.beta(2 + topic % 3, 3, rows), 0, 1).astype(np.float32)
        name = storage.shard_name(s, shards)
        t_uri, q_uri = os.path.join(root, "band_topics", name), os.path.join(root, "band_quality", name)
        storage.write_parquet(pa.table({"id": ids, "fine_cluster": pa.array(topic * 10, pa.int32()), "distance": pa.array(np.zeros(rows, np.float32)), "topic": pa.array(topic, pa.int16())}), t_uri)
        storage.write_parquet(pa.table({"id": ids, "raw_score": pa.array(score * 5), "score": pa.array(score)}), q_uri)
        pairs.append([t_uri, q_uri])
    return pairs


def write_labelled(root: str, n: int, seed: int = 5) -> str:
    """Labelled vectors (labels 0..5 from a linear score plus noise), as .npz."""
    rng = np.random.default_rng(seed)
    x = _unit_rows(rng, n, EMB_DIM)
    truth = x @ (rng.standard_normal(EMB_DIM).astype(np.float32))
    labels = np.clip(np.rint(2.5 + 1.5 * truth / truth.std() + rng.normal(0, 0.7, n)), 0, 5)
    path = os.path.join(root, "labelled.npz")
    np.savez(path, x=x, y=labels)
    return path


def study_inputs(seed: int = 6) -> dict:
    """Sampling groups of a pool (40 topics x 5 bands, 1e8..1e11 tokens each) and the default study."""
    rng = np.random.default_rng(seed)
    names = [f"c{t:02d}q{b}" for t in range(40) for b in range(5)]
    return {"names": names, "tokens": np.floor(np.exp(rng.uniform(np.log(1e8), np.log(1e11), GROUPS))).tolist()}


def _study(names: list[str], tokens: list[float]):
    import polars as pl

    from marin_assets.core.mixture import swarm as ms

    groups = pl.DataFrame({"group": names, "topic": [int(n[1:3]) for n in names], "topic_label": ["t"] * len(names), "band": [int(n[-1]) for n in names], "tokens": [int(t) for t in tokens]})
    return groups, {n: [f"/pool/{n}/bench-00000-of-00001.parquet"] for n in names}, ms.StudyParams(name="bench", n_runs=RUNS, search_candidates=SEARCH[0], search_rounds=SEARCH[1])


def _proxy_results(names: list[str], tokens: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """The study's proposed weights and 4 domain metrics of each run (a smooth law plus noise)."""
    from marin_assets.core.mixture import swarm as ms

    _, _, study = _study(names, tokens)
    weights = ms.propose_mixtures(np.asarray(tokens), study)
    rng = np.random.default_rng(7)
    relevance = rng.random((4, len(names))) ** 3
    effective = (weights * np.array([p.share for p in study.phases])[None, :, None]).sum(axis=1)
    targets = 1.0 + 0.3 * (effective @ relevance.T + 0.02) ** -0.5 + rng.normal(0, 0.003, (len(weights), 4))
    return weights, targets


def topics_ours(shard: str, model: str, work: str) -> dict:
    from marin_assets.core.embed import topics

    params = topics.AssignParams(topic_model_uri=model)
    topics._cached_topic_model(model)  # loaded once per process in production too
    out = os.path.join(work, "topics_ours.parquet")
    with harness.timed():
        stats = topics.assign_topics_shard([shard], out, params)
    os.remove(out)
    return {"items": stats["rows"]}


def topics_peer(shard: str, model: str, work: str) -> dict:
    """faiss used plainly: the shard's vectors, one exact ``IndexFlatL2`` search, Parquet out."""
    import faiss
    import pyarrow as pa
    import pyarrow.parquet as pq

    from marin_assets.core.embed import embeddings as embed
    from marin_assets.core.embed import topics

    centroids = np.load(os.path.join(model, topics.FINE_CENTROIDS))
    fine_to_topic = np.load(os.path.join(model, topics.FINE_TO_TOPIC))
    index = faiss.IndexFlatL2(centroids.shape[1])
    index.add(centroids)
    out = os.path.join(work, "topics_peer.parquet")
    with harness.timed():
        table = pq.read_table(shard, columns=["id", "embedding"])
        vectors = embed.vectors_from_table(table)
        dist, idx = index.search(vectors, 1)
        pq.write_table(pa.table({"id": table.column("id"), "fine_cluster": idx[:, 0].astype(np.int32), "distance": dist[:, 0], "topic": fine_to_topic[idx[:, 0]]}), out)
    os.remove(out)
    return {"items": table.num_rows}


def scores_ours(shard: str, model: str, work: str) -> dict:
    from marin_assets.core.embed import quality

    quality._cached_quality_model(model)
    out = os.path.join(work, "scores_ours.parquet")
    with harness.timed():
        stats = quality.quality_scores_shard([shard], out, quality.QualityScoreParams(model_uri=model))
    os.remove(out)
    return {"items": stats["rows"]}


def scores_peer(shard: str, model: str, work: str) -> dict:
    """The same weights applied plainly: one matrix-vector product, ``np.interp`` calibration."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from marin_assets.core.embed import embeddings as embed

    ridge = np.load(os.path.join(model, "ridge.npz"))
    with open(os.path.join(model, "calibration.json")) as handle:
        cal = json.load(handle)
    coef, intercept = ridge["coef"], np.float32(ridge["intercept"])
    out = os.path.join(work, "scores_peer.parquet")
    with harness.timed():
        table = pq.read_table(shard, columns=["id", "embedding"])
        raw = embed.vectors_from_table(table) @ coef + intercept
        score = np.clip(np.interp(raw, cal["knots_raw"], cal["knots_score"]), 0, 1).astype(np.float32)
        pq.write_table(pa.table({"id": table.column("id"), "raw_score": raw, "score": score}), out)
    os.remove(out)
    return {"items": table.num_rows}


def bands_ours(pairs: list[list[str]], work: str) -> dict:
    from marin_assets.core.embed import quality

    params = quality.BandParams()
    quality.score_histogram([tuple(pairs[0])], params)  # one-off imports paid before timing, as in a long-lived worker
    with harness.timed():
        hist, counters = quality.score_histogram([tuple(p) for p in pairs], params)
        quality.save_band_edges(quality.band_edges(hist, params), os.path.join(work, "bands_ours"))
    return {"items": counters["rows"]}


def bands_peer(pairs: list[list[str]], work: str) -> dict:
    """polars used plainly: every topics and scores shard read, joined on ``id``, one
    ``group_by(topic)`` of score quintiles."""
    import json

    import polars as pl

    pl.read_parquet(pairs[0][0], columns=["id", "topic"]).join(pl.read_parquet(pairs[0][1], columns=["id", "score"]), on="id")  # warm, as ours
    with harness.timed():
        topics = pl.read_parquet([t for t, _ in pairs], columns=["id", "topic"])
        scores = pl.read_parquet([q for _, q in pairs], columns=["id", "score"])
        frame = topics.join(scores, on="id")
        edges = frame.group_by("topic").agg([pl.col("score").quantile(q, "linear").alias(f"q{q}") for q in (0.2, 0.4, 0.6, 0.8)]).sort("topic")
        with open(os.path.join(work, "bands_peer.json"), "w") as handle:
            json.dump(edges.rows(), handle)
    return {"items": frame.height}


def quality_model_ours(labelled: str, work: str) -> dict:
    import scipy.stats  # noqa: F401  (imported outside the measured part, as the peer's are)
    import sklearn.linear_model  # noqa: F401

    from marin_assets.core.embed import quality

    data = np.load(labelled)
    x, y = data["x"], data["y"]
    texts = [str(i) for i in range(len(y))]
    with harness.timed():
        metrics = quality.train_quality_model(texts, y, lambda batch: x[[int(t) for t in batch]], os.path.join(work, "qm_ours"))
    return {"items": len(y), "spearman": round(metrics["heldout"]["spearman"], 3)}


def quality_model_peer(labelled: str, work: str) -> dict:
    """scikit-learn used plainly: ``RidgeCV`` over the same penalties on the same 90/10 split,
    held-out predictions, coefficients saved."""
    from scipy import stats as sps
    from sklearn.linear_model import RidgeCV
    from sklearn.model_selection import train_test_split

    from marin_assets.core.embed import quality

    data = np.load(labelled)
    x, y = data["x"], data["y"]
    with harness.timed():
        xt, xh, yt, yh = train_test_split(x, y, test_size=0.1, random_state=42, stratify=y)
        model = RidgeCV(alphas=quality.QualityParams().ridge_alphas).fit(xt.astype(np.float64), yt)
        rho = sps.spearmanr(model.predict(xh), yh).statistic
        np.savez(os.path.join(work, "qm_peer.npz"), coef=model.coef_, intercept=model.intercept_)
    return {"items": len(y), "spearman": round(float(rho), 3)}


def model_ours(names: list[str], tokens: list[float], work: str) -> dict:
    import lightgbm  # noqa: F401  (imported outside the measured part, as the peer's are)
    import scipy.stats  # noqa: F401
    import sklearn.linear_model  # noqa: F401
    import sklearn.model_selection  # noqa: F401

    from marin_assets.core.mixture import fit

    weights, targets = _proxy_results(names, tokens)
    with harness.timed():
        model = fit.fit_surrogates(weights, targets, fit.FitParams(), [f"d{j}" for j in range(targets.shape[1])])
        fit.save_fit(model, os.path.join(work, "fit_ours"), {"groups": names})
    return {"items": len(weights), "cv_spearman": round(model.cv[model.chosen]["spearman"], 3)}


def model_peer(names: list[str], tokens: list[float], work: str) -> dict:
    """LightGBM used plainly, as RegMix uses it: one regressor per domain metric, 5-fold
    out-of-fold predictions, a final fit on every run, the boosters saved."""
    import lightgbm
    from sklearn.model_selection import KFold, cross_val_predict

    from marin_assets.core.mixture import fit

    weights, targets = _proxy_results(names, tokens)
    p = fit.FitParams()
    x = weights.reshape(len(weights), -1)
    with harness.timed():
        oof = np.zeros(len(x))
        for j in range(targets.shape[1]):
            make = lambda: lightgbm.LGBMRegressor(n_estimators=p.lgbm_estimators, learning_rate=p.lgbm_learning_rate, num_leaves=p.lgbm_leaves,  # noqa: E731
                                                 min_child_samples=p.lgbm_min_child_samples, min_data_in_bin=1, n_jobs=1, verbose=-1, random_state=0)
            oof += cross_val_predict(make(), x, targets[:, j], cv=KFold(5, shuffle=True, random_state=0)) / targets.shape[1]
            make().fit(x, targets[:, j]).booster_.save_model(os.path.join(work, f"peer_d{j}.txt"))
    rho = float(np.corrcoef(np.argsort(np.argsort(oof)), np.argsort(np.argsort(targets.mean(axis=1))))[0, 1])
    return {"items": len(x), "cv_spearman": round(rho, 3)}


def swarm_ours(names: list[str], tokens: list[float], work: str) -> dict:
    from marin_assets.core.mixture import swarm as ms

    groups, pool_files, study = _study(names, tokens)
    with harness.timed():
        swarm = ms.build_swarm(groups, pool_files, study, os.path.join(work, "results"))
        ms.write_swarm(swarm, os.path.join(work, "swarm"), pool_files)
    return {"items": study.n_runs}


def weights_ours(names: list[str], tokens: list[float], work: str) -> dict:
    from marin_assets.core.mixture import fit

    weights, targets = _proxy_results(names, tokens)
    _, _, study = _study(names, tokens)
    params = fit.FitParams()
    models = fit._fit_components("lightgbm", fit.features(weights), targets, params)  # the surrogate it searches (no CV: not measured)
    search = fit.OptimizeParams(candidates=study.search_candidates, rounds=study.search_rounds, seed=study.seed)
    with harness.timed():
        opt = fit.optimize_mixture(lambda w: fit._predict_components(models, fit.features(w)).mean(axis=1), np.asarray(tokens), study, search, seeds=weights)
    return {"items": 1, "predicted": round(opt.predicted, 4), "proportional": round(opt.proportional_predicted, 4)}


def write_pool(root: str, names: list[str], docs: int) -> dict[str, list[str]]:
    """One pool file per group (``id``, ``text``, ``source``, ``tokens``), two sources (domains)."""
    import pyarrow as pa

    from marin_assets.core.runtime import storage

    texts, ids = make_texts(docs, seed=8), _ids(docs, "pool")
    files = {}
    for g, name in enumerate(names):
        rows = list(range(g, docs, len(names)))
        uri = os.path.join(root, "pool", name, "bench-00000-of-00001.parquet")
        storage.write_parquet(pa.table({"id": [ids[i] for i in rows], "text": [texts[i] for i in rows], "source": [f"bench_{i % 2}" for i in rows],
                                        "tokens": pa.array([len(texts[i].split()) for i in rows], pa.int32())}), uri)
        files[name] = [uri]
    return files


def proxy_ours(names: list[str], tokens: list[float], pool_files: dict, work: str) -> dict:
    """Run 1 of the default study with its built-in trainer, the language-model proxy, cut to ``LM_TOKENS``."""
    import shutil

    from marin_assets.core.mixture import lm_proxy, proxy_trainer
    from marin_assets.core.mixture import swarm as ms

    groups, _, study = _study(names, tokens)
    swarm = ms.build_swarm(groups, pool_files, study)
    eval_texts = proxy_trainer.evaluation_texts(pool_files, study.proxy)
    config = {**swarm.configs[ms.run_id(1)], "experiment_budget": LM_TOKENS}
    checkpoints = tempfile.mkdtemp(dir=work)  # a fresh folder: a checkpoint left by an earlier round would be resumed
    with harness.timed():
        trained = lm_proxy.train_lm_proxy(config, eval_texts, study.proxy, study.lm, checkpoints)
    shutil.rmtree(checkpoints)
    return {"items": LM_TOKENS, "train_cpu_s": trained["train_cpu_seconds"], "macro_bpb": round(trained["metrics"]["macro_bpb"], 3)}


def proxy_results_rows(work: str) -> None:
    from marin_assets.core.mixture import swarm as ms

    study = study_inputs()
    pool_files = write_pool(work, study["names"], POOL_DOCS)
    default = ms.StudyParams(name="bench")
    case = harness.Case("proxy_results", "bench.bench_stages:proxy_ours", {**study, "pool_files": pool_files, "work": work}, ONE_THREAD)
    one = harness.compare(f"proxy_results: one run of the built-in trainer ({default.train_run}, size {default.lm.size}), {LM_TOKENS:,} training tokens "
                          f"and its evaluation, pool of {POOL_DOCS:,} documents in {GROUPS} groups (no peer: absolute goals)", [case], ROUNDS, unit="tokens", show_rate=False)
    m = one["proxy_results"]
    cpu, rate = m.values("cpu_s"), [LM_TOKENS / c for c in m.values("train_cpu_s")]
    print(f"  training alone: {harness.fmt(statistics.median(rate))} tokens per CPU second [{harness.fmt(min(rate))}..{harness.fmt(max(rate))}]; "
          f"predicted: a default study's run ({default.proxy_budget:.3g} tokens) trains {default.proxy_budget / statistics.median(rate) / 3600:,.1f} CPU hours", flush=True)
    harness.absolute_goal(f"proxy_results (built-in trainer) <= 60 CPU seconds per run of {LM_TOKENS:,} tokens with its data and evaluation (median)",
                          f"{harness.fmt(m.median('cpu_s'))} s [{harness.fmt(min(cpu))}..{harness.fmt(max(cpu))}]", m.median("cpu_s") <= 60)
    harness.absolute_goal("proxy_results (built-in trainer) peak memory <= 1024 MiB", f"{m.peak_mib():.0f} MiB", m.peak_mib() <= 1024)


def topics_rows(work: str) -> None:
    shard, model = write_embeddings(work, EMB_ROWS), write_topic_model(work)
    kwargs = {"shard": shard, "model": model, "work": work}
    cases = [harness.Case("faiss IndexFlatL2", "bench.bench_stages:topics_peer", kwargs, ONE_THREAD),
             harness.Case("assign_topics_shard", "bench.bench_stages:topics_ours", kwargs, ONE_THREAD)]
    result = harness.compare(f"topics: one int8 embeddings shard of {EMB_ROWS:,} x {EMB_DIM} vs {K_FINE:,} fine centroids, one thread", cases, ROUNDS, unit="vectors")
    harness.speed_goal("assign_topics_shard", "faiss IndexFlatL2", 0.9, "topics >= 0.9x one plain faiss search, vectors per CPU second", "cpu").check(result)
    harness.memory_goal("assign_topics_shard", "faiss IndexFlatL2", 1.2, "topics peak memory <= 1.2x the plain search's (batches of 4,096)").check(result)


def quality_scores_rows(work: str) -> None:
    shard, model = write_embeddings(work, EMB_ROWS), write_quality_model(work)
    kwargs = {"shard": shard, "model": model, "work": work}
    cases = [harness.Case("numpy matmul + interp", "bench.bench_stages:scores_peer", kwargs, ONE_THREAD),
             harness.Case("quality_scores_shard", "bench.bench_stages:scores_ours", kwargs, ONE_THREAD)]
    result = harness.compare(f"quality_scores: one int8 embeddings shard of {EMB_ROWS:,} x {EMB_DIM}, the same weights and calibration", cases, ROUNDS, unit="vectors")
    harness.speed_goal("quality_scores_shard", "numpy matmul + interp", 0.8, "quality_scores >= 0.8x a plain numpy product, vectors per CPU second", "cpu").check(result)
    harness.memory_goal("quality_scores_shard", "numpy matmul + interp", 1.2, "quality_scores peak memory <= 1.2x the plain product's").check(result)


def quality_bands_rows(work: str) -> None:
    pairs = write_band_inputs(work, BAND_SHARDS, BAND_ROWS)
    cases = [harness.Case("polars join + quantile", "bench.bench_stages:bands_peer", {"pairs": pairs, "work": work}, ONE_THREAD),
             harness.Case("score_histogram+band_edges", "bench.bench_stages:bands_ours", {"pairs": pairs, "work": work}, ONE_THREAD)]
    result = harness.compare(f"quality_bands: {BAND_SHARDS} (topics, quality_scores) shard pairs of {BAND_ROWS:,} rows", cases, ROUNDS, unit="rows")
    harness.speed_goal("score_histogram+band_edges", "polars join + quantile", 0.5, "quality_bands >= 0.5x polars quantiles over all rows, rows per CPU second", "cpu").check(result)
    harness.memory_goal("score_histogram+band_edges", "polars join + quantile", 1.0, "quality_bands peak memory <= 1x polars' (streamed histograms, one shard pair at a time)").check(result)


def quality_model_rows(work: str) -> None:
    labelled = write_labelled(work, LABELS)
    cases = [harness.Case("sklearn RidgeCV", "bench.bench_stages:quality_model_peer", {"labelled": labelled, "work": work}, ONE_THREAD),
             harness.Case("train_quality_model", "bench.bench_stages:quality_model_ours", {"labelled": labelled, "work": work}, ONE_THREAD)]
    result = harness.compare(f"quality_model: {LABELS:,} labelled {EMB_DIM}-d vectors (encoding not counted), one thread", cases, ROUNDS, unit="labels")
    harness.speed_goal("train_quality_model", "sklearn RidgeCV", 0.7, "quality_model >= 0.7x RidgeCV alone (it also calibrates and scores both splits), labels per CPU second", "cpu").check(result)
    harness.memory_goal("train_quality_model", "sklearn RidgeCV", 1.5, "quality_model peak memory <= 1.5x RidgeCV's").check(result)


def mixture_rows(work: str) -> None:
    study = study_inputs()
    kwargs = {**study, "work": work}
    cases = [harness.Case("lightgbm + KFold", "bench.bench_stages:model_peer", kwargs, ONE_THREAD),
             harness.Case("fit_surrogates", "bench.bench_stages:model_ours", kwargs, ONE_THREAD)]
    result = harness.compare(f"mixture_model: {RUNS} proxy runs x 2 phases x {GROUPS} groups, 4 domain metrics", cases, ROUNDS, unit="runs")
    harness.speed_goal("fit_surrogates", "lightgbm + KFold", 0.4, "mixture_model >= 0.4x plain LightGBM CV (it fits and cross-validates the log-linear law too), runs per CPU second", "cpu").check(result)
    harness.memory_goal("fit_surrogates", "lightgbm + KFold", 1.5, "mixture_model peak memory <= 1.5x plain LightGBM's").check(result)
    # No library proposes or optimizes mixtures under epoch caps and blocks: absolute goals per study.
    for stage, target, cpu_s, mib, what in (
        ("mixture_swarm", "swarm_ours", 10.0, 256, f"{RUNS} proposed runs with trainer configs written"),
        ("mixture_weights", "weights_ours", 30.0, 1024, f"cross-entropy search, {SEARCH[0]:,} candidates x {SEARCH[1]} rounds, LightGBM surrogate"),
    ):
        one = harness.compare(f"{stage}: one study, {GROUPS} groups; {what} (no peer: absolute goals)", [harness.Case(stage, f"bench.bench_stages:{target}", kwargs, ONE_THREAD)], ROUNDS, unit="studies", show_rate=False)
        m = one[stage]
        cpu = m.values("cpu_s")
        harness.absolute_goal(f"{stage} <= {cpu_s:g} CPU seconds per study (median)", f"{harness.fmt(m.median('cpu_s'))} s [{harness.fmt(min(cpu))}..{harness.fmt(max(cpu))}]", m.median("cpu_s") <= cpu_s)
        harness.absolute_goal(f"{stage} peak memory <= {mib} MiB", f"{m.peak_mib():.0f} MiB", m.peak_mib() <= mib)


# --------------------------------------------------------------------------- main


def contamination_rows(work: str, texts: list[str], shard: str) -> None:
    eval_rows, index = write_eval_rows(work, texts)
    kwargs = {"shard": shard, "eval_rows": eval_rows, "index": index, "work": work}
    cases = [
        harness.Case("python set of 13-grams", "bench.bench_stages:contamination_peer", kwargs),
        harness.Case("contamination_shard", "bench.bench_stages:contamination_ours", kwargs),
    ]
    ngrams = {rule: meta["ngrams"] for rule, meta in (("marin", _index_meta(index)), ("coverage", _index_meta(os.path.join(index, "coverage"))))}
    title = (f"contamination: one normalized shard of {len(texts):,} documents, both rules vs a plain 13-gram set; eval index of "
             f"{ngrams['marin']:,} (marin) / {ngrams['coverage']:,} (coverage) 13-grams (production: 21.78M)")
    result = harness.compare(title, cases, ROUNDS)
    harness.speed_goal("contamination_shard", "python set of 13-grams", 1.0, "contamination >= 1x a Python 13-gram set, documents per CPU second", "cpu").check(result)
    harness.memory_goal("contamination_shard", "python set of 13-grams", 1.5, "contamination peak memory <= 1.5x the 13-gram set's").check(result)


def _index_meta(index: str) -> dict:
    import json

    with open(os.path.join(index, "index.json")) as handle:
        return json.load(handle)


def pool_rows(work: str, texts: list[str], shard: str, ids: list[str]) -> None:
    from marin_assets.core.pool import tokens

    attrs = write_attributes(work, ids, (8, 5))  # exact: 1 id in 8 removed, fuzzy: 1 in 5
    attrs["tokens"] = os.path.join(work, "tokens", os.path.basename(shard))  # counted once, as the token_counts stage does
    tokens.token_counts_shard([shard], attrs["tokens"], tokens.TokenCountParams(tokenizer=tokens.offline_tokenizer_params()))
    cases = [
        harness.Case("polars anti-join", "bench.bench_stages:pool_peer", {"shard": shard, "attrs": attrs, "work": work}),
        harness.Case("pool_shard", "bench.bench_stages:pool_ours", {"shard": shard, "attrs": attrs, "work": work}),
    ]
    title = f"pool: shard {LIST_SHARD} of {LIST_SHARDS} ({len(texts):,} documents, one id range), removal lists of the whole source"
    result = harness.compare(title, cases, ROUNDS)
    harness.speed_goal("pool_shard", "polars anti-join", 0.8, "pool >= 0.8x polars with anti-joins, documents per CPU second", "cpu").check(result)
    harness.memory_goal("pool_shard", "polars anti-join", 1.0, "pool peak memory <= 1x the polars anti-join's").check(result)


def tokens_ours(shard: str, work: str) -> dict:
    from marin_assets.core.pool import tokens

    params = tokens.TokenCountParams(tokenizer=tokens.offline_tokenizer_params())
    tokens.count_tokens(["warm up the tokenizer"], params.tokenizer)
    out = os.path.join(work, "tokens_ours.parquet")
    with harness.timed():
        stats = tokens.token_counts_shard([shard], out, params)
    os.remove(out)
    return {"items": stats["documents"], "tokens": stats["tokens"]}


def tokens_peer(shard: str, work: str) -> dict:
    """The tokenizer library used plainly: the shard's texts, ``encode_batch_fast`` 1,000 at a time,
    ``id`` and ``tokens`` written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from marin_assets.core.pool import tokens

    params = tokens.offline_tokenizer_params()
    tokenizer, _ = tokens.load_tokenizer(params.name, params.revision, params.file)  # the library itself, not count_tokens
    tokenizer.encode_batch_fast(["warm up the tokenizer"], add_special_tokens=False)
    out = os.path.join(work, "tokens_peer.parquet")
    with harness.timed():
        table = pq.read_table(shard, columns=["id", "text"])
        texts = table.column("text").to_pylist()
        counts = [len(e.ids) for b in range(0, len(texts), 1_000) for e in tokenizer.encode_batch_fast(texts[b : b + 1_000], add_special_tokens=False)]
        pq.write_table(pa.table({"id": table.column("id"), "tokens": pa.array(counts, pa.int32())}), out)
    os.remove(out)
    return {"items": len(counts), "tokens": sum(counts)}


def token_counts_rows(work: str) -> None:
    shard, _ = write_shard(work, make_texts(DOCS))
    cases = [harness.Case("tokenizers encode_batch_fast", "bench.bench_stages:tokens_peer", {"shard": shard, "work": work}),
             harness.Case("token_counts_shard", "bench.bench_stages:tokens_ours", {"shard": shard, "work": work})]
    result = harness.compare(f"token_counts: one normalized shard of {DOCS:,} documents, the offline tokenizer", cases, ROUNDS)
    harness.speed_goal("token_counts_shard", "tokenizers encode_batch_fast", 0.9, "token_counts >= 0.9x the tokenizer used plainly, documents per CPU second", "cpu").check(result)
    harness.memory_goal("token_counts_shard", "tokenizers encode_batch_fast", 1.0, "token_counts peak memory <= 1x the plain run's (texts taken 1,024 at a time)").check(result)


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
            contamination_rows(work, texts, shard)
        if not only or "pool" in only:
            pool_rows(work, texts, shard, ids)
        for row in dict.fromkeys(ROWS.values()):  # the rest take only the work folder
            if row not in ("contamination", "pool") and (not only or row in only):
                globals()[f"{row}_rows"](work)


if __name__ == "__main__":
    sys.exit(harness.exit_status(main()))
