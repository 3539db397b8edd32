"""Generated corpora with near-duplicate clusters, for the dedup tests and the dedup benchmark.

One way to make a near copy (random word edits of a base text: replace, delete or insert),
used by both, so the test corpora and the benchmark corpus mean the same thing by "near copy".
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import pyarrow as pa
import xxhash

from marin_assets.core.runtime import storage


def edit_words(base: Sequence[str], edits: int, rng: random.Random, vocab: Sequence[str]) -> str:
    """``base`` with ``edits`` random word edits (40% replace, 30% delete, 30% insert)."""
    words = list(base)
    for _ in range(edits):
        pos = rng.randrange(len(words))
        op = rng.random()
        if op < 0.4:
            words[pos] = rng.choice(vocab)
        elif op < 0.7:
            del words[pos]
        else:
            words.insert(pos, rng.choice(vocab))
    return " ".join(words)


def near_copies(count: int, seed: int, words: int = 200, max_edits: int = 3) -> list[str]:
    """``count`` copies of one random text, each with 1..max_edits random word edits."""
    rng = random.Random(seed)
    vocab = [f"w{rng.randrange(10**6)}" for _ in range(5000)]
    base = [rng.choice(vocab) for _ in range(words)]
    return [edit_words(base, rng.randint(1, max_edits), rng, vocab) for _ in range(count)]


def clustered_sources(
    sources: int, clusters: Sequence[int], unique: int, scale: int, seed: int, words: int = 100, exact_share: float = 0.03
) -> dict[str, list[str]]:
    """Texts per source (``source_00`` ...): ``scale`` times the pattern of near-duplicate
    ``clusters`` (their sizes; 1 to 3 edits per copy) and ``unique`` unrelated texts, each
    text in a random source, then ``exact_share`` of each source's texts copied into another."""
    rng = random.Random(seed)
    vocab = [f"w{rng.randrange(10**7)}" for _ in range(50_000)]
    texts: dict[str, list[str]] = {f"source_{s:02d}": [] for s in range(sources)}
    names = list(texts)
    for _ in range(scale):
        for size in clusters:
            base = [rng.choice(vocab) for _ in range(words)]
            for _ in range(size):
                texts[rng.choice(names)].append(edit_words(base, rng.randint(1, 3), rng, vocab))
        for _ in range(unique):
            texts[rng.choice(names)].append(" ".join(rng.choice(vocab) for _ in range(words)))
    for name in names:
        for text in list(texts[name]):
            if rng.random() < exact_share:
                texts[rng.choice([n for n in names if n != name])].append(text)
    return texts


def doc_id(text: str) -> str:
    return xxhash.xxh3_128_hexdigest(text.encode("utf-8"))


def write_normalized(root: str, source: str, texts: Sequence[str], shards: int) -> list[str]:
    """Normalized-like shards of ``texts``: id = hash of the text (one row per id), rows
    hash-partitioned by id, sorted by id within a shard."""
    rows = sorted({doc_id(t): t for t in texts}.items())
    uris = []
    for k in range(shards):
        mine = [(i, t) for i, t in rows if int(i, 16) % shards == k]
        uri = storage.join(root, "normalized", source, storage.shard_name(k, shards))
        table = pa.table(
            {"id": [i for i, _ in mine], "text": [t for _, t in mine], "source_id": [i for i, _ in mine]},
            schema=pa.schema([("id", pa.string()), ("text", pa.string()), ("source_id", pa.string())]),
        )
        storage.write_parquet(table, uri)
        uris.append(uri)
    return uris
