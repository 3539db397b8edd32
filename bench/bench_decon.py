"""Per-source contamination marking throughput against a plain Python reference, and index memory.

Run: ``python bench/bench_decon.py`` (under a minute on two cores; ``--quick`` skips the
production-size index, ``--full`` also times the reference at production size, ~2 GB more). Both paths run in this process, one core each, on the same documents:
standard-library docstrings (read with ``ast``) joined into pages of a few paragraphs, 3% of
them quoting one docstring that serves as an eval row. The 1,000 eval rows are drawn from a
disjoint set of docstrings, and page docstrings sharing any feature with them are left out, so
matches come from the planted copies (as in a real corpus, where matches are rare).

* marin-assets: ``decon.mark_documents`` (vectorized features, bitmaps + sorted-array index);
* reference: the same rule written plainly (``str.split``, a set of 13-gram strings, a regex
  for the letter test, the 2-distinct-features rule); its decisions must equal ours.

Then the index is padded with random hashes to the production size (21.78M n-grams) and the
marking is timed again; with ``--full`` the reference set is padded the same way (with random
integers: lookups of absent strings then cost what they would in a 21.78M-string set, the
memory does not). Memory per million n-grams: resident bytes of our membership structure
against the reference set of strings measured with tracemalloc.
"""

from __future__ import annotations

import ast
import gc
import os
import random
import re
import sys
import tempfile
import time
import tracemalloc

os.environ.setdefault("OMP_NUM_THREADS", "1")
if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from marin_assets.core import decon, storage  # noqa: E402

N_DOCS = 8_000
N_EVAL_ROWS = 1_000
PLANT_RATE = 0.03
PRODUCTION_NGRAMS = 21_780_000
TARGET_RATIO = 5.0
PARAMS = decon.DeconParams()


def docstrings(limit: int = 14_000) -> list[str]:
    """Docstrings of the standard library, read with ``ast`` from its sources (nothing imported)."""
    root = os.path.dirname(os.__file__)
    seen: dict[str, None] = {}
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in ("site-packages", "test", "tests", "idle_test"))
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            try:
                with open(os.path.join(directory, name), encoding="utf-8") as handle:
                    tree = ast.parse(handle.read())
            except (SyntaxError, UnicodeDecodeError, ValueError):
                continue
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    doc = ast.get_docstring(node)
                    if doc and len(doc.split()) >= 20:
                        seen.setdefault(doc, None)
            if len(seen) >= limit:
                return list(seen)
    return list(seen)


def corpus(seed: int = 0) -> tuple[list[tuple[str, str, str]], list[str]]:
    pool = docstrings()
    rng = random.Random(seed)
    rng.shuffle(pool)
    eval_texts, page_texts = pool[:N_EVAL_ROWS], pool[N_EVAL_ROWS:]
    eval_rows = [("bench_eval", str(i), t) for i, t in enumerate(eval_texts)]
    # Docstrings repeat each other (shared boilerplate, twin implementations); pages only use
    # those sharing no feature with the eval rows, so that matches come from planted copies.
    grams, _ = reference_index(eval_rows)
    page_texts = [t for t in page_texts if not any(f in grams for u in reference_units(t, True) for f in u)]
    pages = []
    for _ in range(N_DOCS):
        paragraphs = rng.sample(page_texts, rng.randint(2, 6))
        if rng.random() < PLANT_RATE:
            paragraphs.insert(rng.randint(0, len(paragraphs)), rng.choice(eval_texts))
        pages.append("\n\n".join(paragraphs))
    return eval_rows, pages


# ----------------------------------------------------------------------------- the reference

_PARAGRAPHS = re.compile(r"\n\s*\n")
_LETTER = re.compile(r"[^\W\d_]")


def reference_units(text: str, short_paragraphs: bool) -> list[list[str]]:
    paragraphs = [p.split() for p in _PARAGRAPHS.split(text)]
    paragraphs = [p for p in paragraphs if p]
    if not paragraphs:
        return []
    whole = max(len(p) for p in paragraphs) < 13
    if whole:
        paragraphs = [[t for p in paragraphs for t in p]]
    units = []
    for tokens in paragraphs:
        if len(tokens) >= 13:
            grams = [" ".join(tokens[i:i + 13]) for i in range(len(tokens) - 12)]
            units.append([g for g in grams if _LETTER.search(g)])
        elif 3 <= len(tokens) <= 12 and (short_paragraphs or whole):
            record = " ".join(tokens)
            units.append([record] if _LETTER.search(record) else [])
    return units


def reference_index(eval_rows) -> tuple[set[str], set[str]]:
    grams: set[str] = set()
    records: set[str] = set()
    for _, _, text in eval_rows:
        features = {f for unit in reference_units(text, False) for f in unit}
        grams |= features
        if len(features) == 1:
            records |= features
    return grams, records


def reference_mark(texts: list[str], grams: set[str], records: set[str]) -> tuple[list[bool], list[float]]:
    flags, overlaps = [], []
    for text in texts:
        best, flagged = 0.0, False
        for unit in reference_units(text, True):
            if not unit:
                continue
            hits = [g for g in unit if g in grams]
            overlap = len(hits) / len(unit)
            best = max(best, overlap)
            if hits and overlap >= 0.5 and (len(set(hits)) >= 2 or any(h in records for h in hits)):
                flagged = True
        flags.append(flagged)
        overlaps.append(best)
    return flags, overlaps


# ----------------------------------------------------------------------------- timing


def best_of(*fns, repeats: int = 3) -> list[float]:
    """Best time of each function over ``repeats`` rounds, interleaved so that both see the same load."""
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, slot in zip(fns, times):
            gc.collect()
            start = time.perf_counter()
            fn()
            slot.append(time.perf_counter() - start)
    return [min(t) for t in times]


def main() -> int:
    quick = "--quick" in sys.argv[1:]
    full = "--full" in sys.argv[1:]
    eval_rows, pages = corpus()
    n_bytes = sum(len(p.encode()) for p in pages)
    texts = pa.array(pages, pa.large_string())
    print(f"documents: {len(pages):,} ({n_bytes / 1e6:.1f} MB, {n_bytes / len(pages):,.0f} B/doc); "
          f"eval rows: {len(eval_rows):,}")

    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        stats = decon.build_eval_index(eval_rows, tmp, PARAMS, {"bench_eval": len(eval_rows)})
        build_s = time.perf_counter() - start
        index = decon.load_eval_index(tmp)
        index = decon.EvalIndex(np.array(index.hashes), np.array(index.record_hashes),
                                np.array(index.attribution_hashes), np.array(index.attribution_rows),
                                index.row_sets, index.row_ids, index.row_excerpts, index.meta)
    print(f"eval index: {stats['ngrams']:,} n-grams built in {build_s:.2f} s")

    tracemalloc.start()
    grams, records = reference_index(eval_rows)
    ref_bytes, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()

    ours = decon.mark_documents(texts, index, None, PARAMS)
    ref_flags, ref_overlaps = reference_mark(pages, grams, records)
    agree_flags = int((ours.contaminated == np.array(ref_flags)).sum())
    agree_overlap = bool(np.allclose(ours.max_overlap, np.array(ref_overlaps, dtype=np.float32), atol=1e-6))
    print(f"agreement with the reference: contaminated {agree_flags:,}/{len(pages):,}, max_overlap "
          f"{'equal' if agree_overlap else 'DIFFERENT'}; flagged {int(ours.contaminated.sum()):,} "
          f"(planted ~{PLANT_RATE:.0%})")

    t_ours, t_ref = best_of(lambda: decon.mark_documents(texts, index, None, PARAMS),
                            lambda: reference_mark(pages, grams, records))
    ratio = t_ref / t_ours
    print(f"\n{'path':34s} {'docs/s/core':>12s} {'MB/s/core':>10s}")
    print(f"{'reference (set of 13-gram strings)':34s} {len(pages) / t_ref:12,.0f} {n_bytes / t_ref / 1e6:10.1f}")
    print(f"{'marin-assets mark_documents':34s} {len(pages) / t_ours:12,.0f} {n_bytes / t_ours / 1e6:10.1f}")
    verdict = "ok" if ratio >= TARGET_RATIO else "BELOW TARGET"
    print(f"speed-up: {ratio:.1f}x (target >= {TARGET_RATIO:.0f}x): {verdict}")

    with tempfile.TemporaryDirectory() as tmp:
        shard = storage.join(tmp, "normalized", storage.shard_name(0, 1))
        ids = [f"{i:032x}" for i in range(len(pages))]
        storage.write_parquet(pa.table({"id": ids, "text": texts}), shard)
        decon._load_index_cached.cache_clear()
        index_dir = storage.join(tmp, "index")
        decon.build_eval_index(eval_rows, index_dir, PARAMS, {})
        params = decon.DeconParams(index_uri=index_dir)
        out = storage.join(tmp, "contamination", storage.shard_name(0, 1))
        decon.contamination_shard([shard], out, params)  # warm: index load and caches
        [t_shard] = best_of(lambda: decon.contamination_shard([shard], out, params), repeats=2)
    label = "contamination_shard (read+mark+write)"
    print(f"{label:34s} {len(pages) / t_shard:12,.0f} {n_bytes / t_shard / 1e6:10.1f}")

    per_m_ref = ref_bytes / max(len(grams), 1) * 1e6 / 2**20
    per_m_ours = index.memory_bytes / index.size * 1e6 / 2**20
    print(f"\nindex memory per million n-grams: marin-assets {per_m_ours:.1f} MiB at {index.size:,} n-grams "
          f"(sorted uint64 + bitmaps), reference set of strings {per_m_ref:.1f} MiB")
    if not quick:
        rng = np.random.default_rng(1)
        padding = rng.integers(0, 2**63, PRODUCTION_NGRAMS - index.size, dtype=np.int64).astype(np.uint64) << 1
        big = decon.EvalIndex(np.unique(np.concatenate([index.hashes, padding])), index.record_hashes,
                              index.attribution_hashes, index.attribution_rows, index.row_sets, index.row_ids,
                              index.row_excerpts, index.meta)
        del padding
        same = np.array_equal(decon.mark_documents(texts, big, None, PARAMS).contaminated, ours.contaminated)
        print(f"production-size index ({big.size / 1e6:.2f}M n-grams): {big.memory_bytes / 2**20:.0f} MiB resident, "
              f"{big.memory_bytes / big.size * 1e6 / 2**20:.1f} MiB per million n-grams; decisions "
              f"{'unchanged' if same else 'CHANGED'}")
        if full:
            padded = set(np.random.default_rng(2).integers(0, 2**62, PRODUCTION_NGRAMS - len(grams)).tolist())
            padded.update(grams)
            t_big, t_ref_big = best_of(lambda: decon.mark_documents(texts, big, None, PARAMS),
                                       lambda: reference_mark(pages, padded, records), repeats=2)
            del padded
            print(f"  reference at production size {len(pages) / t_ref_big:12,.0f} docs/s/core")
        else:
            [t_big] = best_of(lambda: decon.mark_documents(texts, big, None, PARAMS), repeats=2)
            t_ref_big = None
        print(f"  marin-assets at production size {len(pages) / t_big:9,.0f} docs/s/core"
              + (f"; speed-up {t_ref_big / t_big:.1f}x" if t_ref_big else " (reference: run with --full)"))
        per_m_attr = (index.attribution_hashes.nbytes + index.attribution_rows.nbytes) / index.size * 1e6 / 2**20
        print(f"attribution table (memory-mapped, touched only for matches): {per_m_attr:.1f} MiB per million n-grams")
    return 0 if agree_flags == len(pages) and agree_overlap else 1


if __name__ == "__main__":
    sys.exit(main())
