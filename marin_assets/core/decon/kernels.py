"""Compiled inner loops (numba) of decontamination: normalization, tokens and 13-gram features,
and index membership.

Marking a document is a few passes over its bytes; written as numpy array passes each pass
allocates and re-reads whole-batch arrays (about 20 per batch), written as loops it is one read
of the bytes and one of the tokens, with no temporaries. The loops compute exactly what the
array formulation in ``features`` documents (the tests check both against plain Python),
so the features, and every mark, are unchanged.

All 64-bit arithmetic is on ``uint64`` values (wrapping, as in the plain rule); constants are
spelled as ``np.uint64`` because numba types a mixed int64/uint64 expression as float64.
"""

from __future__ import annotations

import numpy as np

from marin_assets.core.runtime.kernels import jit as _jit
from marin_assets.core.runtime.kernels import readonly  # noqa: F401 - the kernels' callers take it from here

# the hash constants of ``features.feature_hash`` (kept equal there)
_BYTE_BASE = np.uint64(0x9E3779B97F4A7C15)
_TOKEN_LEN_SALT = np.uint64(0xA0761D6478BD642F)
_FEATURE_LEN_SALT = np.uint64(0xE7037ED1A0B428DB)
_TOKEN_MIX = np.uint64(0xC4CEB9FE1A85EC53)
_U0, _U1, _U3, _U7, _U29, _U32 = (np.uint64(v) for v in (0, 1, 3, 7, 29, 32))


# ----------------------------------------------------------------------------- normalization


@_jit
def normalize_ascii(data: np.ndarray, offsets: np.ndarray, table: np.ndarray) -> np.ndarray:
    """``table`` applied to every byte, then every token made only of ASCII digits blanked.

    A digit run is blanked when both its neighbours (in the mapped text, inside its document)
    are whitespace or control bytes (<= 32) or the document's edge.
    """
    n = data.shape[0]
    out = np.empty(n, dtype=np.uint8)
    for k in range(n):
        out[k] = table[data[k]]
    for d in range(offsets.shape[0] - 1):
        a, b = offsets[d], offsets[d + 1]
        k = a
        while k < b:
            c = out[k]
            if c < 48 or c > 57:
                k += 1
                continue
            s = k
            while k < b and out[k] >= 48 and out[k] <= 57:
                k += 1
            if (s == a or out[s - 1] <= 32) and (k == b or out[k] <= 32):
                for m in range(s, k):
                    out[m] = 32
    return out


# ----------------------------------------------------------------------------- tokens


@_jit
def _decode(data: np.ndarray, k: int, n: int) -> tuple[int, int]:
    """Code point and byte width of the UTF-8 sequence led by ``data[k]`` (reads clamped to the buffer)."""
    b0 = np.int64(data[k])
    b1 = np.int64(data[min(k + 1, n - 1)]) & 0x3F
    b2 = np.int64(data[min(k + 2, n - 1)]) & 0x3F
    b3 = np.int64(data[min(k + 3, n - 1)]) & 0x3F
    if b0 < 0xE0:
        return min(((b0 & 0x1F) << 6) | b1, 0x10FFFF), 2
    if b0 < 0xF0:
        return min(((b0 & 0x0F) << 12) | (b1 << 6) | b2, 0x10FFFF), 3
    return min(((b0 & 0x07) << 18) | (b1 << 12) | (b2 << 6) | b3, 0x10FFFF), 4


# Byte classes of ``scan_tokens`` (``byte_classes``): a token byte, a token byte that is an ASCII
# letter, ASCII whitespace (``str.isspace``), a newline, and a non-ASCII lead byte (decoded).
TOKEN_BYTE, LETTER_BYTE, SPACE_BYTE, NEWLINE_BYTE, LEAD_BYTE = 0, 1, 2, 3, 4


def byte_classes(ascii_space: np.ndarray, ascii_letter: np.ndarray) -> np.ndarray:
    """The class of every byte value (continuation bytes are token bytes: their lead decides)."""
    classes = np.full(256, TOKEN_BYTE, dtype=np.uint8)
    for b in range(128):
        if b == 10:
            classes[b] = NEWLINE_BYTE
        elif ascii_space[b]:
            classes[b] = SPACE_BYTE
        elif ascii_letter[b]:
            classes[b] = LETTER_BYTE
    classes[0xC0:] = LEAD_BYTE
    return classes


@_jit
def _wide_space(data: np.ndarray, k: int, n: int, cp_space: np.ndarray) -> int:
    """Bytes of the non-ASCII whitespace character led by ``data[k]``, 0 when it is not one (every
    non-ASCII space has lead 0xC2 or 0xE1-0xE3)."""
    c = data[k]
    if c == 0xC2 or (c >= 0xE1 and c <= 0xE3):
        cp, width = _decode(data, k, n)
        if cp_space[cp]:
            return width
    return 0


@_jit
def scan_tokens(data: np.ndarray, offsets: np.ndarray, classes: np.ndarray, cp_space: np.ndarray,
                cp_alpha: np.ndarray) -> tuple:
    """Tokens of every document: maximal runs of non-whitespace characters inside one document.

    Returns per token: byte start, byte end, hash (polynomial over its bytes plus its length,
    mixed), flags (bit 0: it holds a letter, ``str.isalpha`` of some character; bit 1: it starts
    a paragraph, being its document's first token or after a gap with two or more ``\\n``), and
    its document. ``cp_space`` / ``cp_alpha`` are only read for non-ASCII lead bytes.
    """
    n = data.shape[0]
    n_docs = offsets.shape[0] - 1
    cap = n // 2 + n_docs + 1
    starts = np.empty(cap, dtype=np.int64)
    ends = np.empty(cap, dtype=np.int64)
    hashes = np.empty(cap, dtype=np.uint64)
    flags = np.empty(cap, dtype=np.uint8)
    tdoc = np.empty(cap, dtype=np.int64)
    t = 0
    for d in range(n_docs):
        a, b = offsets[d], offsets[d + 1]
        newlines = 2  # the first token of a document starts a paragraph
        k = a
        while k < b:
            x = classes[data[k]]
            if x == SPACE_BYTE:
                k += 1
                continue
            if x == NEWLINE_BYTE:
                newlines += 1
                k += 1
                continue
            if x == LEAD_BYTE:
                width = _wide_space(data, k, n, cp_space)
                if width:
                    k += width
                    continue
            s = k
            poly = _U0
            has = np.uint8(0)
            while k < b:
                c = data[k]
                x = classes[c]
                if x >= SPACE_BYTE:
                    if x != LEAD_BYTE or _wide_space(data, k, n, cp_space):
                        break
                    cp, _ = _decode(data, k, n)
                    if cp_alpha[cp]:
                        has = np.uint8(1)
                else:
                    has |= x
                poly = (poly + np.uint64(c)) * _BYTE_BASE
                k += 1
            h = poly + np.uint64(k - s) * _TOKEN_LEN_SALT
            h ^= h >> _U29
            h *= _TOKEN_MIX
            h ^= h >> _U32
            starts[t] = s
            ends[t] = k
            hashes[t] = h
            flags[t] = has | (np.uint8(2) if newlines >= 2 else np.uint8(0))
            tdoc[t] = d
            newlines = 0
            t += 1
    return starts[:t], ends[:t], hashes[:t], flags[:t], tdoc[:t]


# ----------------------------------------------------------------------------- features


@_jit
def window_features(token_hash: np.ndarray, flags: np.ndarray, tdoc: np.ndarray,
                    up: np.ndarray, down: np.ndarray, n_gram: int, record_min: int,
                    record_max: int, short_paragraphs: bool, keep_prefix: bool) -> tuple:
    """Units, 13-gram features and short-record features of a batch's tokens.

    Units are paragraphs, or a document's whole token sequence when every paragraph of it is
    shorter than ``n_gram``. A window of ``n_gram`` tokens inside one unit holding a letter is a
    feature; a unit of ``record_min``..``min(record_max, n_gram - 1)`` tokens holding a letter is
    one too (only in whole-record documents unless ``short_paragraphs``). Feature hash:
    ``sum h_t * M**(end - t) + length * salt`` via the prefix sums ``seq[k] = sum_{t<k} h_t M**-t``.

    Returns (hashes, unit, unit_doc, unit_first, unit_end, gram_pos, seq); grams first in token
    order, then records in unit order; ``seq`` only with ``keep_prefix`` (else empty).
    """
    n_tok = token_hash.shape[0]
    # units
    tok_unit = np.empty(n_tok, dtype=np.int64)
    unit_first = np.empty(n_tok, dtype=np.int64)
    unit_doc = np.empty(n_tok, dtype=np.int64)
    unit_whole = np.empty(n_tok, dtype=np.bool_)  # the unit is its whole-record document
    n_units = 0
    t0 = 0
    while t0 < n_tok:
        d = tdoc[t0]
        t1 = t0 + 1
        whole = True
        p = t0
        while t1 < n_tok and tdoc[t1] == d:
            if flags[t1] & 2:
                if t1 - p >= n_gram:
                    whole = False
                p = t1
            t1 += 1
        if t1 - p >= n_gram:
            whole = False
        for t in range(t0, t1):
            if t == t0 or (flags[t] & 2 and not whole):
                unit_first[n_units] = t
                unit_doc[n_units] = d
                unit_whole[n_units] = whole
                n_units += 1
            tok_unit[t] = n_units - 1
        t0 = t1
    unit_end = np.empty(n_units, dtype=np.int64)
    for u in range(n_units - 1):
        unit_end[u] = unit_first[u + 1]
    if n_units:
        unit_end[n_units - 1] = n_tok
    # prefix sums of the token hashes (and of letters)
    seq = np.empty(n_tok + 1, dtype=np.uint64)
    letters = np.empty(n_tok + 1, dtype=np.int64)
    seq[0] = _U0
    letters[0] = 0
    acc = _U0
    count = 0
    for t in range(n_tok):
        acc += token_hash[t] * down[t]
        seq[t + 1] = acc
        count += flags[t] & 1
        letters[t + 1] = count
    n_win = max(n_tok - n_gram + 1, 0)
    short_max = min(record_max, n_gram - 1)
    hashes = np.empty(n_win + n_units, dtype=np.uint64)
    unit = np.empty(n_win + n_units, dtype=np.int64)
    gram_pos = np.empty(n_win, dtype=np.int64)
    gram_salt = np.uint64(n_gram) * _FEATURE_LEN_SALT
    f = 0
    for s in range(n_win):
        e = s + n_gram
        if tok_unit[s] == tok_unit[e - 1] and letters[e] != letters[s]:
            hashes[f] = (seq[e] - seq[s]) * up[e] + gram_salt
            unit[f] = tok_unit[s]
            gram_pos[f] = s
            f += 1
    n_grams = f
    for u in range(n_units):
        a, e = unit_first[u], unit_end[u]
        length = e - a
        if length < record_min or length > short_max or letters[e] == letters[a]:
            continue
        if not short_paragraphs and not unit_whole[u]:  # the eval side: only a complete record
            continue
        hashes[f] = (seq[e] - seq[a]) * up[e] + np.uint64(length) * _FEATURE_LEN_SALT
        unit[f] = u
        f += 1
    if not keep_prefix:
        seq = seq[:0]
    return (hashes[:f], unit[:f], unit_doc[:n_units], unit_first[:n_units], unit_end, gram_pos[:n_grams], seq)


# ----------------------------------------------------------------------------- membership


@_jit
def set_bits(bitmap: np.ndarray, hashes: np.ndarray, shift: int, mask: int) -> None:
    """Set bit ``(h >> shift) & mask`` of ``bitmap`` for every hash ``h``: one pass, no temporaries
    (sorting the slots of a production index would take ~4 copies of its hashes, ~700 MB)."""
    s = np.uint64(shift)
    m = np.uint64(mask)
    for i in range(hashes.shape[0]):
        slot = (hashes[i] >> s) & m
        byte = np.int64(slot >> _U3)
        bitmap[byte] = bitmap[byte] | np.uint8(_U1 << (slot & _U7))


@_jit
def contains(queries: np.ndarray, first: np.ndarray, second: np.ndarray, bits: int, hashes: np.ndarray,
             directory: np.ndarray, dir_shift: int) -> np.ndarray:
    """Exact membership of each query in the sorted ``hashes``.

    The two bitmaps (top ``bits`` bits, and the next ``bits`` bits, of the hash) reject almost
    every absent query with one or two memory reads; a survivor is looked up in its bucket of
    the sorted array (``directory[top bits]`` .. ``directory[top bits + 1]``).
    """
    n = queries.shape[0]
    out = np.zeros(n, dtype=np.bool_)
    shift1 = np.uint64(64 - bits)
    shift2 = np.uint64(64 - 2 * bits)
    mask = np.uint64((1 << bits) - 1)
    dshift = np.uint64(dir_shift)
    for i in range(n):
        x = queries[i]
        slot = x >> shift1
        if not (np.uint64(first[slot >> _U3]) >> (slot & _U7)) & _U1:
            continue
        slot = (x >> shift2) & mask
        if not (np.uint64(second[slot >> _U3]) >> (slot & _U7)) & _U1:
            continue
        bucket = x >> dshift
        lo = np.int64(directory[bucket])
        end = np.int64(directory[bucket + _U1])
        hi = end
        while lo < hi:
            mid = (lo + hi) >> 1
            if hashes[mid] < x:
                lo = mid + 1
            else:
                hi = mid
        if lo < end and hashes[lo] == x:
            out[i] = True
    return out
