"""Text normalization of the ``coverage`` rule: one function for eval rows and documents alike.

A copy should match however it was reformatted, so both sides are rewritten the same way:

* Unicode NFKC (full-width letters, ligatures, compatibility forms), then case folding;
* format characters (Unicode category Cf: zero-width spaces and joiners, soft hyphens, BOMs)
  removed;
* punctuation and symbols (categories P* and S*) become spaces: they are split off and not
  counted, so added or removed commas, quotes and brackets do not change the tokens;
* quote markers (``>``, itself punctuation) are ignored, and so are numbers (tokens made only
  of digits once punctuation is split off: ``12``, ``12.``, ``[12]``, ``3.2``), so line numbers,
  and numbers that a reflow moved to the start of a line, do not matter;
* line breaks become spaces: paragraphs do not matter to the rule.

ASCII documents never leave the byte level (a 256-entry table and a few vector passes keep
byte offsets unchanged); only documents with non-ASCII bytes go through ``unicodedata``.
"""

from __future__ import annotations

import functools
import sys
import unicodedata

import numpy as np

from marin_assets.core.decon import kernels


@functools.cache
def _ascii_table() -> np.ndarray:
    """Per byte: ASCII letters lowered, ASCII punctuation/symbols to space; other bytes unchanged."""
    table = np.arange(256, dtype=np.uint8)
    for b in range(128):
        c = chr(b)
        if c.isupper():
            table[b] = ord(c.lower())
        elif not c.isalnum() and not c.isspace() and b >= 32 and b != 127:
            table[b] = ord(" ")
    table[10] = ord(" ")  # line breaks: paragraphs do not matter
    return table


@functools.cache
def _codepoint_action() -> np.ndarray:
    """Per code point: 0 keep, 1 drop (format characters, Cf), 2 space (punctuation and symbols, P* and S*)."""
    action = np.zeros(sys.maxunicode + 1, dtype=np.uint8)
    for cp in range(sys.maxunicode + 1):
        cat = unicodedata.category(chr(cp))
        if cat == "Cf":
            action[cp] = 1
        elif cat[0] in "PS":
            action[cp] = 2
    return action


def normalize_unicode(text: str) -> str:
    """NFKC, case fold, drop format characters, punctuation and symbols to spaces (one table pass)."""
    text = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())
    cps = np.frombuffer(text.encode("utf-32-le", errors="surrogatepass"), dtype=np.uint32)
    action = _codepoint_action()[np.minimum(cps, sys.maxunicode)]
    if action.any():
        cps = np.where(action == 2, np.uint32(32), cps)[action != 1]
    return cps.tobytes().decode("utf-32-le", errors="replace")


def normalize_batch(data: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Normalized UTF-8 bytes and offsets of the documents ``data[offsets[d]:offsets[d+1]]``.

    Offsets change only for documents with non-ASCII bytes (the others keep their byte
    positions, which lets evidence excerpts point into the original text).
    """
    n_docs = len(offsets) - 1
    high = np.flatnonzero(data >= 0x80)  # non-ASCII bytes are few in most text
    wide = np.unique(np.searchsorted(offsets, high, side="right") - 1) if high.size else high
    if wide.size:
        raw = data.tobytes()
        pieces, cursor = [], 0
        new_lengths = np.diff(offsets).copy()
        texts = [raw[int(offsets[d]):int(offsets[d + 1])].decode("utf-8", errors="replace") for d in wide.tolist()]
        joined = "\x00".join(texts)  # one pass for all of them; NUL is kept by every step
        normalized = normalize_unicode(joined).split("\x00") if "\x00" not in "".join(texts) else []
        if len(normalized) != len(texts):
            normalized = [normalize_unicode(t) for t in texts]
        for d, text in zip(wide.tolist(), normalized):
            a, b = int(offsets[d]), int(offsets[d + 1])
            pieces.append(raw[cursor:a])
            piece = text.encode("utf-8")
            pieces.append(piece)
            new_lengths[d] = len(piece)
            cursor = b
        pieces.append(raw[cursor:])
        data = np.frombuffer(b"".join(pieces), dtype=np.uint8)
        offsets = np.zeros(n_docs + 1, dtype=np.int64)
        np.cumsum(new_lengths, out=offsets[1:])
    out = kernels.normalize_ascii(kernels.readonly(data, np.uint8), kernels.readonly(offsets, np.int64), _ascii_table())
    return out, offsets


def normalize_text(text: str) -> str:
    """The normalized form of one text (tests, the eval side, inspection)."""
    data = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    out, _ = normalize_batch(data, np.array([0, len(data)], dtype=np.int64))
    return out.tobytes().decode("utf-8")
