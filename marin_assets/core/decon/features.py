"""Decontamination features: tokens, 13-gram hashes and paragraph units, vectorized over a batch.

Two feature families share the hashing: the ``marin`` features (paragraphs split on blank
lines, whitespace tokens, no normalization; exactly Marin's rule) and the ``coverage`` features
(normalized tokens, 13-grams across the whole document, see ``text_normalize``).

* a feature is the 64-bit hash of its tokens joined by single spaces (``feature_hash``);
* n-grams without an alphabetic character (``str.isalpha``) are dropped because numbers and
  symbol runs repeat everywhere.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa

from marin_assets.core.decon import kernels
from marin_assets.core.decon.params import DeconParams
from marin_assets.core.runtime.kernels import string_buffers

# ----------------------------------------------------------------------------- feature hashing

HASH_SCHEME = "poly64-mix-poly64-v1"
_MASK = (1 << 64) - 1
_BYTE_BASE = 0x9E3779B97F4A7C15  # odd, so invertible modulo 2**64
_TOKEN_BASE = 0xD6E8FEB86659FD93
_TOKEN_LEN_SALT = 0xA0761D6478BD642F
_FEATURE_LEN_SALT = 0xE7037ED1A0B428DB
_TOKEN_MIX = 0xC4CEB9FE1A85EC53


def feature_hash(tokens: Sequence[str]) -> int:
    """The 64-bit feature of a token sequence, written plainly (the vectorized path must agree).

    Each token: polynomial over its UTF-8 bytes modulo 2**64, plus its length, mixed (the mix
    makes the second level see pseudo-random values); the feature: polynomial over the token
    hashes plus the token count. No finalizer: a bijection cannot change which features collide,
    and the bits the index's bitmaps read are already uniform (sums of products of mixed values).
    """
    acc = 0
    for token in tokens:
        data = token.encode("utf-8")
        poly = 0
        for byte in data:
            poly = ((poly + byte) * _BYTE_BASE) & _MASK
        token_hash = _mix_token_int((poly + len(data) * _TOKEN_LEN_SALT) & _MASK)
        acc = ((acc + token_hash) * _TOKEN_BASE) & _MASK
    return (acc + len(tokens) * _FEATURE_LEN_SALT) & _MASK


def _mix_token_int(h: int) -> int:
    h ^= h >> 29
    h = (h * _TOKEN_MIX) & _MASK
    return h ^ (h >> 32)


class _Powers:
    """``base**i`` and ``base**-i`` (mod 2**64) arrays, cached up to 8M entries and grown on demand.

    A batch needs them as long as its token count, so an exceptionally large document gets
    uncached tables for its own batch.
    """

    MAX_CACHED = 1 << 23

    def __init__(self, base: int):
        self.base = base
        self.inverse = pow(base, -1, 1 << 64)
        self.up = np.ones(1, dtype=np.uint64)
        self.down = np.ones(1, dtype=np.uint64)

    def get(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        if n > self.MAX_CACHED:
            return self._table(self.base, n), self._table(self.inverse, n)
        if len(self.up) < n:
            size = min(max(n, 2 * len(self.up), 1 << 16), self.MAX_CACHED)
            self.up = self._table(self.base, size)
            self.down = self._table(self.inverse, size)
        return self.up, self.down

    @staticmethod
    def _table(base: int, size: int) -> np.ndarray:
        out = np.full(size, base, dtype=np.uint64)
        out[0] = 1
        with np.errstate(over="ignore"):
            np.multiply.accumulate(out, out=out)
        return out


_TOKEN_POWERS = _Powers(_TOKEN_BASE)

# Byte tables. Python's str.split() whitespace in ASCII: \t \n \v \f \r, \x1c-\x1f and space; every
# other byte <= 32 is a control character that stays inside tokens. Non-ASCII whitespace (NEL,
# NBSP, U+1680, U+2000-U+200A, U+2028/9, U+202F, U+205F, U+3000) starts with 0xC2 or 0xE1-0xE3.
_ASCII_SPACE = np.array([chr(b).isspace() if b < 128 else False for b in range(256)], dtype=bool)
_ASCII_LETTER = np.array([chr(b).isalpha() if b < 128 else False for b in range(256)], dtype=bool)


@functools.cache
def _codepoint_tables() -> tuple[np.ndarray, np.ndarray]:
    """(isalpha, isspace) for every code point; built once per process (~0.3 s) when non-ASCII text shows up."""
    chars = [chr(i) for i in range(0x110000)]
    alpha = np.fromiter((c.isalpha() for c in chars), dtype=bool, count=0x110000)
    space = np.fromiter((c.isspace() for c in chars), dtype=bool, count=0x110000)
    return alpha, space


_NO_CODEPOINTS = np.zeros(1, dtype=bool)  # stands in for the tables in a batch without non-ASCII leads
_BYTE_CLASSES = kernels.byte_classes(_ASCII_SPACE, _ASCII_LETTER)


@dataclasses.dataclass
class Features:
    """Features of a batch of texts, with the paragraph units they were counted in.

    ``unit`` maps each feature to its unit; units are paragraphs (or whole records when every
    paragraph is short). Byte spans are relative to the batch's UTF-8 buffer.
    """

    hashes: np.ndarray  # uint64 [F]
    unit: np.ndarray  # int64 [F]
    unit_doc: np.ndarray  # int64 [U]
    unit_byte_start: np.ndarray  # int64 [U]
    unit_byte_end: np.ndarray  # int64 [U]
    n_docs: int
    tokens: "TokenWindows | None" = None  # only with keep_tokens=True (the coverage rule)

    @property
    def n_units(self) -> int:
        return len(self.unit_doc)


@dataclasses.dataclass
class TokenWindows:
    """What the coverage rule needs beyond the features: window positions and any-length windows."""

    gram_pos: np.ndarray  # int64 [G]: token index where each 13-gram feature starts
    token_start: np.ndarray  # int64 [T]: byte offset of each token in the batch buffer
    token_doc: np.ndarray  # int64 [T]
    prefix: np.ndarray  # uint64 [T+1]: prefix sums of token hashes * base**-j
    up: np.ndarray  # uint64: base**j

    def window_hashes(self, length: int, positions: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(positions, hashes) of the ``length``-token windows inside one document (all, or at ``positions``)."""
        n_tok = len(self.token_doc)
        salt = np.uint64((length * _FEATURE_LEN_SALT) & _MASK)
        if positions is None:  # every window: slices, no gathers
            n_win = max(n_tok - length + 1, 0)
            same = self.token_doc[:n_win] == self.token_doc[length - 1:]
            hashes = self.prefix[length:n_tok + 1] - self.prefix[:n_win]
            hashes *= self.up[length:n_tok + 1]
            hashes += salt
            positions = np.flatnonzero(same)
            return positions, hashes[same]
        positions = positions[positions + length <= n_tok]
        ends = positions + length
        same = self.token_doc[positions] == self.token_doc[ends - 1]
        positions, ends = positions[same], ends[same]
        hashes = (self.prefix[ends] - self.prefix[positions]) * self.up[ends]
        hashes += salt
        return positions, hashes


def _empty_features(n_docs: int) -> Features:
    empty = np.zeros(0, dtype=np.int64)
    return Features(np.zeros(0, dtype=np.uint64), empty, empty, empty, empty, n_docs)


def _batches(offsets: np.ndarray, batch_bytes: int) -> Iterator[tuple[int, int]]:
    """Document ranges ``[i, j)`` of about ``batch_bytes`` each (at least one document)."""
    n = len(offsets) - 1
    i = 0
    while i < n:
        j = int(np.searchsorted(offsets, offsets[i] + batch_bytes, side="right")) - 1
        j = min(max(j, i + 1), n)
        yield i, j
        i = j


def extract_features(data: np.ndarray, offsets: np.ndarray, params: DeconParams, short_paragraphs: bool,
                     keep_tokens: bool = False) -> Features:
    """Features of the documents ``data[offsets[d]:offsets[d+1]]``, over the whole batch at once.

    Tokens are maximal runs of non-whitespace characters (``str.isspace``) inside one document;
    a paragraph starts at a document's first token and after a gap holding two or more ``\\n``;
    a document whose paragraphs are all shorter than ``ngram_tokens`` is one unit (a record),
    otherwise each paragraph is one. Features: every ``ngram_tokens`` window inside a unit that
    holds a letter, and every ``record_min_tokens``..``record_max_tokens`` unit holding a letter
    (``short_paragraphs``, the document side; the eval side only makes a complete short record
    one). Two compiled passes (``kernels``): one over the bytes, one over the tokens.
    """
    n_docs = len(offsets) - 1
    n = len(data)
    if n == 0 or n_docs == 0:
        return _empty_features(n_docs)
    # non-ASCII characters are decoded and looked up in the code point tables (built on first use)
    cp_alpha, cp_space = _codepoint_tables() if data.max() >= 0xC0 else (_NO_CODEPOINTS, _NO_CODEPOINTS)
    starts, ends, token_hash, flags, token_doc = kernels.scan_tokens(
        kernels.readonly(data, np.uint8), kernels.readonly(offsets, np.int64), _BYTE_CLASSES, cp_space, cp_alpha)
    n_tok = len(starts)
    if n_tok == 0:
        return _empty_features(n_docs)
    t_up, t_down = _TOKEN_POWERS.get(n_tok + 1)
    hashes, unit, unit_doc, unit_first, unit_end, gram_pos, seq = kernels.window_features(
        token_hash, flags, token_doc, t_up, t_down, params.ngram_tokens, params.record_min_tokens,
        params.record_max_tokens, short_paragraphs, keep_tokens)
    return Features(
        hashes=hashes,
        unit=unit,
        unit_doc=unit_doc,
        unit_byte_start=starts[unit_first],
        unit_byte_end=ends[unit_end - 1],
        n_docs=n_docs,
        tokens=TokenWindows(gram_pos, starts, token_doc, seq, t_up) if keep_tokens else None,
    )


def text_features(texts: Sequence[str] | pa.Array, params: DeconParams = DeconParams(),
                  short_paragraphs: bool = True) -> list[np.ndarray]:
    """Per-text sorted arrays of distinct features: a convenience for tests and inspection."""
    array = texts if isinstance(texts, (pa.Array, pa.ChunkedArray)) else pa.array(list(texts), pa.large_string())
    data, offsets, _ = string_buffers(array)
    out: list[np.ndarray] = []
    for i, j in _batches(offsets, params.batch_bytes):
        feats = extract_features(data[offsets[i]:offsets[j]], offsets[i:j + 1] - offsets[i], params, short_paragraphs)
        doc = feats.unit_doc[feats.unit]
        for d in range(j - i):
            out.append(np.unique(feats.hashes[doc == d]))
    return out

