"""MinHash LSH buckets per document: the per-source half of fuzzy deduplication.

Each normalized document gets one bucket id per LSH band; two documents that share a bucket in
any band become candidate near-duplicates for the global ``fuzzy_duplicates`` step
(``marin_assets.core.dedup``). The output is co-partitioned with ``normalized``: same shard
basenames, same row order, columns ``id`` and ``buckets`` (list<uint64>).

The function, fixed by :class:`MinHashParams`:

* text: capped at 500,000 characters (a mega-document would saturate its signature and link
  unrelated documents), lowercased, the 32 ASCII punctuation characters removed, whitespace
  runs (Unicode whitespace, as ``str.split``) collapsed to one space, trimmed;
* shingles: word 5-grams of the cleaned text, i.e. the byte substrings spanning 5 consecutive
  words; a text of 1-4 words is one shingle (the whole text); an empty text has none;
* shingle hash: xxh3-64 (seed 0) of the shingle's UTF-8 bytes;
* permutations: datasketch's ``affine64`` family. The shingle hash is pre-mixed with the
  MurmurHash3 64-bit finalizer ``fmix64`` (a bijection), then permutation ``k`` maps
  ``h -> (a_k * h + b_k) mod 2**64`` with odd ``a_k`` (a bijection too). We chose this family
  over the Mersenne-prime one because uint64 wrap-around *is* the modulus: numpy computes it
  exactly with one multiply and one add per (shingle, permutation), no 128-bit products, no
  modulo. ``a_k, b_k`` come from numpy's PCG64 seeded with ``seed`` (42);
* signature: per permutation the minimum over the document's shingles (2**64-1 when empty);
* bands: the first ``bands * rows`` signature values, ``bands`` groups of ``rows``; a band's
  bucket id is xxh3-64 of its ``rows`` values as little-endian u64 bytes (88 bytes for 11).

The fast path hashes every shingle of a batch of documents at once with a numpy port of xxh3
(exact for inputs up to 128 bytes; longer inputs go through the ``xxhash`` library) and
applies permutations in cache-sized blocks. :func:`datasketch_minhash` builds the same
signature with datasketch's ``MinHash`` (``scheme="affine64"``, ``hashfunc=xxh3_64``,
``permutations=(a, b)``): the two are equal bit for bit, which the tests check.
"""

from __future__ import annotations

import dataclasses
import functools
import string
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from marin_assets.core import storage

# --------------------------------------------------------------------------- parameters


@dataclasses.dataclass(frozen=True)
class MinHashParams:
    """MinHash LSH parameters; the defaults are the reference values (P(candidate) is 50% near
    Jaccard 0.74, 90% at 0.8, 1.3% at 0.5).

    ``threshold``: when set, bands and rows are not taken from ``num_bands``/``rows_per_band``
    but derived by datasketch's optimiser (equal false-positive/false-negative weights) for
    that Jaccard threshold and ``num_perms``.
    """

    num_perms: int = 286
    num_bands: int = 26
    rows_per_band: int = 11
    ngram_size: int = 5
    seed: int = 42
    text_cap_chars: int = 500_000
    threshold: float | None = None

    def __post_init__(self) -> None:
        if self.num_perms < 1 or self.ngram_size < 1 or self.text_cap_chars < 1:
            raise ValueError(f"MinHashParams: num_perms, ngram_size and text_cap_chars must be positive: {self}")
        if self.threshold is not None and not 0.0 < self.threshold < 1.0:
            raise ValueError(f"MinHashParams.threshold must be in (0, 1), got {self.threshold}")
        bands, rows = self.bands_and_rows()
        if bands < 1 or rows < 1 or bands * rows > self.num_perms:
            raise ValueError(
                f"MinHashParams: {bands} bands x {rows} rows needs {bands * rows} permutations "
                f"but num_perms is {self.num_perms}; lower the bands or rows, or raise num_perms"
            )

    def bands_and_rows(self) -> tuple[int, int]:
        if self.threshold is None:
            return self.num_bands, self.rows_per_band
        return optimal_bands_and_rows(self.threshold, self.num_perms)


@functools.lru_cache(maxsize=32)
def optimal_bands_and_rows(threshold: float, num_perms: int) -> tuple[int, int]:
    """(bands, rows) minimising the false-positive plus false-negative area around ``threshold``."""
    from datasketch.lsh import _optimal_param  # noqa: PLC0415 (imports scipy; only when asked)

    bands, rows = _optimal_param(threshold, num_perms, 0.5, 0.5)
    return int(bands), int(rows)


def candidate_probability(similarity: float | np.ndarray, bands: int, rows: int) -> float | np.ndarray:
    """P(two documents with Jaccard ``similarity`` share at least one band): 1-(1-s^r)^b."""
    return 1.0 - (1.0 - np.asarray(similarity, dtype=np.float64) ** rows) ** bands


# --------------------------------------------------------------------------- text and shingles

_PUNCTUATION = str.maketrans("", "", string.punctuation)


def clean_text(text: str, cap_chars: int = 500_000) -> str:
    """Cap, lowercase, drop ASCII punctuation, collapse whitespace, trim."""
    return " ".join(text[:cap_chars].lower().translate(_PUNCTUATION).split())


def shingles(cleaned: str, n: int = 5) -> list[bytes]:
    """The word n-gram shingles of a cleaned text, as UTF-8 bytes (reference, one at a time)."""
    words = cleaned.split(" ") if cleaned else []
    if not words:
        return []
    if len(words) < n:
        return [cleaned.encode("utf-8")]
    return [" ".join(words[i : i + n]).encode("utf-8") for i in range(len(words) - n + 1)]


def ngram_spans(joined: bytes, num_docs: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Byte spans of the word n-grams of ``num_docs`` texts joined by ``\\n``.

    Each text must be words separated by single spaces (no other whitespace, none leading or
    trailing). Returns ``(starts, lengths, counts)``: the n-grams in document order and the
    number per document (a text of 1..n-1 words is one n-gram, an empty text none).
    """
    buf = np.frombuffer(joined, dtype=np.uint8)
    sep = np.flatnonzero((buf == 32) | (buf == 10))
    newline = buf[sep] == 10
    # Segments between separators are words, or empty where a text is empty.
    seg_start = np.concatenate([[0], sep + 1])
    seg_end = np.concatenate([sep, [buf.size]])
    seg_doc = np.concatenate([[0], np.cumsum(newline)])
    word = seg_end > seg_start
    word_starts, word_ends, word_doc = seg_start[word], seg_end[word], seg_doc[word]
    words_per_doc = np.bincount(word_doc, minlength=num_docs).astype(np.int64)
    first_word = np.zeros(num_docs, np.int64)
    np.cumsum(words_per_doc[:-1], out=first_word[1:])
    counts = np.where(words_per_doc >= n, words_per_doc - n + 1, (words_per_doc > 0).astype(np.int64))
    total = int(counts.sum())
    gram_doc = np.repeat(np.arange(num_docs), counts)
    gram_first = np.zeros(num_docs, np.int64)
    np.cumsum(counts[:-1], out=gram_first[1:])
    first = first_word[gram_doc] + np.arange(total, dtype=np.int64) - gram_first[gram_doc]
    last = first + np.minimum(words_per_doc, n)[gram_doc] - 1
    starts = word_starts[first]
    return starts, word_ends[last] - starts, counts


# ASCII fast path of clean_text: lowercase, then one bytes.translate that deletes punctuation
# and maps every ASCII character str.split() treats as whitespace to a space; the runs of
# spaces are collapsed for the whole batch at once in numpy (collapse_spaces).
_ASCII_WHITESPACE = b"\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f"
_ASCII_TABLE = bytes.maketrans(_ASCII_WHITESPACE, b" " * len(_ASCII_WHITESPACE))
_PUNCTUATION_BYTES = string.punctuation.encode("ascii")


def clean_batch(texts: Sequence[str | None], cap_chars: int = 500_000) -> bytes:
    """``clean_text`` of every text, UTF-8, joined by ``\\n`` (None -> empty text)."""
    pieces = []
    for text in texts:
        if not text:
            pieces.append(b"")
        elif text.isascii():
            pieces.append(text[:cap_chars].lower().encode("ascii").translate(_ASCII_TABLE, _PUNCTUATION_BYTES))
        else:
            pieces.append(clean_text(text, cap_chars).encode("utf-8"))
    return collapse_spaces(b"\n".join(pieces))


def collapse_spaces(joined: bytes) -> bytes:
    """Collapse runs of spaces to one and trim them at both ends of every ``\\n``-separated text."""
    buf = np.frombuffer(joined, dtype=np.uint8)
    space = buf == 32
    if not space.any():
        return joined
    prev_space = np.zeros_like(space)
    prev_space[1:] = space[:-1]
    next_space = np.zeros_like(space)
    next_space[:-1] = space[1:]
    run_first = np.flatnonzero(space & ~prev_space)
    run_last = np.flatnonzero(space & ~next_space)
    # A run survives as one space only between two words of the same text.
    before = buf[np.maximum(run_first - 1, 0)]
    before[run_first == 0] = 10
    after = buf[np.minimum(run_last + 1, buf.size - 1)]
    after[run_last == buf.size - 1] = 10
    keep = space.copy()
    keep[run_first[(before != 10) & (after != 10)]] = False
    return buf[~keep].tobytes()


# --------------------------------------------------------------------------- xxh3-64, vectorized

_M64 = 0xFFFFFFFFFFFFFFFF
# The first 128 bytes of xxh3's default secret (all that inputs of <= 128 bytes use).
_SECRET = bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f"
    "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c"
    "3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364"
)


def _secret64(offset: int) -> int:
    return int.from_bytes(_SECRET[offset : offset + 8], "little")


def _secret32(offset: int) -> int:
    return int.from_bytes(_SECRET[offset : offset + 4], "little")


_U = np.uint64
_PRIME64_1 = _U(0x9E3779B185EBCA87)
_PRIME64_2 = _U(0xC2B2AE3D27D4EB4F)
_PRIME64_3 = _U(0x165667B19E3779F9)
_PRIME_MX1 = _U(0x165667919E3779F9)
_PRIME_MX2 = _U(0x9FB21C651E98DF25)
_LO32 = _U(0xFFFFFFFF)
_FMIX1 = _U(0xFF51AFD7ED558CCD)
_FMIX2 = _U(0xC4CEB9FE1A85EC53)


def _mul128_fold64(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Low xor high half of the 128-bit product, from 32-bit limbs (exact in uint64)."""
    x_lo, x_hi = x & _LO32, x >> _U(32)
    y_lo, y_hi = y & _LO32, y >> _U(32)
    lo_lo = x_lo * y_lo
    hi_lo = x_hi * y_lo
    lo_hi = x_lo * y_hi
    cross = (lo_lo >> _U(32)) + (hi_lo & _LO32) + lo_hi
    upper = (hi_lo >> _U(32)) + (cross >> _U(32)) + x_hi * y_hi
    lower = (cross << _U(32)) | (lo_lo & _LO32)
    return lower ^ upper


def _xxh3_avalanche(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> _U(37))
    h = h * _PRIME_MX1
    return h ^ (h >> _U(32))


def _xxh64_avalanche(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> _U(33))
    h = h * _PRIME64_2
    h = h ^ (h >> _U(29))
    h = h * _PRIME64_3
    return h ^ (h >> _U(32))


def _rrmxmx(h: np.ndarray, length: np.ndarray) -> np.ndarray:
    rot49 = (h << _U(49)) | (h >> _U(15))
    rot24 = (h << _U(24)) | (h >> _U(40))
    h = h ^ rot49 ^ rot24
    h = h * _PRIME_MX2
    h = h ^ ((h >> _U(35)) + length)
    h = h * _PRIME_MX2
    return h ^ (h >> _U(28))


HASH_BLOCK = 32768  # spans hashed per numpy pass, so the ~40 temporaries stay in cache


def xxh3_64_spans(data: bytes | np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """xxh3-64 (seed 0) of ``data[s:s+l]`` for every span, equal to ``xxhash.xxh3_64_intdigest``.

    Inputs of up to 128 bytes (every shingle but the rare ones made of very long words) are
    hashed in numpy, a handful of array operations per 16 input bytes; longer ones one by one.
    """
    raw = np.frombuffer(data, dtype=np.uint8) if isinstance(data, (bytes, bytearray, memoryview)) else data
    buf = np.concatenate([raw, np.zeros(8, np.uint8)])  # keeps the overlapping views non-empty
    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    out = np.empty(starts.size, dtype=np.uint64)
    for i in range(0, starts.size, HASH_BLOCK):
        out[i : i + HASH_BLOCK] = _xxh3_block(raw, buf, starts[i : i + HASH_BLOCK], lengths[i : i + HASH_BLOCK])
    return out


def _xxh3_block(raw: np.ndarray, buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    out = np.empty(starts.size, dtype=np.uint64)
    # Overlapping little-endian views: element i is the 8 (4) bytes starting at byte i.
    le64 = np.ndarray(shape=(buf.size - 7,), dtype="<u8", buffer=buf, strides=(1,))
    le32 = np.ndarray(shape=(buf.size - 3,), dtype="<u4", buffer=buf, strides=(1,))

    sel = np.flatnonzero((lengths > 16) & (lengths <= 128))
    if sel.size:
        out[sel] = _xxh3_17to128(le64, starts[sel], lengths[sel])
    sel = np.flatnonzero((lengths >= 9) & (lengths <= 16))
    if sel.size:
        s, n = starts[sel], lengths[sel]
        lo = le64[s] ^ _U(_secret64(24) ^ _secret64(32))
        hi = le64[s + n - 8] ^ _U(_secret64(40) ^ _secret64(48))
        acc = n.astype(np.uint64) + lo.byteswap() + hi + _mul128_fold64(lo, hi)
        out[sel] = _xxh3_avalanche(acc)
    sel = np.flatnonzero((lengths >= 4) & (lengths <= 8))
    if sel.size:
        s, n = starts[sel], lengths[sel]
        first = le32[s].astype(np.uint64)
        last = le32[s + n - 4].astype(np.uint64)
        keyed = (last + (first << _U(32))) ^ _U(_secret64(8) ^ _secret64(16))
        out[sel] = _rrmxmx(keyed, n.astype(np.uint64))
    sel = np.flatnonzero((lengths >= 1) & (lengths <= 3))
    if sel.size:
        s, n = starts[sel], lengths[sel]
        c1 = buf[s].astype(np.uint64)
        c2 = buf[s + (n >> 1)].astype(np.uint64)
        c3 = buf[s + n - 1].astype(np.uint64)
        combined = (c1 << _U(16)) | (c2 << _U(24)) | c3 | (n.astype(np.uint64) << _U(8))
        out[sel] = _xxh64_avalanche(combined ^ _U(_secret32(0) ^ _secret32(4)))
    sel = np.flatnonzero(lengths == 0)
    if sel.size:
        out[sel] = xxhash.xxh3_64_intdigest(b"")
    sel = np.flatnonzero(lengths > 128)
    if sel.size:
        view = memoryview(raw)
        out[sel] = [xxhash.xxh3_64_intdigest(view[s : s + n]) for s, n in zip(starts[sel].tolist(), lengths[sel].tolist())]
    return out


def _xxh3_17to128(le64: np.ndarray, s: np.ndarray, n: np.ndarray) -> np.ndarray:
    acc = n.astype(np.uint64) * _PRIME64_1
    # Pairs of 16-byte blocks read from the front and the back, more pairs for longer inputs.
    for min_len, pair in ((17, 0), (33, 1), (65, 2), (97, 3)):
        idx = np.flatnonzero(n >= min_len) if min_len > 17 else None
        ss = s if idx is None else s[idx]
        nn = n if idx is None else n[idx]
        front = ss + 16 * pair
        back = ss + nn - 16 * (pair + 1)
        sec = 32 * pair
        mix = _mul128_fold64(le64[front] ^ _U(_secret64(sec)), le64[front + 8] ^ _U(_secret64(sec + 8)))
        mix += _mul128_fold64(le64[back] ^ _U(_secret64(sec + 16)), le64[back + 8] ^ _U(_secret64(sec + 24)))
        if idx is None:
            acc += mix
        else:
            if idx.size == 0:
                break
            acc[idx] += mix
    return _xxh3_avalanche(acc)


def xxh3_64(data: bytes) -> int:
    """The scalar xxh3-64 used by the reference path (datasketch's ``hashfunc``)."""
    return xxhash.xxh3_64_intdigest(data)


# --------------------------------------------------------------------------- permutations and signatures


@functools.lru_cache(maxsize=8)
def permutations(num_perms: int = 286, seed: int = 42) -> tuple[np.ndarray, np.ndarray]:
    """``(a, b)`` of the affine64 permutations: ``a`` odd, both uniform uint64, PCG64(seed)."""
    rng = np.random.Generator(np.random.PCG64(seed))
    a = rng.integers(0, 1 << 63, size=num_perms, dtype=np.uint64) * _U(2) + _U(1)
    b = rng.integers(0, _M64, size=num_perms, dtype=np.uint64, endpoint=True)
    a.setflags(write=False)
    b.setflags(write=False)
    return a, b


def fmix64(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finalizer: the pre-mix datasketch's affine64 scheme applies."""
    h = h ^ (h >> _U(33))
    h = h * _FMIX1
    h = h ^ (h >> _U(33))
    h = h * _FMIX2
    return h ^ (h >> _U(33))


# Permutations are applied to blocks of (PERM_BLOCK permutations x ~SHINGLE_BLOCK shingles):
# 16 x 16384 uint64 = 2 MiB, so the multiply, add and segmented min stay in cache.
PERM_BLOCK = 16
SHINGLE_BLOCK = 16384


def signatures_from_hashes(hashes: np.ndarray, counts: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """MinHash signatures (docs x perms, uint64) from the shingle hashes of consecutive docs."""
    num_docs, num_perms = counts.size, a.size
    sig = np.full((num_docs, num_perms), _M64, dtype=np.uint64)
    if hashes.size == 0:
        return sig
    mixed = fmix64(hashes.astype(np.uint64, copy=False))
    doc_start = np.zeros(num_docs + 1, np.int64)
    np.cumsum(counts, out=doc_start[1:])
    a_col = a.reshape(-1, 1)
    b_col = b.reshape(-1, 1)
    out_t = np.empty((num_perms, num_docs), dtype=np.uint64)
    nonempty = counts > 0
    work = np.empty((PERM_BLOCK, SHINGLE_BLOCK), dtype=np.uint64)
    d0 = 0
    while d0 < num_docs:
        # The docs [d0, d1) whose shingles fit one block (at least one doc).
        d1 = int(np.searchsorted(doc_start, doc_start[d0] + SHINGLE_BLOCK, side="right")) - 1
        d1 = min(max(d1, d0 + 1), num_docs)
        lo, hi = doc_start[d0], doc_start[d1]
        docs = np.flatnonzero(nonempty[d0:d1])
        if hi > lo and docs.size:
            chunk = mixed[lo:hi]
            offsets = doc_start[d0:d1][docs] - lo
            buf = work if hi - lo <= SHINGLE_BLOCK else np.empty((PERM_BLOCK, hi - lo), np.uint64)
            for p0 in range(0, num_perms, PERM_BLOCK):
                p1 = min(p0 + PERM_BLOCK, num_perms)
                block = buf[: p1 - p0, : hi - lo]
                np.multiply(a_col[p0:p1], chunk, out=block)
                np.add(block, b_col[p0:p1], out=block)
                out_t[p0:p1, d0 + docs] = np.minimum.reduceat(block, offsets, axis=1)
        d0 = d1
    sig[nonempty] = out_t.T[nonempty]
    return sig


def band_buckets(sig: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """Bucket ids (docs x bands, uint64): xxh3-64 of each band's ``rows`` little-endian u64s."""
    num_docs = sig.shape[0]
    band_bytes = np.ascontiguousarray(sig[:, : bands * rows], dtype="<u8").view(np.uint8).reshape(-1)
    starts = np.arange(num_docs * bands, dtype=np.int64) * (rows * 8)
    lengths = np.full(num_docs * bands, rows * 8, dtype=np.int64)
    return xxh3_64_spans(band_bytes, starts, lengths).reshape(num_docs, bands)


def shingle_hashes(texts: Sequence[str | None], params: MinHashParams) -> tuple[np.ndarray, np.ndarray]:
    """xxh3-64 of every shingle of a batch of raw texts, and the number per text (None -> 0)."""
    joined = clean_batch(texts, params.text_cap_chars)
    starts, lengths, counts = ngram_spans(joined, len(texts), params.ngram_size)
    return xxh3_64_spans(joined, starts, lengths), counts


def signatures(texts: Sequence[str | None], params: MinHashParams = MinHashParams()) -> np.ndarray:
    """MinHash signatures (docs x num_perms, uint64) of raw texts, the fast path."""
    hashes, counts = shingle_hashes(texts, params)
    a, b = permutations(params.num_perms, params.seed)
    return signatures_from_hashes(hashes, counts, a, b)


def datasketch_minhash(text: str, params: MinHashParams = MinHashParams()) -> Any:
    """The reference: a datasketch ``MinHash`` computing the same function one shingle at a time."""
    from datasketch import MinHash  # noqa: PLC0415 (reference only)

    a, b = permutations(params.num_perms, params.seed)
    sketch = MinHash(num_perm=params.num_perms, hashfunc=xxh3_64, permutations=(a, b), scheme="affine64")
    sketch.update_batch(shingles(clean_text(text, params.text_cap_chars), params.ngram_size))
    return sketch


# --------------------------------------------------------------------------- per-shard function

# Documents per vectorized batch: at most BATCH_DOCS and about BATCH_BYTES of text (the
# batch's shingle arrays take ~10x its text bytes, so a shard's peak memory stays flat).
BATCH_DOCS = 2048
BATCH_BYTES = 8 << 20


def batch_bounds(text_bytes: np.ndarray, cap_chars: int) -> list[tuple[int, int]]:
    """[start, end) row ranges of consecutive batches under BATCH_DOCS and ~BATCH_BYTES."""
    if text_bytes.size == 0:
        return []
    weight = np.minimum(text_bytes, 4 * cap_chars)
    before = np.cumsum(weight) - weight
    batch = np.maximum(before // BATCH_BYTES, np.arange(text_bytes.size) // BATCH_DOCS)
    # A batch is a maximal run of rows with the same batch number.
    edges = np.flatnonzero(np.diff(batch)) + 1
    starts = np.concatenate([[0], edges]).tolist()
    ends = np.concatenate([edges, [text_bytes.size]]).tolist()
    return list(zip(starts, ends))


def bucket_table(ids: Sequence[str], texts: Sequence[str | None], params: MinHashParams) -> tuple[pa.Table, dict[str, int]]:
    """``id`` + ``buckets`` for a batch; a document without shingles gets an empty list."""
    bands, rows = params.bands_and_rows()
    hashes, counts = shingle_hashes(texts, params)
    a, b = permutations(params.num_perms, params.seed)
    sig = signatures_from_hashes(hashes, counts, a, b)
    has_shingles = counts > 0
    buckets = band_buckets(sig[has_shingles], bands, rows)
    per_doc = np.where(has_shingles, bands, 0)
    offsets = np.zeros(len(texts) + 1, np.int32)
    np.cumsum(per_doc, out=offsets[1:])
    table = pa.table(
        {
            "id": pa.array(ids, type=pa.string()),
            "buckets": pa.ListArray.from_arrays(pa.array(offsets), pa.array(buckets.reshape(-1), type=pa.uint64())),
        }
    )
    stats = {
        "docs": len(texts),
        "docs_without_shingles": int((~has_shingles).sum()),
        "shingles": int(counts.sum()),
        "null_text": sum(t is None for t in texts),
        "capped_docs": sum(t is not None and len(t) > params.text_cap_chars for t in texts),
    }
    return table, stats


def minhash_shard(input_uris: list[str], output_uri: str, params: MinHashParams) -> dict[str, Any]:
    """One normalized shard (``id``, ``text``) -> ``id`` + ``buckets`` in the same row order.

    Documents whose text is null or empty after cleaning get an empty bucket list (no
    candidates; the global exact step still sees them) and are counted.
    """
    if len(input_uris) != 1:
        raise ValueError(f"minhash_shard takes one normalized shard, got {len(input_uris)}: {input_uris}")
    (uri,) = input_uris
    try:
        table = storage.read_parquet(uri, columns=["id", "text"])
    except (KeyError, ValueError, pa.ArrowInvalid) as exc:
        raise ValueError(
            f"{uri}: cannot read columns 'id' and 'text' ({exc}); minhash_buckets reads normalized "
            "shards, rematerialize the normalized partition of this source"
        ) from exc
    stats = {"docs": 0, "docs_without_shingles": 0, "shingles": 0, "null_text": 0, "capped_docs": 0}
    pieces = []
    ids, texts = table.column("id"), table.column("text")
    text_bytes = pc.fill_null(pc.binary_length(texts), 0).to_numpy(zero_copy_only=False)
    for start, end in batch_bounds(text_bytes, params.text_cap_chars):
        piece, counters = bucket_table(ids.slice(start, end - start).to_pylist(), texts.slice(start, end - start).to_pylist(), params)
        pieces.append(piece)
        for key, value in counters.items():
            stats[key] += value
    empty = pa.table({"id": pa.array([], pa.string()), "buckets": pa.array([], pa.list_(pa.uint64()))})
    out = pa.concat_tables(pieces) if pieces else empty
    storage.write_parquet(out, output_uri)
    bands, rows = params.bands_and_rows()
    stats.update(bands=bands, rows_per_band=rows)
    return stats
