"""The semantic tier: documents that hold a reworded eval item, found with the embeddings the
pool already keeps.

An n-gram cannot see a paraphrase (reworded, reordered, identifiers renamed, numbers written
out). An embedding model can: its vectors of an eval item and of a rewording of it lie close.

* **Eval index.** Each eval row and each of its fields of at least ``min_field_words`` words is
  a unit, encoded with the pool's embedding model into an exact inner-product index (FAISS
  ``IndexFlatIP``, cosine on unit vectors). Beside it, each unit's distinctive words (found in
  at most ``max_term_units`` units) and their weights, for the window look below.
* **Whole documents.** A document's kept embedding (the ``embeddings`` asset; no second pass)
  is scored against its ``score_units`` nearest units: the cosine, plus ``words_weight`` and
  ``code_weight`` times the shares of the unit's distinctive-word and code-shape weight held by
  the document's first ``head_chars`` characters (about what the kept vector saw), less
  ``density_weight`` times its mean cosine to its ``density_units`` nearest units. A score of
  at least ``document`` flags it ``semantic``: the model places some paraphrases a little too
  far, where clean text on the same topic also lies, but a paraphrase keeps some of its item's
  rare words or shape and such clean text rarely does; and generic text (a stock word problem,
  a common helper function) lies near many units at once, a paraphrase near its own item more
  than near the rest. The density needs only the nearest-unit search the score already does,
  so the index stays what the lock and the model make it.
* **Window look.** A document's embedding is an average over its first tokens; an item inside a
  long document barely moves it. So windows of a document longer than ``head_chars`` that its
  kept vector does not flag are scored by the weighted share of
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

  The (window, unit) pairs with at least ``lexical_share`` / ``code_share`` of the unit's
  weight (and ``lexical_min_terms`` / ``code_min_terms`` terms), best first, up to
  ``max_window_tries``, are cut to the paragraph holding most of those terms and up to
  ``max_windows_per_doc`` distinct paragraphs are encoded; one within ``window`` cosine of a
  unit flags the document (its terms picked it: no lexical bonus). Clean documents rarely hold
  that much of an item's rare terms in one window, so few documents are looked at.

Thresholds depend on the model: ``SemanticParams.thresholds`` holds them per model,
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
    """The semantic tier's settings; thresholds are (model, document score, window cosine)."""

    policy: str = "flag"
    # evidence scores (cosine, lexical corroboration, the unit's background, density), calibrated on the paraphrase fixture's
    # calibration split (bench/bench_semantic.py --calibrate)
    thresholds: tuple[tuple[str, float, float], ...] = ((embed.OFFLINE_MODEL, 0.428, 0.645),)
    words_weight: float = 0.2  # score = cosine + this x the unit's distinctive-word share held ...
    code_weight: float = 0.4  # ... + this x its code-shape share held ...
    density_weight: float = 0.25  # ... - this x the text's mean cosine to its density_units nearest units ...
    density_units: int = 20
    background_weight: float = 0.5  # ... - this x the unit's mean cosine to its background_top nearest documents
    background_top: int = 10  # ... among a sample of the shard's documents (missing ones count 0):
    background_docs: int = 2_048  # at most this many, every k-th document of the shard
    score_units: int = 8  # nearest units (by cosine) a text's score is computed for
    head_chars: int = 1_500  # about what a kept vector sees (the bundled model's 256 tokens)
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
    max_window_tries: int = 24  # (window, unit) pairs tried per candidate document
    lexical_share: float = 0.25  # of a unit's distinctive-word weight in one window
    lexical_min_terms: int = 6
    max_term_units: int = 1_000  # a word in more units is not distinctive
    max_term_fraction: float = 0.1  # ... nor one in more than this share of the units
    span_pad_tokens: int = 8
    batch_docs: int = 512

    def threshold(self, model: str) -> tuple[float, float] | None:
        """(document, window) score thresholds calibrated for ``model``, or None."""
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

    def search(self, vectors: np.ndarray, k: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """(cosines, units) of the ``k`` nearest units of each unit vector, nearest first (-1: none)."""
        if not len(vectors) or not self.index.ntotal:
            return np.full((len(vectors), k), -1.0, np.float32), np.full((len(vectors), k), -1, np.int64)
        return self.index.search(np.ascontiguousarray(vectors, dtype=np.float32), k)


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
    similarity: np.ndarray  # float32 [D]: cosine to the unit of the better score (document or window)
    unit: np.ndarray  # int64 [D]: that unit (-1: none)
    document_score: np.ndarray  # float32 [D]: the kept vector's best score (cosine + lexical corroboration)
    window_score: np.ndarray  # float32 [D]: the best window's cosine (-1: not looked at)
    window_share: np.ndarray  # float32 [D]: that window's lexical share of the unit that picked it
    counters: Counter

    @property
    def looked(self) -> np.ndarray:
        """Documents the window look ran on."""
        return self.window_score > -1


def text_shares(texts: Sequence[str], channel: str, lex: Lexicon, params: SemanticParams) -> sp.csr_matrix:
    """texts x units: the share of each unit's distinctive-term weight (in ``channel``) each text holds."""
    rows, cols = [], []
    for d, text in enumerate(texts):
        held = {lex.term_ids[t] for *_, t in channel_terms(channel, text, params) if t in lex.term_ids}
        rows.extend([d] * len(held))
        cols.extend(held)
    x = sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)), shape=(len(texts), len(lex.term_ids)))
    return (x @ sp.diags(lex.weight) @ lex.unit_terms.T @ sp.diags(1 / np.maximum(lex.unit_weight, 1e-9))).tocsr()


UNIT_BATCH = 8_192  # eval units searched against the background at a time (bounds the task's memory)


def unit_background(vectors: np.ndarray, index: EvalEmbeddings, params: SemanticParams) -> np.ndarray:
    """Each unit's mean cosine to its ``background_top`` nearest documents among a sample of
    ``vectors`` (every k-th, at most ``background_docs``; fewer documents than ``background_top``
    count the missing ones as 0): how near the shard's ordinary text comes to the unit. A stock
    word problem or a common helper function has many clean documents near it; a distinctive item
    has none, so this is each unit's own bar, set by the pool rather than by one global number."""
    import faiss  # noqa: PLC0415

    n_units = index.index.ntotal if index.index is not None else 0
    out = np.zeros(n_units, np.float32)
    if not params.background_weight or not len(vectors) or not n_units:
        return out
    sample = faiss.IndexFlatIP(vectors.shape[1])
    sample.add(np.ascontiguousarray(vectors[::-(-len(vectors) // params.background_docs)], dtype=np.float32))
    k = min(params.background_top, sample.ntotal)
    for a in range(0, n_units, UNIT_BATCH):
        sims, _ = sample.search(index.index.reconstruct_n(a, min(UNIT_BATCH, n_units - a)), k)
        out[a:a + len(sims)] = sims.sum(axis=1) / params.background_top
    return out


def evidence_scores(texts: Sequence[str], vectors: np.ndarray, index: EvalEmbeddings,
                    params: SemanticParams) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(score, cosine, unit) of each text's best unit among its ``score_units`` nearest: the
    cosine, plus ``words_weight`` x the share of the unit's distinctive words the text holds,
    plus ``code_weight`` x its share of the unit's code shape, less ``background_weight`` x the
    unit's background (``unit_background`` of ``vectors``, the shard's documents), less
    ``density_weight`` x the text's mean cosine to its ``density_units`` nearest units. A
    paraphrase the model places a little too far keeps some of its item's rare words or shape; a
    clean text as near rarely does. And generic text lies near generic units: a stock word
    problem near many units at once, and many documents near a stock unit, where a paraphrase
    lies near its own item more than near the rest, and its item is not where ordinary text lies."""
    sims, units = index.search(vectors, max(params.score_units, params.density_units))
    known = units >= 0
    density = _mean_known(sims[:, :params.density_units], known[:, :params.density_units])
    sims, units, known = sims[:, :params.score_units], units[:, :params.score_units], known[:, :params.score_units]
    background = unit_background(vectors, index, params)
    score = np.where(known, sims - params.background_weight * background[np.maximum(units, 0)], -1.0).astype(np.float32)
    rows = np.repeat(np.arange(len(texts)), units.shape[1]).reshape(units.shape)
    for channel, weight in (("words", params.words_weight), ("code", params.code_weight)):
        if weight:
            shares = text_shares(texts, channel, index.lexicons[channel], params)
            held = np.zeros(units.shape, np.float32)
            held[known] = np.asarray(shares[rows[known], units[known]]).ravel()
            score += weight * held
    best = score.argmax(axis=1) if len(texts) else np.zeros(0, np.int64)
    pick = np.arange(len(texts))
    return score[pick, best] - params.density_weight * density, sims[pick, best].astype(np.float32), units[pick, best]


def _mean_known(sims: np.ndarray, known: np.ndarray) -> np.ndarray:
    """Each row's mean of the cosines found (0 where none)."""
    return (np.where(known, sims, 0.0).sum(axis=1) / np.maximum(known.sum(axis=1), 1)).astype(np.float32)


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
    """(document, span text, lexical share) of the windows worth encoding: of the (window, unit)
    pairs where the window holds a channel's share of the unit's distinctive-term weight, the
    ``max_window_tries`` best per document, cut to up to ``max_windows_per_doc`` distinct spans."""
    channels, scored = _channels(index, params), {}
    for name, channel in channels.items():
        for d, share, span in _channel_windows(texts, name, channel, params):
            scored.setdefault(d, []).append((share, name, span))
    out = []
    for d, found in scored.items():
        kept: dict[str, float] = {}  # overlapping windows often cut to the same paragraph: encode it once
        tries = sorted(found, key=lambda f: -f[0])[:params.max_window_tries]
        for share, name, span in tries:
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
    window, share, unit = _qualifying_units(x, channel)
    return [(doc_of[w], s, (*spans[w], u)) for w, s, u in zip(window.tolist(), share.tolist(), unit.tolist())]


def _qualifying_units(x: sp.csr_matrix, channel: _Channel) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(window, share, unit) of each window (row of ``x``) and unit whose term weight it holds
    the channel's share of: every such unit, not only the best (a module's words can fill a short
    unit's weight in the same window that holds a reworded item)."""
    lex = channel.lexicon
    weighted = (x @ sp.diags(lex.weight) @ lex.unit_terms.T).tocsr()
    counts = (x @ lex.unit_terms.T).tocsr()
    weighted.sort_indices()
    counts.sort_indices()  # same sparsity as ``weighted``: every weight is positive
    share = weighted.data / np.maximum(lex.unit_weight[weighted.indices], 1e-9)
    window = np.repeat(np.arange(x.shape[0]), np.diff(weighted.indptr))
    keep = (share >= channel.share) & (counts.data >= channel.min_terms)
    return window[keep], share[keep], weighted.indices[keep]


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
    """Flag documents whose kept vector (scored with the text it saw), or one of whose candidate
    windows, reaches the model's calibrated evidence score for an eval unit. The window look is
    for documents longer than their kept vector saw, and not already flagged by it."""
    n = len(texts)
    texts = [t or "" for t in texts]
    counters: Counter = Counter(documents=n)
    doc_score, win_score = np.full(n, -1.0, np.float32), np.full(n, -1.0, np.float32)
    doc_sim, doc_unit = np.full(n, -1.0, np.float32), np.full(n, -1, np.int64)
    win_unit = np.full(n, -1, np.int64)
    share = np.zeros(n, np.float32)
    limits = params.threshold(index.info.get("model", ""))
    counters["uncalibrated_model"] = int(limits is None)
    if limits is None or not n:
        return SemanticMarks(np.zeros(n, bool), doc_sim, doc_unit, doc_score, win_score, share, counters)
    started = time.process_time()
    heads = [t[:params.head_chars] for t in texts]
    doc_score[:], doc_sim[:], doc_unit[:] = evidence_scores(heads, doc_vectors, index, params)
    by_document = doc_score >= limits[0]
    for a in range(0, n, params.batch_docs):
        batch = [t if len(t) > params.head_chars and not by_document[a + d] else ""
                 for d, t in enumerate(texts[a:a + params.batch_docs])]
        windows = _candidate_windows(batch, index, params)
        if not windows:
            continue
        spans = [w[1] for w in windows]
        sims, units = index.search(embed.encode_texts(spans, encoder)[0])  # its terms picked it: its cosine
        counters["windows_encoded"] += len(windows)
        for (d, _, lexical), s, u in zip(windows, sims[:, 0].tolist(), units[:, 0].tolist()):
            if s > win_score[a + d]:
                win_score[a + d], win_unit[a + d], share[a + d] = s, u, lexical
    by_window = win_score >= limits[1]
    flagged = by_document | by_window
    use_window = by_window & ~by_document | (~flagged & (win_score > doc_sim))
    counters.update(flagged_document=int(by_document.sum()), flagged_window_only=int((by_window & ~by_document).sum()),
                    window_look_documents=int((win_score > -1).sum()), semantic=int(flagged.sum()))
    counters["cpu_seconds"] = time.process_time() - started  # type: ignore[assignment]
    return SemanticMarks(flagged, np.where(use_window, win_score, doc_sim), np.where(use_window, win_unit, doc_unit),
                         doc_score, win_score, share, counters)


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
