"""`make rehearse`, part 2 for every stage after normalize: the real tasks against the counting store.

A generated corpus of two sources (``bench_stages.make_texts``, the second holding exact and near
copies of the first) in normalized shards on ``slowstore://`` (``bench/slow_store.py``) runs
through the pipeline's tasks at 1x, 4x and 16x: the shard count grows with the scale while a
shard's documents and every task's fan-in stay fixed (the fan-ins scaled down so that 1x already
fills a task, as normalize's part does). Each task runs in this process through a runner that
counts its requests (``rehearse_kit.counted_map``), by phase, and how many of them one thread
issued (requests on one thread are a serial chain: ``chain`` is that count, a lower bound of the
longest chain and equal to it when the task used one thread).

Per stage, one row: the largest task's requests at each scale and the largest growth of any of
its phases from 1x (or the first scale it runs at) to the top scale against the goal (<= 1.3x:
PASS), the serial chain, the full-pool latency projected at 30 ms per request and beside it the
CPU core-hours. The full pool's tasks times their requests are the requests its shards cause:
the stage's requests per shard at the top scale (all its tasks') x 372,529 shards, which also
holds where a task's fan-in is scaled down here (128 shards per histogram task in production
make 64x the requests of a task here, in 1/64 as many tasks). CPU: task CPU here per MiB of text,
or per document for stages that read vectors or rows, times the pool (256 MiB and ~26,800
documents per shard).
``sampling_groups`` has no tasks: its step reads each source's compacted index; its row counts
that step's requests per source.

The stages: minhash_buckets, contamination, embeddings (the offline MiniLM, 128 tokens),
topics and quality_scores (small generated models of the encoder's dimension), quality_bands'
histogram tasks, topic_model's sample tasks, exact_duplicates and fuzzy_duplicates (their real
drivers, every step's tasks), pool (per shard, then the group-file merges and deletes) and
sampling_groups.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import random
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from bench import bench_stages, slow_store
from bench.harness import MIB, pick
from bench.rehearse_kit import (
    DOCS_PER_SHARD,
    POOL_MIB,
    POOL_SHARDS,
    REQUEST_S,
    counted_map,
)
from marin_assets.core.ingest.recipes import checked_catalog
from marin_assets.core.decon import rules as decon
from marin_assets.core.dedup import minhash
from marin_assets.core.dedup.decisions import removed_uri
from marin_assets.core.dedup.exact import find_exact_duplicates
from marin_assets.core.dedup.fuzzy import FuzzyScale, find_fuzzy_duplicates
from marin_assets.core.embed import embeddings as embed
from marin_assets.core.embed import quality, topics
from marin_assets.core.pool import curated as pool
from marin_assets.core.pool import tokens
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.runner import ShardResult, ShardRunner, ShardTask
from marin_assets.testing.dedup_corpus import edit_words, write_normalized

SOURCES = ("alpha", "beta")
SHARDS_1X = 2  # per source
SHARD_DOCS = 16
FAN_IN = 2  # shards per histogram, sample and exact map task (production: 128, 128, 16)
MERGE_FILES = 16  # group files per merge task (production: 1,024)
# fuzzy task sizes below 1x's records, edges and members, so every step's task count grows with the
# corpus and 1x already fills each step's fan-in: a shard per map task and 4 inputs per task at most
# (production: 16 and 1,024); 1x's 4 map files, 7 label files and 4 removal parts fill it
FUZZY = FuzzyScale(records_per_task=512, edges_per_task=8, union_find_max_edges=0, members_per_task=2, shards_per_map=1, max_inputs_per_task=4)
IDS_PER_PARTITION = 32  # exact dedup's reduce tasks (production: 8,000,000 ids each)
EXACT_INPUTS = 2  # files one exact task reads, at most (production: 1,024): 1x's 2 map files and 2 reduce parts fill it
GOAL = 1.3
POOL_DOCS = POOL_SHARDS * DOCS_PER_SHARD


@dataclasses.dataclass
class Run:
    """Every stage at one scale, and what the corpus held."""

    stages: dict[str, Counts]
    docs: int
    mib: float
    group_requests: int  # sampling_groups' step, per source
    group_files: float  # per shard (production: up to 200, 40 topics x 5 bands)


@dataclasses.dataclass
class Counts:
    """One stage at one scale: each task's requests and serial chain by phase, its tasks' CPU, the shards they cover."""

    requests: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    chains: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    cpu: float = 0.0
    shards: int = 0


@contextlib.contextmanager
def requests_by_thread() -> Iterator[collections.Counter]:
    """The store's requests in this block, by the thread that issued them."""
    counted: collections.Counter = collections.Counter()
    original = slow_store.SlowStore.__dict__["request"]

    def request(cls: Any, kind: str) -> None:
        counted[threading.get_ident()] += 1
        original.__func__(cls, kind)

    slow_store.SlowStore.request = classmethod(request)
    try:
        yield counted
    finally:
        slow_store.SlowStore.request = original


class StageRunner(ShardRunner):
    """Runs each task here (``counted_map``), adding its requests, serial chain and CPU to ``counts``."""

    def __init__(self, counts: Counts) -> None:
        super().__init__()
        object.__setattr__(self, "_counts", counts)

    def map(self, tasks: Any, on_done: Callable[[ShardResult], None] | None = None) -> list[ShardResult]:
        results = []
        for task in tasks:
            with requests_by_thread() as threads:
                (result,) = counted_map([task], self._counts.requests)
            self._counts.chains.setdefault(task.fn.__name__, []).append(max(threads.values(), default=0))
            self._counts.cpu += result.cpu_seconds
            results.append(result)
            if on_done:
                on_done(result)
        return results


@contextlib.contextmanager
def fan_in(module: Any, name: str, value: int) -> Iterator[None]:
    """A driver's module-level fan-in scaled down for the run (kept if the driver no longer has it)."""
    if not hasattr(module, name):
        yield
        return
    saved = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, saved)


# --------------------------------------------------------------------------- the pipeline at one scale


def write_sources(root: str, scale: int) -> dict[str, list[str]]:
    """Normalized shards of both sources; every 8th document of the second is one of the first's, every
    8th (offset 4) a copy with 3 words edited (a near duplicate)."""
    shards = SHARDS_1X * scale
    texts = bench_stages.make_texts(2 * shards * SHARD_DOCS, seed=scale)
    first, second = texts[: len(texts) // 2], texts[len(texts) // 2 :]
    rng = random.Random(scale)
    for i in range(0, len(second) - 4, 8):
        second[i] = first[i]
        second[i + 4] = edit_words(first[i + 4].split(" "), 3, rng, first[i].split())
    return {name: write_normalized(root, name, texts, shards) for name, texts in zip(SOURCES, (first, second))}


def per_shard(counts: Counts, fn: Any, shard_inputs: Sequence[tuple[str, ...]], out_dir: str, params: Any) -> list[ShardResult]:
    """One task per shard, as ``run_shards`` submits them: each reads the same-named shard of every input."""
    tasks = [ShardTask(fn, inputs, storage.join(out_dir, storage.basename(inputs[0])), params) for inputs in shard_inputs]
    counts.shards += len(tasks)
    return StageRunner(counts).map(tasks)


def eval_index(root: str, texts_uri: str) -> str:
    """The eval n-gram index from 60-word excerpts of some documents (so some are flagged), as ``eval_ngrams`` builds it."""
    texts = storage.read_parquet(texts_uri, columns=["text"]).column("text").to_pylist()
    rows = [("bench_eval", f"r{i}", " ".join(t.split()[:60])) for i, t in enumerate(texts) if i % 4 == 0]
    out = storage.join(root, "eval_index")
    decon.build_eval_index(rows, out)
    storage.write_manifest(out, {"rows": len(rows)})
    return out


def attributes(root: str, normalized: dict[str, list[str]], stage: dict[str, Counts]) -> dict[str, dict[str, list[str]]]:
    """minhash_buckets, contamination, token_counts, embeddings, topics and quality_scores of every shard."""
    out: dict[str, dict[str, list[str]]] = {k: {} for k in ("buckets", "contamination", "token_counts", "embeddings", "topics", "quality", "rows")}
    index = eval_index(root, normalized[SOURCES[0]][0])
    encoder = embed.EmbedParams(encoder=embed.offline_encoder_params(max_tokens=128))
    dim = embed.embedding_dim(encoder.encoder)
    topic_model = bench_stages.write_topic_model(storage.join(root, "models"), fine=200, dim=dim)
    quality_model = bench_stages.write_quality_model(storage.join(root, "models"), dim=dim)
    for source, shards in normalized.items():
        one = [(s,) for s in shards]
        for name, fn, params in (("minhash_buckets", minhash.minhash_shard, minhash.MinHashParams()),
                                 ("contamination", decon.contamination_shard, decon.DeconParams(index_uri=index)),
                                 ("token_counts", tokens.token_counts_shard, tokens.TokenCountParams(tokenizer=tokens.offline_tokenizer_params())),
                                 ("embeddings", embed.embed_shard, encoder)):  # fmt: skip
            folder = {"minhash_buckets": "buckets"}.get(name, name)
            results = per_shard(stage[name], fn, one, storage.join(root, folder, source), params)
            out[folder][source] = [r.output for r in results]
            if name == "embeddings":
                out["rows"][source] = [int(r.stats["rows"]) for r in results]
        vectors = [(e,) for e in out["embeddings"][source]]
        out["topics"][source] = [r.output for r in per_shard(stage["topics"], topics.assign_topics_shard, vectors, storage.join(root, "topics", source), topics.AssignParams(topic_model))]
        out["quality"][source] = [r.output for r in per_shard(stage["quality_scores"], quality.quality_scores_shard, vectors, storage.join(root, "quality", source), quality.QualityScoreParams(quality_model))]
    return out


def curation(root: str, attrs: dict[str, dict[str, list[str]]], stage: dict[str, Counts]) -> str:
    """quality_bands' histogram tasks (their edges are the pool's) and topic_model's sample tasks."""
    pairs = {s: list(zip(attrs["topics"][s], attrs["quality"][s])) for s in SOURCES}
    with fan_in(quality, "PAIRS_PER_HISTOGRAM_TASK", FAN_IN):
        hist, _, _ = quality.score_histogram_by_tasks(pairs, storage.join(root, "bands", "_histograms"), quality.BandParams(), StageRunner(stage["quality_bands"]))
    stage["quality_bands"].shards += sum(len(p) for p in pairs.values())
    shards = [topics.SourceShards(s, tuple(attrs["embeddings"][s]), rows=tuple(attrs["rows"][s])) for s in SOURCES]
    with fan_in(topics.layout, "SHARDS_PER_SAMPLE_TASK", FAN_IN):
        topics.sample_embeddings(shards, topics.TopicParams(), StageRunner(stage["topic_model sample"]), storage.join(root, "topic_model", "_sample"))
    stage["topic_model sample"].shards += sum(len(s.embeddings) for s in shards)
    return quality.save_band_edges(quality.band_edges(hist, quality.BandParams()), storage.join(root, "bands"))


def dedup(root: str, normalized: dict[str, list[str]], buckets: dict[str, list[str]], stage: dict[str, Counts]) -> tuple[str, str]:
    """Both dedup stages through their drivers, every step's tasks counted."""
    exact = storage.join(root, "exact")
    find_exact_duplicates(normalized, exact, ids_per_partition=IDS_PER_PARTITION, runner=StageRunner(stage["exact_duplicates"]),
                          lengths=buckets, shards_per_map=FAN_IN, max_inputs=EXACT_INPUTS)  # fmt: skip
    fuzzy = storage.join(root, "fuzzy")
    find_fuzzy_duplicates(buckets, normalized, set(), fuzzy, scale=FUZZY, runner=StageRunner(stage["fuzzy_duplicates"]))
    for name in ("exact_duplicates", "fuzzy_duplicates"):
        stage[name].shards += sum(len(v) for v in normalized.values())
    return exact, fuzzy


def curated_pool(root: str, normalized: dict[str, list[str]], attrs: dict[str, dict[str, list[str]]], edges: str, removals: tuple[str, str],
                 stage: dict[str, Counts]) -> tuple[int, int]:  # fmt: skip
    """pool's per-shard tasks and each source's group-file merges; then sampling_groups' step
    (no tasks: each source's compacted index read by the step). Returns the step's requests (all
    sources) and the group files the pool tasks wrote."""
    sources, group_files = [], 0
    for source, shards in normalized.items():
        params = pool.PoolParams(source=source, pool_dir=storage.join(root, "pool", source), band_edges_uri=edges,
                                 exact_removed_uri=removed_uri(removals[0], source), fuzzy_removed_uri=removed_uri(removals[1], source))  # fmt: skip
        inputs = list(zip(shards, attrs["topics"][source], attrs["quality"][source], attrs["contamination"][source], attrs["token_counts"][source]))
        index_dir = storage.join(root, "pool_index", source)
        results = per_shard(stage["pool"], pool.pool_shard, inputs, index_dir, params)
        merged = pool.compact_pool(results, index_dir, params.pool_dir, source, pool.group_names(edges), pool.CompactParams(max_files_per_task=MERGE_FILES),
                                   StageRunner(stage["pool group files"]))  # fmt: skip
        group_files += int(merged.get("shard_group_files", 0))
        stage["pool group files"].shards += len(results)
        sources.append((source, pool.pool_index_uris(index_dir), params.pool_dir))
    before = slow_store.SlowStore.total()
    pool.group_counts_and_files(sources, storage.join(root, "sampling_groups", "pool_files.parquet"))
    return slow_store.SlowStore.total() - before, group_files


STAGES = ("minhash_buckets", "contamination", "token_counts", "embeddings", "topics", "quality_scores", "quality_bands", "topic_model sample",
          "exact_duplicates", "fuzzy_duplicates", "pool", "pool group files")  # fmt: skip
NOTES = {
    "embeddings": " (this machine's CPU at 128 tokens; production embeds up to 512 on GPUs)",
    "exact_duplicates": " (ids per task scaled down ~10^5x here: tasks per shard, latency and CPU indicative only)",
    "fuzzy_duplicates": " (records, edges and members per task scaled down 10^4-10^6x here: tasks per shard, latency and CPU indicative only)",
}
BY_MIB = {"minhash_buckets", "contamination", "token_counts", "exact_duplicates", "fuzzy_duplicates", "pool", "pool group files"}


def pipeline(work: Path, scale: int) -> Run:
    """Every stage's tasks at ``scale``."""
    root = f"{slow_store.PROTOCOL}://{work}/{scale}x"
    stage = {name: Counts() for name in STAGES}
    normalized = write_sources(root, scale)
    texts = [storage.read_parquet(u, columns=["text"]).column("text") for us in normalized.values() for u in us]
    docs, mib = sum(len(t) for t in texts), sum(sum(len(x) for x in t.to_pylist()) for t in texts) / MIB
    attrs = attributes(root, normalized, stage)
    edges = curation(root, attrs, stage)
    removals = dedup(root, normalized, attrs["buckets"], stage)
    requests, group_files = curated_pool(root, normalized, attrs, edges, removals, stage)
    return Run(stage, docs, mib, -(-requests // len(SOURCES)), group_files / len(texts))


# --------------------------------------------------------------------------- the rows


def stage_row(name: str, runs: dict[int, Run]) -> bool:
    """Print one stage's row (and its phases when it has several); True when no phase grows past the goal."""
    scales = sorted(runs)
    low, top = scales[0], scales[-1]
    at = {s: runs[s].stages[name] for s in scales}
    phases = list(at[top].requests)
    largest = {s: max((max(v) for v in at[s].requests.values()), default=0) for s in scales}
    # a phase that starts past 1x (merges once a step's files exceed the fan-in): against its first scale
    first = {p: next(s for s in scales if at[s].requests.get(p)) for p in phases}
    growth = {p: max(at[top].requests[p]) / max(1, max(at[first[p]].requests[p])) for p in phases}
    worst = max(phases, key=lambda p: growth[p], default="")
    # the goal holds for the stage's largest task and for each phase's
    ratio = max(growth.get(worst, 0.0), largest[top] / max(1, largest[low]))
    chain = max((max(v) for v in at[top].chains.values()), default=0)
    # the full pool's tasks x their requests = the requests its shards cause at the task sizes here
    per_shard = sum(sum(v) for v in at[top].requests.values()) / max(1, at[top].shards)
    hours = per_shard * POOL_SHARDS * REQUEST_S / 3600
    unit, pool_units, here = ("MiB", POOL_MIB, runs[top].mib) if name in BY_MIB else ("document", POOL_DOCS, runs[top].docs)
    per_unit = at[top].cpu / max(here, 1e-9)
    worst_note = f" (phase {worst})" if len(phases) > 1 and growth.get(worst, 0.0) == ratio > 1 else ""
    print(f"rehearse tasks {name}: largest task requests " + " ".join(f"{s}x={largest[s]}" for s in scales)
          + f" ratio {top}x/{low}x={ratio:.2f} {'PASS' if ratio <= GOAL else 'MISS'}{worst_note}; serial chain {chain} (one thread's);"
          f" full pool {hours:,.1f} task-hours of request latency at 30 ms (projected: {per_shard:.1f} requests per shard) beside CPU {per_unit:.4f} s/{unit} here"
          f" -> {per_unit * pool_units / 3600:,.0f} core-hours{NOTES.get(name, '')}", flush=True)  # fmt: skip
    if len(phases) > 1:
        print("    phases (largest task's requests by scale, tasks at top): " + "; ".join(
            f"{p} {'/'.join(str(max(at[s].requests.get(p, [0]))) for s in scales)} x{len(at[top].requests[p])}" for p in phases), flush=True)  # fmt: skip
    return ratio <= GOAL


def every_stage(scales: Sequence[int] | None = None) -> bool:
    """Part 2 for every stage but normalize: one row each; True when every stage's tasks hold the goal."""
    scales = list(scales or pick([1, 4, 16], [1, 4]))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rehearse-tasks-") as tmp:
        runs = {s: pipeline(Path(tmp), s) for s in scales}
    ok = all([stage_row(name, runs) for name in STAGES])
    low, top = runs[scales[0]], runs[scales[-1]]
    ratio = top.group_requests / max(1, low.group_requests)
    sources = len(checked_catalog(None, strict=False).sources)  # the whole pool, also under BENCH_QUICK
    print("rehearse tasks sampling_groups (its step, no tasks): requests per source " + " ".join(f"{s}x={runs[s].group_requests}" for s in scales)
          + f" ratio {ratio:.2f} {'PASS' if ratio <= GOAL else 'MISS'}; full pool {sources} sources x {top.group_requests} requests x 30 ms"
          f" = {sources * top.group_requests * REQUEST_S:.0f} s, one after another in the step", flush=True)  # fmt: skip
    print(f"rehearse tasks: {len(SOURCES)} sources of {SHARDS_1X} shards at 1x, {SHARD_DOCS} documents of ~{low.mib * 1024 / low.docs:.1f} KiB per "
          f"shard ({top.group_files:.1f} group files of the 200 per pool shard: a production pool task writes up to ~200, its merges read "
          f"~200 per shard), scales {scales}; CPU per MiB or document here (tiny shards: per-task costs dominate) x the pool ({POOL_MIB:,} MiB, "
          f"{POOL_DOCS:,} documents); latency: requests per shard here x {POOL_SHARDS:,} shards; {time.perf_counter() - started:.0f} s", flush=True)  # fmt: skip
    return ok and ratio <= GOAL
