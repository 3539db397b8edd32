"""The peer bench's pairwise reference (what it counts as a missed pair and a false removal) and
its draws of this project's LSH (the buckets it explains missed pairs with, and the cleanings)."""

from __future__ import annotations

import random

import pytest

from bench.bench_dedup_peers import CLEANINGS, Reference, draw_buckets, removals_from, sample, write_inputs
from marin_assets.core.dedup.minhash import MinHashParams, bucket_table
from marin_assets.core.runtime.integrity import text_ids


def words(rng: random.Random, n: int) -> list[str]:
    return [f"w{rng.randrange(50_000)}" for _ in range(n)]


def test_missed_pairs_and_false_removals_follow_the_exact_5_gram_sets() -> None:
    rng = random.Random(3)
    base, other = words(rng, 400), words(rng, 400)
    near = base[:200] + ["edited"] + base[201:]  # one word changed: J of the 5-gram sets ~0.98
    docs = [
        {"id": "a", "path": "x.py", "text": " ".join(base)},
        {"id": "b", "path": "x.py", "text": " ".join(near)},
        {"id": "c", "path": "y.py", "text": " ".join(other)},
    ]
    ref = Reference(docs)
    assert [(docs[a]["id"], docs[b]["id"]) for a, b in ref.similar] == [("a", "b")]
    assert ref.quality(set()) == {"missed": 1, "false": 0, "sampled": 0}
    assert ref.quality({"b"}) == {"missed": 0, "false": 0, "sampled": 1}
    assert ref.quality({"a", "b"})["false"] == 2  # no kept copy left: both removals are false
    assert ref.quality({"c"})["false"] == 1  # a document with no near copy at all


def test_a_sample_keeps_every_release_of_a_path_together() -> None:
    files = [(f"s{r % 3}", f"r{r}", f"lib/{p}.py") for p in range(50) for r in range(4)]
    chosen = sample(files, 30)
    paths = {f[2] for f in chosen}
    assert len(chosen) == 4 * len(paths) >= 30


def code_edit(rng: random.Random) -> list[dict[str, str]]:
    """A file, its next release with every third line's punctuation changed (``raise E, 'm'`` ->
    ``raise E('m')``: the same words) and an unrelated document, as the bench's documents."""
    lines = [f"    raise {w}, '{' '.join(words(rng, 10))}'" for w in words(rng, 40)]
    new = [line.replace(", '", "('") + ")" if k % 3 == 1 else line for k, line in enumerate(lines)]
    texts = ["\n".join(lines), "\n".join(new), " ".join(words(rng, 300))]
    return [{"source": s, "path": "x.py", "id": i, "text": t} for s, t, i in zip(("old", "new", "new"), texts, text_ids(texts))]


def test_draw_buckets_are_minhash_shards_at_the_default_seed_and_punctuation_as_a_space_joins_code_edits() -> None:
    docs = code_edit(random.Random(5))
    spaced = draw_buckets(docs, MinHashParams().seed)
    table, _ = bucket_table([d["id"] for d in docs], [d["text"] for d in docs], MinHashParams())
    assert spaced.tolist() == table.column("buckets").to_pylist()
    assert (spaced[0] == spaced[1]).all() and not (spaced[0] == spaced[2]).any()
    deleted = draw_buckets(docs, MinHashParams().seed, CLEANINGS[1])
    assert not (deleted[0] == deleted[1]).any()  # "raise e, 'v u'" and "raise e('v u')": words glued differently


@pytest.mark.system
def test_removals_from_runs_the_fuzzy_step_on_the_buckets_given(tmp_path) -> None:
    docs = code_edit(random.Random(5))
    write_inputs(tmp_path / "data", docs)
    # spaced: a candidate pair, verified, and of two equal lengths the copy in the source later by name goes; deleted: no candidates
    for cleaning, removed in zip(CLEANINGS, ({docs[0]["id"]}, set())):
        assert removals_from(tmp_path / "data", docs, draw_buckets(docs, MinHashParams().seed, cleaning), tmp_path / cleaning) == removed
