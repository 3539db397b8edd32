"""Scale benchmark: every per-shard stage as Ray tasks on a local cluster of 2 workers, at 1x, 4x, 16x.

Goal (issue "Every stage on a Ray cluster"): per-task memory is bounded by configured sizes, not
by the corpus: from 1x to 16x the largest task's peak resident memory (its own VmHWM, reset when
the task starts in its worker) grows by at most 1.3x, and CPU seconds per document stay within
1.3x. Also: normalize of one >= 1 GiB JSONL file peaks within 1.3x of one file a quarter its size
(memory does not grow with the file) and within 1.3x of the 1x normalize peak (same shard
target), and embedding at ``max_seq_length`` 8192 within 1.3x of the 512-token run.

Stages: normalize, minhash_buckets, contamination, token_counts, pool, pool_group_files
(merging a source's group files), sampling_groups on a generated corpus (1x = ``BENCH_SCALE_MB`` MiB of text, default
200; one corpus generated once, scale k reads its first k x 1x files), normalize on a single large
file (a concatenation of corpus files), embeddings (offline model, 512 tokens) on
``BENCH_EMBED_DOCS`` (500) documents, and embedding memory at 8,192 vs 512 tokens
(``bench_embed.bench_long``: the offline MiniLM with its positions tiled to 8,192, each run in a
child process of its own, interleaved). The pool runs side by side with the task it replaced,
which counted its documents' tokens itself (``pool_shard_tokenizing``), ``BENCH_POOL_ROUNDS``
(3) rounds interleaved on the same inputs: goal, its CPU per MiB <= 0.15x the tokenizing task's,
no tokenizer call in its tasks, the same documents and tokens per group. Every figure is
printed, one line per stage and scale (``scale-bench <stage> <scale>x: ...``): the capacity table
in docs/scale.md cites them.

    make bench-scale                      # the full run docs/scale.md cites (24 min on 2 idle cores before the pool ran twice)
    BENCH_QUICK=1 make bench-scale        # 1x = 20 MiB, 1x/4x only
    BENCH_SCALES=1 BENCH_SCALE_MB=500 BENCH_SHARD_MB=256 BENCH_FILE_MB=125 BENCH_BIG_FILE_MB=0 \
        BENCH_EMBED_DOCS=0 BENCH_LONG_DOCS=0 make bench-scale   # 256 MiB (production) shards; 0 skips a part
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench import harness  # noqa: E402
from marin_assets.core.decon import rules as decon  # noqa: E402
from marin_assets.core.dedup import minhash
from marin_assets.core.embed import embeddings as embed
from marin_assets.core.embed import quality
from marin_assets.core.ingest import normalize
from marin_assets.core.pool import curated as pool
from marin_assets.core.pool import tokens
from marin_assets.core.pool.groups import MixtureParams, sampling_groups, write_sampling_groups
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.runner import LOCAL, ShardResult, ShardRunner, ShardTask  # noqa: E402

MIB = 1 << 20
QUICK = os.environ.get("BENCH_QUICK", "") not in ("", "0")
BASE_MB = int(os.environ.get("BENCH_SCALE_MB", "20" if QUICK else "200"))
SCALES = tuple(int(k) for k in os.environ.get("BENCH_SCALES", "").split(",") if k) or ((1, 4) if QUICK else (1, 4, 16))
BIG_FILE_MB = int(os.environ.get("BENCH_BIG_FILE_MB", "128" if QUICK else "1100"))
EMBED_DOCS = int(os.environ.get("BENCH_EMBED_DOCS", "500"))
TARGET_SHARD_BYTES = int(os.environ.get("BENCH_SHARD_MB", "8" if QUICK else "32")) * MIB
FILE_BYTES = int(os.environ.get("BENCH_FILE_MB", "32")) * MIB
# read batches no larger than a shard or a 1x file, so the single big file reads as the 1x files do
BATCH_BYTES = int(os.environ.get("BENCH_BATCH_MB", "0")) * MIB or min(64 * MIB, TARGET_SHARD_BYTES, FILE_BYTES)
WORKER_TASKS = int(os.environ.get("BENCH_WORKER_TASKS", "8"))
LONG_DOCS = int(os.environ.get("BENCH_LONG_DOCS", "12" if QUICK else "24"))
LONG_ROUNDS = 1 if QUICK else 2
POOL_ROUNDS = int(os.environ.get("BENCH_POOL_ROUNDS", "2" if QUICK else "3"))  # the pool and its tokenizing predecessor, interleaved
POOL_CPU_GOAL = 0.15  # the pool's CPU per MiB against the task that counted its tokens itself
POOL_GOALS: list[bool] = []
GROWTH_LIMIT = 1.3
TOKEN_PARAMS = tokens.TokenCountParams(tokenizer=tokens.offline_tokenizer_params())

WORDS = harness.model_vocabulary()


# --------------------------------------------------------------------------- corpus


def write_corpus(directory: Path, total_bytes: int, seed: int, file_bytes: int = FILE_BYTES, count: int | None = None) -> list[str]:
    """JSONL files of generated documents (Zipf-like words, 200-1,500 words each), 1% exact copies.

    ``count``: exactly that many files of about ``file_bytes`` each (``total_bytes`` is ignored).
    """
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    files: list[str] = []
    written = doc = 0
    weights = 1.0 / np.arange(1, len(WORDS) + 1)
    weights /= weights.sum()
    while (len(files) < count) if count is not None else (written < total_bytes):
        path = directory / f"part-{len(files):05d}.jsonl"
        with open(path, "w") as out:
            held = 0
            while held < file_bytes and (count is not None or written < total_bytes):
                lengths = rng.integers(200, 1500, size=256)
                words = WORDS[rng.choice(len(WORDS), size=int(lengths.sum()), p=weights)]
                cuts = np.cumsum(lengths)[:-1]
                lines = []
                for i, part in enumerate(np.split(words, cuts)):
                    text = " ".join(part.tolist())
                    if i % 100 == 7 and lines:  # an exact copy of the previous document
                        text = json.loads(lines[-1])["text"]
                    lines.append(json.dumps({"id": f"d{doc}", "text": text}))
                    doc += 1
                block = "\n".join(lines) + "\n"
                out.write(block)
                held += len(block)
                written += len(block)
        files.append(str(path))
    return files


# --------------------------------------------------------------------------- synthetic attributes


def synthetic_attributes(input_uris: list[str], output_uri: str, params: dict) -> dict:
    """Topic and quality score per document of a normalized shard (deterministic from the id)."""
    import pyarrow as pa  # noqa: PLC0415

    ids = storage.read_parquet(input_uris[0], columns=["id"]).column("id")
    keys = np.array([int(i[:8], 16) for i in ids.to_pylist()], dtype=np.int64)
    parent = output_uri.rsplit("/", 2)[0]
    name = storage.basename(output_uri)
    storage.write_parquet(pa.table({"id": ids, "topic": pa.array(keys % 40, pa.int16())}), storage.join(parent, "topics", name))
    storage.write_parquet(pa.table({"id": ids, "score": pa.array((keys % 1000) / 1000.0, pa.float32())}), storage.join(parent, "quality", name))
    return {"rows": len(ids)}


def pool_shard_tokenizing(input_uris: list[str], output_uri: str, params: pool.PoolParams) -> dict:
    """The pool task before token_counts, which the pool is measured against: the same task with its
    tokens counted in it by the same function and tokenizer (here every document of the shard, the
    ~3% the pool drops included; the task counted its survivors), on every run and rebuild."""
    counted = output_uri + ".tokens.parquet"
    tokens.token_counts_shard(input_uris[:1], counted, TOKEN_PARAMS)
    stats = pool.pool_shard([*input_uris[:4], counted], output_uri, params)
    storage.remove(counted)
    return stats


def sampling_groups_task(input_uris: list[str], output_uri: str, params: dict) -> dict:
    """The sampling_groups step (per-source aggregation, streamed file list) as one task."""
    counts = pool.group_counts_and_files([(params["source"], input_uris, params["pool_dir"])], storage.join(output_uri + ".d", "pool_files.parquet"))
    result = sampling_groups(counts, {}, MixtureParams())
    write_sampling_groups(result, output_uri + ".d")
    storage.write_bytes(output_uri, b"done")
    return {"documents": result.summary["documents"], "tokens": result.summary["tokens"]}


def embed_task(input_uris: list[str], output_uri: str, params: embed.EmbedParams) -> dict:
    return embed.embed_shard(input_uris, output_uri, params)


# --------------------------------------------------------------------------- measuring


class Stage:
    """Task results of one stage at one scale."""

    def __init__(self, name: str, scale: str, results: Sequence[ShardResult], docs: int, text_bytes: int, wall: float) -> None:
        self.name, self.scale, self.docs, self.text_bytes, self.wall = name, scale, docs, text_bytes, wall
        self.results = results
        self.tasks = len(results)
        self.peak = max((r.peak_rss_bytes for r in results), default=0)
        self.cpu = sum(r.cpu_seconds for r in results)
        self.task_peaks = sorted(r.peak_rss_bytes for r in results)

    @property
    def cpu_per_kdoc(self) -> float:
        return 1000 * self.cpu / max(self.docs, 1)

    def line(self) -> str:
        median_peak = statistics.median(self.task_peaks) / MIB if self.task_peaks else 0
        return (
            f"scale-bench {self.name} {self.scale}: docs={self.docs} text_mib={self.text_bytes / MIB:.0f} tasks={self.tasks} "
            f"peak_task_mib={self.peak / MIB:.0f} median_task_mib={median_peak:.0f} cpu_s={self.cpu:.1f} "
            f"cpu_s_per_1k_docs={self.cpu_per_kdoc:.3f} wall_s={self.wall:.1f}"
        )


def for_stage(runner: ShardRunner, name: str, scale: str) -> ShardRunner:
    """The runner with workers of this stage's own: a reused worker carries only its own stage's history."""
    return dataclasses.replace(runner, runtime_env={"env_vars": {"MARIN_BENCH_STAGE": f"{name}-{scale}"}})


def run_stage(runner: ShardRunner, name: str, scale: str, tasks: list[ShardTask], docs: int, text_bytes: int) -> Stage:
    started = time.perf_counter()
    results = for_stage(runner, name, scale).map(tasks)
    stage = Stage(name, scale, results, docs, text_bytes, time.perf_counter() - started)
    print(stage.line(), flush=True)
    return stage


def goal(what: str, ratio: float, limit: float = GROWTH_LIMIT) -> bool:
    ok = ratio <= limit
    print(f"goal: {what}: {ratio:.2f}x <= {limit:.2f}x: {'PASS' if ok else 'MISS'}", flush=True)
    return ok


# --------------------------------------------------------------------------- the pipeline at one scale


def eval_index(root: Path, corpus_file: str) -> str:
    """An eval n-gram index from a few documents of the corpus (so some documents are flagged)."""
    rows = []
    with open(corpus_file) as handle:
        for i, line in enumerate(handle):
            if i % 50 == 0:
                rows.append(("bench_eval", f"r{i}", " ".join(json.loads(line)["text"].split()[:60])))
            if len(rows) >= 200:
                break
    out = str(root / "eval_index")
    decon.build_eval_index(rows, out)
    storage.write_manifest(out, {"rows": len(rows)})
    return out


def removal_list(normalized_dir: str, out: str, every: int) -> str:
    """A sorted sparse removal list naming every ``every``-th id (as the dedup stages write it)."""
    import pyarrow as pa  # noqa: PLC0415

    ids: list[str] = []
    for shard in storage.list_shards(normalized_dir):
        ids.extend(storage.read_parquet(shard, ["id"]).column("id").to_pylist()[::every])
    ids.sort()
    uri = storage.join(out, "removed.parquet")
    storage.write_parquet(pa.table({"id": pa.array(ids, pa.string()), "kept_source": pa.array(["other"] * len(ids), pa.string())}), uri, row_group_size=16_384)
    return uri


def files_per_base() -> int:
    """Input files per 1x: about ``BENCH_FILE_MB`` each, an equal number per 1x so scales are prefixes."""
    return max(1, -(-BASE_MB * MIB // FILE_BYTES))


def shared_corpus(work: Path) -> list[str]:
    """One corpus for every scale, generated once: scale k reads its first k x 1x files.

    Also long enough to make the single large file from (a concatenation of its files).
    """
    per_base = files_per_base()
    file_bytes = BASE_MB * MIB // per_base
    total = max(BASE_MB * MIB * SCALES[-1], BIG_FILE_MB * MIB)
    started, cpu = time.perf_counter(), time.process_time()
    files = write_corpus(work / "corpus", 0, seed=1, file_bytes=file_bytes, count=-(-total // file_bytes))
    print(f"scale bench: corpus of {len(files)} files, {sum(os.path.getsize(f) for f in files) / MIB:.0f} MiB "
          f"generated in {time.perf_counter() - started:.0f} s ({time.process_time() - cpu:.0f} CPU s)", flush=True)
    return files


def pipeline(work: Path, scale: int, runner: ShardRunner, corpus: list[str]) -> dict[str, Stage]:
    label = f"{scale}x"
    root = work / label
    files = corpus[: files_per_base() * scale]
    text_bytes = sum(os.path.getsize(f) for f in files)
    params = normalize.NormalizeParams(target_shard_bytes=TARGET_SHARD_BYTES, batch_bytes=BATCH_BYTES)
    stages: dict[str, Stage] = {}

    started = time.perf_counter()
    collected: list[ShardResult] = []
    recording = _Recording(for_stage(runner, "normalize", label), collected)
    manifest = normalize.normalize_source("bench", files, str(root / "normalized"), params, runner=recording)
    docs = int(manifest["rows"])
    stages["normalize"] = Stage("normalize", label, collected, int(manifest["counters"]["rows_in"]), text_bytes, time.perf_counter() - started)
    print(stages["normalize"].line(), flush=True)
    shards = storage.list_shards(str(root / "normalized"))

    stages["minhash_buckets"] = run_stage(
        runner, "minhash_buckets", label,
        [ShardTask(minhash.minhash_shard, (s,), str(root / "minhash" / storage.basename(s)), minhash.MinHashParams()) for s in shards],
        docs, text_bytes,
    )
    index = eval_index(root, files[0])
    decon_params = decon.DeconParams(index_uri=index)
    stages["contamination"] = run_stage(
        runner, "contamination", label,
        [ShardTask(decon.contamination_shard, (s,), str(root / "contamination" / storage.basename(s)), decon_params) for s in shards],
        docs, text_bytes,
    )
    for_stage(runner, "attributes", label).map([ShardTask(synthetic_attributes, (s,), str(root / "attrs" / "done" / storage.basename(s)), {}) for s in shards])
    edges = quality.band_edges(None, quality.BandParams(method="fixed"))
    edges_uri = quality.save_band_edges(edges, str(root / "bands"))
    stages["token_counts"] = run_stage(
        runner, "token_counts", label,
        [ShardTask(tokens.token_counts_shard, (s,), str(root / "tokens" / storage.basename(s)), TOKEN_PARAMS) for s in shards],
        docs, text_bytes,
    )
    pool_params = pool.PoolParams(
        source="bench",
        pool_dir="",  # each run of the pool below has its own
        band_edges_uri=edges_uri,
        exact_removed_uri=removal_list(str(root / "normalized"), str(root / "exact"), 97),
        fuzzy_removed_uri=removal_list(str(root / "normalized"), str(root / "fuzzy"), 53),
    )
    stages["pool"], pool_dir = pool_side_by_side(runner, root, label, shards, pool_params, docs, text_bytes)
    index_dir = str(Path(stages["pool"].results[0].output).parent)
    collected = []
    started = time.perf_counter()
    merged = pool.compact_pool(stages["pool"].results, index_dir, pool_dir, "bench", pool.group_names(edges_uri),
                               pool.CompactParams(), _Recording(for_stage(runner, "pool_group_files", label), collected))
    stages["pool_group_files"] = Stage("pool_group_files", label, collected, docs, text_bytes, time.perf_counter() - started)
    print(f"{stages['pool_group_files'].line()} group_files={merged['group_files']} from_shard_files={merged['shard_group_files']}", flush=True)
    indexes = tuple(pool.pool_index_uris(index_dir))
    stages["sampling_groups"] = run_stage(
        runner, "sampling_groups", label,
        [ShardTask(sampling_groups_task, indexes, str(root / "groups" / "done"), {"source": "bench", "pool_dir": pool_dir})],
        docs, text_bytes,
    )
    shutil.rmtree(root, ignore_errors=True)
    return stages


def pool_side_by_side(runner: ShardRunner, root: Path, label: str, shards: list[str], params: pool.PoolParams, docs: int,
                      text_bytes: int) -> tuple[Stage, str]:  # fmt: skip
    """The pool (summing token_counts) and the task before it (tokenizing), ``POOL_ROUNDS`` rounds
    interleaved on the same inputs: CPU per MiB of each (median), the goal, and whether their
    indexes (documents and tokens per group) are identical. Returns the last round of the pool and
    its pool directory, whose files the group-file merges take."""

    def run(name: str, fn: Any, r: int) -> Stage:
        out = root / f"{name}-{r}"
        tasks = [
            ShardTask(fn, (s, *(str(root / a / storage.basename(s)) for a in ("attrs/topics", "attrs/quality", "contamination", "tokens"))),
                      str(out / "index" / storage.basename(s)), dataclasses.replace(params, pool_dir=str(out / "files")))
            for s in shards
        ]  # fmt: skip
        return run_stage(runner, name, label, tasks, docs, text_bytes)

    runs: dict[str, list[Stage]] = {"pool_tokenizing": [], "pool": []}
    for r in range(POOL_ROUNDS):
        runs["pool_tokenizing"].append(run("pool_tokenizing", pool_shard_tokenizing, r))
        runs["pool"].append(run("pool", pool.pool_shard, r))
    per_mib = {name: statistics.median(st.cpu / max(st.text_bytes / MIB, 1e-9) for st in done) for name, done in runs.items()}
    ratio = per_mib["pool"] / max(per_mib["pool_tokenizing"], 1e-12)
    calls = sum(int(res.stats.get("tokenizer_calls", 0)) for st in runs["pool"] for res in st.results)
    same = all(_index_of(st) == _index_of(runs["pool_tokenizing"][0]) for st in runs["pool"] + runs["pool_tokenizing"])
    print(f"scale-bench pool {label}: CPU s per MiB {per_mib['pool']:.4f} (sums token_counts) vs {per_mib['pool_tokenizing']:.4f} "
          f"(counts its tokens in the task), median of {POOL_ROUNDS} interleaved rounds: {ratio:.3f}x; tokenizer calls in the pool's "
          f"tasks {calls}; documents and tokens per group {'identical' if same else 'DIFFERENT'}", flush=True)
    POOL_GOALS.append(goal(f"pool {label}: CPU per MiB / the tokenizing pool task's (tokenizer calls {calls}, totals {'identical' if same else 'DIFFERENT'})",
                           ratio if same and calls == 0 else float("inf"), POOL_CPU_GOAL))  # fmt: skip
    for st in runs["pool"][:-1] + runs["pool_tokenizing"]:
        shutil.rmtree(Path(st.results[0].output).parent.parent, ignore_errors=True)
    return runs["pool"][-1], str(root / f"pool-{POOL_ROUNDS - 1}" / "files")


def _index_of(stage: Stage) -> list[tuple]:
    """Documents and tokens per group of a pool run (what sampling_groups counts)."""
    table = pool.read_pool_index([r.output for r in stage.results])
    totals: dict[str, list[int]] = {}
    for group, documents, count in zip(table.column("group").to_pylist(), table.column("documents").to_pylist(), table.column("tokens").to_pylist()):
        totals.setdefault(group, [0, 0])
        totals[group][0] += documents
        totals[group][1] += count
    return sorted((g, *v) for g, v in totals.items())


class _Recording(ShardRunner):
    """The same runner, keeping every task result (normalize maps twice: scatter, then gather)."""

    def __init__(self, runner: ShardRunner, sink: list[ShardResult]) -> None:
        object.__setattr__(self, "_inner", runner)
        object.__setattr__(self, "_sink", sink)
        for field in ("processes", "ray_address", "max_in_flight", "retries", "task_resources", "local_cpus", "worker_max_tasks", "runtime_env", "progress"):
            object.__setattr__(self, field, getattr(runner, field))

    def map(self, tasks: Sequence[ShardTask], on_done: Callable[[ShardResult], None] | None = None) -> list[ShardResult]:
        results = self._inner.map(tasks, on_done)
        self._sink.extend(results)
        return results


def big_file(work: Path, runner: ShardRunner, corpus: list[str], mib: int = BIG_FILE_MB) -> Stage:
    root = work / "big"
    (root / "in").mkdir(parents=True, exist_ok=True)
    path = str(root / "in" / "one.jsonl")
    with open(path, "wb") as out:  # corpus files end in a newline: their concatenation is JSON lines
        for part in corpus:
            with open(part, "rb") as handle:
                shutil.copyfileobj(handle, out, 16 * MIB)
            if out.tell() >= mib * MIB:
                break
    size = os.path.getsize(path)
    collected: list[ShardResult] = []
    started = time.perf_counter()
    manifest = normalize.normalize_source(
        "big", [path], str(root / "normalized"), normalize.NormalizeParams(target_shard_bytes=TARGET_SHARD_BYTES, batch_bytes=BATCH_BYTES),
        runner=_Recording(for_stage(runner, "normalize", f"one-file-{mib}"), collected)
    )
    stage = Stage("normalize_one_file", f"{size / MIB:.0f}MiB", collected, int(manifest["counters"]["rows_in"]), size, time.perf_counter() - started)
    print(stage.line(), flush=True)
    shutil.rmtree(root, ignore_errors=True)
    return stage


def embeddings(work: Path, runner: ShardRunner) -> Stage:
    root = work / "embed"
    files = write_corpus(root / "in", EMBED_DOCS * 6_000, seed=7)  # ~6 KB (1,500+ tokens) per document
    manifest = normalize.normalize_source("embed", files, str(root / "normalized"), normalize.NormalizeParams(), runner=for_stage(runner, "normalize", "embed"))
    shards = storage.list_shards(str(root / "normalized"))
    docs = int(manifest["rows"])
    params = embed.EmbedParams(encoder=embed.offline_encoder_params(max_tokens=512))
    stage = run_stage(
        runner, "embeddings", "max_tokens=512",
        [ShardTask(embed_task, (s,), str(root / "emb512" / storage.basename(s)), params) for s in shards],
        docs, sum(os.path.getsize(f) for f in files),
    )
    tokens = sum(int(storage.read_json(storage.shard_stats_uri(str(root / "emb512" / storage.basename(s))))["tokens"]) for s in shards)
    print(f"scale-bench embeddings throughput: {docs} docs, {tokens} tokens, {stage.cpu:.1f} CPU s on this machine's CPU "
          f"(float32, MiniLM-L6): {tokens / max(stage.cpu, 1e-9):,.0f} tokens per CPU second", flush=True)
    shutil.rmtree(root, ignore_errors=True)
    return stage


def main() -> int:
    import ray  # noqa: PLC0415

    work = Path(os.environ.get("BENCH_SCALE_DIR") or tempfile.mkdtemp(prefix="marin-scale-"))
    print(f"scale bench: 1x = {BASE_MB} MiB of text, scales {SCALES}, shard target {TARGET_SHARD_BYTES // MIB} MiB, "
          f"local Ray with 2 workers, data under {work}", flush=True)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    # Each stage (and scale) gets worker processes of its own (a Ray runtime env per stage), each
    # recycled after BENCH_WORKER_TASKS tasks: a task's peak (VmHWM reset when it starts) carries
    # at most that many earlier tasks of the same stage, never another stage's leftovers, and
    # process start-up is paid once per BENCH_WORKER_TASKS tasks (1: a fresh worker per task).
    runner = ShardRunner(ray_address=LOCAL, max_in_flight=4, worker_max_tasks=WORKER_TASKS)
    started = time.perf_counter()
    ok = True
    try:
        corpus = shared_corpus(work)
        by_scale = {scale: pipeline(work, scale, runner, corpus) for scale in SCALES}
        low, high = by_scale[SCALES[0]], by_scale[SCALES[-1]]
        for name in low if len(SCALES) > 1 else ():
            ok &= goal(f"{name}: largest task peak {SCALES[-1]}x / {SCALES[0]}x", high[name].peak / max(low[name].peak, 1))
            if name != "sampling_groups":  # one task whose work is per file, not per document
                ok &= goal(f"{name}: CPU s per document {SCALES[-1]}x / {SCALES[0]}x", high[name].cpu_per_kdoc / max(low[name].cpu_per_kdoc, 1e-9))
        if BIG_FILE_MB:
            # Memory must not grow with the file: a file 4x as large peaks within 1.3x. Beside it,
            # the peak against the 1x corpus (files of one read batch each; the large file's
            # scatter reads dozens of batches in a row, and the allocator keeps some of each).
            quarter = big_file(work, runner, corpus, BIG_FILE_MB // 4)
            one = big_file(work, runner, corpus)
            ok &= goal(f"normalize: one file of {one.scale} / one file of {quarter.scale}, largest task peak", one.peak / max(quarter.peak, 1))
            ok &= goal("normalize: one large file, largest task peak / 1x corpus", one.peak / max(low["normalize"].peak, 1))
        ok &= all(POOL_GOALS)
        shutil.rmtree(work / "corpus", ignore_errors=True)
        if EMBED_DOCS:
            embeddings(work, runner)
    finally:
        ray.shutdown()
    try:
        from bench import bench_embed  # noqa: PLC0415

        if LONG_DOCS:
            ok &= bench_embed.bench_long(LONG_DOCS, rounds=LONG_ROUNDS)
    finally:
        if not os.environ.get("BENCH_SCALE_DIR"):
            shutil.rmtree(work, ignore_errors=True)
    print(f"scale bench: {time.perf_counter() - started:.0f} s in all; {'every goal met' if ok else 'some goals MISSED'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
