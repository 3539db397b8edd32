"""The semantic tier: documents that hold a reworded eval item, found with the embeddings the
pool already keeps.

An n-gram cannot see a paraphrase (reworded, reordered, identifiers renamed, numbers written
out). An embedding model can: its vectors of an eval item and of a rewording of it lie close.

* **Eval index.** Each eval row and each of its fields of at least ``min_field_words`` words is
  a unit, encoded with the pool's embedding model into an exact inner-product index (FAISS
  ``IndexFlatIP``, cosine on unit vectors). Beside it, each unit's distinctive words (found in
  at most ``max_term_units`` units) and their weights, for the window look below.
* **Whole documents.** A document's kept embedding (the ``embeddings`` asset; no second pass)
  within ``document`` cosine of a unit is flagged ``semantic``.
* **Window look.** A document's embedding is an average over its first tokens; an item inside a
  long document barely moves it. So windows of a document are scored by the weighted share of
  a unit's distinctive terms they hold, in two channels:

  - *words*: windows of ``window_lookup_tokens`` words (half overlapping); a number counts as
    its words (paraphrases write numbers out);
  - *code*: windows of ``code_lookup_tokens`` code tokens, scored on runs of
    ``code_shingle_tokens`` tokens in which every name the code chose (not a keyword, a
    builtin or an attribute) reads ``_``. Renaming identifiers and rewording the docstring
    leave a function's shape (``for _ in range ( len``) and its calls (``. isalnum ( )``)
    in place, where the words channel finds too few distinctive words. Only code units
    (Python that parses) have code terms, and a window the words channel finds for a code
    unit is encoded only if its paragraph also holds ``code_confirm_share`` of the unit's
    code weight: unrelated code shares a code item's names, rarely its shape.

  The best windows with at least ``lexical_share`` / ``code_share`` of a unit's weight (and
  ``lexical_min_terms`` / ``code_min_terms`` terms) are cut to the paragraph holding most of
  those terms and up to ``max_windows_per_doc`` distinct paragraphs are encoded; one within
  ``window`` cosine of a unit flags the document. Clean documents rarely hold that much of an
  item's rare terms in one window, so few documents are looked at.

Cosine thresholds depend on the model: ``SemanticParams.thresholds`` holds them per model,
calibrated on the paraphrase fixture's calibration split (``bench/bench_decon.py --semantic``).
A model without a threshold flags nothing and says so (``uncalibrated_model``).
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import functools
import json
import keyword
import re
import textwrap
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import scipy.sparse as sp

from marin_assets.core.decon.index import _load_npy, _save_npy
from marin_assets.core.decon.params import EvalRow
from marin_assets.core.embed import embeddings as embed
from marin_assets.core.runtime import storage

CODE_VERSION = "3"  # the eval_embeddings folder: units, vectors, lexicons (words, code)
POLICIES = ("flag", "drop")  # flag: reported only; drop: the pool drops semantic flags too
WORD = re.compile(r"[^\W\d_]{2,}|\d+")  # words of 2+ letters (``_`` splits identifiers), and numbers
MIN_NUMBER_WORDS = 10  # smaller numbers (indexes, counters, everywhere in code) stay digits
_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
         "seventeen eighteen nineteen").split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
CODE_TOKEN = re.compile(r"\"\"\"[\s\S]*?\"\"\"|'''[\s\S]*?'''|#[^\n]*|[^\W\d]\w*|\d+|\"[^\"\n]*\"|'[^'\n]*'|[=!<>+\-*/%]=|//|\*\*|->|[^\s\w]")
CODE_NAMES = frozenset(keyword.kwlist) | frozenset(dir(builtins))  # the language's own names are kept
CHANNELS = ("words", "code")
PARAGRAPH = re.compile(r"\n[ \t]*\n")  # a blank line ends a paragraph
UNITS_FILE = "units.parquet"
VECTORS_FILE = "vectors.npy"
TERMS_FILE = "terms.parquet"
INFO_FILE = "semantic.json"


@dataclasses.dataclass(frozen=True)
class SemanticParams:
    """The semantic tier's settings; thresholds are (model, document cosine, window cosine)."""

    policy: str = "flag"
    # calibrated on the paraphrase fixture's calibration split (bench/bench_semantic.py --calibrate)
    thresholds: tuple[tuple[str, float, float], ...] = ((embed.OFFLINE_MODEL, 0.703, 0.632),)
    min_field_words: int = 8  # a field this long is a unit of its own (a copy of only the question)
    window_lookup_tokens: int = 96  # words of a window scored for lexical evidence (half overlapping)
    window_tokens: int = 256  # at most this many words of it are encoded
    code_shingle_tokens: int = 4  # code tokens per term of the code channel
    code_lookup_tokens: int = 192  # code tokens of a window of the code channel (half overlapping)
    code_window_tokens: int = 640  # at most this many code tokens of it are encoded
    code_share: float = 0.5  # of a unit's distinctive code-shingle weight in one window
    code_min_terms: int = 8
    code_confirm_share: float = 0.2  # a code unit's words found in a span count only with this code share
    max_windows_per_doc: int = 6  # distinct paragraphs encoded per candidate document
    lexical_share: float = 0.3  # of a unit's distinctive-word weight in one window
    lexical_min_terms: int = 6
    max_term_units: int = 1_000  # a word in more units is not distinctive
    max_term_fraction: float = 0.1  # ... nor one in more than this share of the units
    span_pad_tokens: int = 8
    batch_docs: int = 512

    def threshold(self, model: str) -> tuple[float, float] | None:
        """(document, window) cosine thresholds calibrated for ``model``, or None."""
        return next(((d, w) for m, d, w in self.thresholds if m == model), None)

    def check(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown semantic decontamination policy {self.policy!r}; use one of {POLICIES}")


# ----------------------------------------------------------------------------- the eval index


def eval_units(rows: Iterable[EvalRow], min_field_words: int) -> list[tuple[str, str, str, str]]:
    """(eval set, row id, field, text): every row, and each field of ``min_field_words`` words or more."""
    units = []
    for row in rows:
        if row.text and row.text.strip():
            units.append((row.eval_set, row.row_id, "", row.text))
        for name, text in row.fields if len(row.fields) > 1 else ():
            if len(text.split()) >= min_field_words:
                units.append((row.eval_set, row.row_id, name, text))
    return units


def lexical_term(word: str) -> str:
    """A word as the lexicon holds it: lower case, a plural or third-person ``s`` dropped."""
    word = word.lower()
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


def number_words(n: int) -> list[str]:
    """``n`` (below a million) as the words a paraphrase writes it with: 96 -> ninety, six."""
    if n < 20:
        return [_ONES[n]]
    if n < 100:
        return [_TENS[n // 10]] + (number_words(n % 10) if n % 10 else [])
    big, unit = (1000, "thousand") if n >= 1000 else (100, "hundred")
    return number_words(n // big) + [unit] + (number_words(n % big) if n % big else [])


def token_terms(token: str) -> list[str]:
    """The lexicon's terms of one token: a word's term; a number of two to six digits as its
    words (a paraphrase writes it out); a smaller number as its digits; none for a larger one.
    Digits that are not decimal (superscripts such as ``⁶⁴``) are a word: ``int`` cannot read them."""
    if not token.isdecimal() or int(token) < MIN_NUMBER_WORDS:
        return [lexical_term(token)]
    return number_words(int(token)) if len(token) <= 6 else []


def words(text: str) -> list[str]:
    return [t for w in WORD.findall(text) for t in token_terms(w)]


def is_code(text: str) -> bool:
    """Whether an eval unit is Python (only code units have code terms: prose's runs of names
    are not code)."""
    try:
        ast.parse(textwrap.dedent(text))
    except (SyntaxError, ValueError):
        return False
    return True


def code_terms(text: str, k: int) -> list[tuple[int, int, str]]:
    """(start, end, term) of each run of ``k`` code tokens in which a name the code chose (not a
    keyword, a builtin or an attribute) reads ``_``, a string literal is double-quoted and a
    docstring is only its quotes (comments left out): what renaming and rewording leave of a
    piece of code."""
    tokens, previous = [], ""
    for m in CODE_TOKEN.finditer(text):
        token = m.group()
        if token[0] == "#":
            continue
        if token[:3] in ('"""', "'''"):
            token = '"""'
        elif token[0] == "'":
            token = f'"{token[1:-1]}"'
        elif (token[0].isalpha() or token[0] == "_") and token not in CODE_NAMES and previous != ".":
            token = "_"
        tokens.append((m.start(), m.end(), token))
        previous = m.group()
    return [(tokens[i][0], tokens[i + k - 1][1], " ".join(t for _, _, t in tokens[i:i + k]))
            for i in range(len(tokens) - k + 1)]


def channel_terms(channel: str, text: str, params: SemanticParams) -> list[tuple[int, int, str]]:
    """(start, end, term) of ``text`` in ``channel`` (``words`` or ``code``)."""
    if channel == "code":
        return code_terms(text, params.code_shingle_tokens)
    return [(m.start(), m.end(), t) for m in WORD.finditer(text) for t in token_terms(m.group())]


@dataclasses.dataclass
class Lexicon:
    """One channel's distinctive terms: unit x term incidence, weights (log inverse unit
    frequency) and each unit's total weight."""

    term_ids: dict[str, int]
    unit_terms: sp.csr_matrix
    weight: np.ndarray = dataclasses.field(init=False)
    unit_weight: np.ndarray = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        df = np.asarray(self.unit_terms.sum(axis=0)).ravel()
        self.weight = (np.log((1 + self.unit_terms.shape[0]) / (1 + df)) + 1.0).astype(np.float32)
        self.unit_weight = np.asarray(self.unit_terms @ self.weight).ravel()

    def unit_postings(self) -> tuple[np.ndarray, list[str]]:
        coo, terms = self.unit_terms.tocoo(), sorted(self.term_ids, key=self.term_ids.get)
        return coo.row.astype(np.int32), [terms[c] for c in coo.col]


def lexicon(per_unit: Sequence[Iterable[str]], cap: int) -> Lexicon:
    """The terms found in at most ``cap`` units."""
    sets = [sorted(set(terms)) for terms in per_unit]
    df = Counter(t for terms in sets for t in terms)
    ids = {t: i for i, t in enumerate(sorted(t for t, n in df.items() if n <= cap))}
    rows = [u for u, terms in enumerate(sets) for t in terms if t in ids]
    cols = [ids[t] for terms in sets for t in terms if t in ids]
    return Lexicon(ids, sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)), shape=(len(sets), len(ids))))


def lexicons(texts: Sequence[str], params: SemanticParams) -> dict[str, Lexicon]:
    """Each channel's lexicon of the units ``texts``."""
    cap = min(params.max_term_units, max(1, int(params.max_term_fraction * len(texts))))
    return {channel: lexicon([[t for *_, t in channel_terms(channel, x, params)]
                              if channel == "words" or is_code(x) else [] for x in texts], cap)
            for channel in CHANNELS}


def build_eval_embeddings(rows: Iterable[EvalRow], out: str, encoder: embed.EncoderParams,
                          params: SemanticParams = SemanticParams()) -> dict[str, Any]:
    """Encode every eval unit with ``encoder`` and write the index folder ``out``."""
    units = eval_units(rows, params.min_field_words)
    texts = [u[3] for u in units]
    vectors, counters = embed.encode_texts(texts, encoder)
    found = lexicons(texts, params)
    storage.write_parquet(pa.table({
        "eval_set": [u[0] for u in units], "row_id": [u[1] for u in units], "field": [u[2] for u in units],
        "excerpt": [t[:300] for t in texts],
    }), storage.join(out, UNITS_FILE))
    postings = {channel: lex.unit_postings() for channel, lex in found.items()}
    storage.write_parquet(pa.table({
        "channel": [c for c, (unit, _) in postings.items() for _ in range(len(unit))],
        "unit": np.concatenate([unit for unit, _ in postings.values()]),
        "term": [t for _, terms in postings.values() for t in terms],
    }), storage.join(out, TERMS_FILE))
    _save_npy(vectors.astype(np.float32), storage.join(out, VECTORS_FILE))
    info = {"model": encoder.model, "revision": encoder.revision, "dim": int(vectors.shape[1]) if units else 0,
            "units": len(units), "rows": len({(u[0], u[1]) for u in units}),
            "terms": {channel: len(lex.term_ids) for channel, lex in found.items()}}
    storage.write_bytes(storage.join(out, INFO_FILE), json.dumps(info).encode())
    return {**info, "tokens": counters["tokens"],
            "units_by_set": dict(sorted(Counter(u[0] for u in units).items()))}


@dataclasses.dataclass
class EvalEmbeddings:
    """The loaded eval index: exact inner-product search, unit labels and each channel's lexicon."""

    info: dict[str, Any]
    index: Any  # faiss.IndexFlatIP
    eval_sets: list[str]
    labels: list[str]  # set:row or set:row#field
    excerpts: list[str]
    lexicons: dict[str, Lexicon]

    def search(self, vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(best cosine, best unit) of each unit vector."""
        if not len(vectors) or not self.index.ntotal:
            return np.full(len(vectors), -1.0, np.float32), np.full(len(vectors), -1, np.int64)
        sims, units = self.index.search(np.ascontiguousarray(vectors, dtype=np.float32), 1)
        return sims[:, 0], units[:, 0]


def load_eval_embeddings(uri: str) -> EvalEmbeddings:
    import faiss  # noqa: PLC0415

    info = json.loads(storage.read_bytes(storage.join(uri, INFO_FILE)))
    units = storage.read_parquet(storage.join(uri, UNITS_FILE)).to_pydict()
    vectors = _load_npy(storage.join(uri, VECTORS_FILE))
    index = faiss.IndexFlatIP(max(int(info["dim"]), 1))
    if len(vectors):
        index.add(np.ascontiguousarray(vectors, dtype=np.float32))
    postings = storage.read_parquet(storage.join(uri, TERMS_FILE)).to_pydict()
    n_units = len(units["eval_set"])
    per_channel: dict[str, list[list[str]]] = {c: [[] for _ in range(n_units)] for c in CHANNELS}
    for channel, unit, term in zip(postings["channel"], postings["unit"], postings["term"]):
        per_channel[channel][unit].append(term)
    labels = [f"{s}:{r}" + (f"#{f}" if f else "") for s, r, f in zip(units["eval_set"], units["row_id"], units["field"])]
    return EvalEmbeddings(info, index, units["eval_set"], labels, units["excerpt"],
                          {c: lexicon(per_unit, n_units) for c, per_unit in per_channel.items()})


# ----------------------------------------------------------------------------- marking


@dataclasses.dataclass
class SemanticMarks:
    flagged: np.ndarray  # bool [D]
    similarity: np.ndarray  # float32 [D]: best cosine to an eval unit (document or window)
    unit: np.ndarray  # int64 [D]: that unit (-1: none)
    document_similarity: np.ndarray  # float32 [D]: the kept vector's best cosine
    window_similarity: np.ndarray  # float32 [D]: the best window's (-1: not looked at)
    window_share: np.ndarray  # float32 [D]: that window's lexical share of its unit
    counters: Counter

    @property
    def looked(self) -> np.ndarray:
        """Documents the window look ran on."""
        return self.window_similarity > -1


@dataclasses.dataclass(frozen=True)
class _Channel:
    """How one channel scores windows: its lexicon, window length, encoded-span cap and bars."""

    lexicon: Lexicon
    lookup: int
    cap: int
    share: float
    min_terms: int
    pad: int


def _channels(index: EvalEmbeddings, params: SemanticParams) -> dict[str, _Channel]:
    return {"words": _Channel(index.lexicons["words"], params.window_lookup_tokens, params.window_tokens,
                              params.lexical_share, params.lexical_min_terms, params.span_pad_tokens),
            "code": _Channel(index.lexicons["code"], params.code_lookup_tokens, params.code_window_tokens,
                             params.code_share, params.code_min_terms, params.span_pad_tokens)}


def _candidate_windows(texts: Sequence[str], index: EvalEmbeddings, params: SemanticParams) -> list[tuple[int, str, float]]:
    """(document, span text, lexical share) of the windows worth encoding: the best ``max_windows_per_doc``
    windows per document holding a channel's share of some unit's distinctive-term weight."""
    channels, scored = _channels(index, params), {}
    for name, channel in channels.items():
        for d, share, span in _channel_windows(texts, name, channel, params):
            scored.setdefault(d, []).append((share, name, span))
    out = []
    for d, found in scored.items():
        kept: dict[str, float] = {}  # overlapping windows often cut to the same paragraph: encode it once
        for share, name, span in sorted(found, key=lambda f: -f[0]):
            text = _span_text(texts[d], span, channels[name])
            if name == "words" and not _code_confirms(text, span[-1], channels["code"].lexicon, params):
                continue
            kept.setdefault(text, share)
            if len(kept) == params.max_windows_per_doc:
                break
        out.extend((d, span, share) for span, share in kept.items())
    return out


def _code_confirms(text: str, unit: int, code: Lexicon, params: SemanticParams) -> bool:
    """Whether a span found by its words for ``unit`` also has the unit's code shape, when the
    unit is code: a code unit's words are mostly names, which unrelated code shares."""
    if code.unit_weight[unit] <= 0:
        return True
    held = {code.term_ids[t] for *_, t in code_terms(text, params.code_shingle_tokens) if t in code.term_ids}
    unit_terms = code.unit_terms.indices[code.unit_terms.indptr[unit]:code.unit_terms.indptr[unit + 1]]
    return code.weight[[t for t in unit_terms if t in held]].sum() >= params.code_confirm_share * code.unit_weight[unit]


def _channel_windows(texts: Sequence[str], name: str, channel: _Channel, params: SemanticParams) -> list[tuple[int, float, tuple]]:
    """(document, share, window) of the windows of ``texts`` passing ``channel``'s bars."""
    half = max(channel.lookup // 2, 1)
    doc_of, win_rows, win_cols, spans = [], [], [], []
    for d, text in enumerate(texts):
        found = [(a, b, channel.lexicon.term_ids.get(t, -1)) for a, b, t in channel_terms(name, text or "", params)]
        pos = np.array([k for k, f in enumerate(found) if f[2] >= 0], dtype=np.int64)
        if len(pos) < channel.min_terms:
            continue
        term = np.array([found[k][2] for k in pos.tolist()], dtype=np.int64)
        n_windows = max(1, -(-(len(found) - channel.lookup) // half) + 1)
        for k in range(-(-channel.lookup // half)):  # each position lies in up to W/half windows
            w = pos // half - k
            ok = (w >= 0) & (w < n_windows)
            win_rows.append(len(spans) + w[ok])
            win_cols.append(term[ok])
        doc_of.extend([d] * n_windows)
        spans.extend((found, pos, term, w * half) for w in range(n_windows))
    if not spans:
        return []
    rows, cols = np.concatenate(win_rows), np.concatenate(win_cols)
    x = sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)), shape=(len(spans), len(channel.lexicon.term_ids)))
    x.data[:] = 1.0  # distinct terms per window
    best, best_unit = _best_units(x, channel)
    return [(doc_of[w], float(best[w]), (*spans[w], int(best_unit[w]))) for w in np.flatnonzero(best > 0).tolist()]


def _best_units(x: sp.csr_matrix, channel: _Channel) -> tuple[np.ndarray, np.ndarray]:
    """Per window (row of ``x``): the largest qualifying share of a unit's term weight, and that unit."""
    lex = channel.lexicon
    weighted = (x @ sp.diags(lex.weight) @ lex.unit_terms.T).tocsr()
    counts = (x @ lex.unit_terms.T).tocsr()
    weighted.sort_indices()
    counts.sort_indices()  # same sparsity as ``weighted``: every weight is positive
    share = weighted.data / np.maximum(lex.unit_weight[weighted.indices], 1e-9)
    window = np.repeat(np.arange(x.shape[0]), np.diff(weighted.indptr))
    keep = (share >= channel.share) & (counts.data >= channel.min_terms)
    best, best_unit = np.zeros(x.shape[0]), np.full(x.shape[0], -1, np.int64)
    order = np.lexsort((share[keep], window[keep]))  # last of each window: its best unit
    w, s, u = window[keep][order], share[keep][order], weighted.indices[keep][order]
    best[w], best_unit[w] = s, u  # later (larger) writes win
    return best, best_unit


def _span_text(text: str, span: tuple, channel: _Channel) -> str:
    """What of the window is encoded: the paragraph holding most of the terms it shares with
    its unit (a copied item usually stands as its own block), or, when that paragraph is longer
    than the channel's cap, the span those terms cover (padded)."""
    found, pos, term, start, unit = span
    lex = channel.lexicon
    unit_terms = lex.unit_terms.indices[lex.unit_terms.indptr[unit]:lex.unit_terms.indptr[unit + 1]]
    hits = pos[(pos >= start) & (pos < start + channel.lookup) & np.isin(term, unit_terms)]
    starts = np.fromiter((f[0] for f in found), np.int64, len(found))
    gaps = [m.span() for m in PARAGRAPH.finditer(text)]
    breaks = np.array([b for _, b in gaps], dtype=np.int64)
    paragraph = np.searchsorted(breaks, starts, side="right")  # paragraph number of each term
    core = np.bincount(paragraph[hits]).argmax()
    inside = np.flatnonzero(paragraph == core)
    if len(inside) <= channel.cap:
        lo, hi = int(inside[0]), int(inside[-1])
    else:
        lo = max(int(hits.min()) - channel.pad, 0)
        hi = min(int(hits.max()) + channel.pad, lo + channel.cap - 1, len(found) - 1)
    end = found[hi][1]  # a code term's run may reach into the next paragraph: cut it there
    after = np.searchsorted(breaks, found[hi][0], side="right")
    return text[found[lo][0]:min(end, gaps[after][0]) if after < len(gaps) else end]


def mark_semantic(texts: Sequence[str | None], doc_vectors: np.ndarray, index: EvalEmbeddings,
                  encoder: embed.EncoderParams, params: SemanticParams = SemanticParams()) -> SemanticMarks:
    """Flag documents whose kept vector, or one of whose candidate windows, lies within the
    model's calibrated cosine of an eval unit."""
    n = len(texts)
    counters: Counter = Counter(documents=n)
    doc_sim, doc_unit = np.full(n, -1.0, np.float32), np.full(n, -1, np.int64)
    win_sim, win_unit = np.full(n, -1.0, np.float32), np.full(n, -1, np.int64)
    share = np.zeros(n, np.float32)
    limits = params.threshold(index.info.get("model", ""))
    counters["uncalibrated_model"] = int(limits is None)
    if limits is None or not n:
        return SemanticMarks(np.zeros(n, bool), doc_sim, doc_unit, doc_sim, win_sim, share, counters)
    started = time.process_time()
    doc_sim[:], doc_unit[:] = index.search(doc_vectors)
    for a in range(0, n, params.batch_docs):
        windows = _candidate_windows([t or "" for t in texts[a:a + params.batch_docs]], index, params)
        if not windows:
            continue
        sims, units = index.search(embed.encode_texts([w[1] for w in windows], encoder)[0])
        counters["windows_encoded"] += len(windows)
        for (d, _, lexical), s, u in zip(windows, sims.tolist(), units.tolist()):
            if s > win_sim[a + d]:
                win_sim[a + d], win_unit[a + d], share[a + d] = s, u, lexical
    by_document, by_window = doc_sim >= limits[0], win_sim >= limits[1]
    flagged = by_document | by_window
    use_window = win_sim > doc_sim
    counters.update(flagged_document=int(by_document.sum()), flagged_window_only=int((by_window & ~by_document).sum()),
                    window_look_documents=int((win_sim > -1).sum()), semantic=int(flagged.sum()))
    counters["cpu_seconds"] = time.process_time() - started  # type: ignore[assignment]
    return SemanticMarks(flagged, np.where(use_window, win_sim, doc_sim), np.where(use_window, win_unit, doc_unit),
                         doc_sim, win_sim, share, counters)


# ----------------------------------------------------------------------------- per shard


@functools.lru_cache(maxsize=2)
def _cached_index(uri: str) -> EvalEmbeddings:
    return load_eval_embeddings(uri)


def shard_marks(texts: pa.ChunkedArray, ids: pa.ChunkedArray, embeddings_uri: str, index_uri: str,
                encoder: embed.EncoderParams, params: SemanticParams) -> tuple[SemanticMarks, EvalEmbeddings]:
    """The semantic tier over one shard, reading its kept embeddings (co-partitioned, same ids in
    the same order) and the eval index; the encoder must be the one both were built with."""
    index = _cached_index(index_uri)
    table = storage.read_parquet(embeddings_uri, columns=["id", "embedding"])
    kept = embed.embedding_metadata(table.schema).get("model")
    if kept != index.info.get("model") or encoder.model != kept:
        raise ValueError(
            f"{embeddings_uri}: the kept embeddings come from model {kept!r}, eval_embeddings from "
            f"{index.info.get('model')!r} and the encoder is {encoder.model!r}; re-materialize embeddings and "
            "eval_embeddings with the same encoder (MARIN_EMBED_MODEL)")
    if not table.column("id").cast(pa.large_string()).equals(ids.cast(pa.large_string())):
        raise ValueError(f"{embeddings_uri}: its ids are not those of the normalized shard, in order; "
                         "re-materialize embeddings for this source")
    vectors = embed.vectors_from_table(table)
    return mark_semantic(texts.to_pylist(), vectors, index, encoder, params), index


def by_eval_set(marks: SemanticMarks, index: EvalEmbeddings) -> dict[str, int]:
    """Flagged documents per eval set (of the unit each is nearest to)."""
    return dict(sorted(Counter(index.eval_sets[u] for u in marks.unit[marks.flagged].tolist()).items()))
