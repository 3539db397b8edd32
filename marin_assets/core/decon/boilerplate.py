"""Drop sets: eval n-grams common in the corpus, left out of both the numerator and the denominator.

The ``marin`` rule keeps Marin's drop sets exactly: per source, eval n-grams in at least
max(5, 0.5%) of its first 5,000 documents; globally, eval n-grams in at least 50 of the first
1,000,000 documents of each source summed, seen in at least 3 sources.

The ``coverage`` rule uses the same thresholds but counts an n-gram in a document only when the
document is not a copy of the n-gram's eval row (it holds less than ``coverage_share`` of the
row's distinct n-grams): licence headers and common phrases are dropped, while an eval row
copied into many documents of one source stays matchable, so every copy is flagged. Only whole
rows count as copies here: a single field (an answer, a question) repeated in many documents of
a source is treated as boilerplate, as Marin treats any partial copy.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from marin_assets.core.decon.features import _batches, extract_features
from marin_assets.core.decon.index import EvalIndex, load_eval_index
from marin_assets.core.decon.marking import short_row_matches
from marin_assets.core.decon.params import DeconParams
from marin_assets.core.decon.text_normalize import normalize_batch
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.kernels import string_buffers


def _iter_text_arrays(uris: Sequence[str], column: str, limit: int) -> Iterator[pa.Array]:
    """Text arrays of the first ``limit`` documents of a source's shards, in shard order."""
    remaining = limit
    for uri in uris:
        if remaining <= 0:
            return
        fs, path = storage.filesystem(uri)
        with fs.open(path, "rb") as handle:
            for batch in storage.parquet_file(handle).iter_batches(columns=[column], batch_size=8192):
                texts = batch.column(0)[:remaining]
                remaining -= len(texts)
                yield texts
                if remaining <= 0:
                    return


def eval_ngram_frequencies(input_uris: list[str], output_uri: str, params: DeconParams,
                           rule: str = "marin") -> dict[str, Any]:
    """Document frequency of each eval n-gram over the head of one source (all its shards, in order).

    Writes ``hash, head_docs, sample_docs``: documents among the first ``source_sample_docs``
    and the first ``global_sample_docs`` containing the n-gram (for ``coverage``: and not a copy
    of its eval row). Input to both drop sets of that rule.
    """
    if not params.index_uri:
        raise ValueError("eval_ngram_frequencies: params.index_uri is empty; pass the eval_ngrams output directory")
    index = load_eval_index(params.index_uri, rule, params.index_cache_dir)
    limit = max(params.global_sample_docs, params.source_sample_docs)
    seen = 0
    head_parts: list[np.ndarray] = []
    sample_parts: list[np.ndarray] = []
    for texts in _iter_text_arrays(input_uris, params.text_column, limit):
        data, offsets, _ = string_buffers(texts)
        for i, j in _batches(offsets, params.batch_bytes):
            chunk, chunk_offsets = data[offsets[i]:offsets[j]], offsets[i:j + 1] - offsets[i]
            if rule == "coverage":
                chunk, chunk_offsets = normalize_batch(chunk, chunk_offsets)
            feats = extract_features(chunk, chunk_offsets, params, True, keep_tokens=rule == "coverage")
            hit = np.flatnonzero(index.contains(feats.hashes))
            doc = feats.unit_doc[feats.unit[hit]].astype(np.int64)
            hh = feats.hashes[hit]
            order = np.lexsort((hh, doc))
            doc, hh = doc[order], hh[order]
            fresh = np.r_[True, (doc[1:] != doc[:-1]) | (hh[1:] != hh[:-1])] if len(doc) else np.zeros(0, bool)
            doc, hh = doc[fresh], hh[fresh]
            if rule == "coverage" and len(doc):
                keep = _not_copies(index, doc, hh, params)
                doc, hh = doc[keep], hh[keep]
            if rule == "coverage":  # whole short rows anywhere: common ones are boilerplate too
                sdoc, shash, _ = short_row_matches(feats.tokens, index, params)
                pairs = np.unique(np.stack([np.concatenate([doc, sdoc]).astype(np.uint64),
                                            np.concatenate([hh, shash])]), axis=1)
                doc, hh = pairs[0].astype(np.int64), pairs[1]
            doc = doc + seen + i
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
    table = table.replace_schema_metadata({"head_size": str(head_size), "sample_size": str(sample_size),
                                           "rule": rule})
    storage.write_parquet(table, output_uri)
    return {"head_documents": head_size, "sample_documents": sample_size, "eval_ngrams_seen": int(len(hashes))}


def _not_copies(index: EvalIndex, doc: np.ndarray, hashes: np.ndarray, params: DeconParams) -> np.ndarray:
    """Per distinct (doc, hash) match: True when some eval row of the hash is not copied in the doc.

    A document copies a row when it holds at least ``coverage_share`` of the row's distinct
    n-grams; such matches are evidence, not boilerplate, and are not counted. Field units are
    left out (each field n-gram is also its row's).
    """
    pair, rows = index.expand(hashes)
    whole = index.unit_is_row[rows]
    pair, rows = pair[whole], rows[whole]
    pair_doc = doc[pair]
    n_rows = max(len(index.row_ids), 1)
    key = pair_doc * n_rows + rows
    uniq, inverse, counts = np.unique(key, return_inverse=True, return_counts=True)
    total = np.maximum(np.asarray(index.row_features, dtype=np.int64)[rows], 1)
    copy = counts[inverse] / total >= params.coverage_share
    keep = np.zeros(len(hashes), dtype=bool)
    keep[pair[~copy]] = True
    return keep


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
