"""13-gram eval decontamination: the eval n-gram index, boilerplate drop sets, per-document marks.

Features (the same on both sides, so an eval row and a copy of it hash identically):

* the text is split into paragraphs on blank lines (a whitespace gap holding two or more
  ``\\n``), each paragraph into whitespace tokens (``str.split()`` semantics, Unicode spaces
  included); no lowercasing, no punctuation stripping;
* a paragraph of at least 13 tokens gives its contiguous 13-grams; n-grams without an
  alphabetic character (``str.isalpha``) are dropped because numbers and symbol runs repeat
  everywhere;
* when no paragraph reaches 13 tokens the record is read as one paragraph, and a complete
  record of 3 to 12 tokens with a letter is one exact feature (short questions still count);
* on the document side a paragraph of 3 to 12 tokens is also one exact feature, so a short eval
  record quoted as its own paragraph matches;
* a feature is the 64-bit hash of its tokens joined by single spaces (``feature_hash``).

The index is an exact sorted ``uint64`` array (false positives only from 64-bit collisions,
about N / 2**64 per lookup, far below 1e-9) fronted by two bitmaps over disjoint hash bits
that reject almost every query with one or two memory accesses; an attribution table maps each
hash to the eval rows it came from. Building refuses to run when a mandatory eval set, its exact row count
or any matchable feature is missing: a "clean" pool must never come from a partial eval corpus.

Drop sets remove boilerplate that eval sets share with ordinary text (licences, instructions,
common phrases) from both the numerator and the denominator of the overlap: per source, eval
n-grams in at least max(5, 0.5%) of its first 5,000 documents; globally, eval n-grams in at
least 50 of the first 1,000,000 documents of each source summed, seen in at least 3 sources.

A document is contaminated when some paragraph has overlap (matched / kept features) >= 0.5
with at least 2 distinct matched features, or with a matched feature that is a complete eval
record on its own. ``matched_evals`` / ``matched_rows`` hold the evidence: for a contaminated
document the rows matched by its qualifying paragraphs, otherwise every row it partly matched
(useful to review near misses), rows with the most matched features first. The pool drops
contaminated documents whole; spans are never cut out.
"""

from __future__ import annotations

import csv
import dataclasses
import fnmatch
import functools
import hashlib
import io
import json
import os
import tempfile
import uuid
import zipfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import xxhash

from marin_assets.core.errors import BadInput
from marin_assets.catalog.evals import EvalRegistry, EvalSet, HuggingFaceProvider, WebArchiveProvider
from marin_assets.core import storage

# ----------------------------------------------------------------------------- parameters


@dataclasses.dataclass(frozen=True)
class DeconParams:
    """Reference values of the decontamination rule; URIs say where the index and drop sets are."""

    ngram_tokens: int = 13
    record_min_tokens: int = 3
    record_max_tokens: int = 12
    overlap_threshold: float = 0.5
    min_matched_features: int = 2
    # drop sets
    source_sample_docs: int = 5_000
    source_min_docs: int = 5
    source_min_fraction: float = 0.005
    global_sample_docs: int = 1_000_000
    global_min_docs: int = 50
    global_min_sources: int = 3
    # reporting
    flagged_sample_size: int = 8
    max_matched_rows: int = 16
    excerpt_chars: int = 600
    # execution
    text_column: str = "text"
    batch_bytes: int = 1 << 20  # per-byte work arrays stay small enough to be reused, not re-faulted
    index_uri: str = ""
    drop_set_uris: tuple[str, ...] = ()
    index_cache_dir: str = ""  # local copies of a remote index (empty: the system temp folder)

    def rule(self) -> dict[str, Any]:
        """The parameters that decide the output (fingerprint input); URIs, cache and batch size excluded."""
        skip = {"index_uri", "drop_set_uris", "batch_bytes", "index_cache_dir"}
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in skip}


class EvalIndexError(BadInput, RuntimeError):
    """The eval corpus is incomplete or unusable; the message lists every problem and the fix."""


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

    @property
    def n_units(self) -> int:
        return len(self.unit_doc)


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


def extract_features(data: np.ndarray, offsets: np.ndarray, params: DeconParams, short_paragraphs: bool) -> Features:
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

    return Features(
        hashes=np.concatenate([gram_hash, rec_hash]),
        unit=np.concatenate([gram_unit.astype(np.int64), r]),
        unit_doc=unit_doc,
        unit_byte_start=starts[unit_first],
        unit_byte_end=ends[unit_end - 1],
        n_docs=n_docs,
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


# ----------------------------------------------------------------------------- the eval index

_INDEX_META = "index.json"


def _sorted_member(sorted_values: np.ndarray, queries: np.ndarray) -> np.ndarray:
    if sorted_values.size == 0 or queries.size == 0:
        return np.zeros(len(queries), dtype=bool)
    pos = np.searchsorted(sorted_values, queries)
    pos[pos == len(sorted_values)] = 0
    return sorted_values[pos] == queries


@dataclasses.dataclass
class EvalIndex:
    """Exact membership over the eval features plus attribution to eval rows."""

    hashes: np.ndarray  # sorted unique uint64
    record_hashes: np.ndarray  # sorted: features that are a complete eval row on their own
    attribution_hashes: np.ndarray  # sorted uint64, one entry per (feature, row)
    attribution_rows: np.ndarray  # int32 row numbers aligned with attribution_hashes
    row_sets: list[str]
    row_ids: list[str]
    row_excerpts: list[str]
    meta: dict[str, Any]
    bitmaps: tuple[np.ndarray, np.ndarray] = dataclasses.field(init=False, repr=False)
    shift: int = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        # Two bitmaps over two disjoint bit ranges of the hash, each with >= 8 slots per hash,
        # reject ~98.5% of misses (most with the first access); the binary search over the
        # sorted array only sees the survivors. Together they cost ~2 bits per slot, ~4 bytes
        # per n-gram.
        n = max(len(self.hashes), 1)
        bits = int(min(max(np.ceil(np.log2(n * 8)), 10), 32))
        self.shift = 64 - bits
        self.bitmaps = (self._bitmap(self.hashes >> np.uint64(64 - bits), bits),
                        self._bitmap((self.hashes >> np.uint64(64 - 2 * bits)) & np.uint64((1 << bits) - 1), bits))

    @staticmethod
    def _bitmap(slots: np.ndarray, bits: int) -> np.ndarray:
        bitmap = np.zeros(1 << (bits - 3), dtype=np.uint8)
        if len(slots):
            slots = np.sort(slots)
            byte = (slots >> np.uint64(3)).astype(np.int64)
            mask = np.left_shift(np.uint8(1), (slots & np.uint64(7)).astype(np.uint8))
            first = np.flatnonzero(np.r_[True, byte[1:] != byte[:-1]])
            bitmap[byte[first]] = np.bitwise_or.reduceat(mask, first)
        return bitmap

    @property
    def size(self) -> int:
        return len(self.hashes)

    @property
    def memory_bytes(self) -> int:
        """Resident bytes of the membership structure (sorted hashes + bitmaps)."""
        return int(self.hashes.nbytes + sum(b.nbytes for b in self.bitmaps) + self.record_hashes.nbytes)

    def contains(self, queries: np.ndarray) -> np.ndarray:
        out = np.zeros(len(queries), dtype=bool)
        if not len(self.hashes) or not len(queries):
            return out
        first, second = self.bitmaps
        slot = (queries >> np.uint64(self.shift)).view(np.int64)
        cand = np.flatnonzero((first[slot >> 3] >> (slot & 7)) & 1)
        if cand.size:
            slot = ((queries[cand] >> np.uint64(2 * self.shift - 64)) & np.uint64((1 << (64 - self.shift)) - 1))
            slot = slot.view(np.int64)
            cand = cand[((second[slot >> 3] >> (slot & 7)) & 1).astype(bool)]
        if cand.size:
            q = queries[cand]
            if cand.size > 4096:  # sorted queries make the binary searches cache-friendly
                order = np.argsort(q, kind="stable")
                q, cand = q[order], cand[order]
            out[cand[_sorted_member(self.hashes, q)]] = True
        return out

    @functools.cached_property
    def _row_tables(self) -> tuple[np.ndarray, np.ndarray, list[str], list[str]]:
        """Per row: rank in (set, row id) order, set code; set names; "set:row" labels."""
        set_names = sorted(set(self.row_sets))
        code = {name: c for c, name in enumerate(set_names)}
        set_code = np.array([code[s] for s in self.row_sets], dtype=np.int64)
        rank = np.empty(len(self.row_ids), dtype=np.int64)
        rank[sorted(range(len(self.row_ids)), key=lambda r: (self.row_sets[r], self.row_ids[r]))] = np.arange(
            len(self.row_ids))
        labels = [f"{s}:{r}" for s, r in zip(self.row_sets, self.row_ids)]
        return rank, set_code, set_names, labels

    def attribute(self, docs: np.ndarray, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Distinct (doc, hash) matches -> (doc, row) pairs, each doc's rows ranked by matched features.

        Rows with more matched features come first, ties in (set, row id) order.
        """
        lo = np.searchsorted(self.attribution_hashes, hashes, side="left")
        count = np.searchsorted(self.attribution_hashes, hashes, side="right") - lo
        total = int(count.sum())
        first = np.cumsum(count) - count
        pos = np.arange(total) + np.repeat(lo - first, count)
        rows = np.asarray(self.attribution_rows[pos], dtype=np.int64)
        pair_docs = np.repeat(docs, count)
        n_rows = max(len(self.row_ids), 1)
        combined, matches = np.unique(pair_docs * n_rows + rows, return_counts=True)
        pair_docs, rows = combined // n_rows, combined % n_rows
        rank = self._row_tables[0]
        order = np.lexsort((rank[rows], -matches, pair_docs))
        return pair_docs[order], rows[order]

    def row_label(self, row: int) -> str:
        return self._row_tables[3][row]


def _save_npy(array: np.ndarray, uri: str) -> None:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    storage.write_bytes(uri, buf.getvalue())


def _load_npy(uri: str) -> np.ndarray:
    fs, path = storage.filesystem(uri)
    if "file" in (fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)):
        return np.load(path, mmap_mode="r", allow_pickle=False)
    return np.load(io.BytesIO(storage.read_bytes(uri)), allow_pickle=False)


def build_eval_index(
    eval_rows: Iterable[tuple[str, str, str]],
    out_dir_uri: str,
    params: DeconParams = DeconParams(),
    expected: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """Build the eval n-gram index from ``(eval_set, row_id, text)`` rows into ``out_dir_uri``.

    ``expected`` maps every mandatory set to its exact row count; the build refuses to run, and
    writes nothing, when one is missing, has another row count or yields no matchable feature.
    Writes ``hashes.npy``, ``record_hashes.npy``, ``attribution_hashes.npy``,
    ``attribution_rows.npy``, ``rows.parquet`` and ``index.json`` (the caller writes the
    manifest). Returns the build's counters.
    """
    expected = dict(expected or {})
    sets: list[str] = []
    ids: list[str] = []
    texts: list[str | None] = []
    for eval_set, row_id, text in eval_rows:
        sets.append(str(eval_set))
        ids.append(str(row_id))
        texts.append(text if isinstance(text, str) else None)
    rows_per_set = Counter(sets)
    problems = []
    for name in sorted(expected):
        have, want = rows_per_set.get(name, 0), int(expected[name])
        if have == 0:
            problems.append(f"mandatory eval set {name!r} is missing (expected {want} rows)")
        elif have != want:
            problems.append(f"mandatory eval set {name!r} has {have} rows, expected {want}")
    if problems:
        raise EvalIndexError("eval_ngrams: refusing to build the index: " + "; ".join(problems)
                             + ". Fetch the missing eval data (or fix 'rows' in the eval registry) and rebuild.")

    array = pa.array(texts, pa.large_string())
    data, offsets, nulls = _string_buffers(array)
    all_hashes, all_rows = [], []
    for i, j in _batches(offsets, params.batch_bytes):
        feats = extract_features(data[offsets[i]:offsets[j]], offsets[i:j + 1] - offsets[i], params,
                                 short_paragraphs=False)
        all_hashes.append(feats.hashes)
        all_rows.append((feats.unit_doc[feats.unit] + i).astype(np.int64))
    hashes = np.concatenate(all_hashes) if all_hashes else np.zeros(0, np.uint64)
    rows = np.concatenate(all_rows) if all_rows else np.zeros(0, np.int64)

    # distinct (row, hash) pairs
    order = np.lexsort((hashes, rows))
    rows, hashes = rows[order], hashes[order]
    fresh = np.r_[True, (rows[1:] != rows[:-1]) | (hashes[1:] != hashes[:-1])] if len(rows) else np.zeros(0, bool)
    rows, hashes = rows[fresh], hashes[fresh]
    features_per_row = np.bincount(rows, minlength=len(sets))
    featureless = Counter(s for s, c in zip(sets, features_per_row.tolist()) if c == 0)
    for name in sorted(expected):
        if featureless.get(name, 0) == rows_per_set[name]:
            problems.append(f"mandatory eval set {name!r} yields no matchable feature (every row is shorter than "
                            f"{params.record_min_tokens} tokens or has no letter)")
    if problems:
        raise EvalIndexError("eval_ngrams: refusing to build the index: " + "; ".join(problems)
                             + ". Check the 'fields' of these sets in the eval registry and rebuild.")

    record_hashes = np.unique(hashes[features_per_row[rows] == 1])
    by_hash = np.argsort(hashes, kind="stable")
    attribution_hashes = hashes[by_hash]
    attribution_rows = rows[by_hash].astype(np.int32)
    unique_hashes = np.unique(attribution_hashes)

    excerpts = [(t or "")[:300] for t in texts]
    _save_npy(unique_hashes, storage.join(out_dir_uri, "hashes.npy"))
    _save_npy(record_hashes, storage.join(out_dir_uri, "record_hashes.npy"))
    _save_npy(attribution_hashes, storage.join(out_dir_uri, "attribution_hashes.npy"))
    _save_npy(attribution_rows, storage.join(out_dir_uri, "attribution_rows.npy"))
    storage.write_parquet(pa.table({
        "row": pa.array(np.arange(len(sets), dtype=np.int32)),
        "eval_set": pa.array(sets, pa.string()),
        "row_id": pa.array(ids, pa.string()),
        "features": pa.array(features_per_row.astype(np.int32)),
        "excerpt": pa.array(excerpts, pa.string()),
    }), storage.join(out_dir_uri, "rows.parquet"))
    features_per_set: Counter = Counter()
    for s, c in zip(sets, features_per_row.tolist()):
        features_per_set[s] += c
    per_set = {
        name: {"rows": rows_per_set[name], "features": int(features_per_set[name]),
               "featureless_rows": int(featureless.get(name, 0)), "mandatory": name in expected}
        for name in sorted(rows_per_set)
    }
    stats = {
        "hash_scheme": HASH_SCHEME,
        "build_id": uuid.uuid4().hex,
        "ngrams": int(len(unique_hashes)),
        "record_features": int(len(record_hashes)),
        "attribution_entries": int(len(attribution_hashes)),
        "rows": len(sets),
        "null_text_rows": int(nulls.sum()),
        "eval_sets": per_set,
        "params": params.rule(),
    }
    storage.write_json(storage.join(out_dir_uri, _INDEX_META), stats)
    return stats


def load_eval_index(index_uri: str, cache_dir: str = "") -> EvalIndex:
    """Load (and cache per process) the index at ``index_uri``; remote indexes are cached on local
    disk under ``cache_dir`` (empty: the system temp folder)."""
    meta = storage.read_json(storage.join(index_uri, _INDEX_META))
    if meta.get("hash_scheme") != HASH_SCHEME:
        raise EvalIndexError(f"eval index {index_uri!r} uses hash scheme {meta.get('hash_scheme')!r}, this code "
                             f"uses {HASH_SCHEME!r}; rebuild eval_ngrams")
    return _load_index_cached(index_uri, meta["build_id"], cache_dir)


@functools.lru_cache(maxsize=2)
def _load_index_cached(index_uri: str, build_id: str, cache_dir: str = "") -> EvalIndex:
    local = _local_copy(index_uri, build_id, cache_dir)
    rows = storage.read_parquet(storage.join(local, "rows.parquet"), columns=["eval_set", "row_id", "excerpt"])
    return EvalIndex(
        hashes=np.ascontiguousarray(_load_npy(storage.join(local, "hashes.npy"))),
        record_hashes=np.asarray(_load_npy(storage.join(local, "record_hashes.npy"))),
        attribution_hashes=np.asarray(_load_npy(storage.join(local, "attribution_hashes.npy"))),
        attribution_rows=np.asarray(_load_npy(storage.join(local, "attribution_rows.npy"))),
        row_sets=rows.column("eval_set").to_pylist(),
        row_ids=rows.column("row_id").to_pylist(),
        row_excerpts=rows.column("excerpt").to_pylist(),
        meta=storage.read_json(storage.join(local, _INDEX_META)),
    )


def _local_copy(index_uri: str, build_id: str, cache_dir: str = "") -> str:
    """Local indexes are used in place; remote ones are copied once into a local cache directory."""
    if "://" not in index_uri or index_uri.startswith("file://"):
        return index_uri
    cache = os.path.join(cache_dir or tempfile.gettempdir(), "marin-eval-index", build_id)
    if not os.path.exists(os.path.join(cache, _INDEX_META)):
        os.makedirs(cache, exist_ok=True)
        for name in ("hashes.npy", "record_hashes.npy", "attribution_hashes.npy", "attribution_rows.npy",
                     "rows.parquet", _INDEX_META):  # index.json last: it marks the copy complete
            storage.write_bytes(os.path.join(cache, name), storage.read_bytes(storage.join(index_uri, name)))
    return cache


# ----------------------------------------------------------------------------- reading eval rows


def _field_values(record: Any, path: str) -> tuple[bool, list[Any]]:
    """(present, values) of a dotted path; lists of structs are mapped over."""
    current = [record]
    for part in path.split("."):
        found, nxt = False, []
        for value in current:
            items = value if isinstance(value, list) else [value]
            for item in items:
                if isinstance(item, dict) and part in item:
                    found = True
                    nxt.append(item[part])
        if not found:
            return False, []
        current = nxt
    return True, current


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value] if value.strip() else []
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    return []  # numbers, booleans, bytes (images), None carry no eval text


def record_text(record: Mapping[str, Any], fields: Sequence[str], parent: Mapping[str, Any] | None = None) -> str:
    """The indexed text of a record: every string under ``fields``, each its own paragraph."""
    parts: list[str] = []
    for field in fields:
        present, values = _field_values(record, field)
        if not present and parent is not None:
            present, values = _field_values(parent, field)
        for value in values:
            parts.extend(_strings(value))
    return "\n\n".join(parts)


def _read_records(uri: str, fmt: str, columns: set[str] | None) -> list[dict[str, Any]]:
    if fmt == "parquet":
        fs, path = storage.filesystem(uri)
        with fs.open(path, "rb") as handle:
            pfile = pq.ParquetFile(handle)
            names = pfile.schema_arrow.names
            wanted = [c for c in names if columns is None or c in columns]
            return pfile.read(columns=wanted).to_pylist()
    raw = storage.read_bytes(uri)
    if fmt == "jsonl":
        return [json.loads(line) for line in raw.decode("utf-8").splitlines() if line.strip()]
    if fmt == "csv":
        return list(csv.DictReader(io.StringIO(raw.decode("utf-8-sig"), newline="")))
    document = json.loads(raw)
    return document if isinstance(document, list) else [document]


def _records_at(document: Any, path: str, label: str) -> list[dict[str, Any]]:
    current = document
    for part in [p for p in path.split(".") if p]:
        if not isinstance(current, dict) or part not in current:
            raise EvalIndexError(f"{label}: 'records' path {path!r} not found in the JSON document")
        current = current[part]
    if isinstance(current, dict):
        current = list(current.values())
    if not isinstance(current, list):
        raise EvalIndexError(f"{label}: 'records' path {path!r} does not hold a list of records")
    return current


def _sha256_of(uri: str) -> str:
    digest = hashlib.sha256()
    fs, path = storage.filesystem(uri)
    with fs.open(path, "rb") as handle:
        while chunk := handle.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def read_eval_rows(eval_set: EvalSet, file_uris: Sequence[str], sha256: str = "") -> Iterator[tuple[str, str, str]]:
    """``(eval_set, row_id, text)`` rows from the downloaded (or local) files of one eval set.

    Hub sets: the Parquet/JSONL/JSON/CSV files the hub client fetched, in the given order. Web
    archives: the single fetched file, checked against ``sha256`` (from the registry or its
    lock) first. A field the registry names that no record has is an error naming the set,
    the field, the file and the columns found.
    """
    provider = eval_set.provider
    label = f"eval set {eval_set.name!r}"
    if not file_uris:
        raise EvalIndexError(f"{label}: no files given; download {getattr(provider, 'repo', '') or 'its data'} first")
    if isinstance(provider, WebArchiveProvider):
        if len(file_uris) != 1:
            raise EvalIndexError(f"{label}: a web archive is one file, got {len(file_uris)}")
        if sha256:
            actual = _sha256_of(file_uris[0])
            if actual != sha256:
                raise EvalIndexError(
                    f"{label}: file {file_uris[0]} has sha256 {actual}, the registry pins {sha256}; the archive at "
                    f"{provider.url} changed: review it and update 'provider.sha256' (or the lock)")
        yield from _web_rows(eval_set, provider, file_uris[0], label)
        return
    fmt_of = (lambda u: provider.format) if not isinstance(provider, HuggingFaceProvider) else _format_of
    top = {f.split(".")[0] for f in eval_set.fields} | {eval_set.id_field, eval_set.explode} - {""}
    position = 0
    for uri in file_uris:
        fmt = fmt_of(uri)
        if not fmt:
            continue  # README, dataset card, other non-data files of the repo
        records = _read_records(uri, fmt, top)
        yield from _rows_of_records(eval_set, records, uri, label, position)
        position += len(records)


def _format_of(uri: str) -> str:
    lowered = uri.lower()
    for fmt in ("parquet", "jsonl", "json", "csv"):
        if lowered.endswith("." + fmt):
            return fmt
    return ""


def _rows_of_records(eval_set: EvalSet, records: list[dict[str, Any]], uri: str, label: str,
                     position: int) -> Iterator[tuple[str, str, str]]:
    if records:
        _check_fields(eval_set, records, uri, label)
    for offset, record in enumerate(records):
        row_id = str(record.get(eval_set.id_field)) if eval_set.id_field else str(position + offset)
        if eval_set.explode:
            for step, element in enumerate(record.get(eval_set.explode) or []):
                element = element if isinstance(element, dict) else {"value": element}
                yield eval_set.name, f"{row_id}.{step}", record_text(element, eval_set.fields, parent=record)
        else:
            yield eval_set.name, row_id, record_text(record, eval_set.fields)


def _check_fields(eval_set: EvalSet, records: list[dict[str, Any]], uri: str, label: str) -> None:
    columns = sorted({key for r in records[:1000] for key in r})
    names = list(eval_set.fields) + ([eval_set.id_field] if eval_set.id_field else [])
    for field in names + ([eval_set.explode] if eval_set.explode else []):
        sample = records[:1000]
        present = any(_field_values(r, field)[0] for r in sample)
        if not present and eval_set.explode and field in eval_set.fields:
            elements = [e for r in sample for e in (r.get(eval_set.explode) or []) if isinstance(e, dict)]
            present = any(_field_values(e, field)[0] for e in elements)
        if not present:
            raise EvalIndexError(f"{label}: field {field!r} is in no record of {uri} (columns: {', '.join(columns)}); "
                                 f"fix 'fields'/'id_field'/'explode' of {eval_set.name!r} in the eval registry")


def _web_rows(eval_set: EvalSet, provider: WebArchiveProvider, uri: str, label: str) -> Iterator[tuple[str, str, str]]:
    if provider.format != "zip":
        if provider.format == "json":
            records = _records_at(json.loads(storage.read_bytes(uri)), provider.records, label)
        else:
            records = _read_records(uri, provider.format, None)
        yield from _rows_of_records(eval_set, records, uri, label, 0)
        return
    with zipfile.ZipFile(io.BytesIO(storage.read_bytes(uri))) as archive:
        names = [n for n in archive.namelist() if not n.endswith("/")]
        if provider.member:
            if provider.member not in names:
                raise EvalIndexError(f"{label}: member {provider.member!r} is not in {uri}; fix 'provider.member'")
            inner_fmt = _format_of(provider.member) or "json"
            payload = archive.read(provider.member)
            if inner_fmt == "json":
                records = _records_at(json.loads(payload), provider.records, label)
            elif inner_fmt == "jsonl":
                records = [json.loads(x) for x in payload.decode("utf-8").splitlines() if x.strip()]
            elif inner_fmt == "csv":
                records = list(csv.DictReader(io.StringIO(payload.decode("utf-8-sig"), newline="")))
            else:
                records = pq.read_table(io.BytesIO(payload)).to_pylist()
            yield from _rows_of_records(eval_set, records, f"{uri}!{provider.member}", label, 0)
            return
        dirs = sorted({d for n in names for d in _parents(n) if _match_segments(d, provider.row_dirs)})
        if not dirs:
            raise EvalIndexError(f"{label}: no directory of {uri} matches row_dirs {provider.row_dirs!r}")
        seen_fields: set[str] = set()
        for d in dirs:  # a matching directory is a row when it holds at least one indexed file
            files = [(field, n) for field in eval_set.fields
                     for n in sorted(n for n in names if fnmatch.fnmatchcase(n, f"{d}/{field}"))]
            if not files:
                continue
            seen_fields.update(field for field, _ in files)
            parts = [archive.read(n).decode("utf-8", errors="replace") for _, n in files]
            yield eval_set.name, d.rsplit("/", 1)[-1], "\n\n".join(p for p in parts if p.strip())
        missing = [f for f in eval_set.fields if f not in seen_fields]
        if missing:
            raise EvalIndexError(f"{label}: file(s) {missing} exist in no row directory of {uri}; fix 'fields'")


def _match_segments(path: str, pattern: str) -> bool:
    """Glob match segment by segment, so ``*/*`` means exactly two levels."""
    parts, globs = path.split("/"), pattern.strip("/").split("/")
    return len(parts) == len(globs) and all(fnmatch.fnmatchcase(p, g) for p, g in zip(parts, globs))


def _parents(name: str) -> Iterator[str]:
    parts = name.split("/")[:-1]
    for i in range(1, len(parts) + 1):
        yield "/".join(parts[:i])


def registry_rows(
    registry: EvalRegistry,
    fetch: Callable[[EvalSet], Sequence[str]],
    on_skip: Callable[[EvalSet, Exception], None] | None = None,
) -> Iterator[tuple[str, str, str]]:
    """Rows of every registry set; ``fetch(eval_set) -> local file URIs`` does the download.

    A best-effort set that cannot be fetched or read is reported through ``on_skip`` and left
    out; a mandatory one raises, naming the set.
    """
    for eval_set in registry.sets:
        try:
            sha = registry.archive_sha256(eval_set) if isinstance(eval_set.provider, WebArchiveProvider) else ""
            rows = list(read_eval_rows(eval_set, list(fetch(eval_set)), sha256=sha))
        except Exception as exc:
            if eval_set.mandatory:
                raise EvalIndexError(f"mandatory eval set {eval_set.name!r} could not be read: {exc}") from exc
            if on_skip is not None:
                on_skip(eval_set, exc)
            continue
        yield from rows


# ----------------------------------------------------------------------------- marking


@dataclasses.dataclass
class DocumentMarks:
    contaminated: np.ndarray  # bool [D]
    max_overlap: np.ndarray  # float32 [D]
    matched_evals: list[list[str]]
    matched_rows: list[list[str]]
    evidence: dict[int, tuple[int, int, list[int]]]  # flagged doc -> (byte start, byte end, row numbers)
    counters: Counter


def load_drop_set(uris: Sequence[str]) -> np.ndarray:
    """Union of the ``hash`` columns of the drop-set files, sorted."""
    parts = [storage.read_parquet(u, columns=["hash"]).column("hash").to_numpy() for u in uris]
    if not parts:
        return np.zeros(0, dtype=np.uint64)
    return np.unique(np.concatenate(parts).astype(np.uint64))


def mark_documents(
    texts: pa.Array | pa.ChunkedArray | Sequence[str | None],
    index: EvalIndex,
    drop: np.ndarray | None = None,
    params: DeconParams = DeconParams(),
) -> DocumentMarks:
    """Apply the marking rule to every text (vectorized per batch; Python only for documents with matches)."""
    array = texts if isinstance(texts, (pa.Array, pa.ChunkedArray)) else pa.array(list(texts), pa.large_string())
    data, offsets, nulls = _string_buffers(array)
    n_docs = len(offsets) - 1
    drop = np.zeros(0, np.uint64) if drop is None else drop
    contaminated = np.zeros(n_docs, dtype=bool)
    max_overlap = np.zeros(n_docs, dtype=np.float32)
    matched_evals: list[list[str]] = [[] for _ in range(n_docs)]
    matched_rows: list[list[str]] = [[] for _ in range(n_docs)]
    evidence: dict[int, tuple[int, int, list[int]]] = {}
    counters: Counter = Counter(documents=n_docs, null_text=int(nulls.sum()))
    for i, j in _batches(offsets, params.batch_bytes):
        base = offsets[i]
        feats = extract_features(data[base:offsets[j]], offsets[i:j + 1] - base, params, short_paragraphs=True)
        counters["features"] += len(feats.hashes)
        hit = np.flatnonzero(index.contains(feats.hashes))
        if hit.size == 0:
            continue
        dropped = _sorted_member(drop, feats.hashes[hit])
        counters["dropped_features"] += int(dropped.sum())
        counters["matched_features"] += int((~dropped).sum())
        n_units = feats.n_units
        kept_hit = hit[~dropped]
        unit_total = np.bincount(feats.unit, minlength=n_units) - np.bincount(feats.unit[hit[dropped]],
                                                                              minlength=n_units)
        hit_unit = feats.unit[kept_hit]
        hit_hash = feats.hashes[kept_hit]
        unit_hits = np.bincount(hit_unit, minlength=n_units)
        overlap = np.divide(unit_hits, unit_total, out=np.zeros(n_units), where=unit_total > 0)
        # distinct matched features per unit, and whether one is a complete eval record
        order = np.lexsort((hit_hash, hit_unit))
        hu, hh = hit_unit[order], hit_hash[order]
        first = np.r_[True, (hu[1:] != hu[:-1]) | (hh[1:] != hh[:-1])] if len(hu) else np.zeros(0, bool)
        hu, hh = hu[first], hh[first]
        distinct = np.bincount(hu, minlength=n_units)
        record = np.bincount(hu[_sorted_member(index.record_hashes, hh)], minlength=n_units)
        unit_flag = (unit_hits > 0) & (overlap >= params.overlap_threshold) & (
            (distinct >= params.min_matched_features) | (record > 0))
        docs = feats.unit_doc
        batch_max = np.zeros(j - i, dtype=np.float64)
        touched = np.flatnonzero(unit_hits)
        np.maximum.at(batch_max, docs[touched], overlap[touched])
        max_overlap[i:j] = batch_max.astype(np.float32)
        flagged_units = np.flatnonzero(unit_flag)
        contaminated[i + docs[flagged_units]] = True

        # evidence: the qualifying paragraphs of a contaminated document, every match of the others
        doc_flagged = np.zeros(j - i, dtype=bool)
        doc_flagged[docs[flagged_units]] = True
        hit_doc = docs[hu]
        keep_pair = unit_flag[hu] | ~doc_flagged[hit_doc]
        ev_doc, ev_hash = hit_doc[keep_pair], hh[keep_pair]
        if not ev_doc.size:
            continue
        combined = np.unique(np.stack([ev_doc.astype(np.uint64), ev_hash]), axis=1)  # distinct (doc, hash)
        pair_doc, pair_row = index.attribute(combined[0].astype(np.int64), combined[1])
        if not pair_doc.size:
            continue
        _, set_code, set_names, labels = index._row_tables
        bounds = np.flatnonzero(np.r_[True, pair_doc[1:] != pair_doc[:-1], True])
        best_unit = {}
        if flagged_units.size:
            by_doc = flagged_units[np.lexsort((-overlap[flagged_units], docs[flagged_units]))]
            firsts = np.r_[True, docs[by_doc][1:] != docs[by_doc][:-1]]
            best_unit = dict(zip(docs[by_doc][firsts].tolist(), by_doc[firsts].tolist()))
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            d = int(pair_doc[a])
            g = i + d
            rows = pair_row[a:b]
            matched_rows[g] = [labels[r] for r in rows[:params.max_matched_rows].tolist()]
            matched_evals[g] = sorted({set_names[c] for c in set_code[rows].tolist()})
            if d in best_unit:
                best = best_unit[d]
                evidence[g] = (int(feats.unit_byte_start[best] + base - offsets[g]),
                               int(feats.unit_byte_end[best] + base - offsets[g]), rows[:3].tolist())
    counters["contaminated"] = int(contaminated.sum())
    return DocumentMarks(contaminated, max_overlap, matched_evals, matched_rows, evidence, counters)


def _required_index(params: DeconParams, stage: str) -> EvalIndex:
    if not params.index_uri:
        raise ValueError(f"{stage}: params.index_uri is empty; pass the eval_ngrams output directory")
    return load_eval_index(params.index_uri, params.index_cache_dir)


def _sample_key(doc_id: str) -> int:
    """Deterministic priority of a document in the flagged-document sample (bottom-k merges exactly)."""
    return xxhash.xxh3_64_intdigest(doc_id.encode("utf-8"))


def contamination_shard(input_uris: list[str], output_uri: str, params: DeconParams) -> dict[str, Any]:
    """Mark one normalized shard; write ``id, contaminated, max_overlap, matched_evals, matched_rows``.

    Output rows are in input order (co-partitioned). ``params.index_uri`` names the eval index,
    ``params.drop_set_uris`` this source's and the global drop sets. The counters carry flagged
    documents per eval set and a bottom-k sample of flagged excerpts with their eval rows.
    """
    index = _required_index(params, "contamination_shard")
    drop = load_drop_set(params.drop_set_uris)
    tables = [storage.read_parquet(u, columns=["id", params.text_column]) for u in input_uris]
    table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    texts = table.column(params.text_column)
    marks = mark_documents(texts, index, drop, params)
    out = pa.table({
        "id": table.column("id"),
        "contaminated": pa.array(marks.contaminated, pa.bool_()),
        "max_overlap": pa.array(marks.max_overlap, pa.float32()),
        "matched_evals": pa.array(marks.matched_evals, pa.list_(pa.string())),
        "matched_rows": pa.array(marks.matched_rows, pa.list_(pa.string())),
    })
    storage.write_parquet(out, output_uri)

    flagged_by_eval: Counter = Counter()
    for d in np.flatnonzero(marks.contaminated).tolist():
        flagged_by_eval.update(marks.matched_evals[d])
    flagged = sorted(marks.evidence)
    flagged_ids = table.column("id").take(pa.array(flagged, pa.int64())).to_pylist() if flagged else []
    candidates = []
    for d, doc_id in zip(flagged, flagged_ids):
        lo, hi, rows = marks.evidence[d]
        candidates.append((_sample_key(str(doc_id)), d, str(doc_id), lo, hi, rows))
    candidates.sort()
    sample = []
    for key, d, doc_id, lo, hi, rows in candidates[:params.flagged_sample_size]:
        text = texts[d].as_py() or ""
        excerpt = text.encode("utf-8")[lo:hi].decode("utf-8", errors="replace")[:params.excerpt_chars]
        sample.append({
            "key": key, "id": doc_id, "max_overlap": round(float(marks.max_overlap[d]), 4), "excerpt": excerpt,
            "matched_rows": marks.matched_rows[d][:3],
            "eval_excerpts": [index.row_excerpts[r] for r in rows],
        })
    counters = marks.counters
    return {
        "documents": int(counters["documents"]),
        "contaminated": int(counters["contaminated"]),
        "contamination_rate": counters["contaminated"] / counters["documents"] if counters["documents"] else 0.0,
        "null_text": int(counters["null_text"]),
        "features": int(counters["features"]),
        "matched_features": int(counters["matched_features"]),
        "dropped_features": int(counters["dropped_features"]),
        "flagged_by_eval": dict(sorted(flagged_by_eval.items())),
        "flagged_sample": sample,
    }


def summarize_contamination(shard_stats: Iterable[Mapping[str, Any]], sample_size: int = 8) -> dict[str, Any]:
    """Per-source totals from the shards' counters: flagged per eval set, rate, a merged sample."""
    totals: Counter = Counter()
    by_eval: Counter = Counter()
    sample: list[Mapping[str, Any]] = []
    for stats in shard_stats:
        for key in ("documents", "contaminated", "null_text", "features", "matched_features", "dropped_features"):
            totals[key] += int(stats.get(key, 0))
        by_eval.update(stats.get("flagged_by_eval", {}))
        sample.extend(stats.get("flagged_sample", []))
    sample = sorted(sample, key=lambda s: s["key"])[:sample_size]
    documents = totals["documents"]
    return {
        **{k: int(v) for k, v in totals.items()},
        "contamination_rate": totals["contaminated"] / documents if documents else 0.0,
        "flagged_by_eval": dict(sorted(by_eval.items())),
        "flagged_sample": sample,
    }


# ----------------------------------------------------------------------------- drop sets


def _iter_text_arrays(uris: Sequence[str], column: str, limit: int) -> Iterator[pa.Array]:
    """Text arrays of the first ``limit`` documents of a source's shards, in shard order."""
    remaining = limit
    for uri in uris:
        if remaining <= 0:
            return
        fs, path = storage.filesystem(uri)
        with fs.open(path, "rb") as handle:
            for batch in pq.ParquetFile(handle).iter_batches(columns=[column], batch_size=8192):
                texts = batch.column(0)[:remaining]
                remaining -= len(texts)
                yield texts
                if remaining <= 0:
                    return


def eval_ngram_frequencies(input_uris: list[str], output_uri: str, params: DeconParams) -> dict[str, Any]:
    """Document frequency of each eval n-gram over the head of one source (all its shards, in order).

    Writes ``hash, head_docs, sample_docs``: documents among the first ``source_sample_docs``
    and the first ``global_sample_docs`` containing the n-gram. Input to both drop sets.
    """
    index = _required_index(params, "eval_ngram_frequencies")
    limit = max(params.global_sample_docs, params.source_sample_docs)
    seen = 0
    head_parts: list[np.ndarray] = []
    sample_parts: list[np.ndarray] = []
    for texts in _iter_text_arrays(input_uris, params.text_column, limit):
        data, offsets, _ = _string_buffers(texts)
        for i, j in _batches(offsets, params.batch_bytes):
            feats = extract_features(data[offsets[i]:offsets[j]], offsets[i:j + 1] - offsets[i], params, True)
            hit = np.flatnonzero(index.contains(feats.hashes))
            doc = (feats.unit_doc[feats.unit[hit]] + seen + i).astype(np.int64)
            hh = feats.hashes[hit]
            order = np.lexsort((hh, doc))
            doc, hh = doc[order], hh[order]
            fresh = np.r_[True, (doc[1:] != doc[:-1]) | (hh[1:] != hh[:-1])] if len(doc) else np.zeros(0, bool)
            doc, hh = doc[fresh], hh[fresh]
            sample_parts.append(hh[doc < params.global_sample_docs])
            head_parts.append(hh[doc < params.source_sample_docs])
        seen += len(texts)
    head_hashes, head_counts = np.unique(np.concatenate(head_parts) if head_parts else np.zeros(0, np.uint64),
                                         return_counts=True)
    hashes, counts = np.unique(np.concatenate(sample_parts) if sample_parts else np.zeros(0, np.uint64),
                               return_counts=True)
    head = np.zeros(len(hashes), dtype=np.int64)
    head[np.searchsorted(hashes, head_hashes)] = head_counts
    head_size = min(seen, params.source_sample_docs)
    sample_size = min(seen, params.global_sample_docs)
    table = pa.table({"hash": pa.array(hashes, pa.uint64()), "head_docs": pa.array(head, pa.int64()),
                      "sample_docs": pa.array(counts.astype(np.int64), pa.int64())})
    table = table.replace_schema_metadata({"head_size": str(head_size), "sample_size": str(sample_size)})
    storage.write_parquet(table, output_uri)
    return {"head_documents": head_size, "sample_documents": sample_size, "eval_ngrams_seen": int(len(hashes))}


def _frequency_table(uri: str) -> tuple[pa.Table, int]:
    fs, path = storage.filesystem(uri)
    with fs.open(path, "rb") as handle:
        table = pq.read_table(handle)
    meta = table.schema.metadata or {}
    return table, int(meta.get(b"head_size", b"0"))


def source_drop_set(freq_uri: str, output_uri: str, params: DeconParams = DeconParams()) -> dict[str, Any]:
    """Eval n-grams in at least max(5, 0.5%) of the source's first 5,000 documents."""
    table, head_size = _frequency_table(freq_uri)
    threshold = max(params.source_min_docs, params.source_min_fraction * head_size)
    head = table.column("head_docs").to_numpy()
    hashes = np.sort(table.column("hash").to_numpy()[head >= threshold])
    storage.write_parquet(pa.table({"hash": pa.array(hashes, pa.uint64())}), output_uri)
    return {"dropped_ngrams": int(len(hashes)), "threshold_docs": float(threshold), "head_documents": head_size}


def global_drop_set(freq_uris: Sequence[str], output_uri: str, params: DeconParams = DeconParams()) -> dict[str, Any]:
    """Eval n-grams in >= 50 sampled documents summed over sources and seen in >= 3 sources."""
    parts_hash, parts_docs = [], []
    for uri in freq_uris:
        table, _ = _frequency_table(uri)
        parts_hash.append(table.column("hash").to_numpy())
        parts_docs.append(table.column("sample_docs").to_numpy())
    if parts_hash:
        all_hash = np.concatenate(parts_hash)
        all_docs = np.concatenate(parts_docs)
        hashes, inverse = np.unique(all_hash, return_inverse=True)
        docs = np.bincount(inverse, weights=all_docs, minlength=len(hashes))
        sources = np.bincount(inverse, weights=(all_docs > 0), minlength=len(hashes))
        keep = (docs >= params.global_min_docs) & (sources >= params.global_min_sources)
        hashes = hashes[keep]
    else:
        hashes = np.zeros(0, np.uint64)
    storage.write_parquet(pa.table({"hash": pa.array(hashes, pa.uint64())}), output_uri)
    return {"dropped_ngrams": int(len(hashes)), "sources": len(parts_hash)}
