"""Global deduplication across all sources: exact (same ``id``) and fuzzy (MinHash candidates
verified by word 3-gram containment).

Both steps read every source and write *sparse* decisions, one Parquet file per source at
``<out_dir>/<source>/removed.parquet`` (an empty file when a source loses nothing), sorted by
``id`` and written deterministically, so a source's file changes only when that source's
decisions do. :func:`removed_ids_digest` gives the content hash of a source's removed ids.

Both run as shuffles of per-partition tasks mapped with :class:`~marin_assets.core.runtime.runner.ShardRunner`
(in-process, local processes or Ray): :mod:`.exact` partitions ids by range,
:mod:`.fuzzy` partitions bucket records by (band, bucket), finds connected components over
edge shards, verifies clusters in parallel and reuses the verdicts of clusters an
incremental change did not touch. This module holds what both share: the parameters, the
verification rule and the per-source output files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa

from marin_assets.core.dedup.minhash import ngram_spans, xxh3_64_spans
from marin_assets.core.dedup.retained import RetainedIndex
from marin_assets.core.runtime import storage
from marin_assets.errors import BadInput

REMOVED_FILE = "removed.parquet"


class DedupError(BadInput, RuntimeError):
    """A dedup input is missing or inconsistent; the message names the source, file and fix."""


# --------------------------------------------------------------------------- shared helpers


def removed_uri(out_dir_uri: str, source: str) -> str:
    return storage.join(out_dir_uri, source, REMOVED_FILE)


def removal_files(exact_uri: str, fuzzy_uri: str, source: str) -> tuple[str, str]:
    """The source's removal files in the exact and the fuzzy dedup outputs: what its pool drops."""
    return removed_uri(exact_uri, source), removed_uri(fuzzy_uri, source)


def removed_ids_digest(ids: Iterable[str]) -> str:
    """sha256 of the sorted removed ids: the per-source fingerprint of a dedup decision."""
    digest = hashlib.sha256()
    for value in sorted(ids):
        digest.update(value.encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()[:16]


def removal_ratios(removed: Mapping[str, int], docs: Mapping[str, int]) -> dict[str, float]:
    """Fraction of each source's documents a dedup step removes (0.0 for an empty source)."""
    return {source: (removed.get(source, 0) / n if n else 0.0) for source, n in sorted(docs.items())}


def sources_over_removal_limit(ratios: Mapping[str, float], limit: float = 0.5) -> dict[str, float]:
    """The sources that would lose more than ``limit`` of their documents (a check warns on them)."""
    return {source: ratio for source, ratio in sorted(ratios.items()) if ratio > limit}


# --------------------------------------------------------------------------- exact duplicates


@dataclasses.dataclass(frozen=True)
class ExactDedupParams:
    """Which copy of an id survives: the copy in the first source of ``source_priority`` that
    has it, else in the first source in name order (then shard, then row, which only matters
    inside one source, where normalize already kept the first copy of each id).
    """

    source_priority: tuple[str, ...] = ()


def keep_order(sources: Iterable[str], params: ExactDedupParams = ExactDedupParams()) -> list[str]:
    """Sources from most to least preferred keeper under ``params``."""
    names = sorted(set(sources))
    first = [s for s in dict.fromkeys(params.source_priority) if s in names]
    return first + [s for s in names if s not in first]


EXACT_SCHEMA = pa.schema([("id", pa.string()), ("kept_source", pa.string())])


# --------------------------------------------------------------------------- fuzzy duplicates


@dataclasses.dataclass(frozen=True)
class FuzzyDedupParams:
    """Verification of MinHash candidate clusters (rule: word 3-gram containment >= 0.75).

    Members are processed longest first; a member is removed when an already-retained member
    at least as long contains ``containment_threshold`` of its distinct word ``ngram_size``-grams
    (case-folded, whitespace tokens, xxh3-64). Every retained member that could reach the
    threshold is compared (an exact prefix filter over the retained members' n-grams picks
    them), so clusters of any size get the pairwise rule's survivors. Text beyond
    ``max_chars_per_doc`` characters is not compared.
    """

    containment_threshold: float = 0.75
    ngram_size: int = 3
    max_chars_per_doc: int = 8 * 2**20


VERIFY_BATCH_CHARS = 1 << 20  # ~15 bytes of n-gram arrays per character while hashed

FUZZY_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("cluster_id", pa.string()),
        ("representative_id", pa.string()),
        ("representative_source", pa.string()),
        ("containment", pa.float64()),
        ("jaccard", pa.float64()),
    ]
)


def ngram_sets(texts: Sequence[str], n: int = 3, max_chars: int = 8 * 2**20) -> list[np.ndarray]:
    """Distinct word n-gram hashes per text (sorted uint64): case-folded, whitespace tokens,
    xxh3-64 of the n tokens joined by one space; a text of fewer than n tokens is one n-gram."""
    cleaned = [" ".join(t[:max_chars].casefold().split()) for t in texts]
    joined = "\n".join(cleaned).encode("utf-8")
    starts, lengths, counts = ngram_spans(joined, len(cleaned), n)
    hashes = xxh3_64_spans(joined, starts, lengths)
    doc = np.repeat(np.arange(len(cleaned)), counts)
    order = np.lexsort((hashes, doc))
    hashes, doc = hashes[order], doc[order]
    keep = np.ones(hashes.size, bool)
    keep[1:] = (hashes[1:] != hashes[:-1]) | (doc[1:] != doc[:-1])
    hashes, doc = hashes[keep], doc[keep]
    bounds = np.searchsorted(doc, np.arange(len(cleaned) + 1))
    return [hashes[bounds[i] : bounds[i + 1]] for i in range(len(cleaned))]


@dataclasses.dataclass(frozen=True)
class Removal:
    """A verified duplicate: member ``index`` is contained in retained member ``representative``."""

    index: int
    representative: int
    containment: float
    jaccard: float


@dataclasses.dataclass
class ClusterVerdict:
    """What verification decided for one cluster."""

    removals: list[Removal]
    exempt_kept: int = 0  # exempt members that met the threshold and were kept anyway
    comparisons: int = 0  # containment computations


class GreedyVerifier:
    """The rule applied to one cluster, member by member in processing order (longest first).

    Each member is compared with every retained member that could contain ``threshold`` of its
    n-grams: a retained set sharing at least ``k`` of the member's ``n`` n-grams must hold one of
    any ``n - k + 1`` of them, so the candidates are the retained members found in the postings
    of the member's ``n - k + 1`` n-grams held by the fewest retained members. That is exact
    (no retained member that meets the threshold is missed) and, for near-identical copies whose
    retained set stays small, cheap at any cluster size. Only retained members are indexed;
    removed members never represent.
    """

    def __init__(self, params: FuzzyDedupParams = FuzzyDedupParams(), memory_bytes: int = 1 << 30) -> None:
        self.threshold = params.containment_threshold
        self.retained = RetainedIndex(memory_bytes)  # past memory_bytes, spilled to memory-mapped files
        self.comparisons = 0
        self.exempt_kept = 0

    def close(self) -> None:
        """Remove the spilled index, if any."""
        self.retained.close()

    def offer(self, i: int, length: int, grams: np.ndarray, exempt: bool) -> Removal | None:
        """Decide member ``i``; returns its removal, or None when it is retained."""
        best = self._best(i, length, grams)
        if best is not None and best[1] >= self.threshold:
            if not exempt:
                return Removal(i, best[0], best[1], best[2])
            self.exempt_kept += 1
        self.retained.add(i, length, grams)
        return None

    def _best(self, i: int, length: int, grams: np.ndarray) -> tuple[int, float, float] | None:
        own = int(grams.size)
        if own == 0 or not len(self.retained):
            return None
        must_share = max(1, math.floor(self.threshold * own) - 1)  # a safe lower bound on shared n-grams
        probe = own - must_share + 1
        df = self.retained.counts(grams)
        if probe < own:
            chosen = np.argpartition(df, probe - 1)[:probe]
        else:
            chosen = np.arange(own)
        chosen = chosen[df[chosen] > 0]
        if chosen.size == 0:
            return None
        best: tuple[int, float, float] | None = None
        for r in self.retained.holders(grams[chosen]).tolist():
            if self.retained.lengths[r] < length:
                continue
            other = self.retained.grams.get(r)
            self.comparisons += 1
            shared = int(np.intersect1d(grams, other, assume_unique=True).size)
            containment = shared / own
            if best is None or containment > best[1]:
                best = (r, containment, shared / (own + other.size - shared))
        return best


def verify_cluster(
    lengths: Sequence[int],
    grams: Sequence[np.ndarray],
    exempt: Sequence[bool],
    params: FuzzyDedupParams = FuzzyDedupParams(),
) -> ClusterVerdict:
    """Decide one candidate cluster whose members are already in processing order (longest
    first). Removed members never act as representatives; exempt members are never removed."""
    verifier = GreedyVerifier(params)
    verdict = ClusterVerdict([])
    for i in range(len(grams)):
        removal = verifier.offer(i, int(lengths[i]), grams[i], bool(exempt[i]))
        if removal is not None:
            verdict.removals.append(removal)
    verifier.close()
    verdict.comparisons, verdict.exempt_kept = verifier.comparisons, verifier.exempt_kept
    return verdict


def verify_cluster_pairwise(
    lengths: Sequence[int],
    grams: Sequence[np.ndarray],
    exempt: Sequence[bool],
    params: FuzzyDedupParams = FuzzyDedupParams(),
) -> ClusterVerdict:
    """The rule as written: each member against every retained member (the reference)."""
    sets: list[set[int] | None] = [None] * len(grams)
    retained: list[int] = []
    verdict = ClusterVerdict([])
    for i in range(len(grams)):
        verdict.comparisons += len(retained)
        best = _best_representative(i, retained, lengths, grams, sets)
        if _decide(i, best, exempt, params, verdict):
            retained.append(i)
    return verdict


def _decide(i: int, best: tuple[int, float, float] | None, exempt: Sequence[bool], params: FuzzyDedupParams, verdict: ClusterVerdict) -> bool:
    """Record member ``i``'s fate; True when it is retained."""
    if best is None or best[1] < params.containment_threshold:
        return True
    if exempt[i]:
        verdict.exempt_kept += 1
        return True
    verdict.removals.append(Removal(i, best[0], best[1], best[2]))
    return False


def _as_set(i: int, grams: Sequence[np.ndarray], sets: list[set[int] | None]) -> set[int]:
    cached = sets[i]
    if cached is None:
        cached = sets[i] = set(grams[i].tolist())
    return cached


def _best_representative(
    i: int, candidates: Iterable[int], lengths: Sequence[int], grams: Sequence[np.ndarray], sets: list[set[int] | None]
) -> tuple[int, float, float] | None:
    """(representative, containment, jaccard) maximising containment; ties: earliest candidate."""
    own = len(grams[i])
    if own == 0:
        return None
    mine = _as_set(i, grams, sets)
    best: tuple[int, float, float] | None = None
    for r in candidates:
        if lengths[r] < lengths[i]:
            continue
        other = _as_set(r, grams, sets)
        shared = len(mine & other) if len(mine) <= len(other) else len(other & mine)
        containment = shared / own
        if best is None or containment > best[1]:
            best = (r, containment, shared / (own + len(other) - shared))
    return best


def size_bin(size: int) -> str:
    if size <= 2:
        return "2"
    upper = 1 << (size - 1).bit_length()
    return f"{upper // 2 + 1}-{upper}"
