"""The eval n-gram index: an exact sorted ``uint64`` array fronted by two bitmaps, with attribution.

False positives come only from 64-bit collisions (about N / 2**64 per lookup); the bitmaps over
disjoint hash bits reject almost every query with one or two memory accesses; an attribution
table maps each hash to the eval units it came from. A unit is a whole eval row or, in the
``coverage`` index, one distinctive field of a row (13-grams in no other row of its set), so that
a copy of only a row's answer or only its question is measured against that field. Building
refuses to run when a mandatory eval set, its exact row count or any matchable feature is
missing: a "clean" pool must never come from a partial eval corpus.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import mmap
import os
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from marin_assets.core.decon import kernels
from marin_assets.core.decon.features import HASH_SCHEME, Features, _batches, extract_features
from marin_assets.core.decon.params import DeconParams, EvalIndexError, EvalRow
from marin_assets.core.decon.text_normalize import normalize_batch
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.kernels import string_buffers

_INDEX_META = "index.json"


def _zeros_on_huge_pages(nbytes: int) -> np.ndarray:
    """A zeroed ``uint8`` array, on transparent huge pages where the kernel allows: every query
    probes the bitmaps at random, and with 4 KiB pages most probes also miss the TLB."""
    if nbytes < 1 << 21 or not hasattr(mmap, "MADV_HUGEPAGE"):
        return np.zeros(nbytes, dtype=np.uint8)
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        region.madvise(mmap.MADV_HUGEPAGE)
    except OSError:  # not supported here: ordinary pages
        pass
    return np.frombuffer(region, dtype=np.uint8)


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
    row_features: np.ndarray | None = None  # int32 [R]: distinct features of each unit (coverage share)
    short_prefix: np.ndarray | None = None  # sorted uint64: hash of the first tokens of each short row
    row_fields: list[str] | None = None  # per unit: "" for a whole row, else the field it holds
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
        self.bitmaps = (self._bitmap(self.hashes, 64 - bits, bits), self._bitmap(self.hashes, 64 - 2 * bits, bits))

    @staticmethod
    def _bitmap(hashes: np.ndarray, shift: int, bits: int) -> np.ndarray:
        """Bit ``(h >> shift) & (2**bits - 1)`` set for every hash (``kernels.set_bits``)."""
        bitmap = _zeros_on_huge_pages(1 << (bits - 3))
        if len(hashes):
            kernels.set_bits(bitmap, kernels.readonly(hashes, np.uint64), shift, (1 << bits) - 1)
        return bitmap

    @functools.cached_property
    def unit_is_row(self) -> np.ndarray:
        """bool [R]: the unit is a whole eval row (not one of its fields)."""
        if self.row_fields is None:
            return np.ones(len(self.row_ids), dtype=bool)
        return np.array([not f for f in self.row_fields], dtype=bool)

    @functools.cached_property
    def short_prefix_set(self) -> "EvalIndex":
        """Membership over the short-row prefix keys, with the same bitmap front as the index."""
        empty = np.zeros(0, np.uint64)
        prefix = np.zeros(0, np.uint64) if self.short_prefix is None else np.asarray(self.short_prefix)
        return EvalIndex(prefix, empty, empty, np.zeros(0, np.int32), [], [], [], {})

    @property
    def size(self) -> int:
        return len(self.hashes)

    @property
    def memory_bytes(self) -> int:
        """Resident bytes of the membership structure (sorted hashes + bitmaps)."""
        return int(self.hashes.nbytes + sum(b.nbytes for b in self.bitmaps) + self.record_hashes.nbytes)

    @functools.cached_property
    def _lookup(self) -> tuple[np.ndarray, np.ndarray, int]:
        """The sorted hashes as the kernel reads them, and the bucket directory over them: the
        start of each bucket of equal top hash bits (about 16 hashes, two cache lines, each)."""
        hashes = kernels.readonly(self.hashes, np.uint64)
        bits = int(min(max(np.ceil(np.log2(max(len(hashes), 1) / 16)), 1), 26))
        bounds = np.arange(1, 1 << bits, dtype=np.uint64) << np.uint64(64 - bits)
        directory = np.empty((1 << bits) + 1, dtype=np.uint32 if len(hashes) < 1 << 32 else np.int64)
        directory[0], directory[-1] = 0, len(hashes)
        directory[1:-1] = np.searchsorted(hashes, bounds)
        return hashes, directory, 64 - bits

    def contains(self, queries: np.ndarray) -> np.ndarray:
        """Exact membership of each ``uint64`` query (one compiled pass, ``kernels.contains``)."""
        if not len(self.hashes) or not len(queries):
            return np.zeros(len(queries), dtype=bool)
        hashes, directory, dir_shift = self._lookup
        return kernels.contains(kernels.readonly(queries, np.uint64), self.bitmaps[0], self.bitmaps[1],
                                64 - self.shift, hashes, directory, dir_shift)

    @functools.cached_property
    def _row_tables(self) -> tuple[np.ndarray, np.ndarray, list[str], list[str]]:
        """Per unit: rank in (set, row id, field) order, set code; set names; "set:row[#field]" labels."""
        set_names = sorted(set(self.row_sets))
        code = {name: c for c, name in enumerate(set_names)}
        set_code = np.array([code[s] for s in self.row_sets], dtype=np.int64)
        rank = np.empty(len(self.row_ids), dtype=np.int64)
        fields = self.row_fields or [""] * len(self.row_ids)
        rank[sorted(range(len(self.row_ids)), key=lambda r: (self.row_sets[r], self.row_ids[r], fields[r]))] = \
            np.arange(len(self.row_ids))
        labels = [f"{s}:{r}#{f}" if f else f"{s}:{r}" for s, r, f in zip(self.row_sets, self.row_ids, fields)]
        return rank, set_code, set_names, labels

    def attribute(self, docs: np.ndarray, hashes: np.ndarray,
                  with_counts: bool = False) -> tuple[np.ndarray, ...]:
        """Distinct (doc, hash) matches -> (doc, row) pairs, each doc's rows ranked by matched features.

        Rows with more matched features come first, ties in (set, row id) order; ``with_counts``
        adds the number of distinct matched features of each pair.
        """
        pair, rows = self.expand(hashes)
        pair_docs = np.asarray(docs, dtype=np.int64)[pair]
        n_rows = max(len(self.row_ids), 1)
        combined, matches = np.unique(pair_docs * n_rows + rows, return_counts=True)
        pair_docs, rows = combined // n_rows, combined % n_rows
        rank = self._row_tables[0]
        order = np.lexsort((rank[rows], -matches, pair_docs))
        if with_counts:
            return pair_docs[order], rows[order], matches[order]
        return pair_docs[order], rows[order]

    def expand(self, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(query position, row) for every eval row each (present) query hash came from."""
        lo = np.searchsorted(self.attribution_hashes, hashes, side="left")
        count = np.searchsorted(self.attribution_hashes, hashes, side="right") - lo
        total = int(count.sum())
        first = np.cumsum(count) - count
        pos = np.arange(total) + np.repeat(lo - first, count)
        rows = np.asarray(self.attribution_rows[pos], dtype=np.int64)
        return np.repeat(np.arange(len(hashes), dtype=np.int64), count), rows

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
    eval_rows: Iterable[EvalRow | tuple[str, str, str]],
    out_dir_uri: str,
    params: DeconParams = DeconParams(),
    expected: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """Build both rules' eval n-gram indexes from ``EvalRow`` (or ``(eval_set, row_id, text)``) rows.

    ``expected`` maps every mandatory set to its exact row count; the build refuses to run, and
    writes nothing, when one is missing, has another row count or yields no matchable feature.
    The ``marin`` index is written at the top (``hashes.npy``, ``record_hashes.npy``,
    ``attribution_*.npy``, ``rows.parquet``, ``index.json``), the ``coverage`` index (features
    of the normalized rows, plus ``short_prefix.npy``; its units are the rows and their
    distinctive fields) under ``coverage/``. The caller writes the manifest. Returns the build's
    counters.
    """
    expected = dict(expected or {})
    sets: list[str] = []
    ids: list[str] = []
    texts: list[str | None] = []
    fields: list[tuple[int, str, str]] = []  # (row, field, text) of rows with several fields
    for row in eval_rows:
        eval_set, row_id, text, *rest = row
        sets.append(str(eval_set))
        ids.append(str(row_id))
        texts.append(text if isinstance(text, str) else None)
        fields.extend((len(sets) - 1, str(f), t) for f, t in (rest[0] if rest else ()) if isinstance(t, str))
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
    data, offsets, nulls = string_buffers(array)
    marin = _row_features(data, offsets, params, normalized=False)
    coverage = _row_features(data, offsets, params, normalized=True)
    for name in sorted(expected):
        for rule, (_, _, per_row, _) in (("marin", marin), ("coverage", coverage)):
            featureless = sum(1 for s, c in zip(sets, per_row.tolist()) if s == name and c == 0)
            if featureless == rows_per_set[name]:
                problems.append(f"mandatory eval set {name!r} yields no matchable feature ({rule} rule: every row "
                                f"is shorter than {params.record_min_tokens} tokens or has no letter)")
    if problems:
        raise EvalIndexError("eval_ngrams: refusing to build the index: " + "; ".join(problems)
                             + ". Check the 'fields' of these sets in the eval registry and rebuild.")

    units = Units(sets, ids, [""] * len(sets), texts)
    stats = _write_index(out_dir_uri, marin, units, expected, params, "marin")
    coverage, units = _with_field_units(coverage, units, fields, params)
    stats["coverage"] = _write_index(storage.join(out_dir_uri, COVERAGE_DIR), coverage, units, expected, params,
                                     "coverage")
    stats["null_text_rows"] = int(nulls.sum())
    storage.write_json(storage.join(out_dir_uri, COVERAGE_DIR, _INDEX_META), stats["coverage"])
    storage.write_json(storage.join(out_dir_uri, _INDEX_META), stats)
    return stats


COVERAGE_DIR = "coverage"


def _row_features(data: np.ndarray, offsets: np.ndarray, params: DeconParams,
                  normalized: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(distinct row, hash) pairs, features per row and the short-row prefix keys of one rule's features."""
    all_hashes, all_rows, prefixes = [], [], []
    for i, j in _batches(offsets, params.batch_bytes):
        chunk, chunk_offsets = data[offsets[i]:offsets[j]], offsets[i:j + 1] - offsets[i]
        if normalized:
            chunk, chunk_offsets = normalize_batch(chunk, chunk_offsets)
        feats = extract_features(chunk, chunk_offsets, params, short_paragraphs=False, keep_tokens=normalized)
        all_hashes.append(feats.hashes)
        all_rows.append((feats.unit_doc[feats.unit] + i).astype(np.int64))
        if normalized and feats.tokens is not None:
            prefixes.append(_short_row_prefixes(feats, params))
    hashes = np.concatenate(all_hashes) if all_hashes else np.zeros(0, np.uint64)
    rows = np.concatenate(all_rows) if all_rows else np.zeros(0, np.int64)
    order = np.lexsort((hashes, rows))
    rows, hashes = rows[order], hashes[order]
    fresh = np.r_[True, (rows[1:] != rows[:-1]) | (hashes[1:] != hashes[:-1])] if len(rows) else np.zeros(0, bool)
    rows, hashes = rows[fresh], hashes[fresh]
    per_row = np.bincount(rows, minlength=len(offsets) - 1)
    prefix = np.unique(np.concatenate(prefixes)) if prefixes else np.zeros(0, np.uint64)
    return rows, hashes, per_row, prefix


def _short_row_prefixes(feats: Features, params: DeconParams) -> np.ndarray:
    """Hash of the first ``short_min_tokens`` tokens of each short row (record feature of enough tokens)."""
    tokens = feats.tokens
    n_docs = feats.n_docs
    counts = np.bincount(tokens.token_doc, minlength=n_docs)
    first = np.searchsorted(tokens.token_doc, np.arange(n_docs))
    short = (counts >= params.short_min_tokens) & (counts < params.ngram_tokens)
    _, prefix = tokens.window_hashes(params.short_min_tokens, first[short])
    return prefix


@dataclasses.dataclass
class Units:
    """The units of one index, whole rows first: eval set, row id, field ("" for a row), text."""

    sets: list[str]
    ids: list[str]
    fields: list[str]
    texts: list[str | None]


def _with_field_units(built: tuple, units: Units, fields: list[tuple[int, str, str]],
                      params: DeconParams) -> tuple[tuple, Units]:
    """The coverage features with each distinctive field of a row added as a unit after the rows.

    A field's features are its 13-grams found in no other row of its eval set (identical rows
    count as one): an instruction shared by the rows of a set, or a field under
    ``field_min_features`` such n-grams, is no unit; the whole row still is. A question that
    two sets share (one benchmark in two task variants) stays a unit of each. These n-grams are
    already the row's, so the membership index is unchanged; only the attribution grows.
    """
    rows, hashes, per_row, prefix = built
    n_rows = len(units.ids)
    if not fields or not len(rows):
        return built, units
    row_key = np.zeros(n_rows, dtype=np.uint64)  # order-free key of a row's feature set
    np.add.at(row_key, rows, hashes)
    row_key ^= per_row.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    set_salt = _set_salts(units.sets)
    in_set = hashes ^ set_salt[rows]  # an n-gram within one eval set
    keys = row_key[rows]
    order = np.lexsort((keys, in_set))
    in_set, keys = in_set[order], keys[order]
    fresh = np.r_[True, (in_set[1:] != in_set[:-1]) | (keys[1:] != keys[:-1])]  # distinct (n-gram, row content)
    ngrams, spread = np.unique(in_set[fresh], return_counts=True)
    own = ngrams[spread == 1]
    data, offsets, _ = string_buffers(pa.array([t for _, _, t in fields], pa.large_string()))
    f_units, f_hashes, f_count, _ = _row_features(data, offsets, params, normalized=True)
    owners = np.array([r for r, _, _ in fields], dtype=np.int64)
    keep = _sorted_member(own, f_hashes ^ set_salt[owners[f_units]])
    f_units, f_hashes = f_units[keep], f_hashes[keep]
    f_count = np.bincount(f_units, minlength=len(fields))
    chosen = np.flatnonzero(f_count >= params.field_min_features)
    number = np.full(len(fields), -1, dtype=np.int64)
    number[chosen] = n_rows + np.arange(len(chosen))
    take = number[f_units] >= 0
    owner = [fields[k][0] for k in chosen.tolist()]
    units = Units(units.sets + [units.sets[r] for r in owner], units.ids + [units.ids[r] for r in owner],
                  units.fields + [fields[k][1] for k in chosen.tolist()],
                  units.texts + [fields[k][2] for k in chosen.tolist()])
    built = (np.concatenate([rows, number[f_units[take]]]), np.concatenate([hashes, f_hashes[take]]),
             np.concatenate([per_row, f_count[chosen]]), prefix)
    return built, units


def _set_salts(sets: list[str]) -> np.ndarray:
    """Per row: a 64-bit value of its eval set (xor-ed into a hash, it keys the n-gram within the set)."""
    names = sorted(set(sets))
    salt = {name: int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little") for name in names}
    return np.array([salt[s] for s in sets], dtype=np.uint64)


def _write_index(out_dir_uri: str, built: tuple, units: Units, expected: Mapping[str, int], params: DeconParams,
                 rule: str) -> dict[str, Any]:
    rows, hashes, features_per_row, prefix = built
    is_row = np.array([not f for f in units.fields], dtype=bool)
    record_hashes = np.unique(hashes[(features_per_row[rows] == 1) & is_row[rows]])
    by_hash = np.argsort(hashes, kind="stable")
    attribution_hashes = hashes[by_hash]
    attribution_rows = rows[by_hash].astype(np.int32)
    unique_hashes = np.unique(attribution_hashes)
    excerpts = [(t or "")[:300] for t in units.texts]
    _save_npy(unique_hashes, storage.join(out_dir_uri, "hashes.npy"))
    _save_npy(record_hashes, storage.join(out_dir_uri, "record_hashes.npy"))
    _save_npy(attribution_hashes, storage.join(out_dir_uri, "attribution_hashes.npy"))
    _save_npy(attribution_rows, storage.join(out_dir_uri, "attribution_rows.npy"))
    _save_npy(prefix, storage.join(out_dir_uri, "short_prefix.npy"))
    storage.write_parquet(pa.table({
        "row": pa.array(np.arange(len(units.sets), dtype=np.int32)),
        "eval_set": pa.array(units.sets, pa.string()),
        "row_id": pa.array(units.ids, pa.string()),
        "field": pa.array(units.fields, pa.string()),
        "features": pa.array(features_per_row.astype(np.int32)),
        "excerpt": pa.array(excerpts, pa.string()),
    }), storage.join(out_dir_uri, "rows.parquet"))
    rows_per_set = Counter(s for s, row in zip(units.sets, is_row) if row)
    features_per_set: Counter = Counter()
    featureless: Counter = Counter()
    field_units: Counter = Counter()
    for s, c, row in zip(units.sets, features_per_row.tolist(), is_row.tolist()):
        features_per_set[s] += c if row else 0
        featureless[s] += row and c == 0
        field_units[s] += not row
    per_set = {
        name: {"rows": rows_per_set[name], "features": int(features_per_set[name]),
               "featureless_rows": int(featureless.get(name, 0)), "field_units": int(field_units.get(name, 0)),
               "mandatory": name in expected}
        for name in sorted(rows_per_set)
    }
    return {
        "rule": rule,
        "hash_scheme": HASH_SCHEME,
        "build_id": uuid.uuid4().hex,
        "ngrams": int(len(unique_hashes)),
        "record_features": int(len(record_hashes)),
        "short_rows": int(len(prefix)),
        "attribution_entries": int(len(attribution_hashes)),
        "rows": int(is_row.sum()),
        "field_units": int((~is_row).sum()),
        "eval_sets": per_set,
        "params": params.rule(),
    }


def load_eval_index(index_uri: str, rule: str = "marin", cache_dir: str = "") -> EvalIndex:
    """Load (and cache per process) one rule's index at ``index_uri``; remote indexes are cached on local
    disk under ``cache_dir`` (empty: the system temp folder)."""
    if rule == "coverage":
        index_uri = storage.join(index_uri, COVERAGE_DIR)
    meta = storage.read_json(storage.join(index_uri, _INDEX_META))
    if meta.get("hash_scheme") != HASH_SCHEME:
        raise EvalIndexError(f"eval index {index_uri!r} uses hash scheme {meta.get('hash_scheme')!r}, this code "
                             f"uses {HASH_SCHEME!r}; rebuild eval_ngrams")
    return _load_index_cached(index_uri, meta["build_id"], cache_dir)


@functools.lru_cache(maxsize=2)
def _load_index_cached(index_uri: str, build_id: str, cache_dir: str = "") -> EvalIndex:
    local = _local_copy(index_uri, build_id, cache_dir)
    rows = storage.read_parquet(storage.join(local, "rows.parquet"),
                                columns=["eval_set", "row_id", "field", "excerpt", "features"])
    rows_features = rows.column("features").to_numpy().astype(np.int64)
    return EvalIndex(
        hashes=np.ascontiguousarray(_load_npy(storage.join(local, "hashes.npy"))),
        record_hashes=np.asarray(_load_npy(storage.join(local, "record_hashes.npy"))),
        attribution_hashes=np.asarray(_load_npy(storage.join(local, "attribution_hashes.npy"))),
        attribution_rows=np.asarray(_load_npy(storage.join(local, "attribution_rows.npy"))),
        row_sets=rows.column("eval_set").to_pylist(),
        row_ids=rows.column("row_id").to_pylist(),
        row_excerpts=rows.column("excerpt").to_pylist(),
        meta=storage.read_json(storage.join(local, _INDEX_META)),
        row_features=rows_features,
        short_prefix=np.asarray(_load_npy(storage.join(local, "short_prefix.npy"))),
        row_fields=rows.column("field").to_pylist(),
    )


def _local_copy(index_uri: str, build_id: str, cache_dir: str = "") -> str:
    """Local indexes are used in place; remote ones are copied once into a local cache directory."""
    if "://" not in index_uri or index_uri.startswith("file://"):
        return index_uri
    cache = os.path.join(cache_dir or tempfile.gettempdir(), "marin-eval-index", build_id)
    if not os.path.exists(os.path.join(cache, _INDEX_META)):
        os.makedirs(cache, exist_ok=True)
        for name in ("hashes.npy", "record_hashes.npy", "attribution_hashes.npy", "attribution_rows.npy",
                     "short_prefix.npy", "rows.parquet", _INDEX_META):  # index.json last: it marks the copy complete
            storage.write_bytes(os.path.join(cache, name), storage.read_bytes(storage.join(index_uri, name)))
    return cache

