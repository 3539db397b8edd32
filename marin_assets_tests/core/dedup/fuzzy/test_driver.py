"""Fuzzy dedup end to end over small generated corpora: planted near-duplicates, the longest copy
kept, identical results across reruns, and the pairwise reference on big and chained clusters."""

from __future__ import annotations

import dataclasses
import functools
import json
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from marin_assets.core.dedup import decisions as dedup
from marin_assets.core.dedup.decisions import FuzzyDedupParams
from marin_assets.core.dedup.fuzzy import FuzzyScale, find_fuzzy_duplicates
from marin_assets.core.runtime import storage
from marin_assets.testing import dedup_corpus
from marin_assets.testing.dedup_corpus import doc_id
from marin_assets_tests.core.dedup.corpora import SMALL_TASKS, big_cluster_corpus, outputs, read_removed, write_source
from marin_assets_tests.core.dedup.reference import reference_fuzzy_removals
from marin_assets_tests.core.dedup.corpora import shingle_jaccard, stdlib_documents


def delete_words(text: str, count: int, rng: random.Random) -> str:
    words = text.split()
    drop = set(rng.sample(range(len(words)), count))
    return " ".join(w for i, w in enumerate(words) if i not in drop)


@functools.lru_cache(maxsize=1)
def fuzzy_corpus() -> tuple[list[str], dict[str, list[str]], dict[str, set[tuple[str, str]]]]:
    """Sources with planted near-duplicates: the base documents, texts per source and the
    expected (removed id, representative source) pairs per source."""
    rng = random.Random(17)
    base = stdlib_documents(40, per_doc=6, seed=17)
    near = {}
    for i in range(12):
        edited = delete_words(base[i], 2, rng)
        assert shingle_jaccard(base[i], edited) >= 0.9
        near[i] = edited
    far = [delete_words(base[i], len(base[i].split()) // 2, rng) for i in range(30, 34)]
    assert all(shingle_jaccard(base[30 + k], far[k]) < 0.5 for k in range(4))
    # a copy with a short tail added (5% of its words), whatever the docstring pool holds
    longer = {i: base[i] + "\n\n" + " ".join(base[39 - i].split()[: max(3, len(base[i].split()) // 20)]) for i in (17, 18)}
    assert all(shingle_jaccard(base[i], longer[i]) >= 0.9 for i in longer)
    texts = {
        "alpha": base[0:20] + base[30:34],
        "beta": [near[i] for i in range(0, 8)] + base[20:26] + [delete_words(base[20], 2, rng), longer[17]] + far,
        "gamma": [near[i] for i in range(8, 12)] + [longer[18]] + base[26:28],
        "delta": base[28:30],
    }
    expected = {
        "alpha": {(doc_id(base[17]), "beta"), (doc_id(base[18]), "gamma")},
        "beta": {(doc_id(near[i]), "alpha") for i in range(8)} | {(doc_id(texts["beta"][14]), "beta")},
        "gamma": set(),
        "delta": set(),
    }
    return base, texts, expected


def run_fuzzy(root: Path, shards: dict[str, int], **knobs) -> tuple[str, dict]:
    _, texts, _ = fuzzy_corpus()
    normalized, buckets = {}, {}
    for source, docs in texts.items():
        normalized[source], buckets[source] = write_source(root, source, docs, shards[source])
    out = str(root / "fuzzy")
    return out, find_fuzzy_duplicates(buckets, normalized, {"gamma"}, out, FuzzyDedupParams(), **knobs)


def test_fuzzy_finds_planted_near_duplicates_across_sources(tmp_path: Path) -> None:
    _, texts, expected = fuzzy_corpus()
    out, stats = run_fuzzy(tmp_path, {"alpha": 2, "beta": 1, "gamma": 1, "delta": 1})
    for source in texts:
        rows = read_removed(out, source)
        assert {(r["id"], r["representative_source"]) for r in rows} == expected[source], source
        for r in rows:
            assert r["containment"] >= 0.75 and 0 < r["jaccard"] <= 1
            assert r["representative_id"] != r["id"] or r["representative_source"] != source
    # The exempt source's contained copies were kept, and it still represents alpha's doc.
    assert stats["exempt_kept"] == 4
    assert stats["removed_per_source"] == {s: len(e) for s, e in expected.items()}
    assert stats["cluster_size_histogram"] and stats["examples"]
    json.dumps(stats)  # stats go into Dagster metadata as they are
    example = stats["examples"][0]
    assert example["excerpt"] and example["representative_excerpt"] and example["containment"] >= 0.75


def test_fuzzy_keeps_the_longest_copy(tmp_path: Path) -> None:
    base, texts, _ = fuzzy_corpus()
    out, _ = run_fuzzy(tmp_path, {"alpha": 1, "beta": 1, "gamma": 1, "delta": 1})
    rows = {r["id"]: r for r in read_removed(out, "alpha")}
    longer = texts["beta"][15]
    assert len(longer) > len(base[17])
    removed = rows[doc_id(base[17])]
    assert removed["representative_id"] == doc_id(longer) == removed["cluster_id"]
    assert doc_id(longer) not in {r["id"] for r in read_removed(out, "beta")}


def test_fuzzy_results_are_identical_across_reruns_shard_counts_and_spilling(tmp_path: Path) -> None:
    first, _ = run_fuzzy(tmp_path / "a", {"alpha": 1, "beta": 1, "gamma": 1, "delta": 1})
    again, _ = run_fuzzy(tmp_path / "b", {"alpha": 1, "beta": 1, "gamma": 1, "delta": 1})
    resharded, stats = run_fuzzy(
        tmp_path / "c",
        {"alpha": 3, "beta": 2, "gamma": 4, "delta": 2},
        scale=FuzzyScale(records_per_task=500, edges_per_task=10, union_find_max_edges=0, members_per_task=8),
    )
    assert stats["bucket_partitions"] > 1 and stats["verify_partitions"] > 1
    assert stats["cc_method"] == "star_rounds" and stats["cc_rounds"] >= 1
    for source in ("alpha", "beta", "gamma", "delta"):
        reference = storage.read_bytes(dedup.removed_uri(first, source))
        assert storage.read_bytes(dedup.removed_uri(again, source)) == reference
        assert storage.read_bytes(dedup.removed_uri(resharded, source)) == reference


def test_fuzzy_rejects_buckets_that_are_not_co_partitioned(tmp_path: Path) -> None:
    normalized, buckets = write_source(tmp_path, "alpha", stdlib_documents(4, seed=1), 2)
    with pytest.raises(dedup.DedupError, match="source 'alpha'.*rematerialize minhash_buckets"):
        find_fuzzy_duplicates({"alpha": buckets[:1]}, {"alpha": normalized}, set(), str(tmp_path / "out"))


@pytest.mark.system
def test_sharded_fuzzy_dedup_equals_the_pairwise_reference_with_a_600_copy_cluster(tmp_path: Path) -> None:
    normalized, buckets = big_cluster_corpus(tmp_path)
    out = str(tmp_path / "out")
    stats = find_fuzzy_duplicates(buckets, normalized, {"gamma"}, out, scale=SMALL_TASKS)
    assert stats["largest_cluster"] >= 550 and stats["cc_method"] == "star_rounds" and stats["verify_partitions"] > 1
    assert outputs(out, buckets) == reference_fuzzy_removals(buckets, normalized, {"gamma"})
    assert stats["removed"] > 400 and stats["streamed_clusters"] == 0
    # the big cluster verified batch by batch (texts read from storage 20 KB at a time): the same files
    streamed = str(tmp_path / "streamed")
    small_batches = dataclasses.replace(SMALL_TASKS, cluster_chars_in_memory=50_000, verify_batch_chars=20_000)
    streamed_stats = find_fuzzy_duplicates(buckets, normalized, {"gamma"}, streamed, scale=small_batches)
    assert streamed_stats["streamed_clusters"] == 1
    for source in buckets:
        assert storage.read_bytes(dedup.removed_uri(streamed, source)) == storage.read_bytes(dedup.removed_uri(out, source))


def chained_corpus(root: Path, docs: int, copy_every: int) -> tuple[dict, dict, set[tuple[str, str]]]:
    """One source whose candidate component is a chain of ``docs`` distinct documents (each a
    60-word window of one random text, 20 words past the one before: neighbours share two
    thirds of their words, under the rule's threshold), written with MinHash buckets that link
    each document to the next (A~B, B~C, A not ~ C), plus a one-word-shorter copy of every
    ``copy_every``-th document in the same buckets. Returns the expected (removed, representative) ids."""
    rng = random.Random(3)
    vocab = [f"w{k}" for k in range(50_000)]
    words = [rng.choice(vocab) for _ in range(20 * docs + 60)]
    texts = [" ".join(words[20 * i : 20 * i + 60]) for i in range(docs)]
    copies = {i: " ".join(words[20 * i + 1 : 20 * i + 60]) for i in range(0, docs, copy_every)}
    rows = [(doc_id(t), t, [i // 2, docs + (i + 1) // 2]) for i, t in enumerate(texts)] + [(doc_id(c), c, [i // 2, docs + (i + 1) // 2]) for i, c in copies.items()]
    rows.sort()
    normalized = dedup_corpus.write_normalized(str(root), "chain", [t for _, t, _ in rows], 1)
    bucket_uri = str(root / "buckets" / "chain" / storage.basename(normalized[0]))
    table = pa.table({"id": [i for i, _, _ in rows], "buckets": pa.array([b for _, _, b in rows], pa.list_(pa.uint64())), "chars": [len(t) for _, t, _ in rows]})
    storage.write_parquet(table, bucket_uri)
    return {"chain": normalized}, {"chain": [bucket_uri]}, {(doc_id(c), doc_id(texts[i])) for i, c in copies.items()}


@pytest.mark.system
def test_a_chained_component_of_20000_distinct_documents_is_verified_within_the_index_budget(tmp_path: Path) -> None:
    normalized, buckets, expected = chained_corpus(tmp_path, 20_000, 1000)
    scale = dataclasses.replace(FuzzyScale(), verify_index_bytes=4 << 20)
    out = str(tmp_path / "out")
    stats = find_fuzzy_duplicates(buckets, normalized, set(), out, scale=scale)
    assert stats["largest_cluster"] == 20_000 + len(expected)
    assert {(r["id"], r["representative_id"]) for r in read_removed(out, "chain")} == expected
    assert stats["verify_spilled_bytes"] > 0 and stats["largest_verify_index_bytes"] <= 4 << 20


def test_a_small_chained_component_keeps_exactly_the_pairwise_survivors(tmp_path: Path) -> None:
    normalized, buckets, expected = chained_corpus(tmp_path, 400, 40)
    out = str(tmp_path / "out")
    stats = find_fuzzy_duplicates(buckets, normalized, set(), out, scale=dataclasses.replace(FuzzyScale(), verify_index_bytes=64 << 10))
    assert stats["largest_cluster"] == 400 + len(expected) and stats["verify_spilled_bytes"] > 0
    assert {(r["id"], r["representative_id"]) for r in read_removed(out, "chain")} == expected
    assert outputs(out, buckets) == reference_fuzzy_removals(buckets, normalized, set())



def test_gather_reads_requested_rows_across_row_groups_and_batches_in_request_order(tmp_path: Path) -> None:
    from marin_assets.core.dedup.fuzzy.gather import READ_ROWS, _requested_rows  # noqa: PLC0415
    from marin_assets.core.runtime.integrity import text_ids  # noqa: PLC0415

    rows = 3 * READ_ROWS + 7
    text = [("x" * (i % 300)) + str(i) if i % 11 else None for i in range(rows)]
    uri = str(tmp_path / "part-00000-of-00001.parquet")
    id_of = [text_ids(pa.array([t]))[0] if t else f"{i:06d}" for i, t in enumerate(text)]
    storage.write_parquet(pa.table({"id": id_of, "text": text}), uri, row_group_size=READ_ROWS + 500)
    take = np.array([rows - 1, 3, READ_ROWS + 500, 3, 2 * READ_ROWS - 1, 0, 22])
    ids, texts = _requested_rows(uri, take, 50)
    assert ids.to_pylist() == [id_of[i] for i in take]
    assert texts.to_pylist() == [(text[i] or "")[:50] for i in take]
