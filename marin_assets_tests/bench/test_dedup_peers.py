"""The peer bench's pairwise reference: what it counts as a missed pair and a false removal."""

from __future__ import annotations

import random

from bench.bench_dedup_peers import Reference, sample


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
