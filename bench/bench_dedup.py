"""Global exact and fuzzy dedup at 1x, 4x, 16x and 64x a generated corpus, and an incremental
rebuild after one source changed, on the shared harness (``bench/harness.py``).

Run: ``python -m bench.bench_dedup [--scales 1,4,16,64] [--rounds N] [--incremental-only] [--incremental-change appended|edited]
[--local-workers] [--store slow|local] [--latency-ms MS] [--corpus real|lab]``, or ``python -m
bench --only dedup`` (``--quick``: 1x and 4x, incremental at 4x, one round).

The corpus, by default of the production shape (:func:`real_shape_sources`, ~2,450 documents
per 1x): a Zipf vocabulary, boilerplate shared by unrelated documents, heavy-tailed lengths (~200
B to ~650 KB), near-duplicate clusters of power-law sizes whose largest grows with the scale
(160 per 1x), chains of overlapping windows (big components of partly distinct documents), and
32 sources, the first ~14%, ten under 1%. ``--corpus lab`` is the earlier corpus
(:mod:`marin_assets.testing.dedup_corpus`): 16 equal sources; per 1x, 2,575 documents of ~100
words: near-duplicate clusters of 1,200, 300, 3 x 50, 10 x 10, 40 x 3 and 100 x 2 copies, 430
unrelated documents, 3% exact copies; the largest cluster stays at ~1,200 at every scale.

Every run is a fresh child process (one case per scale, interleaved over rounds); inside it
both steps run as tasks on a local Ray cluster of two workers, never recycled, as in production
(``--local-workers``: two local worker processes, ``ShardRunner(processes=2)``), each task
reporting its own CPU time, its process's peak RSS (``VmHWM``, reset when the task starts) and
the requests it made. Inputs, scratch and outputs are on the latency store (``bench/slow_store.py``:
the local disk behind an object store's request model, ``--latency-ms`` per request; ``--store
local``: plain local paths, no requests counted). A worker process's one-time
library loads (pyarrow's pandas shim, Parquet readers, polars kernels, the n-gram kernels: ~0.3-0.6 s per
process, and the local runner starts fresh processes for every step) run before a task's clock
and are printed apart as warm-up CPU; a long-lived worker (Ray) pays them once. The goals (issue 13):

* the largest task's peak RSS grows at most 1.3x from 1x to the largest scale;
* CPU time per document (all tasks) stays within 1.3x from 1x to the largest scale;
* the removals equal a one-process reference of the pairwise rule at 1x and 4x (and, for the
  exact step, a plain dict of ids);
* no exact or fuzzy task reads more input files than the configured bound (16 here: merge tasks
  combine a step's files first);
* the largest task's requests (exact and fuzzy apart) grow at most 1.3x from 1x to the largest
  scale: a task's reads follow its configured size and bound, not the corpus;
* after one source changes (3% more documents, near copies of its own), the incremental
  rebuild costs at most a quarter of a full rebuild's task CPU, with byte-identical removal
  files (full and incremental rebuilds interleaved, each in its own child). The changed source
  keeps the nodes of its unchanged documents, so the previous components only merge over the
  added documents' edges (``cc: incremental``) and only the clusters they touch are read and
  verified; the rest is carried over. The rebuilds run on the same workers and store as the
  scale cases. The goal holds for the default change, ``--incremental-change appended`` (each
  copy its original plus a word: where the original was retained the copy takes its place, and
  a copy of a cluster's head becomes the new head, so every row of that cluster is decided
  again: the worst case); ``edited`` (one word of the original edited, so a copy lands before or
  after its original) is the typical change, measured beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import multiprocessing
import os
import random
import shutil
import statistics
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import harness, slow_store  # noqa: E402
from marin_assets.core.dedup import decisions as dedup  # noqa: E402
from marin_assets.core.dedup import minhash
from marin_assets.core.dedup.exact import find_exact_duplicates
from marin_assets.core.dedup.fuzzy import (
    FuzzyScale,  # noqa: E402
    find_fuzzy_duplicates,
)
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.runner import LOCAL, ShardRunner  # noqa: E402
from marin_assets.testing.dedup_corpus import (  # noqa: E402
    clustered_sources,
    doc_id,
    edit_words,
    write_normalized,
)

SOURCES = 16
SHARD_DOCS = 2_000
CLUSTERS_1X = [1200, 300] + [50] * 3 + [10] * 10 + [3] * 40 + [2] * 100
UNIQUE_1X = 430
# bench-sized tasks; at most 16 input files per task (production: 1,024) and 4 shards per map
# task (a gather task reads 2 files per shard), so the map files of 32 sources are merged before
# the edges step, as ~25,000 are at production counts; the byte budgets ~1/128 of production's,
# so that the bench's larger scales reach them (at production's 1 GiB a merge or verify task of
# the bench holds everything it is given, and its peak grows with the corpus)
MIB = 1 << 20
SCALE = FuzzyScale(
    records_per_task=80_000, edges_per_task=60_000, union_find_max_edges=30_000, members_per_task=4_000, shards_per_map=4, max_inputs_per_task=16,
    merge_bytes=8 * MIB, member_chars_per_task=8 * MIB, cluster_chars_in_memory=4 * MIB, verify_index_bytes=8 * MIB,
)  # fmt: skip
IDS_PER_PARTITION = 4_000
PROCESSES = 2
CHANGED = "source_07"
LATENCY_MS = 2  # per request: waits ~x15 shorter than an object store's (~30 ms) keep 16x within minutes on two cores


def _minhash(args: tuple[str, str]) -> None:
    minhash.minhash_shard([args[0]], args[1], minhash.MinHashParams())


def write_corpus(root: str, texts: dict[str, list[str]]) -> dict[str, dict[str, list[str]]]:
    """Normalized-like shards (~SHARD_DOCS each) and their minhash buckets."""
    layout: dict[str, dict[str, list[str]]] = {"normalized": {}, "buckets": {}}
    jobs = []
    for source, docs in texts.items():
        shards = max(1, -(-len(set(docs)) // SHARD_DOCS))
        layout["normalized"][source] = write_normalized(root, source, docs, shards)
        layout["buckets"][source] = [storage.join(root, "buckets", source, storage.basename(u)) for u in layout["normalized"][source]]
        jobs.extend(zip(layout["normalized"][source], layout["buckets"][source]))
    with ProcessPoolExecutor(PROCESSES) as pool:
        list(pool.map(_minhash, jobs))
    return layout


def on_store(layout: dict[str, dict[str, list[str]]], store: str) -> dict[str, dict[str, list[str]]]:
    """The corpus' URIs as the steps read them: through the latency store (``slow``) or as written."""
    return {kind: {s: [at_store(u, store) for u in uris] for s, uris in by_source.items()} for kind, by_source in layout.items()}


def at_store(path: str, store: str) -> str:
    """A local path as the steps address it: through the latency store (``slow``) or as it is."""
    return slow_store.uri(path) if store == "slow" else path


def workers_text(ray: bool) -> str:
    return "a local Ray cluster of 2 unrecycled workers" if ray else "2 worker processes"


def exact_reference(texts: dict[str, list[str]]) -> dict[str, set[str]]:
    first: dict[str, str] = {}
    removed: dict[str, set[str]] = {s: set() for s in texts}
    for source in sorted(texts):
        for text in texts[source]:
            i = doc_id(text)
            if first.setdefault(i, source) != source:
                removed[source].add(i)
    return removed


def _texts(scale: int, corpus: str = "real") -> dict[str, list[str]]:
    if corpus == "lab":
        return clustered_sources(SOURCES, CLUSTERS_1X, UNIQUE_1X, scale, seed=scale)
    return real_shape_sources(scale, seed=scale)


REAL_SOURCES = 32
BIGGEST_SOURCE_SHARE = 0.14  # the catalog's largest source holds ~14% of the documents; most are tiny


def _source_weights(rng: np.random.Generator) -> np.ndarray:
    """One source ~14%, the others by a power law (many tiny)."""
    rest = 1.0 / np.arange(5, REAL_SOURCES + 4) ** 1.6  # the next ~10%, 8%, ...; ten under 1%
    rest = rest / rest.sum() * (1 - BIGGEST_SOURCE_SHARE)
    return np.r_[BIGGEST_SOURCE_SHARE, rest]


def real_shape_sources(scale: int, seed: int) -> dict[str, list[str]]:
    """The production shape, small: a Zipf vocabulary; boilerplate templates shared by unrelated
    documents; heavy-tailed lengths (~200 B to ~1 MB, Pareto); near-duplicate clusters whose
    sizes follow a power law, the largest 160 x scale (10,240 at 64x); chains of overlapping
    windows of long texts (A~B, B~C, A not ~ C: big components of partly distinct documents);
    32 sources, the first ~14% of the documents, most tiny; 3% exact copies across sources."""
    rng = np.random.default_rng(seed)
    vocab = np.array([f"w{k}" for k in range(200_000)])

    def words(n: int) -> list[str]:
        return vocab[np.minimum(rng.zipf(1.2, int(n)), vocab.size) - 1].tolist()

    boilerplate = [words(rng.integers(20, 80)) for _ in range(12)]
    docs: list[str] = []
    for _ in range(1200 * scale):  # unrelated documents, a third with boilerplate
        body = words(min(200_000, 35 * (rng.pareto(1.3) + 1)))
        if rng.random() < 0.33:
            body = boilerplate[rng.integers(len(boilerplate))] + body + boilerplate[rng.integers(len(boilerplate))]
        docs.append(" ".join(body))
    sizes = np.minimum(rng.zipf(2.0, 200 * scale), 160 * scale).tolist() + [160 * scale]
    edit_rng = random.Random(seed)
    small_vocab = vocab[:20_000].tolist()
    for size in sizes:  # near-duplicate clusters
        base = words(min(20_000, 80 * (rng.pareto(1.5) + 1)))
        docs.extend(edit_words(base, edit_rng.randint(1, 3), edit_rng, small_vocab) for _ in range(size))
    for _ in range(scale):  # the long tail: a ~1 MB document per 1x
        docs.append(" ".join(words(150_000)))
    for _ in range(4 * scale):  # chained components: windows of one long text, each 8% past the one before
        text = words(3000)
        docs.extend(" ".join(text[s : s + 600]) for s in range(0, 2400, 48))
    weights = _source_weights(rng)
    owner = rng.choice(REAL_SOURCES, size=len(docs), p=weights)
    texts: dict[str, list[str]] = {f"source_{s:02d}": [] for s in range(REAL_SOURCES)}
    names = list(texts)
    for doc, s in zip(docs, owner.tolist()):
        texts[names[s]].append(doc)
    for name in names:
        for text in list(texts[name]):
            if rng.random() < 0.03:
                texts[names[rng.choice(REAL_SOURCES, p=weights)]].append(text)
    return texts


# --------------------------------------------------------------------------- in the children


RAY_WORKER_TASKS = 0  # Ray: workers are never recycled (as in production); a task's peak is its own (VmHWM reset when it starts)


@contextlib.contextmanager
def workers(ray: bool) -> Iterator[None]:
    """A local Ray cluster of ``PROCESSES`` workers for the run (nothing without ``ray``)."""
    if not ray:
        yield
        return
    import ray as ray_lib  # noqa: PLC0415

    ray_lib.init(num_cpus=PROCESSES, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray_lib.shutdown()


def make_runner(ray: bool) -> slow_store.RequestCountingRunner:
    """Tasks on the cluster of :func:`workers`, its workers never recycled, or two local worker
    processes; either way each task's store requests are counted in its worker."""
    if ray:
        return slow_store.RequestCountingRunner(ray_address=LOCAL, max_in_flight=2 * PROCESSES, worker_max_tasks=RAY_WORKER_TASKS)
    return slow_store.RequestCountingRunner(processes=PROCESSES)


def largest_requests(runner: slow_store.RequestCountingRunner) -> dict[str, list[int]]:
    """Per task function, the most requests one of its tasks made and the most input files one read."""
    return {name: [max(counts), runner.widest[name]] for name, counts in runner.per_task.items()}


def scale_run(root: str, scale: int, check: bool, ray: bool = True, corpus: str = "real", store: str = "slow") -> dict:
    """One scale: corpus, then exact and fuzzy dedup (the measured part), on a local Ray cluster
    of two workers started for this run (or two local worker processes), through the store."""
    multiprocessing.set_start_method("spawn", force=True)  # no fork of a parent with arrow/polars threads
    texts = _texts(scale, corpus)
    layout = on_store(write_corpus(storage.join(root, "corpus"), texts), store)
    base = at_store(root, store)
    runners = {"exact": make_runner(ray), "fuzzy": make_runner(ray)}
    before = slow_store.SlowStore.total()
    with workers(ray), harness.timed():
        exact = find_exact_duplicates(layout["normalized"], storage.join(base, "exact"), ids_per_partition=IDS_PER_PARTITION, runner=runners["exact"], lengths=layout["buckets"], max_inputs=SCALE.max_inputs_per_task, shards_per_map=SCALE.shards_per_map)
        fuzzy = find_fuzzy_duplicates(layout["buckets"], layout["normalized"], set(), storage.join(base, "fuzzy"), scale=SCALE, runner=runners["fuzzy"])
    driver_requests = slow_store.SlowStore.total() - before
    result = {
        "items": fuzzy["docs"],
        "exact_cpu_s": exact["task_cpu_s"],
        "fuzzy_cpu_s": fuzzy["task_cpu_s"],
        "warmup_cpu_s": exact["warmup_cpu_s"] + fuzzy["warmup_cpu_s"],
        "exact_task_kib": exact["max_task_rss_kb"],
        "fuzzy_task_kib": fuzzy["max_task_rss_kb"],
        "exact_scratch": exact["scratch_bytes"],
        "fuzzy_scratch": fuzzy["scratch_bytes"],
        "tasks": exact["tasks"] + fuzzy["tasks"],
        "removed": [exact["removed"], fuzzy["removed"]],
        "largest_cluster": fuzzy["largest_cluster"],
        "cc": fuzzy["cc_method"],
        "records": fuzzy["bucket_records"],
        "edges": fuzzy["candidate_edges"],
        "steps": fuzzy["steps"],
        "inputs": [fuzzy["max_task_inputs"], fuzzy["max_inputs_per_task"]],
        "exact_inputs": max(runners["exact"].widest.values()),
        "requests": {step: largest_requests(r) for step, r in runners.items()},
        "task_requests": {step: sum(sum(counts) for counts in r.per_task.values()) for step, r in runners.items()},
        "own_peak_kib": {step: max(r.own_peak_kb.values(), default=0) for step, r in runners.items()},
        "start_rss_kib": {step: max(r.start_kb.values(), default=0) for step, r in runners.items()},
        "driver_requests": driver_requests,
    }
    if check:
        from marin_assets_tests.core.dedup.reference import reference_fuzzy_removals  # noqa: PLC0415

        ref = reference_fuzzy_removals(layout["buckets"], layout["normalized"], set())
        out = storage.join(base, "fuzzy")
        got = {s: {(r["id"], r["representative_source"], r["representative_id"]) for r in storage.read_parquet(dedup.removed_uri(out, s)).to_pylist()} for s in texts}
        exact_got = {s: {r["id"] for r in storage.read_parquet(dedup.removed_uri(storage.join(base, "exact"), s)).to_pylist()} for s in texts}
        result["equal"] = got == ref and exact_got == exact_reference(texts)
    shutil.rmtree(root, ignore_errors=True)
    return result


def rebuild(root: str, layout: dict, mode: str, ray: bool = True, store: str = "slow") -> dict:
    """A full rebuild, or an incremental one against the first run (its cache copied first, so
    every round starts from the same state)."""
    multiprocessing.set_start_method("spawn", force=True)
    work = tempfile.mkdtemp(prefix=f"rebuild-{mode}-", dir=root)
    kwargs = {}
    if mode == "incremental":
        shutil.copytree(storage.join(root, "cache"), storage.join(work, "cache"))
        kwargs = {"cache_uri": at_store(storage.join(work, "cache"), store), "previous_uri": at_store(storage.join(root, "first"), store)}
    out = at_store(storage.join(work, "out"), store)
    runner = make_runner(ray)
    with workers(ray), harness.timed():
        stats = find_fuzzy_duplicates(layout["buckets"], layout["normalized"], set(), out, scale=SCALE, runner=runner, **kwargs)
    files = {s: hashlib.sha256(storage.read_bytes(dedup.removed_uri(out, s))).hexdigest() for s in layout["buckets"]}
    shutil.rmtree(work, ignore_errors=True)
    return {
        "items": stats["docs"],
        "task_cpu_s": stats["task_cpu_s"],
        "task_kib": stats["max_task_rss_kb"],
        "files": files,
        "warmup_cpu_s": stats["warmup_cpu_s"],
        "cc": stats["cc_method"],
        "reused": stats["reused_clusters"],
        "verified": stats["verified_clusters"],
        "republished": stats["sources_republished"],
        "steps": stats["steps"],
        "requests": sum(sum(counts) for counts in runner.per_task.values()),
    }


# --------------------------------------------------------------------------- in the parent


def scales_bench(scales: list[int], rounds: int, ray: bool = True, corpus: str = "real", store: str = "slow") -> None:
    roots = []
    cases = []
    for scale in scales:
        root = tempfile.mkdtemp(prefix=f"bench-dedup-{scale}x-")
        roots.append(root)
        kwargs = {"root": root, "scale": scale, "check": scale <= 4, "ray": ray, "corpus": corpus, "store": store}
        cases.append(harness.Case(f"{scale}x", "bench.bench_dedup:scale_run", kwargs, timeout_s=3600))
    try:
        result = harness.compare(
            f"Global exact + fuzzy dedup, {', '.join(f'{s}x' for s in scales)} ({corpus} corpus; {workers_text(ray)}; {store} store, "
            f"{slow_store.SlowStore.latency_s * 1000:g} ms per request; time = both steps; load {os.getloadavg()[0]:.1f})",
            cases,
            rounds=rounds,
            unit="docs",
        )
    finally:
        for root in roots:
            shutil.rmtree(root, ignore_errors=True)
    for case in cases:
        m = result[case.label]
        run = m.runs[0]
        docs = run["items"]
        print(
            f"  {case.label:>4}: {docs} docs, {run['tasks']} tasks, fuzzy {1e6 * statistics.median(m.values('fuzzy_cpu_s')) / docs:.0f} us CPU/doc "
            f"(cc: {run['cc']}, {run['records']} records, {run['edges']} edges, largest cluster {run['largest_cluster']}), largest task "
            f"{max(m.values('fuzzy_task_kib')) / 1024:.0f} MiB, scratch {run['fuzzy_scratch'] / docs:.0f} B/doc; exact {1e6 * statistics.median(m.values('exact_cpu_s')) / docs:.0f} us CPU/doc, "
            f"largest task {max(m.values('exact_task_kib')) / 1024:.0f} MiB, scratch {run['exact_scratch'] / docs:.0f} B/doc; removed exact {run['removed'][0]}, fuzzy {run['removed'][1]}; "
            f"worker warm-up {statistics.median(m.values('warmup_cpu_s')):.1f} s (not in task CPU)"
        )
        if "own_peak_kib" in run:
            own, start = ({k: max(r[key][k] for r in m.runs) / 1024 for k in ("fuzzy", "exact")} for key in ("own_peak_kib", "start_rss_kib"))
            print(
                f"        a task's peak above its worker's size at its start, at most: fuzzy {own['fuzzy']:.0f} MiB, exact {own['exact']:.0f} MiB; "
                f"the largest worker size at a task's start: fuzzy {start['fuzzy']:.0f} MiB, exact {start['exact']:.0f} MiB"
            )
    steps_table(result, cases)
    lo, hi = cases[0].label, cases[-1].label
    if lo != hi:
        for step in ("fuzzy", "exact"):
            harness.growth_goal(lo, hi, 1.3, f"{step} dedup: largest task's peak RSS {hi} <= 1.3x {lo}", key=f"{step}_task_kib").check(result)
            harness.cost_growth_goal(lo, hi, 1.3, f"{step} dedup: task CPU per document {hi} <= 1.3x {lo}", key=f"{step}_cpu_s").check(result)
    if store == "slow":
        requests_goals(result, cases)
    for case in cases:
        widest, bound = result[case.label].runs[0]["inputs"]
        harness.absolute_goal(f"fuzzy dedup at {case.label}: input files per task <= the configured bound", f"{widest} <= {bound}", widest <= bound)
        exact_widest = max(run["exact_inputs"] for run in result[case.label].runs)
        harness.absolute_goal(f"exact dedup at {case.label}: input files per task <= the configured bound", f"{exact_widest} <= {bound}", exact_widest <= bound)
    for case in cases:
        if "equal" in result[case.label].runs[0]:
            equal = all(run["equal"] for run in result[case.label].runs)
            harness.absolute_goal(f"removals at {case.label} equal the one-process pairwise reference", str(equal), equal)


def steps_table(result: harness.Result, cases: list[harness.Case]) -> None:
    """Per fuzzy step: its CPU per document at the largest scale, its largest task's peak at each."""
    labels = [c.label for c in cases]
    big = result[labels[-1]].runs[0]
    print(f"  per fuzzy step: task CPU at {labels[-1]} (us per document); largest task's peak RSS, MiB ({' / '.join(labels)}):")
    for step, cost in big["steps"].items():
        peaks = [max((r["steps"].get(step, {}).get("max_rss_kb", 0) for r in result[c].runs), default=0) / 1024 for c in labels]
        print(f"    {step:10s} {1e6 * cost['cpu_s'] / big['items']:5.0f}  " + " / ".join(f"{p:.0f}" if p else "-" for p in peaks))


def requests_goals(result: harness.Result, cases: list[harness.Case]) -> None:
    """The largest task's store requests per task function at each scale, the driver's, and per
    step the goal: the largest task's requests at the largest scale <= 1.3x those at the smallest."""
    largest: dict[str, dict[str, dict[str, int]]] = {c.label: {"exact": {}, "fuzzy": {}} for c in cases}
    inputs: dict[str, int] = {}
    for case in cases:
        for run in result[case.label].runs:
            for step, by_fn in run["requests"].items():
                for fn, (n, widest) in by_fn.items():
                    largest[case.label][step][fn] = max(n, largest[case.label][step].get(fn, 0))
                    inputs[fn] = max(widest, inputs.get(fn, 0))
    labels = [c.label for c in cases]
    print(f"  store requests of the largest task ({' / '.join(labels)}; the most inputs a task's spec named, any scale: a manifest counts one):")
    for step in ("exact", "fuzzy"):
        for fn in sorted({fn for c in labels for fn in largest[c][step]}):
            print(f"    {step} {fn:24s} " + " / ".join(f"{largest[c][step].get(fn, '-')}" for c in labels) + f"  ({inputs[fn]} named)")
    for step in ("exact", "fuzzy"):
        print(f"    {step} all tasks, per document  " + " / ".join(f"{result[c].runs[0]['task_requests'][step] / result[c].runs[0]['items']:.3f}" for c in labels))
    print("    driver (both steps)         " + " / ".join(f"{result[c].runs[0]['driver_requests']:,}" for c in labels))
    lo, hi = labels[0], labels[-1]
    if lo == hi:
        return
    for step in ("exact", "fuzzy"):
        a, b = max(largest[lo][step].values()), max(largest[hi][step].values())
        harness.absolute_goal(f"{step} dedup: largest task's store requests {hi} <= 1.3x {lo}", f"{b} / {a} = {b / a:.2f}x", b <= 1.3 * a)


def added_copies(texts: list[str], change: str, rng: random.Random) -> list[str]:
    """Near copies of 3% of ``texts``. ``appended``: each its original plus a word, so it comes
    just before its original in processing order (longest first) and, where the original was
    retained, is retained in its place and becomes its cluster's new head (the worst case: every
    later decision of the cluster is read again). ``edited``: one random word of the original
    replaced, deleted or duplicated, so a copy lands just before or after its original as any
    member's edit would."""
    picked = rng.sample(texts, len(texts) * 3 // 100)
    if change == "appended":
        return [t + " " + rng.choice(["appendix", "note", "footer"]) for t in picked]
    return [edit_words(t.split(" "), 1, rng, t.split(" ")) for t in picked]


def incremental_bench(scale: int, rounds: int, corpus: str = "real", ray: bool = True, store: str = "slow", change: str = "appended") -> None:
    """First run, then one source changes; full and incremental rebuilds interleaved."""
    multiprocessing.set_start_method("spawn", force=True)
    root = tempfile.mkdtemp(prefix="bench-dedup-inc-")
    try:
        texts = _texts(scale, corpus)
        layout = on_store(write_corpus(storage.join(root, "v1"), texts), store)
        previous, cache = at_store(storage.join(root, "first"), store), at_store(storage.join(root, "cache"), store)
        find_fuzzy_duplicates(layout["buckets"], layout["normalized"], set(), previous, scale=SCALE, runner=ShardRunner(processes=PROCESSES), cache_uri=cache)
        rng = random.Random(99)
        extra = added_copies(texts[CHANGED], change, rng)
        changed = on_store(write_corpus(storage.join(root, "v2"), {CHANGED: texts[CHANGED] + extra}), store)
        layout2 = {k: dict(layout[k]) | {CHANGED: changed[k][CHANGED]} for k in ("buckets", "normalized")}
        common = {"root": root, "layout": layout2, "ray": ray, "store": store}
        cases = [
            harness.Case("full rebuild", "bench.bench_dedup:rebuild", common | {"mode": "full"}, timeout_s=3600),
            harness.Case("incremental", "bench.bench_dedup:rebuild", common | {"mode": "incremental"}, timeout_s=3600),
        ]
        result = harness.compare(
            f"Fuzzy dedup rebuild after {CHANGED} (1 of {len(texts)} sources) grew by 3% near copies ({change}), {scale}x, {corpus} corpus; {workers_text(ray)}, {store} store "
            f"({len(extra)} new docs; load {os.getloadavg()[0]:.1f})",
            cases,
            rounds=rounds,
            unit="docs",
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    full, inc = result["full rebuild"].runs, result["incremental"].runs
    ratios = [i["task_cpu_s"] / f["task_cpu_s"] for f, i in zip(full, inc)]
    same = all(f["files"] == i["files"] for f, i in zip(full, inc))
    first = inc[0]
    print(
        f"  incremental: cc {first['cc']}, clusters reused {first['reused']}, verified {first['verified']}, sources republished {first['republished']}, "
        f"task requests {first['requests']:,} (full rebuild {full[0]['requests']:,}); "
        f"worker warm-up (not in task CPU) {statistics.median(i['warmup_cpu_s'] for i in inc):.1f} s incremental, {statistics.median(f['warmup_cpu_s'] for f in full):.1f} s full"
    )
    for step, c in first["steps"].items():
        print(f"    {step:10s} {c['cpu_s']:6.2f} s task CPU (full rebuild: {full[0]['steps'].get(step, {}).get('cpu_s', 0):6.2f} s)")
    mid = statistics.median(ratios)
    harness.absolute_goal(
        f"incremental rebuild (1 of {len(layout2['buckets'])} sources changed) <= 0.25 of a full rebuild's task CPU",
        f"{mid:.2f} [{min(ratios):.2f}..{max(ratios):.2f}] ({statistics.median(i['task_cpu_s'] for i in inc):.1f} s vs {statistics.median(f['task_cpu_s'] for f in full):.1f} s)",
        mid <= 0.25,
    )
    harness.absolute_goal("incremental rebuild's removal files are byte-identical to the full rebuild's", str(same), same)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scales", default=harness.pick("1,4,16,64", "1,4"))
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds of the scale cases (each 64x run takes minutes)")
    parser.add_argument("--incremental-scale", type=int, default=harness.pick(16, 4))
    parser.add_argument("--incremental-rounds", type=int, default=harness.pick(3, 1))
    parser.add_argument("--no-incremental", action="store_true")
    parser.add_argument("--incremental-change", choices=("appended", "edited"), default="appended", help="the added copies: a word appended (each before its original: the worst case) or one word edited")
    parser.add_argument("--incremental-only", action="store_true")
    parser.add_argument("--local-workers", action="store_true", help="two local worker processes instead of a local Ray cluster of 2 workers (started per run)")
    parser.add_argument("--store", choices=("slow", "local"), default="slow", help="slow: inputs and outputs through the latency store (requests counted); local: plain paths")
    parser.add_argument("--latency-ms", type=float, default=float(os.environ.get("REHEARSE_LATENCY_MS", LATENCY_MS)), help="the latency store's wait per request")
    parser.add_argument("--corpus", choices=("real", "lab"), default="real", help="real: the production shape (real_shape_sources); lab: the earlier uniform corpus")
    args = parser.parse_args(argv)
    os.environ["REHEARSE_LATENCY_MS"] = str(args.latency_ms)  # read by the store in every child and worker
    slow_store.SlowStore.latency_s = args.latency_ms / 1000
    ray = not args.local_workers
    if not args.incremental_only:
        scales_bench([int(x) for x in args.scales.split(",")], args.rounds, ray, args.corpus, args.store)
    if not args.no_incremental:
        incremental_bench(args.incremental_scale, args.incremental_rounds, args.corpus, ray, args.store, args.incremental_change)
    return 0


if __name__ == "__main__":
    sys.exit(harness.exit_status(main()))
