"""Small generated corpora written as real shards, the readers of dedup's removal files and a
runner that counts task inputs: what the dedup tests share."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import random
from pathlib import Path

from marin_assets.core.dedup import decisions as dedup
from marin_assets.core.dedup import manifest, minhash
from marin_assets.core.dedup.fuzzy import FuzzyScale
from marin_assets.core.dedup.minhash import MinHashParams
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.runner import ShardRunner
from marin_assets.testing import dedup_corpus
from marin_assets.testing.dedup_corpus import near_copies


STDLIB_MODULES = (
    "argparse", "asyncio", "calendar", "collections", "csv", "datetime", "decimal", "email",
    "fractions", "functools", "http.client", "inspect", "itertools", "json", "logging",
    "os", "pathlib", "random", "re", "shutil", "socket", "sqlite3", "statistics", "string",
    "subprocess", "tarfile", "textwrap", "typing", "unittest", "zipfile",
)  # fmt: skip


@functools.lru_cache(maxsize=1)
def stdlib_docstrings() -> tuple[str, ...]:
    """Distinct docstrings of 30+ words from stdlib modules: real English technical prose.

    Only the members a module defines itself: its other attributes (submodules, imported
    names) depend on what else the process has imported, and the pool must not.
    """
    seen: dict[str, None] = {}
    for name in STDLIB_MODULES:
        module = importlib.import_module(name)
        for _, member in inspect.getmembers(module):
            if getattr(member, "__module__", None) != name:
                continue
            doc = inspect.getdoc(member)
            if doc and len(doc.split()) >= 30:
                seen.setdefault(doc, None)
    return tuple(seen)


def stdlib_documents(count: int, per_doc: int = 3, seed: int = 0) -> list[str]:
    """``count`` distinct documents, each a few docstrings joined (a few hundred words)."""
    docs = stdlib_docstrings()
    rng = random.Random(seed)
    out: dict[str, None] = {}
    while len(out) < count:
        out.setdefault("\n\n".join(rng.sample(docs, per_doc)), None)
    return list(out)


def shingle_jaccard(a: str, b: str, params: MinHashParams = MinHashParams()) -> float:
    sa = set(minhash.shingles(minhash.clean_text(a, params.text_cap_chars), params.ngram_size))
    sb = set(minhash.shingles(minhash.clean_text(b, params.text_cap_chars), params.ngram_size))
    return len(sa & sb) / len(sa | sb)


def write_normalized(root: Path, source: str, texts: list[str], shards: int) -> list[str]:
    """Normalized-like shards: rows hash-partitioned by id, sorted by id within a shard."""
    return dedup_corpus.write_normalized(str(root), source, texts, shards)


def write_source(root: Path, source: str, texts: list[str], shards: int) -> tuple[list[str], list[str]]:
    normalized = write_normalized(root, source, texts, shards)
    buckets = []
    for uri in normalized:
        out = str(root / "buckets" / source / storage.basename(uri))
        minhash.minhash_shard([uri], out, minhash.MinHashParams())
        buckets.append(out)
    return normalized, buckets


def read_removed(out_dir: str, source: str) -> list[dict]:
    return storage.read_parquet(dedup.removed_uri(out_dir, source)).to_pylist()


def doc_text(n: int) -> str:
    return f"document number {n} " + " ".join(["filler"] * n)


def exact_corpus(root: Path, shards: int = 1) -> dict[str, list[str]]:
    texts = {n: doc_text(n) for n in range(1, 6)}
    members = {"a_src": [1, 2, 3], "b_src": [2, 3, 4], "c_src": [3, 4, 5], "d_src": []}
    return {source: write_normalized(root, source, [texts[n] for n in ns], shards) for source, ns in members.items()}


SMALL_TASKS = FuzzyScale(records_per_task=4000, edges_per_task=1500, union_find_max_edges=0, members_per_task=150)


def outputs(out: str, sources) -> dict[str, set[tuple[str, str, str]]]:
    return {s: {(r["id"], r["representative_source"], r["representative_id"]) for r in read_removed(out, s)} for s in sources}


def big_cluster_corpus(root: Path, extra: dict[str, list[str]] | None = None, shards: int = 2) -> tuple[dict, dict]:
    """Three sources sharing a 600-copy cluster, a few small clusters and unrelated documents."""
    copies = near_copies(600, seed=11)
    small = [t for k in range(6) for t in near_copies(k + 2, seed=100 + k, words=80)]
    loose = stdlib_documents(30, per_doc=4, seed=5)
    apart = [near_copies(3, seed=200 + k, words=60) for k in range(5)]  # clusters beta has no member of
    texts = {
        "alpha": copies[:300] + small[::2] + loose[:10] + [c for trio in apart for c in trio[:2]],
        "beta": copies[300:500] + small[1::2] + loose[10:20],
        "gamma": copies[500:] + loose[20:] + [trio[2] for trio in apart],
    }
    for source, more in (extra or {}).items():
        texts[source] = texts.get(source, []) + more
    normalized, buckets = {}, {}
    for source, docs in texts.items():
        normalized[source], buckets[source] = write_source(root, source, docs, shards)
    return normalized, buckets


@dataclasses.dataclass(frozen=True)
class InputCountingRunner(ShardRunner):
    """The in-process runner, noting per task function the most input files one task was given."""

    widest: dict[str, int] = dataclasses.field(default_factory=dict, compare=False)

    def map(self, tasks, on_done=None):
        for task in tasks:
            name = task.fn.__name__
            self.widest[name] = max(self.widest.get(name, 0), manifest.count(task.inputs))
        return super().map(tasks, on_done)

