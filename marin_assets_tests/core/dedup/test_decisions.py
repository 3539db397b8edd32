"""The verification rule (greedy against the pairwise reference, within its memory budget), the
removal ratios, and what exact and fuzzy runs report and leave behind."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from marin_assets.core.dedup import decisions as dedup
from marin_assets.core.dedup.decisions import FuzzyDedupParams
from marin_assets.core.dedup.exact import find_exact_duplicates
from marin_assets.core.dedup.fuzzy import find_fuzzy_duplicates
from marin_assets.core.runtime import storage
from marin_assets.testing.dedup_corpus import near_copies
from marin_assets_tests.core.dedup.corpora import SMALL_TASKS, big_cluster_corpus, doc_text, exact_corpus, read_removed
from marin_assets_tests.core.dedup.corpora import shingle_jaccard, stdlib_documents


def grams(*ranges: range) -> np.ndarray:
    return np.unique(np.concatenate([np.arange(r.start, r.stop, dtype=np.uint64) for r in ranges]))


def test_removed_documents_never_act_as_representatives() -> None:
    a = grams(range(0, 100))
    b = grams(range(20, 120))  # 80% inside a
    c = grams(range(60, 80), range(100, 120), range(200, 210))  # 80% inside b, 40% inside a
    verdict = dedup.verify_cluster([300, 200, 100], [a, b, c], [False, False, False])
    assert [(r.index, r.representative) for r in verdict.removals] == [(1, 0)]
    assert verdict.removals[0].containment == pytest.approx(0.8)
    assert verdict.removals[0].jaccard == pytest.approx(80 / 120)


def test_exempt_members_are_kept_but_still_represent() -> None:
    a = grams(range(0, 100))
    b = grams(range(20, 120))
    c = grams(range(60, 80), range(100, 120), range(200, 210))
    verdict = dedup.verify_cluster([300, 200, 100], [a, b, c], [False, True, False])
    assert [(r.index, r.representative) for r in verdict.removals] == [(2, 1)]
    assert verdict.exempt_kept == 1


def in_processing_order(texts: list[str]) -> tuple[list[int], list[np.ndarray]]:
    texts = sorted(texts, key=lambda t: (-len(t), t))
    return [len(t) for t in texts], dedup.ngram_sets(texts)


@pytest.mark.parametrize("copies", [600, pytest.param(6000, marks=pytest.mark.system)])
def test_big_clusters_of_near_copies_keep_exactly_the_pairwise_survivors(copies: int) -> None:
    texts = near_copies(copies, seed=copies)
    assert shingle_jaccard(texts[0], texts[1]) >= 0.8
    lengths, grams = in_processing_order(texts)
    exempt = [i % 97 == 5 for i in range(copies)]
    greedy = dedup.verify_cluster(lengths, grams, exempt)
    pairwise = dedup.verify_cluster_pairwise(lengths, grams, exempt)
    assert [(r.index, r.representative, r.containment) for r in greedy.removals] == [(r.index, r.representative, r.containment) for r in pairwise.removals]
    assert greedy.exempt_kept == pairwise.exempt_kept
    survivors = copies - len(greedy.removals)
    assert survivors - greedy.exempt_kept < 10  # near-identical copies: a handful survive, as the rule says


def mixed_cluster(seed: int) -> tuple[list[int], list[np.ndarray], list[bool]]:
    """Four families of partial copies that borrow from each other, in processing order, and exempt flags."""
    rng = np.random.default_rng(seed)
    members, lengths = [], []
    for family in range(4):
        base = np.arange(family * 1000, family * 1000 + 120, dtype=np.uint64)
        for variant in range(60):
            keep = base[rng.random(base.size) < rng.uniform(0.4, 1.0)]
            other = np.arange(((family + 1) % 4) * 1000, ((family + 1) % 4) * 1000 + 120, dtype=np.uint64)
            borrowed = other[rng.random(other.size) < rng.uniform(0.0, 0.5)]
            unique = np.arange(rng.integers(0, 8), dtype=np.uint64) + np.uint64(10**6 + 100 * (family * 60 + variant))
            members.append(np.unique(np.concatenate([keep, borrowed, unique])))
            lengths.append(int(members[-1].size))
    order = sorted(range(len(members)), key=lambda i: -lengths[i])
    members = [members[i] for i in order]
    lengths = [lengths[i] for i in order]
    return lengths, members, [bool(x) for x in rng.random(len(members)) < 0.1]


def test_greedy_verification_equals_the_pairwise_rule_on_mixed_clusters() -> None:
    lengths, members, exempt = mixed_cluster(3)
    greedy = dedup.verify_cluster(lengths, members, exempt)
    pairwise = dedup.verify_cluster_pairwise(lengths, members, exempt)
    assert pairwise.removals and len(pairwise.removals) < len(members) - 20  # many retained: a real test of the filter
    assert [(r.index, r.representative, r.containment, r.jaccard) for r in greedy.removals] == [(r.index, r.representative, r.containment, r.jaccard) for r in pairwise.removals]
    assert greedy.exempt_kept == pairwise.exempt_kept
    assert greedy.comparisons < pairwise.comparisons


def test_a_verifier_past_its_memory_budget_spills_its_index_and_decides_the_same() -> None:
    """The retained members' n-grams go to memory-mapped files past the budget; the decisions
    are those of the pairwise rule (and of an unbounded verifier)."""
    lengths, members, exempt = mixed_cluster(8)
    pairwise = dedup.verify_cluster_pairwise(lengths, members, exempt)
    small = dedup.GreedyVerifier(FuzzyDedupParams(), memory_bytes=64 << 10)
    removals = [(r.index, r.representative, r.containment) for i, g in enumerate(members) if (r := small.offer(i, lengths[i], g, exempt[i])) is not None]
    assert small.retained.spilled > 0 and small.retained.held <= 64 << 10
    assert len(small.retained) > 20 and pairwise.removals  # many retained (spilled), some removed
    assert removals == [(r.index, r.representative, r.containment) for r in pairwise.removals]
    folder = small.retained.spill.folder
    small.close()
    assert folder and not Path(folder).exists()


def test_removal_ratio_helpers() -> None:
    ratios = dedup.removal_ratios({"a": 6, "b": 1}, {"a": 10, "b": 10, "c": 0})
    assert ratios == {"a": 0.6, "b": 0.1, "c": 0.0}
    assert dedup.sources_over_removal_limit(ratios, 0.5) == {"a": 0.6}


@pytest.mark.system
def test_scratch_is_collected_after_publishing_but_the_stored_index_is_kept(tmp_path: Path) -> None:
    normalized, buckets = big_cluster_corpus(tmp_path / "v1")
    cache = str(tmp_path / "cache")
    first = str(tmp_path / "first")
    stats = find_fuzzy_duplicates(buckets, normalized, set(), first, scale=SMALL_TASKS, cache_uri=cache)
    assert stats["scratch_bytes"] > 0
    assert sorted(p.name for p in (Path(first) / "_work").iterdir()) == ["labels", "verify"]  # the labels and verdicts the next run reuses
    entries = {s: [p.name for p in (Path(cache) / s).iterdir()] for s in buckets}
    assert all(len(e) == 1 for e in entries.values())
    # beta changes: its old cached map output goes once the incremental run has published
    normalized2, buckets2 = big_cluster_corpus(tmp_path / "v2", extra={"beta": stdlib_documents(2, seed=78)})
    for source in ("alpha", "gamma"):
        normalized2[source], buckets2[source] = normalized[source], buckets[source]
    other_run = Path(cache) / "beta" / "0123456789abcdef-s9-g16"  # another run's entry: not ours to remove
    other_run.mkdir()
    inc = str(tmp_path / "inc")
    inc_stats = find_fuzzy_duplicates(buckets2, normalized2, set(), inc, scale=SMALL_TASKS, cache_uri=cache, previous_uri=first)
    assert inc_stats["reused_clusters"] > 0 and inc_stats["changed_sources"] == ["beta"]
    after = {s: [p.name for p in (Path(cache) / s).iterdir()] for s in buckets}
    assert after["alpha"] == entries["alpha"] and after["gamma"] == entries["gamma"]
    assert other_run.exists() and entries["beta"][0] not in after["beta"] and len(after["beta"]) == 2
    # an earlier run's verdicts that are gone only cost the reuse, never the answer
    shutil.rmtree(Path(inc) / "_work" / "verify")
    again = str(tmp_path / "again")
    again_stats = find_fuzzy_duplicates(buckets2, normalized2, set(), again, scale=SMALL_TASKS, cache_uri=cache, previous_uri=inc)
    assert again_stats["reused_clusters"] == 0 and again_stats["removed_ids_digest"] == inc_stats["removed_ids_digest"]
    exact = find_exact_duplicates(exact_corpus(tmp_path / "e"), str(tmp_path / "exact"))
    assert exact["scratch_bytes"] > 0
    assert not (tmp_path / "exact" / "_work" / "map").exists() and not (tmp_path / "exact" / "_work" / "reduce").exists()


def test_removed_characters_come_from_the_tasks_and_match_the_texts(tmp_path: Path) -> None:
    normalized, buckets = big_cluster_corpus(tmp_path)
    out = str(tmp_path / "out")
    stats = find_fuzzy_duplicates(buckets, normalized, set(), out)
    for source in buckets:
        removed = {r["id"] for r in read_removed(out, source)}
        texts = [t for uri in normalized[source] for i, t in zip(*storage.read_parquet(uri, ["id", "text"]).to_pydict().values()) if i in removed]
        assert stats["removed_chars_per_source"][source] == sum(len(t) for t in texts)
    exact = find_exact_duplicates(exact_corpus(tmp_path / "e"), str(tmp_path / "exact"))
    assert exact["removed_chars_per_source"] == {"a_src": 0, "b_src": len(doc_text(2)) + len(doc_text(3)), "c_src": len(doc_text(3)) + len(doc_text(4)), "d_src": 0}

