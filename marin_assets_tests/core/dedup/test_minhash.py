"""MinHash buckets: bit-exact against datasketch, the banding S-curve, near-duplicate recall."""

from __future__ import annotations

import random
import string

import numpy as np
import pyarrow as pa
import pytest
import xxhash

from marin_assets.core.dedup import minhash
from marin_assets.core.dedup.minhash import MinHashParams
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.integrity import text_ids
from marin_assets_tests.core.dedup.corpora import shingle_jaccard, stdlib_docstrings, stdlib_documents


def vocabulary() -> list[str]:
    return sorted({w for d in stdlib_docstrings()[:200] for w in d.split()})


def edit_words(text: str, edits: int, rng: random.Random, vocab: list[str]) -> str:
    """Replace ``edits`` distinct random words of ``text`` with random vocabulary words."""
    words = text.split()
    for i in rng.sample(range(len(words)), min(edits, len(words))):
        words[i] = rng.choice(vocab) + "x"  # a word that is surely different
    return " ".join(words)


def share_bucket(a: str, b: str, params: MinHashParams = MinHashParams()) -> bool:
    sig = minhash.signatures([a, b], params)
    buckets = minhash.band_buckets(sig, *params.bands_and_rows())
    return bool((buckets[0] == buckets[1]).any())


# --------------------------------------------------------------------------- hashing and text


def test_xxh3_kernel_equals_the_xxhash_library_for_every_length() -> None:
    rng = np.random.default_rng(7)
    data = rng.integers(0, 256, 8192, dtype=np.uint8).tobytes()
    # Every length through the 240-byte mid size, then long inputs around the 1 KiB blocks.
    lengths = np.concatenate([np.repeat(np.arange(0, 300), 3), [1023, 1024, 1025, 2047, 2048, 2049, 3100, 4096]])
    starts = rng.integers(0, len(data) - 4096, lengths.size)
    got = minhash.xxh3_64_spans(data, starts, lengths)
    expected = [xxhash.xxh3_64_intdigest(data[s : s + n]) for s, n in zip(starts.tolist(), lengths.tolist())]
    assert got.tolist() == expected


def test_clean_text_lowercases_reads_punctuation_as_space_and_collapses_whitespace() -> None:
    assert minhash.clean_text("  Hello,  World!\n\tIt's  (very) \u00a0 GOOD.  ") == "hello world it s very good"
    assert minhash.clean_text("raise E('m')") == minhash.clean_text("raise E, 'm'") == "raise e m"
    assert minhash.clean_text("abc def", cap_chars=5) == "abc d"
    assert minhash.clean_text("-- ... !!") == ""
    assert all(ch not in minhash.clean_text(string.punctuation + " x") for ch in string.punctuation)


def test_batch_cleaning_equals_clean_text_on_awkward_whitespace() -> None:
    texts = [
        "  lead and trail  ", "a - b -- c", "tabs\tand\r\nnewlines\x0b\x0cfeeds", "sep\x1cfile\x1dgroup\x1erecord\x1funit",
        "nul\x00kept as a character", "\n\n\n", "", "UPPER Case, MiXeD!", "nbsp\u00a0ideographic\u3000line\u2028next\x85end",
        "  ünïcödé   and  ascii  ", "...", "x" * 40 + " . " + "y", "İstanbul ΣΑΣ",
    ]  # fmt: skip
    expected = "\n".join(minhash.clean_text(t) for t in texts).encode("utf-8")
    assert minhash.clean_batch(texts) == expected
    assert minhash.clean_batch(texts, cap_chars=7) == "\n".join(minhash.clean_text(t, 7) for t in texts).encode("utf-8")


def test_batch_cleaning_equals_clean_text_on_every_code_point() -> None:
    """Every character (surrogates aside), mixed with ASCII capitals, punctuation and spaces,
    so each of Python's lowercase and whitespace rules is checked, with caps that fall inside
    characters of 1 to 4 UTF-8 bytes. The two characters that send a text to Python's
    str.lower (U+0130, U+03A3) get texts of their own, so the others stay on the kernel."""
    rng = random.Random(4)
    points = [c for c in range(1, 0x110000) if not 0xD800 <= c < 0xE000 and c not in (0x130, 0x3A3)]
    texts = []
    for i in range(0, len(points), 4096):
        chunk = [chr(c) for c in points[i : i + 4096]]
        texts.append("".join(ch + rng.choice(["", "", "A", " ", "-", "  "]) for ch in chunk))
    assert minhash.clean_batch(texts) == "\n".join(minhash.clean_text(t) for t in texts).encode("utf-8")
    sample = texts[::23] + ["ÀÉÎ ǅ ẞ σς K Å ꞋꟅ 𐐀𐐨 \U0001e900", "ΣΑΣ. ΌΣΟΣ Σ", "İi İSTANBUL"]
    for cap in (1, 2, 3, 5, 17, 1000):
        assert minhash.clean_batch(sample, cap) == "\n".join(minhash.clean_text(t, cap) for t in sample).encode("utf-8")


def test_awkward_texts_sign_as_datasketch_does() -> None:
    """Every cleaning rule matters here: texts of 1-4 words are one shingle, the whole text,
    so any difference in case, punctuation or whitespace changes the signature."""
    spaces = "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2005\u200a\u2028\u2029\u202f\u205f\u3000"
    texts = [
        "  lead and trail  ", "a - b -- c", "a-b c", "tabs\tand\r\nnewlines\x0b\x0cfeeds", "sep\x1cfile\x1dgroup\x1erecord\x1funit",
        "nul\x00kept", "\n\n\n", "", "UPPER Case, MiXeD!", "nbsp\u00a0ideographic\u3000line\u2028next\x85end",
        "  ünïcödé   and  ascii  ", "...", "x" * 40 + " . " + "y", "İstanbul ΣΑΣ", "zero\u200bwidth is no space",
        "\u00c2\u00a0 is not \u00a0", "é\u3000\u3000 ,\u2001 ", "ok\u2029", "日本語の文章 です", "em—dash… ‰ 、 © ½ ‧  ", "\u1680ogham",
    ]  # fmt: skip
    texts += [f"left{ch}right" for ch in spaces] + [f"one{ch}{ch}two ,{ch}. three" for ch in spaces]
    params = MinHashParams(num_perms=16, num_bands=4, rows_per_band=4)
    ours = minhash.signatures(texts, params)
    for text, row in zip(texts, ours):
        assert np.array_equal(minhash.datasketch_minhash(text, params).hashvalues, row), repr(text)


def test_short_texts_are_one_shingle_and_the_kernel_counts_the_reference_shingles() -> None:
    texts = ["one two three", "", "a b c d e f g", "ünï cödé wörds are here today and tomorrow", "x", "  Σ İ ,, a  b  "]
    assert minhash.shingles("one two three") == [b"one two three"]
    assert minhash.shingles("") == []
    _, counts = minhash.signatures_and_counts(texts)
    assert counts.tolist() == [len(minhash.shingles(minhash.clean_text(t), 5)) for t in texts] == [1, 0, 3, 4, 1, 1]
    cleaned = [minhash.clean_text(t) for t in texts]
    joined = "\n".join(cleaned).encode()
    starts, lengths, span_counts = minhash.ngram_spans(joined, len(texts), 5)
    spans = [joined[s : s + n] for s, n in zip(starts.tolist(), lengths.tolist())]
    assert spans == [s for t in cleaned for s in minhash.shingles(t, 5)]
    assert span_counts.tolist() == counts.tolist()


# --------------------------------------------------------------------------- signatures


def random_texts(count: int, seed: int) -> list[str]:
    """Texts that exercise the corner cases: unicode, punctuation, long words, short, empty."""
    rng = random.Random(seed)
    vocab = vocabulary() + ["Σίσυφος", "naïve", "日本語の文章", "x" * 150, "emoji🙂", "ΣΑΣ", "İstanbul"]
    texts = ["", "   ", "!!!", "one", "two words", "exactly five words right here"]
    while len(texts) < count:
        n = rng.choice([3, 8, 40, 300, 1200])
        seps = [" ", "  ", "\n", "\t", ", ", ". "]
        texts.append("".join(rng.choice(vocab) + rng.choice(seps) for _ in range(n)))
    return texts


def test_signatures_equal_datasketch_bit_for_bit() -> None:
    texts = random_texts(40, seed=1)
    params = MinHashParams()
    ours = minhash.signatures(texts, params)
    assert ours.shape == (len(texts), 286) and ours.dtype == np.uint64
    for text, row in zip(texts, ours):
        reference = minhash.datasketch_minhash(text, params).hashvalues
        assert np.array_equal(reference, row), text[:80]


def test_signatures_equal_datasketch_with_other_parameters() -> None:
    params = MinHashParams(num_perms=37, num_bands=6, rows_per_band=6, ngram_size=3, seed=7, text_cap_chars=300)
    texts = random_texts(12, seed=2)
    ours = minhash.signatures(texts, params)
    for text, row in zip(texts, ours):
        assert np.array_equal(minhash.datasketch_minhash(text, params).hashvalues, row)


def test_signatures_do_not_depend_on_batch_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    texts = random_texts(30, seed=3)
    whole = minhash.signatures(texts)
    monkeypatch.setattr(minhash, "JIT_SHINGLE_CHUNK", 40)  # several chunks per long text
    assert np.array_equal(minhash.signatures(texts), whole)
    assert np.array_equal(np.vstack([minhash.signatures([t]) for t in texts]), whole)


def test_arrow_input_equals_list_input() -> None:
    """Shards hand Arrow arrays over as they are: sliced, chunked, with nulls, string or
    large_string; the signatures must be those of the same texts as a list."""
    texts = random_texts(24, seed=6) + [None, "İstanbul ΣΑΣ", None]
    expected = minhash.signatures(texts)
    assert np.array_equal(minhash.signatures(pa.chunked_array([pa.array(texts[:10]), pa.array(texts[10:])])), expected)
    assert np.array_equal(minhash.signatures(pa.array(texts, pa.large_string())), expected)
    sliced = pa.chunked_array([pa.array(["dropped"] + texts[:13]), pa.array(texts[13:] + ["dropped"])]).slice(1, len(texts))
    assert np.array_equal(minhash.signatures(sliced), expected)
    assert np.array_equal(minhash.signatures(pa.array(["a", *texts], pa.string()).slice(1)), expected)


def fmix64(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finalizer, in numpy: the pre-mix of datasketch's affine64 scheme."""
    for shift, factor in ((33, 0xFF51AFD7ED558CCD), (33, 0xC4CEB9FE1A85EC53)):
        h = (h ^ (h >> np.uint64(shift))) * np.uint64(factor)
    return h ^ (h >> np.uint64(33))


def test_signatures_from_hashes_match_a_direct_minimum(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(8)
    counts = np.array([0, 1, 2, 31, 32, 33, 0, 700, 5])
    hashes = rng.integers(0, 2**64 - 1, int(counts.sum()), dtype=np.uint64, endpoint=True)
    a, b = minhash.permutations(37, 3)
    monkeypatch.setattr(minhash, "JIT_SHINGLE_CHUNK", 100)
    sig = minhash.signatures_from_hashes(hashes, counts, a, b)
    mixed = np.split(fmix64(hashes), np.cumsum(counts)[:-1])
    for row, doc in zip(sig, mixed):
        expected = (a[:, None] * doc[None, :] + b[:, None]).min(axis=1) if doc.size else np.full(37, 2**64 - 1, np.uint64)
        assert np.array_equal(row, expected)


def test_permutations_are_odd_and_seeded() -> None:
    a, b = minhash.permutations(286, 42)
    assert a.size == b.size == 286 and bool(np.all(a & np.uint64(1)))
    a2, _ = minhash.permutations(286, 43)
    assert not np.array_equal(a, a2)


# --------------------------------------------------------------------------- banding


def random_pair(similarity_num: int, union: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Two random hash sets with Jaccard exactly similarity_num / union (equal sizes)."""
    values = rng.integers(0, 2**64 - 1, union, dtype=np.uint64, endpoint=True)
    common = values[:similarity_num]
    rest = values[similarity_num:]
    half = rest.size // 2
    return np.concatenate([common, rest[:half]]), np.concatenate([common, rest[half:]])


def test_candidate_rate_follows_the_banding_s_curve() -> None:
    params = MinHashParams()
    bands, rows = params.bands_and_rows()
    a, b = minhash.permutations(params.num_perms, params.seed)
    rng = np.random.default_rng(11)
    union, trials = 200, 400
    for common in (80, 110, 130, 140, 150, 160, 170, 180):  # s = 0.40 .. 0.90, (union - common) even
        s = common / union
        sets = [x for _ in range(trials) for x in random_pair(common, union, rng)]
        sig = minhash.signatures_from_hashes(np.concatenate(sets), np.array([len(x) for x in sets]), a, b)
        buckets = minhash.band_buckets(sig, bands, rows).reshape(trials, 2, bands)
        observed = float((buckets[:, 0] == buckets[:, 1]).any(axis=1).mean())
        expected = float(minhash.candidate_probability(s, bands, rows))
        tolerance = 4 * np.sqrt(expected * (1 - expected) / trials) + 0.01
        assert abs(observed - expected) <= tolerance, (s, observed, expected)


def test_threshold_option_derives_bands_and_rows() -> None:
    loose, strict = MinHashParams(threshold=0.5), MinHashParams(threshold=0.9)
    for params in (loose, strict):
        bands, rows = params.bands_and_rows()
        assert bands * rows <= params.num_perms
        p_at_threshold = float(minhash.candidate_probability(params.threshold, bands, rows))
        assert 0.2 < p_at_threshold < 0.95, (params.threshold, bands, rows)
    assert minhash.candidate_probability(0.7, *loose.bands_and_rows()) > minhash.candidate_probability(0.7, *strict.bands_and_rows())
    with pytest.raises(ValueError, match="permutations"):
        MinHashParams(num_bands=30, rows_per_band=11)


def test_near_duplicates_by_edit_are_candidates_and_dissimilar_texts_are_not() -> None:
    rng = random.Random(5)
    vocab = vocabulary()
    high, low = [], []
    for text in stdlib_documents(60, seed=5):
        for edits in (1, 3, 6, 40, 80):
            edited = edit_words(text, edits, rng, vocab)
            j = shingle_jaccard(text, edited)
            (high if j >= 0.9 else low if j < 0.5 else []).append(share_bucket(text, edited))
    assert len(high) >= 60 and len(low) >= 60
    assert all(high)
    assert sum(low) <= max(1, 0.03 * len(low))


# --------------------------------------------------------------------------- per-shard function


def test_minhash_shard_writes_one_bucket_list_per_row_in_row_order(tmp_path) -> None:
    texts = stdlib_documents(5, seed=9) + ["", None, "tiny text"]
    ids = [text_ids([t])[0] if t is not None else f"{i:032x}" for i, t in enumerate(texts)]
    src = str(tmp_path / "normalized" / storage.shard_name(0, 1))
    storage.write_parquet(pa.table({"id": ids, "text": pa.array(texts, pa.string()), "source_id": ids}), src)
    out = str(tmp_path / "buckets" / storage.shard_name(0, 1))
    stats = minhash.minhash_shard([src], out, MinHashParams())
    table = storage.read_parquet(out)
    assert table.column_names == ["id", "buckets", "chars"]
    assert table.schema.field("buckets").type == pa.list_(pa.uint64())
    assert table.column("id").to_pylist() == ids
    lengths = [len(b) for b in table.column("buckets").to_pylist()]
    assert lengths == [26] * 5 + [0, 0, 26]
    assert table.column("chars").to_pylist() == [len(t or "") for t in texts]
    assert stats["docs"] == 8 and stats["docs_without_shingles"] == 2 and stats["null_text"] == 1
    sig = minhash.signatures([texts[0]])
    assert table.column("buckets")[0].as_py() == minhash.band_buckets(sig, 26, 11)[0].tolist()


def test_minhash_shard_output_does_not_depend_on_batching(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    texts = stdlib_documents(12, seed=4) + [None, ""]
    src = str(tmp_path / storage.shard_name(0, 1))
    storage.write_parquet(pa.table({"id": text_ids(texts), "text": pa.array(texts, pa.string())}), src)
    whole = str(tmp_path / "whole.parquet")
    minhash.minhash_shard([src], whole, MinHashParams())
    monkeypatch.setattr(minhash, "BATCH_DOCS", 3)
    monkeypatch.setattr(minhash, "BATCH_BYTES", 2000)
    assert len(minhash.batch_bounds(np.array([len(t or "") for t in texts]), 500_000)) > len(texts) // 3
    batched = str(tmp_path / "batched.parquet")
    minhash.minhash_shard([src], batched, MinHashParams())
    assert storage.read_parquet(batched).equals(storage.read_parquet(whole))


def test_text_cap_limits_what_is_hashed() -> None:
    params = MinHashParams(text_cap_chars=1000)
    base = stdlib_documents(1, per_doc=8, seed=3)[0]
    assert len(base) > 1200
    # Enough new words that some of the 286 minima surely move when the tail is hashed.
    tail_changed = base[:1000] + base[1000:].upper() + " " + " ".join(f"tail{i}" for i in range(60))
    assert np.array_equal(minhash.signatures([base], params), minhash.signatures([tail_changed], params))
    assert not np.array_equal(minhash.signatures([base]), minhash.signatures([tail_changed]))
