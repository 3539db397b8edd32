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
  long document barely moves it. So windows of ``window_lookup_tokens`` words (half
  overlapping) are scored by the weighted share of a unit's distinctive words they hold; the
  best ``max_windows_per_doc`` windows with at least ``lexical_share`` (and
  ``lexical_min_terms`` words) are cut to the paragraph holding most of those words (at most
  ``window_tokens`` words) and encoded; one within ``window`` cosine of a unit flags the
  document. Clean documents rarely hold that many of an item's rare words in one window, so few
  documents are looked at.

Cosine thresholds depend on the model: ``SemanticParams.thresholds`` holds them per model,
calibrated on the paraphrase fixture's calibration split (``bench/bench_decon.py --semantic``).
A model without a threshold flags nothing and says so (``uncalibrated_model``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
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

CODE_VERSION = "1"  # the eval_embeddings folder: units, vectors, lexicon
POLICIES = ("flag", "drop")  # flag: reported only; drop: the pool drops semantic flags too
WORD = re.compile(r"[^\W\d_]{2,}")  # words of 2+ letters (numbers are often written out); ``_`` splits identifiers
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
    thresholds: tuple[tuple[str, float, float], ...] = ((embed.OFFLINE_MODEL, 0.692, 0.597),)
    min_field_words: int = 8  # a field this long is a unit of its own (a copy of only the question)
    window_lookup_tokens: int = 96  # words of a window scored for lexical evidence (half overlapping)
    window_tokens: int = 256  # at most this many words of it are encoded
    max_windows_per_doc: int = 2
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


def words(text: str) -> list[str]:
    return [lexical_term(w) for w in WORD.findall(text)]


def _lexicon(texts: Sequence[str], params: SemanticParams) -> tuple[list[str], np.ndarray, sp.csr_matrix]:
    """Distinctive words (in few units), their weights (log inverse unit frequency) and the
    unit x word incidence matrix."""
    per_unit = [sorted(set(words(t))) for t in texts]
    df = Counter(w for ws in per_unit for w in ws)
    cap = min(params.max_term_units, max(1, int(params.max_term_fraction * len(texts))))
    terms = sorted(w for w, n in df.items() if n <= cap)
    ids = {w: i for i, w in enumerate(terms)}
    weight = np.log((1 + len(texts)) / (1 + np.array([df[w] for w in terms], dtype=np.float64))) + 1.0
    rows = [u for u, ws in enumerate(per_unit) for w in ws if w in ids]
    cols = [ids[w] for ws in per_unit for w in ws if w in ids]
    incidence = sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)), shape=(len(texts), len(terms)))
    return terms, weight.astype(np.float32), incidence


def build_eval_embeddings(rows: Iterable[EvalRow], out: str, encoder: embed.EncoderParams,
                          params: SemanticParams = SemanticParams()) -> dict[str, Any]:
    """Encode every eval unit with ``encoder`` and write the index folder ``out``."""
    units = eval_units(rows, params.min_field_words)
    texts = [u[3] for u in units]
    vectors, counters = embed.encode_texts(texts, encoder)
    terms, weight, incidence = _lexicon(texts, params)
    coo = incidence.tocoo()
    storage.write_parquet(pa.table({
        "eval_set": [u[0] for u in units], "row_id": [u[1] for u in units], "field": [u[2] for u in units],
        "excerpt": [t[:300] for t in texts],
    }), storage.join(out, UNITS_FILE))
    storage.write_parquet(pa.table({"unit": coo.row.astype(np.int32), "term": pa.array([terms[c] for c in coo.col])}),
                          storage.join(out, TERMS_FILE))
    _save_npy(vectors.astype(np.float32), storage.join(out, VECTORS_FILE))
    info = {"model": encoder.model, "revision": encoder.revision, "dim": int(vectors.shape[1]) if units else 0,
            "units": len(units), "rows": len({(u[0], u[1]) for u in units}), "terms": len(terms)}
    storage.write_bytes(storage.join(out, INFO_FILE), json.dumps(info).encode())
    return {**info, "tokens": counters["tokens"],
            "units_by_set": dict(sorted(Counter(u[0] for u in units).items()))}


@dataclasses.dataclass
class EvalEmbeddings:
    """The loaded eval index: exact inner-product search, unit labels and the word lexicon."""

    info: dict[str, Any]
    index: Any  # faiss.IndexFlatIP
    eval_sets: list[str]
    labels: list[str]  # set:row or set:row#field
    excerpts: list[str]
    term_ids: dict[str, int]
    weight: np.ndarray  # per term
    unit_terms: sp.csr_matrix  # unit x term, 1 where the unit holds the term
    unit_weight: np.ndarray  # per unit: its distinctive words' total weight

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
    terms = sorted(set(postings["term"]))
    term_ids = {t: i for i, t in enumerate(terms)}
    n_units = len(units["eval_set"])
    cols = np.array([term_ids[t] for t in postings["term"]], dtype=np.int64)
    rows = np.array(postings["unit"], dtype=np.int64)
    unit_terms = sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)), shape=(n_units, len(terms)))
    df = np.asarray(unit_terms.sum(axis=0)).ravel()
    weight = (np.log((1 + n_units) / (1 + df)) + 1.0).astype(np.float32)
    labels = [f"{s}:{r}" + (f"#{f}" if f else "") for s, r, f in zip(units["eval_set"], units["row_id"], units["field"])]
    return EvalEmbeddings(info, index, units["eval_set"], labels, units["excerpt"], term_ids, weight,
                          unit_terms, np.asarray(unit_terms @ weight).ravel())


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


def _candidate_windows(texts: Sequence[str], index: EvalEmbeddings, params: SemanticParams) -> list[tuple[int, str, float]]:
    """(document, span text, lexical share) of the windows worth encoding: the best ``max_windows_per_doc``
    windows per document holding ``lexical_share`` of some unit's distinctive-word weight."""
    half = max(params.window_lookup_tokens // 2, 1)
    doc_of, win_rows, win_cols, spans = [], [], [], []
    for d, text in enumerate(texts):
        found = [(m.start(), m.end(), index.term_ids.get(lexical_term(m.group()), -1)) for m in WORD.finditer(text or "")]
        pos = np.array([k for k, f in enumerate(found) if f[2] >= 0], dtype=np.int64)
        if len(pos) < params.lexical_min_terms:
            continue
        term = np.array([found[k][2] for k in pos.tolist()], dtype=np.int64)
        n_windows = max(1, -(-(len(found) - params.window_lookup_tokens) // half) + 1)
        for k in range(-(-params.window_lookup_tokens // half)):  # each position lies in up to W/half windows
            w = pos // half - k
            ok = (w >= 0) & (w < n_windows)
            win_rows.append(len(spans) + w[ok])
            win_cols.append(term[ok])
        doc_of.extend([d] * n_windows)
        spans.extend((d, found, pos, term, w * half) for w in range(n_windows))
    if not spans:
        return []
    rows, cols = np.concatenate(win_rows), np.concatenate(win_cols)
    x = sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)), shape=(len(spans), len(index.term_ids)))
    x.data[:] = 1.0  # distinct words per window
    best, best_unit = _best_units(x, index, params)
    chosen: dict[int, list[tuple[float, int]]] = {}
    for w in np.flatnonzero(best > 0).tolist():
        chosen.setdefault(doc_of[w], []).append((float(best[w]), w))
    out = []
    for d, scored in chosen.items():
        for _, w in sorted(scored, reverse=True)[:params.max_windows_per_doc]:
            out.append((d, _span_text(texts[d], spans[w], int(best_unit[w]), index, params), float(best[w])))
    return out


def _best_units(x: sp.csr_matrix, index: EvalEmbeddings, params: SemanticParams) -> tuple[np.ndarray, np.ndarray]:
    """Per window (row of ``x``): the largest qualifying share of a unit's word weight, and that unit."""
    weighted = (x @ sp.diags(index.weight) @ index.unit_terms.T).tocsr()
    counts = (x @ index.unit_terms.T).tocsr()
    weighted.sort_indices()
    counts.sort_indices()  # same sparsity as ``weighted``: every weight is positive
    share = weighted.data / np.maximum(index.unit_weight[weighted.indices], 1e-9)
    window = np.repeat(np.arange(x.shape[0]), np.diff(weighted.indptr))
    keep = (share >= params.lexical_share) & (counts.data >= params.lexical_min_terms)
    best, best_unit = np.zeros(x.shape[0]), np.full(x.shape[0], -1, np.int64)
    order = np.lexsort((share[keep], window[keep]))  # last of each window: its best unit
    w, s, u = window[keep][order], share[keep][order], weighted.indices[keep][order]
    best[w], best_unit[w] = s, u  # later (larger) writes win
    return best, best_unit


def _span_text(text: str, span: tuple, unit: int, index: EvalEmbeddings, params: SemanticParams) -> str:
    """What of the window is encoded: the paragraph holding most of the words it shares with
    ``unit`` (a copied item usually stands as its own block), or, when that paragraph is longer
    than ``window_tokens`` words, the span those words cover (padded)."""
    _, found, pos, term, start = span
    unit_terms = index.unit_terms.indices[index.unit_terms.indptr[unit]:index.unit_terms.indptr[unit + 1]]
    hits = pos[(pos >= start) & (pos < start + params.window_lookup_tokens) & np.isin(term, unit_terms)]
    starts = np.fromiter((f[0] for f in found), np.int64, len(found))
    breaks = np.array([m.end() for m in PARAGRAPH.finditer(text)], dtype=np.int64)
    paragraph = np.searchsorted(breaks, starts, side="right")  # paragraph number of each word
    core = np.bincount(paragraph[hits]).argmax()
    inside = np.flatnonzero(paragraph == core)
    if len(inside) <= params.window_tokens:
        lo, hi = int(inside[0]), int(inside[-1])
    else:
        lo = max(int(hits.min()) - params.span_pad_tokens, 0)
        hi = min(int(hits.max()) + params.span_pad_tokens, lo + params.window_tokens - 1, len(found) - 1)
    return text[found[lo][0]:found[hi][1]]


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
