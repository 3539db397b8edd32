"""Global deduplication across all sources: exact (same ``id``) and fuzzy (MinHash candidates
verified by word 3-gram containment).

Both steps read every source and write *sparse* decisions, one Parquet file per source at
``<out_dir>/<source>/removed.parquet`` (an empty file when a source loses nothing), sorted by
``id`` and written deterministically, so a source's file changes only when that source's
decisions do. :func:`removed_ids_digest` gives the content hash of a source's removed ids.

Memory is bounded by the decisions, not by the corpus: the exact step holds only ``id``
columns, partitioned on disk by id hash above ``ids_per_partition``; the fuzzy step shards the
bucket table on disk by bucket hash, keeps only candidate edges, runs connected components
over the nodes that have an edge, then reads the text of cluster members only, shard by shard,
and verifies clusters partition by partition.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import math
import os
import tempfile
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import xxhash

from marin_assets.core.errors import BadInput
from marin_assets.core import storage
from marin_assets.core.minhash import ngram_spans, xxh3_64_spans

REMOVED_FILE = "removed.parquet"


class DedupError(BadInput, RuntimeError):
    """A dedup input is missing or inconsistent; the message names the source, file and fix."""


# --------------------------------------------------------------------------- shared helpers


def removed_uri(out_dir_uri: str, source: str) -> str:
    return storage.join(out_dir_uri, source, REMOVED_FILE)


def removed_ids_digest(ids: Iterable[str]) -> str:
    """sha256 of the sorted removed ids: the per-source fingerprint of a dedup decision."""
    digest = hashlib.sha256()
    for value in sorted(ids):
        digest.update(value.encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()[:16]


def removal_ratios(removed: Mapping[str, int], docs: Mapping[str, int]) -> dict[str, float]:
    """Fraction of each source's documents a dedup step removes (0.0 for an empty source)."""
    return {source: (removed.get(source, 0) / n if n else 0.0) for source, n in sorted(docs.items())}


def sources_over_removal_limit(ratios: Mapping[str, float], limit: float = 0.5) -> dict[str, float]:
    """The sources that would lose more than ``limit`` of their documents (a check warns on them)."""
    return {source: ratio for source, ratio in sorted(ratios.items()) if ratio > limit}


def _shard_lists(sources: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """Sources in name order, each with its shards in basename order."""
    return {source: sorted(sources[source], key=storage.basename) for source in sorted(sources)}


def _write_removed(out_dir_uri: str, source: str, table: pa.Table) -> None:
    storage.write_parquet(table, removed_uri(out_dir_uri, source))


def _read_ids(source: str, uri: str) -> pa.Array:
    try:
        table = storage.read_parquet(uri, columns=["id"])
    except (KeyError, ValueError, pa.ArrowInvalid) as exc:
        raise DedupError(
            f"source {source!r}: cannot read column 'id' from {uri} ({exc}); rematerialize the "
            f"normalized partition {source!r}"
        ) from exc
    return table.column("id").combine_chunks().cast(pa.string())


# --------------------------------------------------------------------------- exact duplicates


@dataclasses.dataclass(frozen=True)
class ExactDedupParams:
    """Which copy of an id survives: the copy in the first source of ``source_priority`` that
    has it, else in the first source in name order (then shard, then row, which only matters
    inside one source, where normalize already kept the first copy of each id).
    """

    source_priority: tuple[str, ...] = ()


def keep_order(sources: Iterable[str], params: ExactDedupParams = ExactDedupParams()) -> list[str]:
    """Sources from most to least preferred keeper under ``params``."""
    names = sorted(set(sources))
    first = [s for s in dict.fromkeys(params.source_priority) if s in names]
    return first + [s for s in names if s not in first]


_EXACT_SCHEMA = pa.schema([("id", pa.string()), ("kept_source", pa.string())])


def find_exact_duplicates(
    sources: Mapping[str, Sequence[str]],
    out_dir_uri: str,
    params: ExactDedupParams = ExactDedupParams(),
    *,
    ids_per_partition: int = 8_000_000,
    work_dir: str | None = None,
) -> dict[str, Any]:
    """Ids present in several sources: every source but the keeper lists the id as removed.

    Writes ``<out_dir>/<source>/removed.parquet`` (``id``, ``kept_source``) for every source.
    Reads only the ``id`` column; above ``ids_per_partition`` ids in total, the (id, source)
    pairs are spilled to local disk in id-hash partitions processed one at a time.
    """
    shards = _shard_lists(sources)
    order = keep_order(shards, params)
    rank = {source: i for i, source in enumerate(order)}
    total = sum(storage.parquet_num_rows(uri) for uris in shards.values() for uri in uris)
    partitions = max(1, min(1024, math.ceil(total / max(1, ids_per_partition))))

    removed_frames: list[pl.DataFrame] = []
    counters = {"docs": 0, "unique_ids": 0, "within_source_repeats": 0, "ids_in_several_sources": 0}

    def decide(frame: pl.DataFrame) -> None:
        pairs = frame.unique(["id", "rank"])
        counters["within_source_repeats"] += frame.height - pairs.height
        keeper = pairs.group_by("id").agg(pl.col("rank").min().alias("kept_rank"), pl.len().alias("copies"))
        counters["unique_ids"] += keeper.height
        counters["ids_in_several_sources"] += int((keeper["copies"] > 1).sum())
        dropped = pairs.join(keeper, on="id").filter(pl.col("rank") != pl.col("kept_rank"))
        if dropped.height:
            removed_frames.append(dropped.select("rank", "id", "kept_rank"))

    def id_frames() -> Iterable[pl.DataFrame]:
        for source, uris in shards.items():
            for uri in uris:
                ids = _read_ids(source, uri)
                counters["docs"] += len(ids)
                yield pl.DataFrame({"id": pl.from_arrow(ids), "rank": np.full(len(ids), rank[source], np.uint32)})

    if partitions == 1:
        frames = list(id_frames())
        decide(pl.concat(frames) if frames else pl.DataFrame(schema={"id": pl.Utf8, "rank": pl.UInt32}))
    else:
        with tempfile.TemporaryDirectory(prefix="exact-dedup-", dir=work_dir) as tmp:
            spill = _Spill(tmp, partitions)
            for frame in id_frames():
                part = (frame["id"].hash(seed=0) % partitions).to_numpy()
                spill.write(frame.to_arrow(), part)
            spill.close()
            for table in spill.read_all():
                decide(pl.from_arrow(table))

    removed = pl.concat(removed_frames) if removed_frames else pl.DataFrame(schema={"rank": pl.UInt32, "id": pl.Utf8, "kept_rank": pl.UInt32})
    per_source: dict[str, int] = {}
    digests: dict[str, str] = {}
    pair_counts: dict[str, int] = {}
    for source in shards:
        mine = removed.filter(pl.col("rank") == rank[source]).sort("id")
        kept = [order[r] for r in mine["kept_rank"].to_list()]
        ids = mine["id"].to_list()
        _write_removed(out_dir_uri, source, pa.table({"id": pa.array(ids, pa.string()), "kept_source": pa.array(kept, pa.string())}, schema=_EXACT_SCHEMA))
        per_source[source] = len(ids)
        digests[source] = removed_ids_digest(ids)
        for keeper_source in kept:
            key = f"{source} <- {keeper_source}"
            pair_counts[key] = pair_counts.get(key, 0) + 1
    top_pairs = dict(sorted(pair_counts.items(), key=lambda kv: (-kv[1], kv[0]))[:10])
    return {
        **counters,
        "removed": sum(per_source.values()),
        "removed_per_source": per_source,
        "removed_ids_digest": digests,
        "top_source_pairs": top_pairs,
        "keep_order": order,
        "partitions": partitions,
    }


class _Spill:
    """Arrow IPC files, one per hash partition, in a local scratch directory."""

    def __init__(self, directory: str, partitions: int) -> None:
        self.paths = [os.path.join(directory, f"part-{i:05d}.arrows") for i in range(partitions)]
        self.writers: list[ipc.RecordBatchStreamWriter | None] = [None] * partitions
        self.sinks: list[Any] = [None] * partitions

    def write(self, table: pa.Table, part: np.ndarray) -> None:
        order = np.argsort(part, kind="stable")
        bounds = np.searchsorted(part[order], np.arange(len(self.paths) + 1))
        for p in np.flatnonzero(np.diff(bounds)):
            piece = table.take(pa.array(order[bounds[p] : bounds[p + 1]]))
            if self.writers[p] is None:
                self.sinks[p] = pa.OSFile(self.paths[p], "wb")
                self.writers[p] = ipc.new_stream(self.sinks[p], piece.schema)
            self.writers[p].write_table(piece)

    def close(self) -> None:
        for writer, sink in zip(self.writers, self.sinks):
            if writer is not None:
                writer.close()
                sink.close()

    def read(self, p: int) -> pa.Table | None:
        if self.writers[p] is None:
            return None
        with pa.memory_map(self.paths[p], "r") as source:
            return ipc.open_stream(source).read_all()

    def read_all(self) -> Iterable[pa.Table]:
        for p in range(len(self.paths)):
            table = self.read(p)
            if table is not None:
                yield table
                os.remove(self.paths[p])


# --------------------------------------------------------------------------- fuzzy duplicates


@dataclasses.dataclass(frozen=True)
class FuzzyDedupParams:
    """Verification of MinHash candidate clusters (rule: word 3-gram containment >= 0.75).

    Members are processed longest first; a member is removed when an already-retained member
    at least as long contains ``containment_threshold`` of its distinct word ``ngram_size``-grams
    (case-folded, whitespace tokens, xxh3-64). Clusters of up to ``exact_scan_max_members``
    compare each member with every retained one; larger clusters probe an inverted index with
    the member's ``probe_ngrams`` rarest n-grams (skipping n-grams in more than
    ``max_posting_docs`` members) and compare with at most ``max_candidates`` retained members.
    Text beyond ``max_chars_per_doc`` characters is not compared.
    """

    containment_threshold: float = 0.75
    ngram_size: int = 3
    exact_scan_max_members: int = 256
    probe_ngrams: int = 32
    max_posting_docs: int = 512
    max_candidates: int = 32
    max_chars_per_doc: int = 8 * 2**20


VERIFY_BATCH_CHARS = 1 << 20  # ~15 bytes of n-gram arrays per character while hashed

_FUZZY_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("cluster_id", pa.string()),
        ("representative_id", pa.string()),
        ("representative_source", pa.string()),
        ("containment", pa.float64()),
        ("jaccard", pa.float64()),
    ]
)


def ngram_sets(texts: Sequence[str], n: int = 3, max_chars: int = 8 * 2**20) -> list[np.ndarray]:
    """Distinct word n-gram hashes per text (sorted uint64): case-folded, whitespace tokens,
    xxh3-64 of the n tokens joined by one space; a text of fewer than n tokens is one n-gram."""
    cleaned = [" ".join(t[:max_chars].casefold().split()) for t in texts]
    joined = "\n".join(cleaned).encode("utf-8")
    starts, lengths, counts = ngram_spans(joined, len(cleaned), n)
    hashes = xxh3_64_spans(joined, starts, lengths)
    doc = np.repeat(np.arange(len(cleaned)), counts)
    order = np.lexsort((hashes, doc))
    hashes, doc = hashes[order], doc[order]
    keep = np.ones(hashes.size, bool)
    keep[1:] = (hashes[1:] != hashes[:-1]) | (doc[1:] != doc[:-1])
    hashes, doc = hashes[keep], doc[keep]
    bounds = np.searchsorted(doc, np.arange(len(cleaned) + 1))
    return [hashes[bounds[i] : bounds[i + 1]] for i in range(len(cleaned))]


@dataclasses.dataclass(frozen=True)
class Removal:
    """A verified duplicate: member ``index`` is contained in retained member ``representative``."""

    index: int
    representative: int
    containment: float
    jaccard: float


@dataclasses.dataclass
class ClusterVerdict:
    """What verification decided for one cluster."""

    removals: list[Removal]
    exempt_kept: int = 0  # exempt members that met the threshold and were kept anyway
    comparisons: int = 0  # containment computations


def verify_cluster(
    lengths: Sequence[int],
    grams: Sequence[np.ndarray],
    exempt: Sequence[bool],
    params: FuzzyDedupParams = FuzzyDedupParams(),
) -> ClusterVerdict:
    """Decide one candidate cluster whose members are already in processing order (longest
    first). Removed members never act as representatives; exempt members are never removed."""
    size = len(grams)
    if size > params.exact_scan_max_members:
        return _verify_indexed(lengths, grams, exempt, params)
    sets: list[set[int] | None] = [None] * size
    retained: list[int] = []
    verdict = ClusterVerdict([])
    for i in range(size):
        verdict.comparisons += len(retained)
        best = _best_representative(i, retained, lengths, grams, sets)
        if _decide(i, best, exempt, params, verdict):
            retained.append(i)
    return verdict


def _decide(i: int, best: tuple[int, float, float] | None, exempt: Sequence[bool], params: FuzzyDedupParams, verdict: ClusterVerdict) -> bool:
    """Record member ``i``'s fate; True when it is retained."""
    if best is None or best[1] < params.containment_threshold:
        return True
    if exempt[i]:
        verdict.exempt_kept += 1
        return True
    verdict.removals.append(Removal(i, best[0], best[1], best[2]))
    return False


def _as_set(i: int, grams: Sequence[np.ndarray], sets: list[set[int] | None]) -> set[int]:
    cached = sets[i]
    if cached is None:
        cached = sets[i] = set(grams[i].tolist())
    return cached


def _best_representative(
    i: int, candidates: Iterable[int], lengths: Sequence[int], grams: Sequence[np.ndarray], sets: list[set[int] | None]
) -> tuple[int, float, float] | None:
    """(representative, containment, jaccard) maximising containment; ties: earliest candidate."""
    own = len(grams[i])
    if own == 0:
        return None
    mine = _as_set(i, grams, sets)
    best: tuple[int, float, float] | None = None
    for r in candidates:
        if lengths[r] < lengths[i]:
            continue
        other = _as_set(r, grams, sets)
        shared = len(mine & other) if len(mine) <= len(other) else len(other & mine)
        containment = shared / own
        if best is None or containment > best[1]:
            best = (r, containment, shared / (own + len(other) - shared))
    return best


def _verify_indexed(
    lengths: Sequence[int], grams: Sequence[np.ndarray], exempt: Sequence[bool], params: FuzzyDedupParams
) -> list[Removal]:
    size = len(grams)
    # Static inverted index over all members: n-gram -> members containing it (CSR).
    member_of = np.repeat(np.arange(size), [g.size for g in grams])
    flat = np.concatenate(grams) if size else np.zeros(0, np.uint64)
    order = np.lexsort((member_of, flat))
    flat, member_of = flat[order], member_of[order]
    vocab, first, df = np.unique(flat, return_index=True, return_counts=True)
    retained_flag = np.zeros(size, bool)
    retained_rank = np.full(size, size, np.int64)  # position in retained order
    sets: list[set[int] | None] = [None] * size
    verdict = ClusterVerdict([])
    n_retained = 0
    for i in range(size):
        g = grams[i]
        candidates: list[int] = []
        if g.size and n_retained:
            pos = np.searchsorted(vocab, g)
            rarest = pos[np.argsort(df[pos], kind="stable")[: params.probe_ngrams]]
            rarest = rarest[df[rarest] <= params.max_posting_docs]
            if rarest.size:
                postings = np.concatenate([member_of[first[p] : first[p] + df[p]] for p in rarest.tolist()])
                postings = postings[retained_flag[postings]]
                if postings.size:
                    docs, hits = np.unique(postings, return_counts=True)
                    ranked = np.lexsort((retained_rank[docs], -hits))[: params.max_candidates]
                    candidates = docs[ranked][np.argsort(retained_rank[docs[ranked]], kind="stable")].tolist()
        verdict.comparisons += len(candidates)
        best = _best_representative(i, candidates, lengths, grams, sets) if candidates else None
        if _decide(i, best, exempt, params, verdict):
            retained_flag[i] = True
            retained_rank[i] = n_retained
            n_retained += 1
        else:
            sets[i] = None  # removed members are never compared again
    return verdict


def _size_bin(size: int) -> str:
    if size <= 2:
        return "2"
    upper = 1 << (size - 1).bit_length()
    return f"{upper // 2 + 1}-{upper}"


@dataclasses.dataclass
class _ShardRef:
    source: str
    rank: int
    buckets_uri: str
    normalized_uri: str
    base: int
    rows: int


def _pair_shards(buckets: Mapping[str, Sequence[str]], normalized: Mapping[str, Sequence[str]]) -> list[_ShardRef]:
    if set(buckets) != set(normalized):
        missing = sorted(set(buckets) ^ set(normalized))
        raise DedupError(
            f"sources {missing} have minhash buckets or normalized shards but not both; "
            "materialize minhash_buckets for every normalized source (or drop the source from both)"
        )
    refs: list[_ShardRef] = []
    base = 0
    for rank, source in enumerate(sorted(buckets)):
        bucket_shards = {storage.basename(u): u for u in buckets[source]}
        text_shards = {storage.basename(u): u for u in normalized[source]}
        if set(bucket_shards) != set(text_shards):
            odd = sorted(set(bucket_shards) ^ set(text_shards))
            raise DedupError(
                f"source {source!r}: minhash_buckets and normalized are not co-partitioned (shards {odd} "
                f"are on one side only); rematerialize minhash_buckets for {source!r}"
            )
        for name in sorted(bucket_shards):
            rows = storage.parquet_num_rows(bucket_shards[name])
            refs.append(_ShardRef(source, rank, bucket_shards[name], text_shards[name], base, rows))
            base += rows
    return refs


_BUCKET_RECORD = np.dtype([("bucket", "<u8"), ("node", "<i8"), ("band", "<u2")])


def _bucket_records(ref: _ShardRef, expected_bands: list[int]) -> np.ndarray:
    """(bucket, node, band) for every bucket of one shard."""
    column = storage.read_parquet(ref.buckets_uri, columns=["buckets"]).column("buckets").combine_chunks()
    if column.null_count:
        column = pc.fill_null(column, pa.scalar([], column.type))
    lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False).astype(np.int64)
    values = pc.list_flatten(column).to_numpy(zero_copy_only=False).astype(np.uint64, copy=False)
    if lengths.size and np.any(lengths):
        bands = np.unique(lengths[lengths > 0])
        if not expected_bands:
            expected_bands.append(int(bands[0]))
        if bands.size != 1 or int(bands[0]) != expected_bands[0]:
            raise DedupError(
                f"source {ref.source!r}: {ref.buckets_uri} has {sorted(bands.tolist())} buckets per document, other "
                f"shards have {expected_bands[0]}; rematerialize minhash_buckets of every source with the same MinHashParams"
            )
    records = np.empty(values.size, _BUCKET_RECORD)
    records["bucket"] = values
    rows = np.repeat(np.arange(lengths.size, dtype=np.int64), lengths)
    records["node"] = ref.base + rows
    starts = np.zeros(lengths.size, np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    records["band"] = np.arange(values.size, dtype=np.int64) - starts[rows]
    return records


def _edges_from_records(records: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Star edges (first member, other member) of every bucket shared by several documents."""
    if records.size < 2:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), int(records.size > 0)
    order = np.lexsort((records["node"], records["band"], records["bucket"]))
    rec = records[order]
    new = np.ones(rec.size, bool)
    new[1:] = (rec["bucket"][1:] != rec["bucket"][:-1]) | (rec["band"][1:] != rec["band"][:-1])
    head = np.maximum.accumulate(np.where(new, np.arange(rec.size), 0))
    member = ~new
    starts = np.flatnonzero(new)
    largest = int(np.diff(np.append(starts, rec.size)).max())
    return rec["node"][head[member]], rec["node"][member], largest


def _unique_edges(u: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if u.size == 0:
        return u, v
    lo, hi = np.minimum(u, v), np.maximum(u, v)
    order = np.lexsort((hi, lo))
    lo, hi = lo[order], hi[order]
    keep = np.ones(lo.size, bool)
    keep[1:] = (lo[1:] != lo[:-1]) | (hi[1:] != hi[:-1])
    return lo[keep], hi[keep]


def _candidate_edges(refs: list[_ShardRef], entries_per_partition: int, work_dir: str | None) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """All candidate edges, the bucket table sharded by bucket hash on local disk when large."""
    total_docs = sum(r.rows for r in refs)
    partitions = max(1, min(512, math.ceil(total_docs * 26 / max(1, entries_per_partition))))
    expected: list[int] = []
    us: list[np.ndarray] = []
    vs: list[np.ndarray] = []
    largest = 0
    if partitions == 1:
        records = [_bucket_records(r, expected) for r in refs]
        u, v, largest = _edges_from_records(np.concatenate(records) if records else np.zeros(0, _BUCKET_RECORD))
        us, vs = [u], [v]
    else:
        with tempfile.TemporaryDirectory(prefix="fuzzy-buckets-", dir=work_dir) as tmp:
            paths = [os.path.join(tmp, f"part-{p:05d}.bin") for p in range(partitions)]
            handles = [open(path, "wb") for path in paths]  # noqa: SIM115 (closed below)
            try:
                for ref in refs:
                    records = _bucket_records(ref, expected)
                    part = (records["bucket"] % np.uint64(partitions)).astype(np.int64)
                    order = np.argsort(part, kind="stable")
                    bounds = np.searchsorted(part[order], np.arange(partitions + 1))
                    for p in np.flatnonzero(np.diff(bounds)):
                        records[order[bounds[p] : bounds[p + 1]]].tofile(handles[p])
            finally:
                for handle in handles:
                    handle.close()
            for path in paths:
                u, v, big = _edges_from_records(np.fromfile(path, dtype=_BUCKET_RECORD))
                os.remove(path)
                u, v = _unique_edges(u, v)
                us.append(u)
                vs.append(v)
                largest = max(largest, big)
    u, v = _unique_edges(np.concatenate(us), np.concatenate(vs))
    return u, v, {"bucket_partitions": partitions, "candidate_edges": int(u.size), "largest_bucket": largest, "bands": expected[0] if expected else 0}


def _components(u: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(nodes, component label) over the nodes that have at least one edge."""
    from scipy.sparse import coo_matrix  # noqa: PLC0415
    from scipy.sparse.csgraph import connected_components  # noqa: PLC0415

    nodes = np.unique(np.concatenate([u, v]))
    if nodes.size == 0:
        return nodes, np.zeros(0, np.int64)
    graph = coo_matrix((np.ones(u.size, np.int8), (np.searchsorted(nodes, u), np.searchsorted(nodes, v))), shape=(nodes.size, nodes.size))
    _, labels = connected_components(graph.tocsr(), directed=False)
    return nodes, labels.astype(np.int64)


_MEMBER_SCHEMA = pa.schema(
    [("label", pa.int64()), ("rank", pa.int32()), ("id", pa.string()), ("length", pa.int64()), ("text", pa.large_string())]
)


def _gather_members(
    refs: list[_ShardRef], nodes: np.ndarray, labels: np.ndarray, partitions: int, spill: _Spill | None, params: FuzzyDedupParams
) -> list[pa.Table]:
    """Read the id and text of every cluster member, shard by shard, into cluster partitions."""
    kept: list[pa.Table] = []
    bases = np.array([r.base for r in refs], np.int64)
    shard_of = np.searchsorted(bases, nodes, side="right") - 1
    bounds = np.searchsorted(shard_of, np.arange(len(refs) + 1))
    for s in np.flatnonzero(np.diff(bounds)):
        ref = refs[s]
        rows = nodes[bounds[s] : bounds[s + 1]] - ref.base
        table = storage.read_parquet(ref.normalized_uri, columns=["id", "text"])
        if table.num_rows != ref.rows:
            raise DedupError(
                f"source {ref.source!r}: {ref.normalized_uri} has {table.num_rows} rows but its minhash buckets "
                f"{ref.buckets_uri} have {ref.rows}; rematerialize minhash_buckets for {ref.source!r}"
            )
        take = pa.array(rows)
        ids = table.column("id").take(take).combine_chunks().cast(pa.string())
        bucket_ids = storage.read_parquet(ref.buckets_uri, columns=["id"]).column("id").take(take).combine_chunks().cast(pa.string())
        if not ids.equals(bucket_ids):
            raise DedupError(
                f"source {ref.source!r}: row order of {ref.buckets_uri} differs from {ref.normalized_uri}; "
                f"rematerialize minhash_buckets for {ref.source!r}"
            )
        texts = pc.fill_null(table.column("text").take(take).combine_chunks().cast(pa.large_string()), "")
        lengths = pc.utf8_length(texts).cast(pa.int64())
        texts = pc.utf8_slice_codeunits(texts, 0, params.max_chars_per_doc)
        piece = pa.table(
            [pa.array(labels[bounds[s] : bounds[s + 1]]), pa.array(np.full(rows.size, ref.rank, np.int32)), ids, lengths, texts],
            schema=_MEMBER_SCHEMA,
        )
        if spill is None:
            kept.append(piece)
        else:
            spill.write(piece, (labels[bounds[s] : bounds[s + 1]] % partitions).astype(np.int64))
    return kept


def find_fuzzy_duplicates(
    buckets: Mapping[str, Sequence[str]],
    normalized: Mapping[str, Sequence[str]],
    exempt: Collection[str],
    out_dir_uri: str,
    params: FuzzyDedupParams = FuzzyDedupParams(),
    *,
    bucket_entries_per_partition: int = 8_000_000,
    member_chars_per_partition: int = 256 * 2**20,
    num_examples: int = 5,
    excerpt_chars: int = 240,
    work_dir: str | None = None,
) -> dict[str, Any]:
    """Candidate clusters from shared buckets, verified; writes one removal list per source.

    Nodes are (source, id): equal ids in different sources stay separate documents. A cluster
    is processed longest first, ties by source name then id (independent of sharding); its
    ``cluster_id`` is the id of that first, longest member, which is always kept. Removed rows:
    ``id``, ``cluster_id``, ``representative_id``, ``representative_source``, ``containment``
    (of the removed document's n-grams in the representative) and ``jaccard``.
    """
    refs = _pair_shards(buckets, normalized)
    sources = sorted(buckets)
    exempt_set = set(exempt)
    docs_per_source = {s: 0 for s in sources}
    for ref in refs:
        docs_per_source[ref.source] += ref.rows

    u, v, edge_stats = _candidate_edges(refs, bucket_entries_per_partition, work_dir)
    nodes, labels = _components(u, v)
    del u, v
    histogram: dict[str, int] = {}
    cluster_sizes = np.bincount(labels) if labels.size else np.zeros(0, np.int64)
    for size in cluster_sizes.tolist():
        key = _size_bin(size)
        histogram[key] = histogram.get(key, 0) + 1
    histogram = dict(sorted(histogram.items(), key=lambda kv: int(kv[0].split("-")[0])))

    verification = _Verification(sources, exempt_set, params, num_examples, excerpt_chars)
    partitions = 0
    if nodes.size:
        # Members' text is read shard by shard and routed to cluster partitions; their count
        # comes from the text bytes per row in the shards' Parquet metadata.
        estimate = _estimate_member_chars(refs, nodes)
        partitions = max(1, min(1024, math.ceil(estimate / max(1, member_chars_per_partition))))
        if partitions == 1:
            verification.partition(pa.concat_tables(_gather_members(refs, nodes, labels, 1, None, params)))
        else:
            with tempfile.TemporaryDirectory(prefix="fuzzy-members-", dir=work_dir) as tmp:
                spill = _Spill(tmp, partitions)
                _gather_members(refs, nodes, labels, partitions, spill, params)
                spill.close()
                for table in spill.read_all():
                    verification.partition(table)
    results, counters = verification.results, verification.counters

    removed_per_source: dict[str, int] = {}
    digests: dict[str, str] = {}
    for source in sources:
        rows = sorted(results[source])
        removed_per_source[source] = len(rows)
        digests[source] = removed_ids_digest(r[0] for r in rows)
        columns = list(zip(*rows)) if rows else [[] for _ in _FUZZY_SCHEMA]
        table = pa.table([pa.array(col, type=f.type) for col, f in zip(columns, _FUZZY_SCHEMA)], schema=_FUZZY_SCHEMA)
        _write_removed(out_dir_uri, source, table)
    return {
        "docs": sum(docs_per_source.values()),
        **edge_stats,
        "clusters": int(cluster_sizes.size),
        "docs_in_clusters": int(nodes.size),
        "largest_cluster": int(cluster_sizes.max()) if cluster_sizes.size else 0,
        "cluster_size_histogram": histogram,
        "verify_partitions": partitions,
        **counters,
        "removed": sum(removed_per_source.values()),
        "removed_per_source": removed_per_source,
        "removal_ratio_per_source": removal_ratios(removed_per_source, docs_per_source),
        "removed_ids_digest": digests,
        "exempt_sources": sorted(exempt_set & set(sources)),
        "examples": verification.examples(),
    }


class _Verification:
    """Verifies the clusters of one partition after another and collects the removals."""

    def __init__(self, sources: list[str], exempt: set[str], params: FuzzyDedupParams, num_examples: int, excerpt_chars: int) -> None:
        self.sources, self.exempt, self.params = sources, exempt, params
        self.num_examples, self.excerpt_chars = num_examples, excerpt_chars
        self.results: dict[str, list[tuple[str, str, str, str, float, float]]] = {s: [] for s in sources}
        self.counters = {"exact_scan_clusters": 0, "indexed_clusters": 0, "exempt_kept": 0, "verified_members": 0, "comparisons": 0}
        self._examples: list[tuple[int, dict[str, Any]]] = []  # heap on -key: keeps the smallest keys

    def partition(self, table: pa.Table) -> None:
        """All clusters of a members table (``label``, ``rank``, ``id``, ``length``, ``text``)."""
        table = table.sort_by([("label", "ascending"), ("length", "descending"), ("rank", "ascending"), ("id", "ascending")])
        labels = table.column("label").to_numpy()
        if labels.size == 0:
            return
        starts = np.flatnonzero(np.r_[True, labels[1:] != labels[:-1]])
        ends = np.append(starts[1:], labels.size)
        ranks = table.column("rank").to_numpy()
        ids = table.column("id").to_pylist()
        lengths = table.column("length").to_numpy()
        capped = lengths.clip(max=self.params.max_chars_per_doc)
        c = 0
        while c < starts.size:  # runs of clusters of about VERIFY_BATCH_CHARS share one n-gram pass
            c_end, chars = c + 1, int(capped[starts[c] : ends[c]].sum())
            while c_end < starts.size and chars < VERIFY_BATCH_CHARS:
                chars += int(capped[starts[c_end] : ends[c_end]].sum())
                c_end += 1
            lo, hi = int(starts[c]), int(ends[c_end - 1])
            texts = table.column("text").slice(lo, hi - lo).to_pylist()
            grams = ngram_sets(texts, self.params.ngram_size, self.params.max_chars_per_doc)
            for k in range(c, c_end):
                a, b = int(starts[k]) - lo, int(ends[k]) - lo
                self._cluster(ranks[lo + a : lo + b].tolist(), ids[lo + a : lo + b], lengths[lo + a : lo + b].tolist(), grams[a:b], texts[a:b])
            c = c_end

    def _cluster(self, ranks: list[int], ids: list[str], lengths: list[int], grams: list[np.ndarray], texts: list[str]) -> None:
        is_exempt = [self.sources[r] in self.exempt for r in ranks]
        size = len(ids)
        self.counters["indexed_clusters" if size > self.params.exact_scan_max_members else "exact_scan_clusters"] += 1
        self.counters["verified_members"] += size
        verdict = verify_cluster(lengths, grams, is_exempt, self.params)
        self.counters["exempt_kept"] += verdict.exempt_kept
        self.counters["comparisons"] += verdict.comparisons
        for r in verdict.removals:
            source, rep_source = self.sources[ranks[r.index]], self.sources[ranks[r.representative]]
            self.results[source].append((ids[r.index], ids[0], ids[r.representative], rep_source, r.containment, r.jaccard))
            self._offer_example(
                {
                    "source": source,
                    "id": ids[r.index],
                    "representative_source": rep_source,
                    "representative_id": ids[r.representative],
                    "containment": round(r.containment, 4),
                    "jaccard": round(r.jaccard, 4),
                    "excerpt": texts[r.index][: self.excerpt_chars],
                    "representative_excerpt": texts[r.representative][: self.excerpt_chars],
                }
            )

    def _offer_example(self, entry: dict[str, Any]) -> None:
        """Keep the removals with the smallest hash of (source, id): a stable sample."""
        if not self.num_examples:
            return
        key = xxhash.xxh3_64_intdigest(f"{entry['source']}\x00{entry['id']}".encode())
        if len(self._examples) < self.num_examples:
            heapq.heappush(self._examples, (-key, entry))
        elif -self._examples[0][0] > key:
            heapq.heapreplace(self._examples, (-key, entry))

    def examples(self) -> list[dict[str, Any]]:
        return [entry for _, entry in sorted(self._examples, key=lambda kv: -kv[0])]


def _estimate_member_chars(refs: list[_ShardRef], nodes: np.ndarray) -> int:
    """Members' text size from each shard's uncompressed ``text`` bytes per row (metadata only)."""
    bases = np.array([r.base for r in refs], np.int64)
    per_shard = np.bincount(np.searchsorted(bases, nodes, side="right") - 1, minlength=len(refs))
    total = 0
    for ref, members in zip(refs, per_shard.tolist()):
        if members and ref.rows:
            total += members * _text_bytes(ref.normalized_uri) // ref.rows
    return total


def _text_bytes(uri: str) -> int:
    import pyarrow.parquet as pq  # noqa: PLC0415

    fs, path = storage.filesystem(uri)
    with fs.open(path, "rb") as handle:
        meta = pq.ParquetFile(handle).metadata
    total = 0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            column = group.column(c)
            if column.path_in_schema == "text":
                total += column.total_uncompressed_size
    return total
