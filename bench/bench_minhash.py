"""MinHash signature throughput against datasketch and rensa, and peak memory of the global
fuzzy dedup step at two corpus sizes.

Run: ``python bench/bench_minhash.py`` (about a minute on two cores). Every path runs in this
process on the same generated documents (stdlib docstrings joined into documents of a few
hundred words), one core each, and includes text cleaning and shingling:

* marin-assets: ``minhash.signatures`` in batches of ``BATCH_DOCS`` documents, on the JIT
  path (numba; compiled before timing) and on the numpy path (the fallback without numba);
  the JIT path also on the same documents with every "e" accented (non-ASCII lowercasing);
* datasketch ``update_batch``: a ``MinHash`` per document configured with the same hash
  function and permutations (its fastest route; checked bit-equal to ours here);
* datasketch ``update``: the same, one shingle per call (its documented usage);
* rensa ``RMinHash.digest_matrix_from_token_sets``: its bulk API, same shingles, 286
  permutations, seed 42 (its own hash family, so values differ; speed only).

The fuzzy step runs in a child process per corpus size (built beforehand by the parent) and
reports the child's peak RSS (``VmHWM``, else ``ru_maxrss``) and its growth over the peak of
a warm-up run on a small corpus in the same child.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import xxhash  # noqa: E402

from marin_assets.core import dedup, minhash, storage  # noqa: E402

MODULES = (
    "argparse", "asyncio", "calendar", "collections", "csv", "datetime", "decimal", "email",
    "fractions", "functools", "http.client", "inspect", "itertools", "json", "logging", "os",
    "pathlib", "random", "re", "shutil", "socket", "sqlite3", "statistics", "string",
    "subprocess", "tarfile", "textwrap", "typing", "unittest", "zipfile",
)  # fmt: skip


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


def rate(fn, items: list, repeats: int = 2) -> float:
    """Best-of-``repeats`` documents per second of ``fn(items)``."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn(items)
        best = min(best, time.perf_counter() - start)
    return len(items) / best


def ours(docs: list[str]) -> None:
    for i in range(0, len(docs), minhash.BATCH_DOCS):
        minhash.signatures(docs[i : i + minhash.BATCH_DOCS])


def ours_numpy(docs: list[str]) -> None:
    jit, minhash.JIT = minhash.JIT, False
    try:
        ours(docs)
    finally:
        minhash.JIT = jit


def datasketch_batch(docs: list[str]) -> None:
    for doc in docs:
        minhash.datasketch_minhash(doc)


def datasketch_update(docs: list[str]) -> None:
    from datasketch import MinHash

    a, b = minhash.permutations()
    for doc in docs:
        sketch = MinHash(num_perm=286, hashfunc=minhash.xxh3_64, permutations=(a, b), scheme="affine64")
        for shingle in minhash.shingles(minhash.clean_text(doc)):
            sketch.update(shingle)


def rensa_bulk(docs: list[str]) -> None:
    import rensa

    token_sets = [[s.decode() for s in minhash.shingles(minhash.clean_text(doc))] for doc in docs]
    rensa.RMinHash.digest_matrix_from_token_sets(token_sets, 286, 42)


def throughput() -> None:
    docs = documents(2400)
    words = np.mean([len(d.split()) for d in docs])
    minhash.datasketch_minhash(docs[0])  # import datasketch/scipy outside the timings
    check = minhash.signatures(docs[:50])  # also compiles the JIT kernels (or loads them)
    assert all(np.array_equal(minhash.datasketch_minhash(d).hashvalues, row) for d, row in zip(docs[:50], check))
    rows = [("marin-assets numba JIT" if minhash.JIT else "marin-assets numpy", rate(ours, docs))]
    if minhash.JIT:
        # Non-ASCII text: every "e" accented, so UTF-8 decoding and Unicode lowercasing run.
        accented = [d.replace("e", "é").replace("E", "É") for d in docs]
        assert all(np.array_equal(minhash.datasketch_minhash(d).hashvalues, row) for d, row in zip(accented[:20], minhash.signatures(accented[:20])))
        rows.append(("marin-assets JIT, accented", rate(ours, accented)))
        rows.append(("marin-assets numpy path", rate(ours_numpy, docs)))
    rows += [
        ("datasketch update_batch", rate(datasketch_batch, docs[:400])),
        ("datasketch update", rate(datasketch_update, docs[:40], repeats=1)),
        ("rensa digest_matrix", rate(rensa_bulk, docs[:1200])),
    ]
    print(f"MinHash signatures, 286 permutations, word 5-grams, {words:.0f} words/doc, one core")
    print("  (signatures of the first 50 documents equal datasketch's bit for bit)")
    if not minhash.JIT:
        print("  (numba is not installed: the JIT path is not measured)")
    base = rows[0][1]
    for name, value in rows:
        ratio = "" if value == base else f"   marin-assets is {base / value:5.1f}x faster" if base >= value else f"   marin-assets is {value / base:5.1f}x slower"
        print(f"  {name:26s} {value:9.0f} docs/s{ratio}")


# --------------------------------------------------------------------------- fuzzy memory


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
            minhash.minhash_shard([norm], out, minhash.MinHashParams())
            layout["normalized"][name].append(norm)
            layout["buckets"][name].append(out)
    return layout


def peak_rss_kib() -> int:
    """Peak resident memory of this process in KiB.

    Linux: ``VmHWM``, which starts afresh at exec; ``ru_maxrss`` would also count the
    parent's memory at fork time. Elsewhere ``ru_maxrss`` (KiB on Linux, bytes on macOS).
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak // 1024 if sys.platform == "darwin" else peak


def fuzzy_child(root: str) -> None:
    # A run on a small corpus first loads every library and lazy kernel, so the growth over
    # the baseline measures the data, not the code.
    warm = json.loads(storage.read_bytes(storage.join(root, "warm", "layout.json")))
    dedup.find_fuzzy_duplicates(warm["buckets"], warm["normalized"], set(), storage.join(root, "warm", "out"))
    layout = json.loads(storage.read_bytes(storage.join(root, "layout.json")))
    baseline = peak_rss_kib()
    start = time.perf_counter()
    stats = dedup.find_fuzzy_duplicates(layout["buckets"], layout["normalized"], set(), storage.join(root, "out"))
    peak = peak_rss_kib()
    print(json.dumps({"peak_kib": peak, "baseline_kib": baseline, "seconds": time.perf_counter() - start,
                      "docs": stats["docs"], "edges": stats["candidate_edges"], "removed": stats["removed"]}))  # fmt: skip


def fuzzy_memory(sizes: tuple[int, ...] = (4000, 16000)) -> None:
    print("Global fuzzy dedup step (child process per corpus; 4 sources, 20% near-duplicates)")
    for size in sizes:
        with tempfile.TemporaryDirectory(prefix="bench-fuzzy-") as root:
            storage.write_json(storage.join(root, "warm", "layout.json"), build_corpus(storage.join(root, "warm"), 400))
            storage.write_json(storage.join(root, "layout.json"), build_corpus(root, size))
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--fuzzy-child", root], check=True, capture_output=True, text=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(
                f"  {r['docs']:6d} docs: peak RSS {r['peak_kib'] / 1024:6.1f} MiB "
                f"(+{(r['peak_kib'] - r['baseline_kib']) / 1024:5.1f} MiB over a warmed-up process), "
                f"{r['edges']} candidate edges, {r['removed']} removed, {r['seconds']:.1f} s"
            )


def main(argv: list[str] | None = None) -> None:
    """``--memory-only`` skips the throughput part; ``--fuzzy-child ROOT`` is internal."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "--fuzzy-child":
        fuzzy_child(argv[1])
        return
    started = time.perf_counter()
    if "--memory-only" not in argv:
        throughput()
    fuzzy_memory()
    print(f"(bench took {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
