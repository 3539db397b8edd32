"""MinHash signatures against datasketch and rensa as their users run them, where the time of
our kernel goes, and the peak memory of the global fuzzy step at two corpus sizes.

Every case runs in its own child process (``bench.harness``), interleaved over rounds, on the
same generated documents (stdlib docstrings joined into documents of a few hundred words), one
core each, reading the texts from Parquet before the timed part:

* ``marin-assets``: ``minhash.signatures`` in batches of ``BATCH_DOCS`` Arrow rows (the fused
  kernel: clean, shingle, hash, permute), also on the same documents with every "e" accented
  (UTF-8 decoding and Unicode lowercasing);
* its stages one at a time (clean+shingle: ``clean_batch`` + ``ngram_spans``; hash:
  ``xxh3_64_spans``; permute: ``signatures_from_hashes``), each child running the stages before
  it untimed, so the shares say where the fused kernel's time goes;
* datasketch ``update_batch``: a ``MinHash`` per document fed its word 5-gram shingles (built
  in Python with the project's reference ``clean_text``/``shingles``), the same hash function
  and permutations (checked bit-equal to ours before timing);
* datasketch ``MinHash.bulk``: the same through its bulk constructor;
* rensa ``RMinHash.digest_matrix_from_token_sets``: its bulk API fed ``text.split()`` per
  document as its documentation shows (its own tokens and hash family, so values differ), 286
  permutations, one Rayon thread.

Goal: our signatures are faster than datasketch ``update_batch`` (what a user of the library
would write), and not slower than rensa's bulk path.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import random
import statistics
import sys
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from bench import harness
from marin_assets.core.dedup import minhash
from marin_assets.core.dedup.fuzzy import find_fuzzy_duplicates
from marin_assets.core.runtime import storage

MODULES = (
    "argparse", "asyncio", "calendar", "collections", "csv", "datetime", "decimal", "email",
    "fractions", "functools", "http.client", "inspect", "itertools", "json", "logging", "os",
    "pathlib", "random", "re", "shutil", "socket", "sqlite3", "statistics", "string",
    "subprocess", "tarfile", "textwrap", "typing", "unittest", "zipfile",
)  # fmt: skip
PARAMS = minhash.MinHashParams()


def documents(count: int, per_doc: int = 5, seed: int = 0) -> list[str]:
    docstrings: dict[str, None] = {}
    for name in MODULES:
        for _, member in inspect.getmembers(importlib.import_module(name)):
            doc = inspect.getdoc(member)
            if doc and len(doc.split()) >= 30:
                docstrings.setdefault(doc, None)
    pool = list(docstrings)
    rng = random.Random(seed)
    return ["\n\n".join(rng.sample(pool, per_doc)) for _ in range(count)]


def read_texts(path: str, limit: int) -> pa.ChunkedArray:
    return pq.read_table(path, columns=["text"]).column("text").slice(0, limit)


# --------------------------------------------------------------------------- cases (in the child)


def ours(path: str, limit: int) -> dict:
    texts = read_texts(path, limit)
    minhash.signatures(texts.slice(0, 16))  # loads the compiled kernels
    with harness.timed():
        for start in range(0, len(texts), minhash.BATCH_DOCS):
            minhash.signatures(texts.slice(start, minhash.BATCH_DOCS), PARAMS)
    return {"items": len(texts)}


def stage(path: str, limit: int, which: str) -> dict:
    """One stage of the kernel over every batch, the stages before it run untimed."""
    import time

    texts = read_texts(path, limit)
    a, b = minhash.permutations(PARAMS.num_perms, PARAMS.seed)
    minhash.signatures(texts.slice(0, 16))
    minhash.xxh3_64_spans(b"warm", np.array([0]), np.array([4]))
    minhash.signatures_from_hashes(np.zeros(1, np.uint64), np.array([1]), a, b)
    minhash.clean_batch(["warm"])
    seconds, cpu = 0.0, 0.0
    for start in range(0, len(texts), minhash.BATCH_DOCS):
        batch = texts.slice(start, minhash.BATCH_DOCS)
        t0, c0 = time.perf_counter(), time.process_time()
        joined = minhash.clean_batch(batch, PARAMS.text_cap_chars)
        starts, lengths, counts = minhash.ngram_spans(joined, len(batch), PARAMS.ngram_size)
        t1, c1 = time.perf_counter(), time.process_time()
        hashes = minhash.xxh3_64_spans(joined, starts, lengths)
        t2, c2 = time.perf_counter(), time.process_time()
        minhash.signatures_from_hashes(hashes, counts, a, b)
        t3, c3 = time.perf_counter(), time.process_time()
        k = ("clean+shingle", "hash", "permute").index(which)
        seconds += (t1 - t0, t2 - t1, t3 - t2)[k]
        cpu += (c1 - c0, c2 - c1, c3 - c2)[k]
    return {"items": len(texts), "seconds": seconds, "cpu_s": cpu}


def datasketch_update_batch(path: str, limit: int) -> dict:
    from datasketch import LeanMinHash, MinHash

    texts = read_texts(path, limit).to_pylist()
    a, b = minhash.permutations(PARAMS.num_perms, PARAMS.seed)
    kwargs = {"num_perm": PARAMS.num_perms, "hashfunc": minhash.xxh3_64, "permutations": (a, b), "scheme": "affine64"}
    MinHash(**kwargs).update_batch([b"warm"])
    out = []
    with harness.timed():
        for text in texts:
            sketch = MinHash(**kwargs)
            sketch.update_batch(minhash.shingles(minhash.clean_text(text, PARAMS.text_cap_chars), PARAMS.ngram_size))
            out.append(LeanMinHash(sketch))
    return {"items": len(texts)}


def datasketch_bulk(path: str, limit: int) -> dict:
    from datasketch import MinHash

    texts = read_texts(path, limit).to_pylist()
    a, b = minhash.permutations(PARAMS.num_perms, PARAMS.seed)
    kwargs = {"num_perm": PARAMS.num_perms, "hashfunc": minhash.xxh3_64, "permutations": (a, b), "scheme": "affine64"}
    MinHash.bulk([[b"warm"]], **kwargs)
    with harness.timed():
        MinHash.bulk((minhash.shingles(minhash.clean_text(t, PARAMS.text_cap_chars), PARAMS.ngram_size) for t in texts), **kwargs)
    return {"items": len(texts)}


def rensa_bulk(path: str, limit: int) -> dict:
    import rensa

    texts = read_texts(path, limit).to_pylist()
    rensa.RMinHash.digest_matrix_from_token_sets([["warm", "up"]], PARAMS.num_perms, PARAMS.seed)
    with harness.timed():
        rensa.RMinHash.digest_matrix_from_token_sets([t.split() for t in texts], PARAMS.num_perms, PARAMS.seed)
    return {"items": len(texts)}


# --------------------------------------------------------------------------- fuzzy step memory


def build_corpus(root: str, docs_total: int, sources: int = 4, shards: int = 2) -> dict:
    """Sources of generated documents, a fifth of them near-duplicates (2 words deleted)."""
    rng = random.Random(docs_total)
    docs = documents(docs_total, per_doc=3, seed=docs_total)
    for i in range(0, docs_total, 5):
        words = docs[i - 1].split()
        for _ in range(2):
            words.pop(rng.randrange(len(words)))
        docs[i] = " ".join(words)
    layout: dict[str, dict[str, list[str]]] = {"buckets": {}, "normalized": {}}
    for s in range(sources):
        name = f"source_{s}"
        rows = sorted({xxhash.xxh3_128_hexdigest(t.encode()): t for t in docs[s::sources]}.items())
        for kind in layout.values():
            kind[name] = []
        for k in range(shards):
            part = rows[k::shards]
            shard = storage.shard_name(k, shards)
            norm = storage.join(root, "normalized", name, shard)
            storage.write_parquet(pa.table({"id": [r[0] for r in part], "text": [r[1] for r in part]}), norm)
            out = storage.join(root, "buckets", name, shard)
            minhash.minhash_shard([norm], out, PARAMS)
            layout["normalized"][name].append(norm)
            layout["buckets"][name].append(out)
    return layout


def fuzzy(root: str, warm: str, out: str) -> dict:
    # A run on a small corpus first loads every library and lazy kernel.
    layout = json.loads(storage.read_bytes(storage.join(warm, "layout.json")))
    find_fuzzy_duplicates(layout["buckets"], layout["normalized"], set(), storage.join(out, "warm"))
    layout = json.loads(storage.read_bytes(storage.join(root, "layout.json")))
    with harness.timed():
        stats = find_fuzzy_duplicates(layout["buckets"], layout["normalized"], set(), storage.join(out, "run"))
    return {"items": stats["docs"], "edges": stats["candidate_edges"], "removed": stats["removed"]}


# --------------------------------------------------------------------------- the bench (in the parent)


def check_bit_equal(docs: list[str]) -> None:
    """Our signatures equal datasketch's (update_batch and bulk) on a sample, before timing."""
    from datasketch import MinHash

    sample = docs[:40]
    ours_sig = minhash.signatures(sample, PARAMS)
    a, b = minhash.permutations(PARAMS.num_perms, PARAMS.seed)
    bulk = MinHash.bulk([minhash.shingles(minhash.clean_text(t), 5) for t in sample], num_perm=286, hashfunc=minhash.xxh3_64, permutations=(a, b), scheme="affine64")
    for text, row, other in zip(sample, ours_sig, bulk):
        if not (np.array_equal(minhash.datasketch_minhash(text, PARAMS).hashvalues, row) and np.array_equal(other.hashvalues, row)):
            raise SystemExit(f"signatures differ from datasketch's on {text[:60]!r}")


def throughput(workdir: str) -> None:
    n = harness.pick(20000, 6000)
    docs = documents(n)
    plain, accented = os.path.join(workdir, "docs.parquet"), os.path.join(workdir, "accented.parquet")
    pq.write_table(pa.table({"text": docs}), plain)
    pq.write_table(pa.table({"text": [d.replace("e", "é").replace("E", "É") for d in docs]}), accented)
    check_bit_equal(docs)
    check_bit_equal([d.replace("e", "é").replace("E", "É") for d in docs[:40]])
    words = np.mean([len(d.split()) for d in docs])
    slow = harness.pick(600, 200)  # datasketch: fewer documents, rates per document compare
    one_thread = {"RAYON_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    cases = [
        harness.Case("datasketch update_batch", "bench.bench_minhash:datasketch_update_batch", {"path": plain, "limit": slow}, one_thread),
        harness.Case("datasketch MinHash.bulk", "bench.bench_minhash:datasketch_bulk", {"path": plain, "limit": slow}, one_thread),
        harness.Case("rensa digest_matrix (split)", "bench.bench_minhash:rensa_bulk", {"path": plain, "limit": n}, one_thread),
        harness.Case("marin-assets signatures", "bench.bench_minhash:ours", {"path": plain, "limit": n}, one_thread),
        harness.Case("marin-assets, accented", "bench.bench_minhash:ours", {"path": accented, "limit": n}, one_thread),
    ]
    cases += [
        harness.Case(f"  stage: {name}", "bench.bench_minhash:stage", {"path": plain, "limit": n, "which": name}, one_thread)
        for name in ("clean+shingle", "hash", "permute")
    ]
    title = f"MinHash signatures: {PARAMS.num_perms} permutations, word 5-grams, {words:.0f} words/doc, one core (bit-equal to datasketch, checked)"
    result = harness.compare(title, cases, rounds=harness.pick(5, 2), unit="docs")
    fused = "marin-assets signatures"
    stages = ("clean+shingle", "hash", "permute")
    per_doc = {name: [c / r["items"] for c, r in zip(result[f"  stage: {name}"].values("cpu_s"), result[f"  stage: {name}"].runs)] for name in stages}
    staged = [sum(values) for values in zip(*per_doc.values())]
    fused_per_doc = [c / r["items"] for c, r in zip(result[fused].values("cpu_s"), result[fused].runs)]
    for name in stages:
        shares = [v / t for v, t in zip(per_doc[name], staged)]
        print(f"  where the time goes: {name:<14} {statistics.median(shares):6.1%} [{min(shares):.1%}..{max(shares):.1%}] of the staged CPU time")
    ratios = [t / f for t, f in zip(staged, fused_per_doc)]
    print(f"  the three stages run apart take {statistics.median(ratios):.2f}x [{min(ratios):.2f}..{max(ratios):.2f}] the fused kernel's CPU time")
    harness.speed_goal(fused, "datasketch update_batch", 1.0, "marin-assets signatures faster than datasketch update_batch (> 1x)", "cpu").check(result)
    harness.speed_goal(fused, "datasketch MinHash.bulk", 1.0, "marin-assets signatures faster than datasketch MinHash.bulk (> 1x)", "cpu").check(result)
    harness.speed_goal(fused, "rensa digest_matrix (split)", 1.0, "marin-assets signatures at least as fast as rensa's bulk path (>= 1x)", "cpu").check(result)


def fuzzy_memory(workdir: str) -> None:
    small, large = harness.pick((4000, 16000), (2000, 8000))
    storage.write_json(storage.join(workdir, "warm", "layout.json"), build_corpus(storage.join(workdir, "warm"), 400))
    cases = []
    for size in (small, large):
        root = storage.join(workdir, f"fuzzy-{size}")
        storage.write_json(storage.join(root, "layout.json"), build_corpus(root, size))
        cases.append(harness.Case(f"{size} docs", "bench.bench_minhash:fuzzy", {"root": root, "warm": storage.join(workdir, "warm"), "out": storage.join(workdir, f"out-{size}")}))
    result = harness.compare("Global fuzzy dedup step (4 sources, 20% near-duplicates; peak counted from after a warm-up run)", cases, rounds=harness.pick(3, 1))
    for case in cases:
        run = result[case.label].runs[-1]
        print(f"  {case.label}: {run['edges']} candidate edges, {run['removed']} removed")
    harness.growth_goal(cases[0].label, cases[1].label, 1.3, f"fuzzy step peak memory grows <= 1.3x from {small} to {large} docs (memory bounded by configured sizes)").check(result)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-minhash-") as workdir:
        throughput(workdir)
        fuzzy_memory(workdir)


if __name__ == "__main__":
    sys.exit(harness.exit_status(main()))
