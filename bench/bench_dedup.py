"""Global exact and fuzzy dedup at 1x, 4x, 16x and 64x a generated corpus, and an incremental
rebuild after one of 16 sources changed.

Run: ``python bench/bench_dedup.py [--scales 1,4,16,64]`` (about ten minutes on two cores at
all four scales). The corpus: 16 sources; per 1x, 2,500 documents of ~100 words: near-duplicate
clusters of 1,200, 300, 3 x 50, 10 x 10, 40 x 3 and 100 x 2 copies (1 to 3 random word edits
each, spread over the sources), 430 unrelated documents, and 3% exact copies in a second
source. Each scale repeats that pattern with new texts, so the largest cluster stays at 1,200
and the per-task sizes below (fixed) decide each task's memory.

Both steps run as tasks in local worker processes (``ShardRunner(processes=2)``); each task
reports its own CPU time and its process's peak RSS (``VmHWM``). The goals (issue 13):

* the largest task's peak RSS grows at most 1.3x from 1x to 64x;
* CPU time per document (all tasks) stays within 1.3x from 1x to 64x;
* the removals equal a one-process reference of the pairwise rule on 1x and 4x (and, for the
  exact step, a plain dict of ids);
* after one source of 16 changes (3% more documents), the incremental rebuild costs at most a
  quarter of a full rebuild's CPU, with byte-identical removal files.

Runs are interleaved (1x, 4x, 16x, 64x, then 1x and 4x again); for scales run twice the median
and range are shown.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow as pa  # noqa: E402
import xxhash  # noqa: E402

from marin_assets.core import dedup, minhash, storage  # noqa: E402
from marin_assets.core.dedup_fuzzy import FuzzyScale  # noqa: E402
from marin_assets.core.runner import ShardRunner  # noqa: E402
from marin_assets_tests.dedup_reference import reference_fuzzy_removals  # noqa: E402

SOURCES = 16
SHARD_DOCS = 2_000
WORDS = 100
CLUSTERS_1X = [1200, 300] + [50] * 3 + [10] * 10 + [3] * 40 + [2] * 100
UNIQUE_1X = 430
EXACT_SHARE = 0.03
SCALE = FuzzyScale(records_per_partition=80_000, edges_per_task=60_000, union_find_max_edges=30_000, members_per_partition=4_000)
IDS_PER_PARTITION = 4_000
PROCESSES = 2


def generate(scale: int, seed: int = 0) -> dict[str, list[str]]:
    """Texts per source for ``scale`` x the 1x pattern."""
    rng = random.Random(seed)
    vocab = [f"w{rng.randrange(10**7)}" for _ in range(50_000)]
    texts: dict[str, list[str]] = {f"source_{s:02d}": [] for s in range(SOURCES)}
    names = list(texts)
    for _ in range(scale):
        for size in CLUSTERS_1X:
            base = [rng.choice(vocab) for _ in range(WORDS)]
            for _ in range(size):
                words = list(base)
                for _ in range(rng.randint(1, 3)):
                    pos = rng.randrange(len(words))
                    op = rng.random()
                    if op < 0.4:
                        words[pos] = rng.choice(vocab)
                    elif op < 0.7:
                        del words[pos]
                    else:
                        words.insert(pos, rng.choice(vocab))
                texts[rng.choice(names)].append(" ".join(words))
        for _ in range(UNIQUE_1X):
            texts[rng.choice(names)].append(" ".join(rng.choice(vocab) for _ in range(WORDS)))
    for name in names:  # exact copies in another source
        for text in list(texts[name]):
            if rng.random() < EXACT_SHARE:
                texts[rng.choice([n for n in names if n != name])].append(text)
    return texts


def _minhash(args: tuple[str, str]) -> None:
    minhash.minhash_shard([args[0]], args[1], minhash.MinHashParams())


def write_corpus(root: str, texts: dict[str, list[str]]) -> dict[str, dict[str, list[str]]]:
    """Normalized-like shards (sorted by id, ~SHARD_DOCS each) and their minhash buckets."""
    layout: dict[str, dict[str, list[str]]] = {"normalized": {}, "buckets": {}}
    jobs = []
    for source, docs in texts.items():
        rows = sorted({xxhash.xxh3_128_hexdigest(t.encode()): t for t in docs}.items())
        shards = max(1, -(-len(rows) // SHARD_DOCS))
        layout["normalized"][source], layout["buckets"][source] = [], []
        for k in range(shards):
            part = [r for r in rows if int(r[0], 16) % shards == k]
            norm = storage.join(root, "normalized", source, storage.shard_name(k, shards))
            storage.write_parquet(pa.table({"id": [r[0] for r in part], "text": [r[1] for r in part]}), norm)
            out = storage.join(root, "buckets", source, storage.shard_name(k, shards))
            layout["normalized"][source].append(norm)
            layout["buckets"][source].append(out)
            jobs.append((norm, out))
    with ProcessPoolExecutor(PROCESSES) as pool:
        list(pool.map(_minhash, jobs))
    return layout


def removed_sets(out: str, sources) -> dict[str, set]:
    return {s: {(r["id"], r["representative_source"], r["representative_id"]) for r in storage.read_parquet(dedup.removed_uri(out, s)).to_pylist()} for s in sources}


def exact_reference(texts: dict[str, list[str]]) -> dict[str, set[str]]:
    first: dict[str, str] = {}
    removed: dict[str, set[str]] = {s: set() for s in texts}
    for source in sorted(texts):
        for text in texts[source]:
            i = xxhash.xxh3_128_hexdigest(text.encode())
            if first.setdefault(i, source) != source:
                removed[source].add(i)
    return removed


def dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def run_scale(root: str, scale: int, check: bool) -> dict:
    texts = generate(scale, seed=scale)
    layout = write_corpus(storage.join(root, "corpus"), texts)
    runner = ShardRunner(processes=PROCESSES)
    start = time.perf_counter()
    exact = dedup.find_exact_duplicates(layout["normalized"], storage.join(root, "exact"), ids_per_partition=IDS_PER_PARTITION, runner=runner, lengths=layout["buckets"])
    exact_wall = time.perf_counter() - start
    start = time.perf_counter()
    fuzzy = dedup.find_fuzzy_duplicates(layout["buckets"], layout["normalized"], set(), storage.join(root, "fuzzy"), scale=SCALE, runner=runner)
    fuzzy_wall = time.perf_counter() - start
    result = {
        "scale": scale,
        "docs": fuzzy["docs"],
        "exact": {"cpu_s": exact["task_cpu_s"], "rss_kb": exact["max_task_rss_kb"], "wall_s": exact_wall, "tasks": exact["tasks"], "scratch": dir_bytes(os.path.join(root, "exact", "_work")), "removed": exact["removed"]},
        "fuzzy": {"cpu_s": fuzzy["task_cpu_s"], "rss_kb": fuzzy["max_task_rss_kb"], "wall_s": fuzzy_wall, "tasks": fuzzy["tasks"], "scratch": dir_bytes(os.path.join(root, "fuzzy", "_work")), "removed": fuzzy["removed"], "steps": fuzzy["steps"], "records": fuzzy["bucket_records"], "edges": fuzzy["candidate_edges"], "members": fuzzy["docs_in_clusters"], "largest": fuzzy["largest_cluster"], "cc": fuzzy["cc_method"]},
    }
    if check:
        ref = reference_fuzzy_removals(layout["buckets"], layout["normalized"], set())
        result["fuzzy_equal"] = removed_sets(storage.join(root, "fuzzy"), layout["buckets"]) == ref
        got = {s: {r["id"] for r in storage.read_parquet(dedup.removed_uri(storage.join(root, "exact"), s)).to_pylist()} for s in texts}
        result["exact_equal"] = got == exact_reference(texts)
    return result


def incremental(root: str, scale: int = 16) -> dict:
    """Full run, one source changes, then a full rebuild and an incremental one."""
    texts = generate(scale, seed=scale)
    layout = write_corpus(storage.join(root, "v1"), texts)
    runner = ShardRunner(processes=PROCESSES)
    cache = storage.join(root, "cache")
    first = storage.join(root, "first")
    dedup.find_fuzzy_duplicates(layout["buckets"], layout["normalized"], set(), first, scale=SCALE, runner=runner, cache_uri=cache)
    changed = "source_07"
    rng = random.Random(99)
    extra = [t + " " + rng.choice(["appendix", "note", "footer"]) for t in rng.sample(texts[changed], len(texts[changed]) * 3 // 100)]
    layout2 = write_corpus(storage.join(root, "v2"), {changed: texts[changed] + extra})
    buckets = dict(layout["buckets"]) | {changed: layout2["buckets"][changed]}
    normalized = dict(layout["normalized"]) | {changed: layout2["normalized"][changed]}
    full = dedup.find_fuzzy_duplicates(buckets, normalized, set(), storage.join(root, "full"), scale=SCALE, runner=runner)
    inc = dedup.find_fuzzy_duplicates(buckets, normalized, set(), storage.join(root, "inc"), scale=SCALE, runner=runner, cache_uri=cache, previous_uri=first)
    same = all(storage.read_bytes(dedup.removed_uri(storage.join(root, "full"), s)) == storage.read_bytes(dedup.removed_uri(storage.join(root, "inc"), s)) for s in buckets)
    moved = sorted(s for s in buckets if full["removed_ids_digest"][s] != inc["removed_ids_digest"][s])
    return {"full_cpu": full["task_cpu_s"], "inc_cpu": inc["task_cpu_s"], "same": same and not moved, "reused": inc["reused_clusters"], "verified": inc["verified_clusters"], "changed": inc["changed_sources"], "docs": full["docs"], "inc_steps": inc["steps"], "full_steps": full["steps"]}


def verdict(ok: bool) -> str:
    return "meets" if ok else "MISSES"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scales", default="1,4,16,64")
    parser.add_argument("--no-incremental", action="store_true")
    parser.add_argument("--incremental-only", action="store_true")
    args = parser.parse_args(argv)
    # Workers are spawned, not forked: the parent has polars/arrow thread pools a fork can deadlock on.
    multiprocessing.set_start_method("spawn", force=True)
    scales = [int(x) for x in args.scales.split(",")]
    order = [] if args.incremental_only else scales + [s for s in scales[:2]]
    runs: dict[int, list[dict]] = {}
    started = time.perf_counter()
    for scale in order:
        root = tempfile.mkdtemp(prefix=f"bench-dedup-{scale}x-")
        try:
            r = run_scale(root, scale, check=scale <= 4 and scale not in runs)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        runs.setdefault(scale, []).append(r)
        f, e = r["fuzzy"], r["exact"]
        extra = "" if "fuzzy_equal" not in r else f"; equal to the pairwise reference: fuzzy {r['fuzzy_equal']}, exact {r['exact_equal']}"
        print(
            f"{scale:3d}x {r['docs']:7d} docs | exact: {e['tasks']:4d} tasks, {1e6 * e['cpu_s'] / r['docs']:6.1f} us CPU/doc, max task RSS {e['rss_kb'] / 1024:6.1f} MiB, "
            f"{e['removed']} removed | fuzzy: {f['tasks']:5d} tasks ({f['cc']}), {1e6 * f['cpu_s'] / r['docs']:7.1f} us CPU/doc, max task RSS {f['rss_kb'] / 1024:6.1f} MiB, "
            f"largest cluster {f['largest']}, {f['removed']} removed, scratch {f['scratch'] / r['docs']:.0f} B/doc, wall {f['wall_s']:.1f} s{extra}",
            flush=True,
        )
    ok = True
    lo, hi = min(scales), max(scales)
    if args.incremental_only:
        scales, runs = [], {}

    def med(scale: int, step: str, key: str) -> tuple[float, str]:
        values = [(r[step][key] / r["docs"]) if key == "cpu_s" else r[step][key] for r in runs[scale]]
        spread = f" (range {min(values):.3g}-{max(values):.3g})" if len(values) > 1 else ""
        return statistics.median(values), spread

    for step in ("exact", "fuzzy") if runs else ():
        rss_lo, rss_lo_s = med(lo, step, "rss_kb")
        rss_hi, _ = med(hi, step, "rss_kb")
        cpu_lo, cpu_lo_s = med(lo, step, "cpu_s")
        cpu_hi, _ = med(hi, step, "cpu_s")
        rss_ratio, cpu_ratio = rss_hi / rss_lo, cpu_hi / cpu_lo
        ok &= rss_ratio <= 1.3 and cpu_ratio <= 1.3
        print(f"{step}: largest task peak RSS {hi}x/{lo}x = {rss_ratio:.2f} (goal <= 1.3: {verdict(rss_ratio <= 1.3)}){rss_lo_s}; CPU per doc {hi}x/{lo}x = {cpu_ratio:.2f} (goal <= 1.3: {verdict(cpu_ratio <= 1.3)}){cpu_lo_s}")
    for scale in (1, 4):
        if scale in runs:
            equal = runs[scale][0]["fuzzy_equal"] and runs[scale][0]["exact_equal"]
            ok &= equal
            print(f"removals at {scale}x equal the pairwise reference (goal: yes): {verdict(equal)}")
    big = runs[hi][0] if runs else None
    if big:
        print(f"per-step costs at {hi}x ({big['docs']} docs, {big['fuzzy']['records']} bucket records, {big['fuzzy']['edges']} edges, {big['fuzzy']['members']} docs in clusters):")
        for step, c in big["fuzzy"]["steps"].items():
            print(f"  fuzzy {step:10s} {int(c['tasks']):5d} tasks, {1e6 * c['cpu_s'] / big['docs']:7.1f} us CPU/doc, max RSS {c['max_rss_kb'] / 1024:6.1f} MiB")
        print(f"  exact all        {big['exact']['tasks']:5d} tasks, {1e6 * big['exact']['cpu_s'] / big['docs']:7.1f} us CPU/doc, scratch {big['exact']['scratch'] / big['docs']:.0f} B/doc")
    if not args.no_incremental:
        root = tempfile.mkdtemp(prefix="bench-dedup-inc-")
        try:
            inc = incremental(root, 16)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        ratio = inc["inc_cpu"] / inc["full_cpu"]
        good = ratio <= 0.25 and inc["same"]
        ok &= good
        print(
            f"incremental (16x, {inc['docs']} docs, {inc['changed']} changed by 3%): {inc['inc_cpu']:.1f} s CPU vs full rebuild {inc['full_cpu']:.1f} s = {ratio:.2f} "
            f"(goal <= 0.25: {verdict(ratio <= 0.25)}); removals identical: {inc['same']}; clusters reused {inc['reused']}, verified {inc['verified']}"
        )
        for step, c in inc["inc_steps"].items():
            print(f"  incremental {step:10s} {c['cpu_s']:6.2f} s CPU (full: {inc['full_steps'].get(step, {}).get('cpu_s', 0):6.2f} s)")
    print(f"(bench took {time.perf_counter() - started:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
