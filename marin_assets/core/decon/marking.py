"""The two marking rules, per document, and the per-shard contamination output.

``marin`` (reproduction of Marin's rule): per paragraph (split on blank lines, whitespace
tokens, no normalization), overlap = matched / kept features; a document is contaminated when
some paragraph has overlap >= 0.5 with at least 2 distinct matched features, or with a matched
feature that is a complete eval record on its own (a 3-12 token paragraph).

``coverage``: the same 13-gram features over normalized tokens (``text_normalize``) and
across the whole document; contaminated when the document holds at least ``coverage_share`` of
the distinct (kept) 13-grams of some eval row, or of one distinctive field of a row (at least
``field_min_features`` kept 13-grams of its own: a copy of only the answer, the solution or the
question), or a run of consecutive
matched 13-grams covering at least ``run_tokens`` tokens (a gap of up to ``run_gap_windows``
13-grams, what one changed token removes, does not end a run), or a whole short eval row (6-12
normalized tokens) anywhere. Paragraph boundaries, case, width, zero-width characters,
punctuation, quote markers and line numbers do not matter.

The default flag (``either``) is a document either rule flags: each catches copies the other
misses (``marin`` a short paragraph of a long row, ``coverage`` every reformatted copy).

Both keep Marin's evidence columns: ``matched_evals`` / ``matched_rows`` hold, for a
contaminated document, the rows behind the decision (most matched features first), otherwise
every row it partly matched (useful to review near misses). The pool drops contaminated
documents whole; spans are never cut out.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import xxhash

from marin_assets.core.decon.features import TokenWindows, _batches, extract_features
from marin_assets.core.decon.index import EvalIndex, _sorted_member, load_eval_index
from marin_assets.core.decon import semantic
from marin_assets.core.decon.params import EITHER, RULES, DeconParams
from marin_assets.core.decon.text_normalize import normalize_batch
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.integrity import check_text_ids
from marin_assets.core.runtime.kernels import string_buffers

# ----------------------------------------------------------------------------- the marin rule


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


def _batch_inputs(texts: pa.Array | pa.ChunkedArray | Sequence[str | None], drop: np.ndarray | None) -> tuple:
    """Both rules' start: the texts' UTF-8 buffers (data, offsets, nulls) and the drop set (empty if none)."""
    array = texts if isinstance(texts, (pa.Array, pa.ChunkedArray)) else pa.array(list(texts), pa.large_string())
    return (*string_buffers(array), np.zeros(0, np.uint64) if drop is None else drop)


def mark_marin(
    texts: pa.Array | pa.ChunkedArray | Sequence[str | None],
    index: EvalIndex,
    drop: np.ndarray | None = None,
    params: DeconParams = DeconParams(),
) -> DocumentMarks:
    """Apply Marin's paragraph rule to every text (vectorized per batch; Python only for documents with matches)."""
    data, offsets, nulls, drop = _batch_inputs(texts, drop)
    n_docs = len(offsets) - 1
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




# ----------------------------------------------------------------------------- the coverage rule


def _kept_row_features(index: EvalIndex, drop: np.ndarray) -> np.ndarray:
    """Distinct features of each eval unit, less those in the drop set (the share's denominator)."""
    total = np.asarray(index.row_features if index.row_features is not None else np.zeros(len(index.row_ids)),
                       dtype=np.int64).copy()
    if drop.size:
        present = drop[index.contains(drop)]
        if present.size:
            _, rows = index.expand(present)
            total -= np.bincount(rows, minlength=len(total))
    return total


def _runs(pos: np.ndarray, doc: np.ndarray, max_gap: int) -> tuple[np.ndarray, np.ndarray]:
    """(doc, tokens covered) of every run of matched window positions (``pos`` sorted within each doc).

    Windows up to ``max_gap`` positions apart continue a run: one changed token removes exactly
    ``ngram_tokens`` consecutive 13-grams, and should not split a copy in two.
    """
    if not len(pos):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    breaks = np.r_[True, (pos[1:] - pos[:-1] > max_gap + 1) | (doc[1:] != doc[:-1])]
    first = np.flatnonzero(breaks)
    last = np.append(first[1:], len(pos)) - 1
    return doc[first], pos[last] - pos[first]


def short_row_matches(tokens: TokenWindows | None, index: EvalIndex,
                      params: DeconParams) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(doc, row hash, token position) of whole short eval rows found anywhere in the batch.

    A prefix key (the row's first ``short_min_tokens`` tokens) finds the few candidate
    positions; the exact row hash is then checked there at every short length.
    """
    empty = (np.zeros(0, np.int64), np.zeros(0, np.uint64), np.zeros(0, np.int64))
    if tokens is None or index.short_prefix is None or not len(index.short_prefix) or not len(tokens.token_doc):
        return empty
    starts, prefix = tokens.window_hashes(params.short_min_tokens)
    cand = starts[index.short_prefix_set.contains(prefix)]
    if not cand.size:
        return empty
    docs, hashes_out, positions = [], [], []
    for length in range(params.short_min_tokens, params.ngram_tokens):
        pos, hashes = tokens.window_hashes(length, cand)
        found = _sorted_member(index.record_hashes, hashes)
        docs.append(tokens.token_doc[pos[found]])
        hashes_out.append(hashes[found])
        positions.append(pos[found])
    return np.concatenate(docs), np.concatenate(hashes_out), np.concatenate(positions)


def mark_coverage(
    texts: pa.Array | pa.ChunkedArray | Sequence[str | None],
    index: EvalIndex,
    drop: np.ndarray | None = None,
    params: DeconParams = DeconParams(),
) -> DocumentMarks:
    """Apply the coverage rule to every text (``index`` is the coverage index: normalized features)."""
    data, offsets, nulls, drop = _batch_inputs(texts, drop)
    n_docs = len(offsets) - 1
    kept_total = _kept_row_features(index, drop)
    # a field scores on its own only while distinctive: enough of its own n-grams are not boilerplate
    scored = index.unit_is_row | (kept_total >= params.field_min_features)
    contaminated = np.zeros(n_docs, dtype=bool)
    max_overlap = np.zeros(n_docs, dtype=np.float32)
    matched_evals: list[list[str]] = [[] for _ in range(n_docs)]
    matched_rows: list[list[str]] = [[] for _ in range(n_docs)]
    evidence: dict[int, tuple[int, int, list[int]]] = {}
    counters: Counter = Counter(documents=n_docs, null_text=int(nulls.sum()))
    for i, j in _batches(offsets, params.batch_bytes):
        base = offsets[i]
        raw_offsets = offsets[i:j + 1] - base
        norm, norm_offsets = normalize_batch(data[base:offsets[j]], raw_offsets)
        feats = extract_features(norm, norm_offsets, params, short_paragraphs=True, keep_tokens=True)
        tokens = feats.tokens
        counters["features"] += len(feats.hashes)
        hit = np.flatnonzero(index.contains(feats.hashes))
        short_doc, short_hash, short_pos = short_row_matches(tokens, index, params)
        if hit.size == 0 and short_doc.size == 0:
            continue
        dropped = _sorted_member(drop, feats.hashes[hit])
        counters["dropped_features"] += int(dropped.sum())
        counters["matched_features"] += int((~dropped).sum())
        kept = hit[~dropped]
        n_grams = len(tokens.gram_pos) if tokens is not None else 0
        gram_kept = kept[kept < n_grams]
        hit_doc = np.concatenate([feats.unit_doc[feats.unit[kept]], short_doc]).astype(np.int64)
        hit_hash = np.concatenate([feats.hashes[kept], short_hash])
        # rule 2: runs of consecutive matched 13-grams (positions are in token order)
        flag = np.zeros(j - i, dtype=bool)
        first_pos = {}
        if gram_kept.size:
            pos = tokens.gram_pos[gram_kept]
            run_doc, run_span = _runs(pos, feats.unit_doc[feats.unit[gram_kept]], params.run_gap_windows)
            flag[run_doc[run_span + params.ngram_tokens >= params.run_tokens]] = True
        # rule 1: share of an eval unit's distinct kept features (short rows: the whole row, 1 of 1)
        order = np.lexsort((hit_hash, hit_doc))
        hd, hh = hit_doc[order], hit_hash[order]
        fresh = np.r_[True, (hd[1:] != hd[:-1]) | (hh[1:] != hh[:-1])] if len(hd) else np.zeros(0, bool)
        hd, hh = hd[fresh], hh[fresh]
        if not hd.size:
            continue
        pair_doc, pair_row, pair_count = index.attribute(hd, hh, with_counts=True)
        share = np.where(scored[pair_row], pair_count / np.maximum(kept_total[pair_row], 1), 0.0)
        qualifies = share >= params.coverage_share
        flag[pair_doc[qualifies]] = True
        best = np.zeros(j - i, dtype=np.float64)
        np.maximum.at(best, pair_doc, share)
        max_overlap[i:j] = np.minimum(best, 1.0).astype(np.float32)
        contaminated[i:j] |= flag
        # evidence: rows behind the decision first; the byte span of the first matched window
        _, set_code, set_names, labels = index._row_tables
        if gram_kept.size:
            gdoc = feats.unit_doc[feats.unit[gram_kept]]
            gbyte = tokens.token_start[tokens.gram_pos[gram_kept]] - norm_offsets[gdoc]
            firsts = np.r_[True, gdoc[1:] != gdoc[:-1]]
            first_pos = dict(zip(gdoc[firsts].tolist(), gbyte[firsts].tolist()))
        if short_pos.size:
            sbyte = tokens.token_start[short_pos] - norm_offsets[tokens.token_doc[short_pos]]
            for d, b in zip(tokens.token_doc[short_pos].tolist(), sbyte.tolist()):
                first_pos.setdefault(d, b)
        bounds = np.flatnonzero(np.r_[True, pair_doc[1:] != pair_doc[:-1], True])
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            d = int(pair_doc[a])
            g = i + d
            rows = pair_row[a:b]
            if flag[d]:
                rows = np.concatenate([rows[qualifies[a:b]], rows[~qualifies[a:b]]])
            matched_rows[g] = [labels[r] for r in rows[:params.max_matched_rows].tolist()]
            matched_evals[g] = sorted({set_names[c] for c in set_code[rows].tolist()})
            if flag[d]:
                # normalized byte position -> original (exact for ASCII documents, scaled otherwise)
                norm_len = max(int(norm_offsets[d + 1] - norm_offsets[d]), 1)
                raw_len = int(raw_offsets[d + 1] - raw_offsets[d])
                start = int(first_pos.get(d, 0) * raw_len / norm_len)
                evidence[g] = (start, start + params.excerpt_chars * 4, rows[:3].tolist())
    counters["contaminated"] = int(contaminated.sum())
    return DocumentMarks(contaminated, max_overlap, matched_evals, matched_rows, evidence, counters)


def mark_documents(
    texts: pa.Array | pa.ChunkedArray | Sequence[str | None],
    index: EvalIndex,
    drop: np.ndarray | None = None,
    params: DeconParams = DeconParams(),
    rule: str = "marin",
) -> DocumentMarks:
    """Apply one rule (``marin`` or ``coverage``; its own index and drop set) to every text."""
    if rule == "coverage":
        return mark_coverage(texts, index, drop, params)
    if rule != "marin":
        raise ValueError(f"unknown decontamination rule {rule!r}; use 'coverage' or 'marin' (the default flag "
                         f"{EITHER!r} combines both: either_marks)")
    return mark_marin(texts, index, drop, params)


def either_marks(coverage: DocumentMarks, marin: DocumentMarks) -> DocumentMarks:
    """The default flag: documents either rule flags, with the evidence of ``coverage`` where it
    flags and of ``marin`` where only it does (whole rows are numbered alike in both indexes)."""
    only_marin = marin.contaminated & ~coverage.contaminated
    pick = only_marin.tolist()
    counters = Counter(coverage.counters)
    counters["contaminated"] = int((coverage.contaminated | marin.contaminated).sum())
    return DocumentMarks(
        contaminated=coverage.contaminated | marin.contaminated,
        max_overlap=np.where(only_marin, marin.max_overlap, coverage.max_overlap).astype(np.float32),
        matched_evals=[m if p else c for p, c, m in zip(pick, coverage.matched_evals, marin.matched_evals)],
        matched_rows=[m if p else c for p, c, m in zip(pick, coverage.matched_rows, marin.matched_rows)],
        evidence={**{d: e for d, e in marin.evidence.items() if pick[d]}, **coverage.evidence},
        counters=counters,
    )


# ----------------------------------------------------------------------------- per shard

def _required_index(params: DeconParams, stage: str) -> EvalIndex:
    if not params.index_uri:
        raise ValueError(f"{stage}: params.index_uri is empty; pass the eval_ngrams output directory")
    return load_eval_index(params.index_uri, cache_dir=params.index_cache_dir)


def _sample_key(doc_id: str) -> int:
    """Deterministic priority of a document in the flagged-document sample (bottom-k merges exactly)."""
    return xxhash.xxh3_64_intdigest(doc_id.encode("utf-8"))


def contamination_shard(input_uris: list[str], output_uri: str, params: DeconParams) -> dict[str, Any]:
    """Mark one normalized shard with both rules; write ``id, contaminated, max_overlap, matched_evals,
    matched_rows`` (of ``params.rule_name``: ``either`` by default) and ``contaminated_marin``,
    ``contaminated_coverage``.

    Output rows are in input order (co-partitioned). ``params.index_uri`` names the eval index,
    ``params.drop_set_uris`` / ``coverage_drop_set_uris`` each rule's drop sets. The counters
    carry flagged documents per eval set and per rule, a bottom-k sample of flagged excerpts
    with their eval rows, and samples of documents only one rule flags.

    With ``params.semantic_index_uri`` (the ``eval_embeddings`` folder) the inputs are the
    normalized shard and its embeddings shard, and the semantic tier adds
    ``contaminated_semantic``, ``semantic_row`` and ``semantic_similarity`` (``semantic``).
    """
    _required_index(params, "contamination_shard")
    semantic_on = bool(params.semantic_index_uri)
    if semantic_on and len(input_uris) != 2:
        raise ValueError(f"contamination_shard with the semantic tier takes a normalized and an embeddings shard, got {input_uris}")
    normalized_uris = input_uris[:1] if semantic_on else input_uris
    if params.rule_name not in (EITHER, *RULES):
        raise ValueError(f"unknown decontamination rule {params.rule_name!r}; use {EITHER!r}, 'coverage' or 'marin'")
    indexes = {rule: load_eval_index(params.index_uri, rule, params.index_cache_dir) for rule in ("marin", "coverage")}
    drops = {"marin": load_drop_set(params.drop_set_uris), "coverage": load_drop_set(params.coverage_drop_set_uris)}
    tables = [storage.read_parquet(u, columns=["id", params.text_column]) for u in normalized_uris]
    for uri, read in zip(normalized_uris, tables):
        check_text_ids(uri, read.column("id"), read.column(params.text_column))
    table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    texts = table.column(params.text_column)
    marks = {rule: mark_documents(texts, indexes[rule], drops[rule], params, rule) for rule in ("marin", "coverage")}
    chosen = either_marks(marks["coverage"], marks["marin"]) if params.rule_name == EITHER else marks[params.rule_name]
    chosen_index = indexes["marin" if params.rule_name == "marin" else "coverage"]
    columns, semantic_counters = {}, {}
    if semantic_on:
        columns, semantic_counters = _semantic(table, texts, input_uris[1], params, chosen.contaminated)
        chosen.counters["contaminated"] = int(chosen.contaminated.sum())
    out = pa.table({
        "id": table.column("id"),
        "contaminated": pa.array(chosen.contaminated, pa.bool_()),
        "max_overlap": pa.array(chosen.max_overlap, pa.float32()),
        "matched_evals": pa.array(chosen.matched_evals, pa.list_(pa.string())),
        "matched_rows": pa.array(chosen.matched_rows, pa.list_(pa.string())),
        "contaminated_marin": pa.array(marks["marin"].contaminated, pa.bool_()),
        "contaminated_coverage": pa.array(marks["coverage"].contaminated, pa.bool_()),
        **columns,
    })
    storage.write_parquet(out, output_uri)

    ids = table.column("id")
    flagged_by_eval: Counter = Counter()
    for d in np.flatnonzero(chosen.contaminated).tolist():
        flagged_by_eval.update(chosen.matched_evals[d])
    sample = _sample(chosen, ids, texts, chosen_index, params, None)
    only = {
        rule: _sample(marks[rule], ids, texts, indexes[rule], params,
                      marks[rule].contaminated & ~marks[other].contaminated)
        for rule, other in (("marin", "coverage"), ("coverage", "marin"))
    }
    counters = chosen.counters
    return {
        "documents": int(counters["documents"]),
        "contaminated": int(counters["contaminated"]),
        "contamination_rate": counters["contaminated"] / counters["documents"] if counters["documents"] else 0.0,
        "null_text": int(counters["null_text"]),
        "features": int(counters["features"]),
        "matched_features": int(counters["matched_features"]),
        "dropped_features": int(counters["dropped_features"]),
        "flagged_marin": int(marks["marin"].contaminated.sum()),
        "flagged_coverage": int(marks["coverage"].contaminated.sum()),
        "flagged_only_marin": int((marks["marin"].contaminated & ~marks["coverage"].contaminated).sum()),
        "flagged_only_coverage": int((marks["coverage"].contaminated & ~marks["marin"].contaminated).sum()),
        "flagged_by_eval": dict(sorted(flagged_by_eval.items())),
        "flagged_sample": sample,
        "only_marin_sample": only["marin"],
        "only_coverage_sample": only["coverage"],
        **semantic_counters,
    }


def _semantic(table: pa.Table, texts: pa.ChunkedArray, embeddings_uri: str, params: DeconParams,
              contaminated: np.ndarray) -> tuple[dict[str, pa.Array], dict[str, Any]]:
    """The semantic tier's columns and counters; under policy ``drop`` its flags join ``contaminated``
    (changed in place), under ``flag`` they are only reported."""
    marks, index = semantic.shard_marks(texts, table.column("id"), embeddings_uri, params.semantic_index_uri,
                                        params.encoder, params.semantic)
    if params.semantic.policy == "drop":
        contaminated |= marks.flagged
    nearest = [index.labels[u] if f else None for f, u in zip(marks.flagged.tolist(), marks.unit.tolist())]
    columns = {
        "contaminated_semantic": pa.array(marks.flagged, pa.bool_()),
        "semantic_row": pa.array(nearest, pa.string()),
        "semantic_similarity": pa.array(marks.similarity, pa.float32()),
    }
    counters = {
        "flagged_semantic": int(marks.flagged.sum()),
        "flagged_semantic_only": int((marks.flagged & ~contaminated).sum()) if params.semantic.policy == "flag" else 0,
        "semantic_window_look": int(marks.counters["window_look_documents"]),
        "semantic_windows": int(marks.counters["windows_encoded"]),
        "semantic_cpu_seconds": float(marks.counters.get("cpu_seconds", 0.0)),
        "semantic_uncalibrated": int(marks.counters["uncalibrated_model"]),
        "semantic_by_eval": semantic.by_eval_set(marks, index),
    }
    return columns, counters


def _sample(marks: DocumentMarks, ids: pa.ChunkedArray, texts: pa.ChunkedArray, index: EvalIndex,
            params: DeconParams, among: np.ndarray | None) -> list[dict[str, Any]]:
    """Bottom-k (by a hash of the id) flagged documents with an excerpt and their eval rows."""
    flagged = [d for d in sorted(marks.evidence) if among is None or among[d]]
    flagged_ids = ids.take(pa.array(flagged, pa.int64())).to_pylist() if flagged else []
    candidates = sorted((_sample_key(str(doc_id)), d, str(doc_id)) for d, doc_id in zip(flagged, flagged_ids))
    sample = []
    for key, d, doc_id in candidates[:params.flagged_sample_size]:
        lo, hi, rows = marks.evidence[d]
        text = texts[d].as_py() or ""
        excerpt = text.encode("utf-8")[lo:hi].decode("utf-8", errors="replace")[:params.excerpt_chars]
        sample.append({
            "key": key, "id": doc_id, "max_overlap": round(float(marks.max_overlap[d]), 4), "excerpt": excerpt,
            "matched_rows": marks.matched_rows[d][:3],
            "eval_excerpts": [index.row_excerpts[r] for r in rows],
        })
    return sample


def summarize_contamination(shard_stats: Iterable[Mapping[str, Any]], sample_size: int = 8) -> dict[str, Any]:
    """Per-source totals from the shards' counters: flagged per eval set and per rule, rate, merged samples."""
    totals: Counter = Counter()
    by_eval: Counter = Counter()
    semantic_by_eval: Counter = Counter()
    semantic_cpu = 0.0
    samples: dict[str, list[Mapping[str, Any]]] = {"flagged_sample": [], "only_marin_sample": [],
                                                   "only_coverage_sample": []}
    for stats in shard_stats:
        for key in ("documents", "contaminated", "null_text", "features", "matched_features", "dropped_features",
                    "flagged_marin", "flagged_coverage", "flagged_only_marin", "flagged_only_coverage",
                    "flagged_semantic", "flagged_semantic_only", "semantic_window_look", "semantic_windows",
                    "semantic_uncalibrated"):
            totals[key] += int(stats.get(key, 0))
        semantic_cpu += float(stats.get("semantic_cpu_seconds", 0.0))
        by_eval.update(stats.get("flagged_by_eval", {}))
        semantic_by_eval.update(stats.get("semantic_by_eval", {}))
        for name, sample in samples.items():
            sample.extend(stats.get(name, []))
    documents = totals["documents"]
    return {
        **{k: int(v) for k, v in totals.items()},
        "contamination_rate": totals["contaminated"] / documents if documents else 0.0,
        "flagged_by_eval": dict(sorted(by_eval.items())),
        "semantic_by_eval": dict(sorted(semantic_by_eval.items())),
        "semantic_cpu_seconds": round(semantic_cpu, 3),
        **{name: sorted(sample, key=lambda s: s["key"])[:sample_size] for name, sample in samples.items()},
    }
