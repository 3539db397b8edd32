"""Decontamination features: tokens, 13-gram hashes and paragraph units, vectorized over a batch.

Two feature families share the hashing: the ``marin`` features (paragraphs split on blank
lines, whitespace tokens, no normalization; exactly Marin's rule) and the ``coverage`` features
(normalized tokens, 13-grams across the whole document, see ``decon_normalize``).

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
import pyarrow.compute as pc

from marin_assets.core.decon_params import DeconParams

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


def _mix_token(h: np.ndarray) -> np.ndarray:
    """Multiply-xorshift of the token hashes, in place."""
    h ^= h >> np.uint64(29)
    h *= np.uint64(_TOKEN_MIX)
    h ^= h >> np.uint64(32)
    return h


class _Powers:
    """``base**i`` and ``base**-i`` (mod 2**64) arrays, cached up to 8M entries and grown on demand.

    A batch needs them as long as its text (in bytes), so an exceptionally large document gets
    uncached tables for its own batch: peak memory is about 40 bytes per byte of the largest batch.
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


_BYTE_POWERS = _Powers(_BYTE_BASE)
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


def _decode_leads(data: np.ndarray, lead: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Code points and byte widths of the UTF-8 sequences starting at ``lead``."""
    n = len(data)
    b0 = data[lead].astype(np.uint32)
    b1 = data[np.minimum(lead + 1, n - 1)].astype(np.uint32) & 0x3F
    b2 = data[np.minimum(lead + 2, n - 1)].astype(np.uint32) & 0x3F
    b3 = data[np.minimum(lead + 3, n - 1)].astype(np.uint32) & 0x3F
    width = np.where(b0 < 0xE0, 2, np.where(b0 < 0xF0, 3, 4))
    cp = np.where(width == 2, ((b0 & 0x1F) << 6) | b1,
                  np.where(width == 3, ((b0 & 0x0F) << 12) | (b1 << 6) | b2,
                           ((b0 & 0x07) << 18) | (b1 << 12) | (b2 << 6) | b3))
    return np.minimum(cp, 0x10FFFF), width


def _token_bytes(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per byte: part of a token, i.e. not whitespace (exactly ``str.isspace``); and the ``\\n`` positions."""
    inside = data > 32
    special = np.flatnonzero((data < 28) | (data >= 0xC2))  # newlines, tabs, control bytes, UTF-8 leads
    special_bytes = data[special]
    low = special_bytes < 28
    inside[special[low & ~_ASCII_SPACE[special_bytes]]] = True  # control characters are not whitespace
    newlines = special[special_bytes == 10]
    maybe = special[(special_bytes == 0xC2) | ((special_bytes >= 0xE1) & (special_bytes <= 0xE3))]
    if maybe.size:
        cp, width = _decode_leads(data, maybe)
        spaces = _codepoint_tables()[1][cp]
        for step in range(3):
            inside[maybe[spaces & (width > step)] + step] = False
    return inside, newlines


def _tokens_with_letter(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Exact ``any(c.isalpha())`` for the given tokens (only called for the few undecided ones)."""
    lengths = ends - starts
    first = np.cumsum(lengths) - lengths
    pos = np.arange(int(lengths.sum())) + np.repeat(starts - first, lengths)
    chunk = data[pos]
    flag = _ASCII_LETTER[chunk]
    leads = np.flatnonzero(chunk >= 0xC0)
    if leads.size:
        cp, _ = _decode_leads(data, pos[leads])
        flag[leads] = _codepoint_tables()[0][cp]
    return np.maximum.reduceat(flag.view(np.uint8), first) > 0


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


def _string_buffers(texts: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(UTF-8 bytes, offsets [n+1] into them, null mask) without copying the text."""
    if isinstance(texts, pa.ChunkedArray):
        if texts.num_chunks == 0:
            texts = pa.array([], pa.large_string())
        else:
            texts = texts.combine_chunks() if texts.num_chunks != 1 else texts.chunk(0)
    if not (pa.types.is_string(texts.type) or pa.types.is_large_string(texts.type)):
        texts = texts.cast(pa.large_string())
    nulls = texts.is_null().to_numpy(zero_copy_only=False) if texts.null_count else np.zeros(len(texts), bool)
    if texts.null_count:
        texts = pc.fill_null(texts, "")
    buffers = texts.buffers()
    dtype = np.int64 if pa.types.is_large_string(texts.type) else np.int32
    offsets = np.frombuffer(buffers[1], dtype=dtype)[texts.offset: texts.offset + len(texts) + 1].astype(np.int64)
    data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None else np.zeros(0, np.uint8)
    data = data[offsets[0]: offsets[-1]]
    return data, offsets - offsets[0], nulls


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
    """Features of the documents ``data[offsets[d]:offsets[d+1]]``, vectorized over the whole batch.

    ``short_paragraphs`` makes every 3-12 token paragraph an exact feature (document side); the
    eval side only makes a complete short record one. Token-level work uses slices rather than
    gathers where it can: this function is the marking's inner loop.
    """
    n_gram = params.ngram_tokens
    n_docs = len(offsets) - 1
    n = len(data)
    if n == 0 or n_docs == 0:
        return _empty_features(n_docs)

    # -- tokens: maximal non-whitespace runs, never crossing a document boundary
    inside, newlines = _token_bytes(data)
    change = np.empty(n + 1, dtype=bool)
    change[0], change[n] = inside[0], inside[-1]
    np.not_equal(inside[1:], inside[:-1], out=change[1:n])
    edges = np.flatnonzero(change)  # starts and ends alternate
    starts, ends = edges[0::2], edges[1::2]
    inner = offsets[1:-1]
    inner = inner[(inner > 0) & (inner < n)]
    glued = np.unique(inner[inside[inner - 1] & inside[inner]]) if inner.size else inner
    if glued.size:
        starts = np.insert(starts, np.searchsorted(starts, glued), glued)
        ends = np.insert(ends, np.searchsorted(ends, glued), glued)
    n_tok = len(starts)
    if n_tok == 0:
        return _empty_features(n_docs)
    doc_first_tok = np.searchsorted(starts, offsets[:-1])
    doc_has_tokens = doc_first_tok < np.append(doc_first_tok[1:], n_tok)

    # -- token hashes: polynomial over bytes via prefix sums of b_j * B^-j, then mixed
    up, down = _BYTE_POWERS.get(n + 1)
    prefix = np.empty(n + 1, dtype=np.uint64)
    prefix[0] = 0
    prefix[1:] = data
    prefix[1:] *= down[:n]
    np.cumsum(prefix[1:], out=prefix[1:])
    token_hash = prefix[ends]
    token_hash -= prefix[starts]
    del prefix
    token_hash *= up[ends]
    lengths = (ends - starts).view(np.uint64)
    lengths *= np.uint64(_TOKEN_LEN_SALT)
    token_hash += lengths
    _mix_token(token_hash)

    # -- paragraphs: a gap with two or more newlines starts one, and so does every document
    para_start = np.zeros(n_tok, dtype=bool)
    if newlines.size > 1:
        first_nl, second_nl = newlines[:-1], newlines[1:]
        # consecutive newlines with only whitespace between: a cheap necessary test, then exact
        maybe = np.flatnonzero(~inside[first_nl + 1] & ~inside[second_nl - 1])
        if maybe.size:
            after_first = np.searchsorted(starts, first_nl[maybe])  # the next token
            inside_doc = after_first < n_tok
            after_first, maybe = after_first[inside_doc], maybe[inside_doc]
            para_start[after_first[starts[after_first] > second_nl[maybe]]] = True
    para_start[doc_first_tok[doc_has_tokens]] = True
    para_first = np.flatnonzero(para_start)
    para_len = np.diff(np.append(para_first, n_tok))
    para_doc = np.searchsorted(doc_first_tok, para_first, side="right") - 1
    whole_record = np.ones(n_docs, dtype=bool)  # every paragraph short: the record is one unit
    whole_record[para_doc[para_len >= n_gram]] = False
    merged = whole_record[para_doc] & (para_first != doc_first_tok[para_doc])
    if merged.any():
        para_start[para_first[merged]] = False
        unit_first, unit_doc = para_first[~merged], para_doc[~merged]
    else:
        unit_first, unit_doc = para_first, para_doc
    unit_end = np.append(unit_first[1:], n_tok)
    unit_len = unit_end - unit_first
    tok_unit = np.cumsum(para_start, dtype=np.int32)  # unit number + 1

    # -- which windows / short units hold a letter: decided by first bytes, exact check for the rest
    sure = _ASCII_LETTER[data[starts]]
    letters = np.zeros(n_tok + 1, dtype=np.int32)
    np.cumsum(sure, out=letters[1:])
    n_win = max(n_tok - n_gram + 1, 0)
    in_unit = tok_unit[:n_win] == tok_unit[n_gram - 1:]
    valid = letters[n_gram:] != letters[:n_win]
    valid &= in_unit
    short = (unit_len >= params.record_min_tokens) & (unit_len <= min(params.record_max_tokens, n_gram - 1))
    if not short_paragraphs:
        short &= whole_record[unit_doc]
    r = np.flatnonzero(short)
    open_r = r[letters[unit_end[r]] == letters[unit_first[r]]]
    if open_r.size or np.count_nonzero(valid) != np.count_nonzero(in_unit):
        open_k = np.flatnonzero(in_unit & ~valid)
        cover = np.bincount(np.concatenate([open_k, unit_first[open_r]]), minlength=n_tok + 1)
        cover -= np.bincount(np.concatenate([open_k + n_gram, unit_end[open_r]]), minlength=n_tok + 1)
        undecided = np.flatnonzero((np.cumsum(cover[:-1]) > 0) & ~sure)
        if undecided.size:
            sure[undecided] = _tokens_with_letter(data, starts[undecided], ends[undecided])
            np.cumsum(sure, out=letters[1:])
            np.not_equal(letters[n_gram:], letters[:n_win], out=valid)
            valid &= in_unit
        r = r[letters[unit_end[r]] > letters[unit_first[r]]]

    # -- feature hashes: polynomial over token hashes via prefix sums of h_j * M^-j. Computed for
    # every window start with slices (cheaper than gathers), then the valid windows kept.
    t_up, t_down = _TOKEN_POWERS.get(n_tok + 1)
    seq = np.empty(n_tok + 1, dtype=np.uint64)
    seq[0] = 0
    np.multiply(token_hash, t_down[:n_tok], out=seq[1:])
    np.cumsum(seq[1:], out=seq[1:])
    window_hash = seq[n_gram:] - seq[:n_win]
    window_hash *= t_up[n_gram:n_tok + 1]
    gram_hash = window_hash[valid]
    gram_hash += np.uint64((n_gram * _FEATURE_LEN_SALT) & _MASK)
    gram_unit = tok_unit[:n_win][valid]
    gram_unit -= 1
    rec_hash = (seq[unit_end[r]] - seq[unit_first[r]]) * t_up[unit_end[r]]
    rec_hash += unit_len[r].astype(np.uint64) * np.uint64(_FEATURE_LEN_SALT)

    tokens = None
    if keep_tokens:
        token_doc = np.repeat(np.arange(n_docs, dtype=np.int64), np.diff(np.append(doc_first_tok, n_tok)))
        tokens = TokenWindows(np.flatnonzero(valid), starts, token_doc, seq, t_up)
    return Features(
        hashes=np.concatenate([gram_hash, rec_hash]),
        unit=np.concatenate([gram_unit.astype(np.int64), r]),
        unit_doc=unit_doc,
        unit_byte_start=starts[unit_first],
        unit_byte_end=ends[unit_end - 1],
        n_docs=n_docs,
        tokens=tokens,
    )


def text_features(texts: Sequence[str] | pa.Array, params: DeconParams = DeconParams(),
                  short_paragraphs: bool = True) -> list[np.ndarray]:
    """Per-text sorted arrays of distinct features: a convenience for tests and inspection."""
    array = texts if isinstance(texts, (pa.Array, pa.ChunkedArray)) else pa.array(list(texts), pa.large_string())
    data, offsets, _ = _string_buffers(array)
    out: list[np.ndarray] = []
    for i, j in _batches(offsets, params.batch_bytes):
        feats = extract_features(data[offsets[i]:offsets[j]], offsets[i:j + 1] - offsets[i], params, short_paragraphs)
        doc = feats.unit_doc[feats.unit]
        for d in range(j - i):
            out.append(np.unique(feats.hashes[doc == d]))
    return out

