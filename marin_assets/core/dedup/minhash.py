"""MinHash LSH buckets per document: the per-source half of fuzzy deduplication.

Each normalized document gets one bucket id per LSH band; two documents that share a bucket in
any band become candidate near-duplicates for the global ``fuzzy_duplicates`` step
(``marin_assets.core.dedup.decisions``). The output is co-partitioned with ``normalized``: same shard
basenames, same row order, columns ``id``, ``buckets`` (list<uint64>) and ``chars`` (the text's
length in characters, for dedup's removed-token counts).

The function, fixed by :class:`MinHashParams`:

* text: capped at 500,000 characters (a mega-document would saturate its signature and link
  unrelated documents), lowercased, the 32 ASCII punctuation characters read as spaces,
  whitespace runs (Unicode whitespace, as ``str.split``) collapsed to one space, trimmed. The
  reproduced system deletes punctuation instead; in code that glues words (``raise E('m')``
  becomes ``raise em``, its older spelling ``raise E, 'm'`` stays ``raise e m``), so near-copies
  of a file across releases share no band and are missed (``python -m bench.bench_dedup_peers
  --lsh-draws 12``: 4.8 of 987 pairs at J >= 0.8 missed on average against 0.75 with spaces, no
  false removal either way);
* shingles: word 5-grams of the cleaned text, i.e. the byte substrings spanning 5 consecutive
  words; a text of 1-4 words is one shingle (the whole text); an empty text has none;
* shingle hash: xxh3-64 (seed 0) of the shingle's UTF-8 bytes;
* permutations: datasketch's ``affine64`` family. The shingle hash is pre-mixed with the
  MurmurHash3 64-bit finalizer ``fmix64`` (a bijection), then permutation ``k`` maps
  ``h -> (a_k * h + b_k) mod 2**64`` with odd ``a_k`` (a bijection too). We chose this family
  over the Mersenne-prime one because uint64 wrap-around *is* the modulus: one multiply and
  one add per (shingle, permutation), no 128-bit products, no modulo, which vectorizes to
  64-bit SIMD lanes. ``a_k, b_k`` come from numpy's PCG64 seeded with ``seed`` (42);
* signature: per permutation the minimum over the document's shingles (2**64-1 when empty);
* bands: the first ``bands * rows`` signature values, ``bands`` groups of ``rows``; a band's
  bucket id is xxh3-64 of its ``rows`` values as little-endian u64 bytes (88 bytes for 11).

One compiled pass per batch (numba) computes it: it cleans each document's UTF-8 bytes
straight from an Arrow buffer (lowercasing non-ASCII characters with a table built from this
Python's own ``str.lower``), finds its words, hashes every shingle with a scalar xxh3 kernel
and takes the permutation minima (shingles innermost, so the compiler turns them into SIMD
multiply/add/min over the document's hashes). Only texts with a capital sigma or a U+0130 are
lowercased by Python first. The stages are also exposed one by one (:func:`clean_batch`,
:func:`xxh3_64_spans`, :func:`signatures_from_hashes`) for the tests and the per-stage bench.

:func:`datasketch_minhash` builds the same signature with datasketch's ``MinHash``
(``scheme="affine64"``, ``hashfunc=xxh3_64``, ``permutations=(a, b)``), the reference it is
checked against; the library ``xxhash`` is the reference of the xxh3 kernel.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import string
from collections.abc import Sequence
from typing import Any

import numba
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash
from llvmlite import ir
from numba.extending import intrinsic

from marin_assets.core.runtime import storage
from marin_assets.core.runtime.integrity import check_text_ids
from marin_assets.core.runtime.kernels import jit as _jit
from marin_assets.core.runtime.kernels import readonly as _readonly

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

_PUNCTUATION = str.maketrans(string.punctuation, " " * len(string.punctuation))


def clean_text(text: str, cap_chars: int = 500_000) -> str:
    """Cap, lowercase, ASCII punctuation as a space, collapse whitespace, trim."""
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


# ASCII characters the cleaner reads as a space: str.split()'s whitespace and punctuation.
_ASCII_SEPARATORS = b"\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f" + string.punctuation.encode("ascii")
_ASCII_TABLE = bytes.maketrans(_ASCII_SEPARATORS, b" " * len(_ASCII_SEPARATORS))


# --------------------------------------------------------------------------- xxh3-64 constants

_M64 = 0xFFFFFFFFFFFFFFFF
# xxh3's default secret (192 bytes; inputs of <= 128 bytes use the first 128).
_SECRET = bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f"
    "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c"
    "3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364"
    "eac5ac8334d3ebc3c581a0fffa1363eb170ddd51b7f0da49d316552629d4689e"
    "2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e"
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


def band_buckets(sig: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """Bucket ids (docs x bands, uint64): xxh3-64 of each band's ``rows`` little-endian u64s."""
    num_docs = sig.shape[0]
    band_bytes = np.ascontiguousarray(sig[:, : bands * rows], dtype="<u8").view(np.uint8).reshape(-1)
    starts = np.arange(num_docs * bands, dtype=np.int64) * (rows * 8)
    lengths = np.full(num_docs * bands, rows * 8, dtype=np.int64)
    return xxh3_64_spans(band_bytes, starts, lengths).reshape(num_docs, bands)


def datasketch_minhash(text: str, params: MinHashParams = MinHashParams()) -> Any:
    """The reference: a datasketch ``MinHash`` computing the same function one shingle at a time."""
    from datasketch import MinHash  # noqa: PLC0415 (reference only)

    a, b = permutations(params.num_perms, params.seed)
    sketch = MinHash(num_perm=params.num_perms, hashfunc=xxh3_64, permutations=(a, b), scheme="affine64")
    sketch.update_batch(shingles(clean_text(text, params.text_cap_chars), params.ngram_size))
    return sketch


# --------------------------------------------------------------------------- kernels

# Shingles per pass of the permutation loop: 2048 hashes (16 KiB) stay in L1 across all
# permutations of a long document.
JIT_SHINGLE_CHUNK = 2048


# uint64 constants: numba types a mixed int64/uint64 expression as float64, so the kernels
# spell every constant of their 64-bit arithmetic as uint64.
_U0, _U1, _U2, _U3, _U4, _U5, _U6, _U7, _U8 = (_U(i) for i in range(9))
_U16, _U24, _U28, _U29, _U32, _U33, _U35, _U37 = (_U(i) for i in (16, 24, 28, 29, 32, 33, 35, 37))
_U15, _U40, _U47, _U48, _U49, _U56, _U64, _U96 = (_U(i) for i in (15, 40, 47, 48, 49, 56, 64, 96))
_U128, _U240, _U1024 = _U(128), _U(240), _U(1024)
_UMAX = _U(_M64)
_PRIME32_1, _PRIME32_2, _PRIME32_3 = _U(0x9E3779B1), _U(0x85EBCA77), _U(0xC2B2AE3D)
_PRIME64_4, _PRIME64_5 = _U(0x85EBCA77C2B2AE63), _U(0x27D4EB2F165667C5)
_BYTES_02 = _U(0x00FF00FF00FF00FF)
_BYTES_04 = _U(0x0000FFFF0000FFFF)
# Secret words at every byte offset (xxh3 reads them unaligned), and the short-input keys.
_SECRET64 = np.array([_secret64(k) for k in range(len(_SECRET) - 7)], dtype=np.uint64)
_KEY_1TO3 = _U(_secret32(0) ^ _secret32(4))
_KEY_4TO8 = _U(_secret64(8) ^ _secret64(16))
_KEY_9TO16_LO = _U(_secret64(24) ^ _secret64(32))
_KEY_9TO16_HI = _U(_secret64(40) ^ _secret64(48))
_XXH3_EMPTY = _U(xxhash.xxh3_64_intdigest(b""))
# Secret offsets passed to the helpers as int64 values (a plain int literal would make numba
# compile one specialization per offset).
_KEY_MID_LAST, _KEY_LAST_STRIPE = np.int64(119), np.int64(121)

# ASCII flags of the cleaner: a separator (whitespace or punctuation) or a character (kept).
_IS_SPACE = np.zeros(128, dtype=np.uint64)
_IS_SPACE[list(b" " + _ASCII_SEPARATORS)] = 1
_IS_CHAR = 1 - _IS_SPACE
# What an ASCII byte becomes: lowercase, and a separator a space.
_CLEAN_BYTE = np.frombuffer(bytes(range(128)).lower().translate(_ASCII_TABLE), dtype=np.uint8).copy()

# Non-ASCII characters: the table gives, per code point, its lowercase as a delta, or a marker.
_DELTA_SPACE = np.int32(0x7FFFFFFF)  # str.split whitespace
_DELTA_PYTHON = np.int32(0x7FFFFFFE)  # the text is lowercased by Python (see unicode_lower_table)
_UNICODE_BLOCK = 256


@functools.lru_cache(maxsize=1)
def unicode_lower_table() -> tuple[np.ndarray, np.ndarray]:
    """This Python's ``str.lower`` and ``str.split`` whitespace for every code point, as a
    two-level table the JIT cleaner reads: ``blocks[top[cp >> 8] * 256 + (cp & 255)]`` is the
    delta from ``cp`` to its lowercase, ``_DELTA_SPACE`` or ``_DELTA_PYTHON``.

    Built from Python itself (``lower()`` over all code points, ~40 ms), so it follows the
    running Python's Unicode tables exactly. ``_DELTA_PYTHON`` marks what a per-character
    table cannot express: capital sigma (its lowercase depends on the neighbours), characters
    whose lowercase is several (U+0130), and surrogates; texts with one are lowercased by
    Python before the kernel sees them.
    """
    cps = np.arange(0x80, 0x110000, dtype=np.int64)
    cps = cps[(cps < 0xD800) | (cps > 0xDFFF)]
    chars = cps.astype("<u4").tobytes().decode("utf-32-le")
    lowered, several = [], []
    for first in range(0, len(chars), _UNICODE_BLOCK):
        block = chars[first : first + _UNICODE_BLOCK]
        low = block.lower()
        if len(low) != len(block):  # a lowercase of several characters: find it
            each = [c.lower() for c in block]
            several += [first + k for k, c in enumerate(each) if len(c) != 1]
            low = "".join(c[0] for c in each)
        lowered.append(low)
    full = np.zeros(0x110000, dtype=np.int32)
    full[cps] = np.frombuffer("".join(lowered).encode("utf-32-le"), dtype="<u4").astype(np.int64) - cps
    full[cps[several]] = _DELTA_PYTHON
    full[0x3A3] = _DELTA_PYTHON  # capital sigma
    full[0xD800:0xE000] = _DELTA_PYTHON
    full[cps[[m.start() for m in re.finditer(r"\s", chars)]]] = _DELTA_SPACE
    rows = full.reshape(-1, _UNICODE_BLOCK)
    used = rows.any(axis=1)  # the blocks with a lowercase or a marker; the others share block 0
    top = np.where(used, np.cumsum(used), 0)
    blocks = np.concatenate([np.zeros((1, _UNICODE_BLOCK), np.int32), rows[used]])
    return _readonly(top, np.uint16), _readonly(blocks.reshape(-1), np.int32)


@intrinsic
def _fold64_jit(typingctx, x, y):
    """Low xor high half of the 128-bit product of two uint64: one native 64x64->128
    multiply (numba has no 128-bit integers; LLVM IR does)."""
    if x != numba.types.uint64 or y != numba.types.uint64:
        return None

    def codegen(context, builder, signature, args):
        wide = ir.IntType(128)
        product = builder.mul(builder.zext(args[0], wide), builder.zext(args[1], wide))
        low = builder.trunc(product, ir.IntType(64))
        high = builder.trunc(builder.lshr(product, ir.Constant(wide, 64)), ir.IntType(64))
        return builder.xor(low, high)

    return numba.types.uint64(numba.types.uint64, numba.types.uint64), codegen


@_jit
def _read64(p, i):
    """Little-endian uint64 at byte ``i`` (a uint64 index: no negative-index wrap-around)."""
    return (
        _U(p[i]) | (_U(p[i + _U1]) << _U8) | (_U(p[i + _U2]) << _U16) | (_U(p[i + _U3]) << _U24)
        | (_U(p[i + _U4]) << _U32) | (_U(p[i + _U5]) << _U40) | (_U(p[i + _U6]) << _U48) | (_U(p[i + _U7]) << _U56)
    )  # fmt: skip


@_jit
def _read32(p, i):
    return _U(p[i]) | (_U(p[i + _U1]) << _U8) | (_U(p[i + _U2]) << _U16) | (_U(p[i + _U3]) << _U24)


@_jit
def _bswap64(x):
    x = ((x & _BYTES_02) << _U8) | ((x >> _U8) & _BYTES_02)
    x = ((x & _BYTES_04) << _U16) | ((x >> _U16) & _BYTES_04)
    return (x << _U32) | (x >> _U32)


@_jit
def _avalanche_jit(h):
    h = h ^ (h >> _U37)
    h = h * _PRIME_MX1
    return h ^ (h >> _U32)


@_jit
def _mix16_jit(p, i, k):
    """xxh3's 16-byte mix of input bytes ``i..i+16`` with the secret at offset ``k``."""
    return _fold64_jit(_read64(p, i) ^ _SECRET64[k], _read64(p, i + _U8) ^ _SECRET64[k + 8])


@_jit
def _accumulate512(acc, p, i, k):
    for lane in range(8):
        value = _read64(p, i + _U(8 * lane))
        keyed = value ^ _SECRET64[k + 8 * lane]
        acc[lane ^ 1] += value
        acc[lane] += (keyed & _LO32) * (keyed >> _U32)


@_jit
def _xxh3_long_jit(p, s, n):
    """xxh3-64 of more than 240 bytes: 64-byte stripes into 8 accumulators, 1 KiB blocks."""
    acc = np.empty(8, dtype=np.uint64)
    acc[0], acc[1], acc[2], acc[3] = _PRIME32_3, _PRIME64_1, _PRIME64_2, _PRIME64_3
    acc[4], acc[5], acc[6], acc[7] = _PRIME64_4, _PRIME32_2, _PRIME64_5, _PRIME32_1
    blocks = (n - _U1) // _U1024
    for block in range(int(blocks)):
        base = s + _U(block) * _U1024
        for stripe in range(16):
            _accumulate512(acc, p, base + _U(64 * stripe), 8 * stripe)
        for lane in range(8):  # scramble
            x = acc[lane]
            x = (x ^ (x >> _U47)) ^ _SECRET64[128 + 8 * lane]
            acc[lane] = x * _PRIME32_1
    base = s + blocks * _U1024
    for stripe in range(int(((n - _U1) - blocks * _U1024) // _U64)):
        _accumulate512(acc, p, base + _U(64 * stripe), 8 * stripe)
    _accumulate512(acc, p, s + n - _U64, _KEY_LAST_STRIPE)
    result = n * _PRIME64_1
    for i in range(4):
        result += _fold64_jit(acc[2 * i] ^ _SECRET64[11 + 16 * i], acc[2 * i + 1] ^ _SECRET64[19 + 16 * i])
    return _avalanche_jit(result)


@_jit
def _xxh3_jit(p, s, n):
    """xxh3-64 (seed 0) of ``p[s:s+n]`` (``s``, ``n`` uint64), every length."""
    if n <= _U16:
        if n > _U8:
            lo = _read64(p, s) ^ _KEY_9TO16_LO
            hi = _read64(p, s + n - _U8) ^ _KEY_9TO16_HI
            return _avalanche_jit(n + _bswap64(lo) + hi + _fold64_jit(lo, hi))
        if n >= _U4:
            h = (_read32(p, s + n - _U4) + (_read32(p, s) << _U32)) ^ _KEY_4TO8
            h = h ^ ((h << _U49) | (h >> _U15)) ^ ((h << _U24) | (h >> _U40))
            h = h * _PRIME_MX2
            h = h ^ ((h >> _U35) + n)
            h = h * _PRIME_MX2
            return h ^ (h >> _U28)
        if n > _U0:
            h = (_U(p[s]) << _U16) | (_U(p[s + (n >> _U1)]) << _U24) | _U(p[s + n - _U1]) | (n << _U8)
            h = h ^ _KEY_1TO3
            h = (h ^ (h >> _U33)) * _PRIME64_2
            h = (h ^ (h >> _U29)) * _PRIME64_3
            return h ^ (h >> _U32)
        return _XXH3_EMPTY
    if n <= _U128:
        acc = n * _PRIME64_1
        for pair in range(int((n - _U1) >> _U5) + 1):  # 16-byte blocks from both ends, inwards
            step = _U(16 * pair)
            acc += _mix16_jit(p, s + step, 32 * pair) + _mix16_jit(p, s + n - step - _U16, 32 * pair + 16)
        return _avalanche_jit(acc)
    if n <= _U240:
        acc = n * _PRIME64_1
        for i in range(8):
            acc += _mix16_jit(p, s + _U(16 * i), 16 * i)
        acc = _avalanche_jit(acc)
        for i in range(8, int(n >> _U4)):
            acc += _mix16_jit(p, s + _U(16 * i), 16 * (i - 8) + 3)
        acc += _mix16_jit(p, s + n - _U16, _KEY_MID_LAST)
        return _avalanche_jit(acc)
    return _xxh3_long_jit(p, s, n)


@_jit
def _fmix64_jit(h):
    h = (h ^ (h >> _U33)) * _FMIX1
    h = (h ^ (h >> _U33)) * _FMIX2
    return h ^ (h >> _U33)


@_jit
def _xxh3_spans_kernel(data, starts, lengths, out):
    for i in range(starts.size):
        out[i] = _xxh3_jit(data, _U(starts[i]), _U(lengths[i]))


# Shingle hashes are padded with copies of the first one (which leaves every minimum as it
# is) to a multiple of the vector loop's width, so no scalar remainder loop runs.
_PAD = 32


@_jit
def _min_permuted(hv, count, chunk, a, b, row):
    """``row[p] = min over hv[:count] of a[p] * h + b[p]`` (mod 2**64), chunk by chunk.

    ``hv`` has room for ``count`` rounded up to ``_PAD``. The inner loop runs over shingles
    with a uint64 index (no wrap-around check), which the compiler turns into SIMD
    multiply/add/unsigned-min lanes and one horizontal min per permutation.
    """
    for p in range(a.size):
        row[p] = _UMAX
    if count == 0:
        return
    padded = -(-count // _PAD) * _PAD
    for i in range(count, padded):
        hv[i] = hv[0]
    chunk = -(-chunk // _PAD) * _PAD
    first = 0
    while first < padded:
        last = min(first + chunk, padded)
        lo, hi = _U(first), _U(last)
        for p in range(a.size):
            ap, bp, m = a[p], b[p], row[p]
            j = lo
            while j < hi:
                m = min(m, ap * hv[j] + bp)
                j += _U1
            row[p] = m
        first = last


@_jit
def _decode_utf8(data, i, stop):
    """(code point, byte length) of the UTF-8 character at ``i``; (0, 0) if it is not one."""
    c = np.int64(data[i])
    if c < 0xC2 or c > 0xF4:
        return 0, 0
    if c >= 0xF0:
        length, cp, least = 4, c & 0x07, 0x10000
    elif c >= 0xE0:
        length, cp, least = 3, c & 0x0F, 0x800
    else:
        length, cp, least = 2, c & 0x1F, 0x80
    if i + _U(length) > stop:
        return 0, 0
    for k in range(1, length):
        follow = np.int64(data[i + _U(k)])
        if follow & 0xC0 != 0x80:
            return 0, 0
        cp = (cp << 6) | (follow & 0x3F)
    if cp < least or cp > 0x10FFFF:
        return 0, 0
    return cp, length


@_jit
def _encode_utf8(cp, out, pos):
    """Write code point ``cp`` as UTF-8 at ``out[pos]``; returns the byte length (uint64)."""
    if cp < 0x80:
        out[pos] = cp
        return _U1
    if cp < 0x800:
        out[pos] = 0xC0 | (cp >> 6)
        out[pos + _U1] = 0x80 | (cp & 0x3F)
        return _U2
    if cp < 0x10000:
        out[pos] = 0xE0 | (cp >> 12)
        out[pos + _U1] = 0x80 | ((cp >> 6) & 0x3F)
        out[pos + _U2] = 0x80 | (cp & 0x3F)
        return _U3
    out[pos] = 0xF0 | (cp >> 18)
    out[pos + _U1] = 0x80 | ((cp >> 12) & 0x3F)
    out[pos + _U2] = 0x80 | ((cp >> 6) & 0x3F)
    out[pos + _U3] = 0x80 | (cp & 0x3F)
    return _U4


@_jit
def _clean_words(data, start, end, cap, top, blocks, out, spaces):
    """Clean the first ``cap`` characters of ``data[start:end]`` (UTF-8) into ``out``:
    lowercase, ASCII punctuation read as whitespace, words joined by one space. Returns ``(size, words)``
    with ``spaces[:words - 1]`` the separators' positions in ``out``, or ``(-1, -1)`` when the
    text must be lowercased by Python first (see :func:`unicode_lower_table`).

    ASCII bytes go branch-free (0/1 flags from tables instead of tests: word boundaries are
    too irregular to predict): every byte is written, then kept or overwritten, and
    whitespace is kept, as one space, only right after a word. ``out`` needs room for 1.5x
    the input (a lowercase can take more UTF-8 bytes than its capital).
    """
    size, seps = _U0, _U0
    after_space = _U1  # at the start or after a separator: more whitespace is dropped
    chars = 0
    i, stop = _U(start), _U(end)
    while i < stop and chars < cap:
        chars += 1
        c = data[i]
        if c < 0x80:
            i += _U1
            space = _IS_SPACE[c]
            separator = space & (after_space ^ _U1)
            out[size] = _CLEAN_BYTE[c]
            width = _IS_CHAR[c] | separator
        else:
            cp, length = _decode_utf8(data, i, stop)
            if length == 0:
                return -1, -1
            i += _U(length)
            delta = blocks[np.int64(top[cp >> 8]) * _UNICODE_BLOCK + (cp & (_UNICODE_BLOCK - 1))]
            if delta == _DELTA_PYTHON:
                return -1, -1
            if delta == _DELTA_SPACE:
                space = _U1
                separator = after_space ^ _U1
                out[size] = 32
                width = separator
            else:
                space, separator = _U0, _U0
                width = _encode_utf8(cp + delta, out, size)
        spaces[seps] = size
        seps += separator
        size += width
        after_space = space
    if size > _U0 and out[size - _U1] == 32:  # a trailing separator
        size -= _U1
        seps -= _U1
    return np.int64(size), np.int64(seps + _U1 if size > _U0 else _U0)


@_jit
def _signatures_kernel(data, starts, ends, caps, top, blocks, n, chunk, a, b, sig, counts):
    """Clean, shingle, hash and permute every document ``data[starts[d]:ends[d]]``; a
    document Python must lowercase first gets ``counts[d] = -1`` (its row is left as is)."""
    longest = 0  # bytes read from one document: at most 4 per character of the cap
    for d in range(starts.size):
        span = ends[d] - starts[d]
        longest = max(longest, min(span, 4 * min(caps[d], span)))
    out = np.empty(2 * longest + 8, dtype=np.uint8)
    spaces = np.empty(longest // 2 + 2, dtype=np.uint64)
    hv = np.empty(longest // 2 + 2 + _PAD, dtype=np.uint64)
    for d in range(starts.size):
        size, words = _clean_words(data, starts[d], ends[d], caps[d], top, blocks, out, spaces)
        if words < 0:
            counts[d] = -1
            continue
        count = 0
        if words >= n:
            count = words - n + 1
            for i in range(count):
                first = _U0 if i == 0 else spaces[i - 1] + _U1
                last = spaces[i + n - 1] if i + n - 1 < words - 1 else _U(size)
                hv[i] = _fmix64_jit(_xxh3_jit(out, first, last - first))
        elif words > 0:
            count = 1
            hv[0] = _fmix64_jit(_xxh3_jit(out, _U0, _U(size)))
        counts[d] = count
        _min_permuted(hv, count, chunk, a, b, sig[d])


@_jit
def _clean_kernel(data, starts, ends, caps, top, blocks, out, out_ends):
    """The cleaned texts in ``out``, separated by ``\\n``, ``out_ends[d]`` where text ``d``
    ends (-1 where Python must lowercase it first: nothing is written for it)."""
    longest = 0
    for d in range(starts.size):
        longest = max(longest, ends[d] - starts[d])
    scratch = np.empty(longest // 2 + 2, dtype=np.uint64)
    pos = 0
    for d in range(starts.size):
        if d > 0:
            out[pos] = 10
            pos += 1
        size, _ = _clean_words(data, starts[d], ends[d], caps[d], top, blocks, out[pos:], scratch)
        out_ends[d] = -1 if size < 0 else pos + size
        pos += max(size, 0)


@_jit
def _signatures_from_hashes_kernel(hashes, doc_start, chunk, a, b, sig):
    longest = 0
    for d in range(doc_start.size - 1):
        longest = max(longest, doc_start[d + 1] - doc_start[d])
    hv = np.empty(longest + _PAD, dtype=np.uint64)
    for d in range(doc_start.size - 1):
        first, count = doc_start[d], doc_start[d + 1] - doc_start[d]
        for i in range(count):
            hv[i] = _fmix64_jit(hashes[first + i])
        _min_permuted(hv, count, chunk, a, b, sig[d])


def text_spans(texts: Sequence[str | None] | pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The UTF-8 bytes of a batch of texts as the JIT kernels read them: ``(data, starts,
    ends)``, text ``d`` being ``data[starts[d]:ends[d]]``, straight from the Arrow buffers
    (no copy for Arrow input). Null texts are empty."""
    arr = _large_strings(texts)
    count = len(arr)
    _, offsets_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(offsets_buf, np.int64, count + 1, arr.offset * 8) if count else np.zeros(1, np.int64)
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None and data_buf.size else np.zeros(0, np.uint8)
    starts, ends = offsets[:-1].copy(), offsets[1:].copy()
    if arr.null_count:
        null = arr.is_null().to_numpy(zero_copy_only=False)
        ends[null] = starts[null]
    return _readonly(data, np.uint8), _readonly(starts, np.int64), _readonly(ends, np.int64)


def _lowered_by_python(texts: Sequence[str | None] | pa.Array | pa.ChunkedArray, rows: np.ndarray, cap_chars: int) -> tuple[np.ndarray, ...]:
    """Kernel input (data, starts, ends, caps) for the texts ``rows``, capped and lowercased
    by Python: the rare texts the kernel's per-character table cannot lowercase."""
    if isinstance(texts, (list, tuple)):
        strs = [texts[i] for i in rows.tolist()]
    else:
        strs = _large_strings(texts).take(pa.array(rows)).to_pylist()
    pieces = [t[:cap_chars].lower().encode("utf-8") for t in strs]
    sizes = np.fromiter(map(len, pieces), np.int64, len(pieces))
    ends = np.cumsum(sizes)
    caps = np.full(len(pieces), np.iinfo(np.int64).max, dtype=np.int64)  # capped already
    data = np.frombuffer(b"".join(pieces), np.uint8)
    return _readonly(data, np.uint8), _readonly(ends - sizes, np.int64), _readonly(ends, np.int64), _readonly(caps, np.int64)


def _large_strings(texts: Sequence[str | None] | pa.Array | pa.ChunkedArray) -> pa.Array:
    """Texts as one ``large_string`` Arrow array (int64 offsets, whatever the batch size)."""
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks() if texts.num_chunks != 1 else texts.chunk(0)
    if not isinstance(texts, pa.Array):
        texts = pa.array(texts, type=pa.large_string())
    return texts if texts.type == pa.large_string() else texts.cast(pa.large_string())


# --------------------------------------------------------------------------- entry points


def clean_batch(texts: Sequence[str | None], cap_chars: int = 500_000) -> bytes:
    """``clean_text`` of every text, UTF-8, joined by ``\\n`` (None -> empty text): the
    kernels' cleaner on its own, checked against ``clean_text``."""
    data, starts, ends = text_spans(texts)
    if starts.size == 0:
        return b""
    top, blocks = unicode_lower_table()
    out = np.empty(2 * int((ends - starts).sum()) + starts.size + 8, dtype=np.uint8)
    out_ends = np.empty(starts.size, dtype=np.int64)
    _clean_kernel(data, starts, ends, _readonly(np.full(starts.size, cap_chars), np.int64), top, blocks, out, out_ends)
    if out_ends.min() >= 0:
        return out[: out_ends[-1]].tobytes()
    pieces, pos = [], 0
    for d, end in enumerate(out_ends.tolist()):
        pos += d > 0  # the separator
        if end < 0:
            text = texts[d]
            pieces.append(clean_text(text.as_py() if isinstance(text, pa.Scalar) else text, cap_chars).encode("utf-8"))
        else:
            pieces.append(out[pos:end].tobytes())
            pos = end
    return b"\n".join(pieces)


def xxh3_64_spans(data: bytes | np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """xxh3-64 (seed 0) of ``data[s:s+l]`` for every span, equal to ``xxhash.xxh3_64_intdigest``."""
    raw = np.frombuffer(data, dtype=np.uint8) if isinstance(data, (bytes, bytearray, memoryview)) else data
    starts = _readonly(starts, np.int64)
    lengths = _readonly(lengths, np.int64)
    if starts.shape != lengths.shape or starts.ndim != 1:
        raise ValueError(f"xxh3_64_spans: starts {starts.shape} and lengths {lengths.shape} must be equal 1-d shapes")
    if starts.size and (int(starts.min()) < 0 or int(lengths.min()) < 0 or int((starts + lengths).max()) > raw.size):
        raise ValueError(f"xxh3_64_spans: a span falls outside the {raw.size}-byte data")
    out = np.empty(starts.size, dtype=np.uint64)
    _xxh3_spans_kernel(_readonly(raw, np.uint8), starts, lengths, out)
    return out


def signatures_from_hashes(hashes: np.ndarray, counts: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """MinHash signatures (docs x perms, uint64) from the shingle hashes of consecutive docs."""
    doc_start = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=doc_start[1:])
    if doc_start[-1] != len(hashes):
        raise ValueError(f"signatures_from_hashes: counts sum to {doc_start[-1]} but there are {len(hashes)} hashes")
    sig = np.empty((len(counts), len(a)), dtype=np.uint64)
    a, b = _readonly(a, np.uint64), _readonly(b, np.uint64)
    _signatures_from_hashes_kernel(_readonly(hashes, np.uint64), _readonly(doc_start, np.int64), max(1, JIT_SHINGLE_CHUNK), a, b, sig)
    return sig


def signatures_and_counts(texts: Sequence[str | None] | pa.Array | pa.ChunkedArray, params: MinHashParams = MinHashParams()) -> tuple[np.ndarray, np.ndarray]:
    """MinHash signatures (docs x num_perms, uint64) of raw texts and their shingle counts."""
    a, b = permutations(params.num_perms, params.seed)
    top, blocks = unicode_lower_table()
    chunk = max(1, JIT_SHINGLE_CHUNK)

    def run(data: np.ndarray, starts: np.ndarray, ends: np.ndarray, caps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        sig = np.empty((starts.size, a.size), dtype=np.uint64)
        counts = np.empty(starts.size, dtype=np.int64)
        _signatures_kernel(data, starts, ends, caps, top, blocks, params.ngram_size, chunk, a, b, sig, counts)
        return sig, counts

    data, starts, ends = text_spans(texts)
    sig, counts = run(data, starts, ends, _readonly(np.full(starts.size, params.text_cap_chars), np.int64))
    redo = np.flatnonzero(counts < 0)
    if redo.size:
        sig[redo], counts[redo] = run(*_lowered_by_python(texts, redo, params.text_cap_chars))
    return sig, counts


def signatures(texts: Sequence[str | None] | pa.Array | pa.ChunkedArray, params: MinHashParams = MinHashParams()) -> np.ndarray:
    """MinHash signatures (docs x num_perms, uint64) of raw texts (None -> no shingles)."""
    return signatures_and_counts(texts, params)[0]


# --------------------------------------------------------------------------- per-shard function

# Documents per batch: at most BATCH_DOCS and about BATCH_BYTES of text (a batch's Arrow
# copy, signatures and bucket lists are held at once, so a shard's peak memory stays flat).
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


def bucket_table(
    ids: Sequence[str] | pa.Array | pa.ChunkedArray, texts: Sequence[str | None] | pa.Array | pa.ChunkedArray, params: MinHashParams
) -> tuple[pa.Table, dict[str, int]]:
    """``id`` + ``buckets`` for a batch; a document without shingles gets an empty list."""
    bands, rows = params.bands_and_rows()
    texts = _large_strings(texts)
    sig, counts = signatures_and_counts(texts, params)
    has_shingles = counts > 0
    buckets = band_buckets(sig[has_shingles], bands, rows)
    per_doc = np.where(has_shingles, bands, 0)
    offsets = np.zeros(len(texts) + 1, np.int32)
    np.cumsum(per_doc, out=offsets[1:])
    ids = ids.cast(pa.string()) if isinstance(ids, (pa.Array, pa.ChunkedArray)) else pa.array(ids, type=pa.string())
    table = pa.table(
        {
            "id": ids,
            "buckets": pa.ListArray.from_arrays(pa.array(offsets), pa.array(buckets.reshape(-1), type=pa.uint64())),
            # characters per document: dedup's removed-token counts come from here, not a re-read
            "chars": pc.fill_null(pc.utf8_length(texts), 0).cast(pa.int64()),
        }
    )
    stats = {
        "docs": len(texts),
        "docs_without_shingles": int((~has_shingles).sum()),
        "shingles": int(counts.sum()),
        "null_text": texts.null_count,
        "capped_docs": int(pc.sum(pc.greater(pc.utf8_length(texts), params.text_cap_chars)).as_py() or 0),
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
    check_text_ids(uri, ids, texts)
    text_bytes = pc.fill_null(pc.binary_length(texts), 0).to_numpy(zero_copy_only=False)
    for start, end in batch_bounds(text_bytes, params.text_cap_chars):
        piece, counters = bucket_table(ids.slice(start, end - start), texts.slice(start, end - start), params)
        pieces.append(piece)
        for key, value in counters.items():
            stats[key] += value
    empty = pa.table({"id": pa.array([], pa.string()), "buckets": pa.array([], pa.list_(pa.uint64())), "chars": pa.array([], pa.int64())})
    out = pa.concat_tables(pieces) if pieces else empty
    storage.write_parquet(out, output_uri)
    bands, rows = params.bands_and_rows()
    stats.update(bands=bands, rows_per_band=rows)
    return stats
