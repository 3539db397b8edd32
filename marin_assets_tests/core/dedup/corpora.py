"""Small generated corpora written as real shards, the readers of dedup's removal files and a
runner that counts task inputs: what the dedup tests share."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from marin_assets.core.dedup import decisions as dedup
from marin_assets.core.dedup import manifest, minhash
from marin_assets.core.dedup.fuzzy import FuzzyScale
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.runner import ShardRunner
from marin_assets.testing import dedup_corpus
from marin_assets.testing.dedup_corpus import near_copies
from marin_assets_tests.core.dedup.test_minhash import stdlib_documents


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

