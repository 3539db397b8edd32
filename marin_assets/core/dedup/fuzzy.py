"""Global fuzzy dedup as a chain of shuffles; every step is a list of per-partition tasks.

Nodes are documents, ``node = slot << 40 | row``: ``slot`` is a number per source kept from
run to run and ``row`` the document's row within its source (shards in basename order) when
the source was first mapped. A source whose buckets changed keeps its slot, and each of its
documents that is still there (same id, same buckets) keeps its node; added documents get rows
past the source's previous ones. So the labels (smallest node) of clusters stay the same, and
when no clustered document is gone the previous components can only merge.

1. map, per minhash shard: bucket records ``(key = hash(band, bucket), node)`` and the shard's
   node table (``id``, ``chars``, ``node``, bucket ``digest``). Stored under ``cache/<source>/<fingerprint>``: a source
   whose buckets did not change keeps its map output (that is the stored per-partition index
   an incremental run joins a changed source against);
2. edges, per key range (``records_per_partition``): star edges of every shared bucket;
3. connected components (:mod:`dedup_components`): label = smallest node of the component.
   Incremental (2-3b): edges only of the buckets that hold an added document (their records
   found by one scan of the map files), one union-find of the previous labels over them, and the
   previous label files rewritten with that remap (fresh labels compacted into one small file);
   members, plan and verify then see the touched clusters only and carry the others over;
4. members, per group of ``shards_per_map`` minhash shards: their labelled nodes, keyed by
   hash(label);
5. plan, per label range: which clusters must be verified: all, or, incrementally, those whose
   members (source, id) are not exactly those of the previous run's cluster with the same
   label (ids hash the text, so an equal member set has an equal verdict); their members are
   requested by node;
6. gather, per group of normalized shards that have requested rows: those rows' text, keyed
   by label;

Every step after the components writes block files (:func:`dedup_shuffle.write_blocks`) cut at
its readers' ranges, known before it runs: labels, touched rows and requests (keyed by node)
at the cuts of the shard groups' node ranges; member files at equal label-key ranges (as many
as verify partitions expected from the clustered documents); gathered texts at the verify
partitions, but big clusters' texts, which stay sorted Parquet read batch by batch. So each
task reads its own rows of every file, not a row group of each.
7. verify, per label range: the rule on each requested cluster (reading only its members'
   texts), the previous verdict for every other cluster; removal rows keyed by id;
8. removals, per id range, and publish, per group of sources (each range read once for the
   group): ``<out>/<source>/removed.parquet``.

Counters for the metadata (removed documents and characters per source, the cluster-size
histogram, example pairs) come from what the tasks return; nothing re-reads the corpus.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import json
import os
import tempfile
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import xxhash

from marin_assets.core.dedup import shuffle
from marin_assets.core.dedup.components import EDGE_SCHEMA, LABEL_SCHEMA, connected_components, edge_table, warm_scipy
from marin_assets.core.dedup.decisions import (
    FUZZY_SCHEMA,
    VERIFY_BATCH_CHARS,
    DedupError,
    FuzzyDedupParams,
    GreedyVerifier,
    ngram_sets,
    removal_ratios,
    removed_uri,
    size_bin,
)
from marin_assets.core.dedup.exact import doc_lengths
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.runner import ShardResult, ShardRunner, ShardTask

RANK_SHIFT = 40
STATE_FILE = "_fuzzy_state.json"
RELABEL_FILES = 16  # previous label files per relabel task (the members step reads one touched-rows file per task)
LAYOUT = 4  # the state's layout: nodes kept across changes, label files kept for the next run, map and verify outputs in blocks, retained members (and big clusters' texts of them) in the cluster records

RECORD_SCHEMA = pa.schema([("key", pa.int64()), ("node", pa.int64())])
NODE_SCHEMA = pa.schema([("id", pa.string()), ("chars", pa.int64()), ("node", pa.int64()), ("digest", pa.uint64())])
# ``added``: incremental, the member was not in the previous run's cluster of its label (a full
# run: false everywhere)
MEMBER_SCHEMA = pa.schema(
    [("key", pa.int64()), ("label", pa.int64()), ("node", pa.int64()), ("rank", pa.int32()), ("id", pa.string()), ("chars", pa.int64()), ("added", pa.bool_())]
)
DELTA_SCHEMA = LABEL_SCHEMA.append(pa.field("added", pa.bool_()))  # the touched clusters' rows, as the members step reads them
REMAP_SCHEMA = pa.schema([("key", pa.int64()), ("node", pa.int64()), ("label", pa.int64()), ("fresh", pa.bool_())])
# ``big``: the cluster is verified batch by batch (its texts go to the streamed file, not the blocks)
REQUEST_SCHEMA = pa.schema([("key", pa.int64()), ("lkey", pa.int64()), ("pos", pa.int64()), ("big", pa.bool_())])
# Gathered texts: one block per verify partition, but a big cluster's texts, which are stored
# sorted by (cluster key, place in processing order) in row groups of about VERIFY_BATCH_CHARS,
# so they can be read batch by batch.
TEXT_SCHEMA = pa.schema([("key", pa.int64()), ("pos", pa.int64()), ("node", pa.int64()), ("text", pa.large_string())])
VERDICT_SCHEMA = pa.schema(
    [
        ("key", pa.int64()),
        ("rank", pa.int32()),
        ("id", pa.string()),
        ("label", pa.int64()),
        ("cluster_id", pa.string()),
        ("representative_id", pa.string()),
        ("representative_source", pa.string()),
        ("containment", pa.float64()),
        ("jaccard", pa.float64()),
        ("chars", pa.int64()),
    ]
)
# A cluster's record: its size, a digest of its members and the member keys (source rank, id) of
# those it retained; with its removal rows that is every member, and a later run replays the
# retained ones against the members it gained. A big cluster that retained few members (at most
# one in HEAD_TEXT_SHARE, and at most ``verify_batch_chars`` of text) also keeps their texts
# (``texts``, parallel to ``retained``; else nulls): that replay then reads no shard but the
# added members' (the texts are a small share of the cluster's).
CLUSTER_SCHEMA = pa.schema(
    [("label", pa.int64()), ("size", pa.int64()), ("members", pa.string()), ("retained", pa.list_(pa.string())), ("texts", pa.list_(pa.large_string()))]
)
HEAD_TEXT_SHARE = 16


@dataclasses.dataclass(frozen=True)
class FuzzyScale:
    """Task sizes: each bounds one task's memory (records, edges or members per task). Reduce
    tasks read a key range of every map file, so map files group ``shards_per_map`` shards."""

    records_per_partition: int = 16_000_000
    edges_per_task: int = 16_000_000
    union_find_max_edges: int = 20_000_000
    merge_max_edges: int = 20_000_000  # incremental: the added documents' edges merged in one task (above: components over every edge)
    members_per_partition: int = 1_000_000
    member_chars_per_partition: int = 1 << 30  # verify holds its range's requested texts (but for big clusters)
    cluster_chars_in_memory: int = 1 << 26  # a cluster with more member text is verified batch by batch, read from storage
    verify_batch_chars: int = VERIFY_BATCH_CHARS  # texts turned into n-grams at a time (and gathered row groups)
    shards_per_map: int = 16  # a map task reads this many shards of one source into one records file
    scan_records_per_task: int = 64_000_000  # incremental: map file records one task scans (a row group at a time) for the added documents' buckets
    sources_per_publish: int = 16  # one publish task writes this many sources' removal files, reading each removal part once


def nodes_uri(map_output: str, k: int) -> str:
    """The node table (``id``, ``chars``, ``node``, bucket ``digest`` per row) of shard ``k`` of a map group."""
    return _stem(map_output) + f".nodes-{k:05d}.parquet"


def clusters_uri(verify_output: str) -> str:
    return _stem(verify_output) + ".clusters.parquet"


def _stem(uri: str) -> str:
    return uri.removesuffix(".parquet").removesuffix(shuffle.BLOCK_SUFFIX)


# --------------------------------------------------------------------------- 1. map


@dataclasses.dataclass(frozen=True)
class MapParams:
    source: str
    slot: int
    bases: tuple[int, ...]  # first row (within the source) of each shard of the group
    # A changed source that keeps its node numbers: per shard, the previous run's node table of
    # the shard with the same name ("" if none); a document found there (same id, same buckets)
    # keeps its node, any other gets ``slot << 40 | added_base + base + row``.
    previous: tuple[str, ...] = ()
    added_base: int = -1
    maps: int = 1  # map tasks in all and records per edges task: the edges tasks this map's blocks expect
    records_per_partition: int = 16_000_000


MAX_NODE_RUNS = 16


def node_runs(nodes: np.ndarray, limit: int = MAX_NODE_RUNS) -> list[list[int]]:
    """At most ``limit`` node ranges ``[lo, hi)`` covering ``nodes`` (the smallest gaps closed):
    a shard's labels and requests are read by these ranges, then matched node by node."""
    if nodes.size == 0:
        return []
    ordered = np.unique(nodes)
    breaks = np.flatnonzero(np.diff(ordered) > 1)
    if breaks.size >= limit:
        gaps = ordered[breaks + 1] - ordered[breaks]
        breaks = np.sort(breaks[np.argsort(-gaps, kind="stable")[: limit - 1]])
    lo = np.r_[ordered[0], ordered[breaks + 1]]
    hi = np.r_[ordered[breaks], ordered[-1]] + 1
    return [[int(x), int(y)] for x, y in zip(lo, hi)]


def _rows_of(nodes: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Row index of each ``wanted`` node in a shard's ``nodes`` (every one must be there)."""
    order = np.argsort(nodes, kind="stable")
    pos = np.searchsorted(nodes, wanted, sorter=order)
    return order[np.minimum(pos, max(0, nodes.size - 1))]


def added_uri(map_output: str) -> str:
    """A changed map group's records of its added documents (the buckets an incremental run joins)."""
    return _stem(map_output) + ".added.parquet"


def gone_uri(map_output: str) -> str:
    """The previous run's nodes of a changed map group's documents that are gone (or changed)."""
    return _stem(map_output) + ".gone.parquet"


def _kept_nodes(previous: str, ids: pa.Array, digest: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the previous run's node of the same document (-1: added), and the previous
    nodes of the documents that are gone (not found, or found with other buckets)."""
    if not previous or not storage.exists(previous):
        return np.full(len(ids), -1, np.int64), np.zeros(0, np.int64)
    old = storage.read_parquet(previous)
    if "node" not in old.column_names or "digest" not in old.column_names:
        raise DedupError(f"node table {previous} has no node numbers; delete the fuzzy dedup cache and rerun")
    before = pl.from_arrow(old.select(["id", "node", "digest"]))
    now = pl.DataFrame({"id": pl.Series(ids.to_pylist(), dtype=pl.String), "digest": pl.Series(digest, dtype=pl.UInt64)}).with_row_index("row")
    now = now.filter(pl.col("id").is_first_distinct())
    hit = now.join(before.filter(pl.col("id").is_first_distinct()), on=["id", "digest"], how="inner")
    kept = np.full(len(ids), -1, np.int64)
    kept[hit["row"].to_numpy()] = hit["node"].to_numpy()
    old_nodes = before["node"].to_numpy()
    return kept, old_nodes[~np.isin(old_nodes, hit["node"].to_numpy())]


def _shard_records(
    source: str, buckets_uri: str, normalized_uri: str, first_node: int, nodes_out: str, previous: str = "", added_node: int = -1
) -> tuple[np.ndarray, np.ndarray, dict[str, Any], np.ndarray]:
    table = storage.read_parquet(buckets_uri)
    if "buckets" not in table.column_names or "id" not in table.column_names:
        raise DedupError(f"source {source!r}: {buckets_uri} has no 'id'/'buckets' columns; rematerialize minhash_buckets for {source!r}")
    rows = table.num_rows
    if storage.parquet_num_rows(normalized_uri) != rows:
        raise DedupError(
            f"source {source!r}: {normalized_uri} and its minhash buckets {buckets_uri} have different row counts; "
            f"rematerialize minhash_buckets for {source!r}"
        )
    column = table.column("buckets").combine_chunks()
    if column.null_count:
        column = pc.fill_null(column, pa.scalar([], column.type))
    lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False).astype(np.int64)
    values = pc.list_flatten(column).to_numpy(zero_copy_only=False).astype(np.uint64, copy=False)
    bands = sorted(set(np.unique(lengths[lengths > 0]).tolist()))
    if len(bands) > 1:
        raise DedupError(f"source {source!r}: {buckets_uri} has {bands} buckets per document; rematerialize minhash_buckets for {source!r}")
    row = np.repeat(np.arange(rows, dtype=np.int64), lengths)
    starts = np.zeros(rows, np.int64)
    if rows:
        np.cumsum(lengths[:-1], out=starts[1:])
    band = (np.arange(values.size, dtype=np.int64) - starts[row]).astype(np.uint64)
    with np.errstate(over="ignore"):
        key = shuffle.hash_keys(values ^ shuffle.fmix64(band + np.uint64(1)))
        # Per document, a hash of its bucket keys in band order: a later run keeps the node of a
        # document only when its buckets are the same.
        mixed = shuffle.fmix64(key.astype(np.uint64) + band * np.uint64(0x9E3779B97F4A7C15))
        digest = np.zeros(rows, np.uint64)
        if values.size:
            full = lengths > 0
            digest[full] = np.add.reduceat(mixed, starts[full])
        digest = shuffle.fmix64(digest + lengths.astype(np.uint64))
    if "chars" in table.column_names:
        chars = table.column("chars").combine_chunks().cast(pa.int64())
    else:  # minhash output from before it recorded lengths: read them from the text once
        chars = doc_lengths(source, normalized_uri, None, rows)
    ids = table.column("id").combine_chunks().cast(pa.string())
    node = first_node + np.arange(rows, dtype=np.int64)
    gone, added = np.zeros(0, np.int64), 0
    if added_node >= 0:
        kept, gone = _kept_nodes(previous, ids, digest)
        fresh = kept < 0
        added = int(fresh.sum())
        node = np.where(fresh, added_node + np.arange(rows, dtype=np.int64), kept)
    nodes = pa.table([ids, chars, pa.array(node), pa.array(digest)], schema=NODE_SCHEMA)
    storage.write_parquet(nodes, nodes_out)
    stats = {"docs": rows, "records": int(values.size), "bands": bands[0] if bands else 0, "chars": int(pc.sum(nodes.column("chars")).as_py() or 0), "added": added, "runs": node_runs(node)}
    return key, node[row], stats, gone


@shuffle.measured
def fuzzy_map(inputs: list[str], output: str, params: MapParams) -> dict[str, Any]:
    """A group of minhash shards of one source (each followed by its normalized shard, for row
    counts and, with old minhash output, lengths) -> one records file + a node table per shard."""
    keys, nodes = [], []
    totals = {"docs": 0, "records": 0, "chars": 0, "added": 0}
    bands: set[int] = set()
    runs, gone = [], []
    for k, base in enumerate(params.bases):
        first = (params.slot << RANK_SHIFT) + base
        added_node = (params.slot << RANK_SHIFT) + params.added_base + base if params.added_base >= 0 else -1
        previous = params.previous[k] if params.previous else ""
        key, node, stats, lost = _shard_records(params.source, inputs[2 * k], inputs[2 * k + 1], first, nodes_uri(output, k), previous, added_node)
        gone.append(lost)
        keys.append(key)
        nodes.append(node)
        runs.append(stats["runs"])
        for name in totals:
            totals[name] += stats[name]
        if stats["bands"]:
            bands.add(stats["bands"])
    if len(bands) > 1:
        raise DedupError(f"source {params.source!r}: shards {inputs[::2]} have {sorted(bands)} buckets per document; rematerialize minhash_buckets for {params.source!r}")
    if params.added_base >= 0:
        lost = np.concatenate(gone)
        shuffle.write_sorted(pa.table([pa.array(lost), pa.array(lost)], schema=RECORD_SCHEMA), gone_uri(output))
        totals["gone"] = int(lost.size)
    records = pa.table([pa.array(np.concatenate(keys)), pa.array(np.concatenate(nodes))], schema=RECORD_SCHEMA)
    if params.added_base >= 0:
        fresh = pc.greater_equal(records.column("node"), (params.slot << RANK_SHIFT) + params.added_base)
        totals["added_records"] = shuffle.write_sorted(records.filter(fresh), added_uri(output))
    shuffle.write_keyed(records, output, shuffle.pow2_partitions(records.num_rows * params.maps, params.records_per_partition))
    return totals | {"bands": min(bands) if bands else 0, "runs": runs}


# --------------------------------------------------------------------------- 2. edges


@dataclasses.dataclass(frozen=True)
class RangeParams:
    lo: int
    hi: int
    tasks: int = 1  # edges tasks in all and edges per component task: the component tasks this task's blocks expect
    edges_per_task: int = 16_000_000


@shuffle.measured
def fuzzy_edges(inputs: list[str], output: str, params: RangeParams) -> dict[str, Any]:
    """Star edges (smallest node, other node) of every bucket shared by several documents."""
    table = shuffle.read_range(inputs, params.lo, params.hi, ["node"], RECORD_SCHEMA)
    key, node = table.column("key").to_numpy(), table.column("node").to_numpy()
    order = np.lexsort((node, key))
    key, node = key[order], node[order]
    new = np.r_[True, key[1:] != key[:-1]] if key.size else np.zeros(0, bool)
    head = node[np.maximum.accumulate(np.where(new, np.arange(key.size), 0))] if key.size else node
    member = ~new & (head != node)
    u, v = head[member], node[member]
    if u.size:
        pairs = np.unique(np.stack([u, v], axis=1), axis=0)
        u, v = pairs[:, 0], pairs[:, 1]
    shuffle.write_keyed(edge_table(u, v), output, shuffle.pow2_partitions(2 * u.size * params.tasks, params.edges_per_task))
    starts = np.flatnonzero(new)
    largest = int(np.diff(np.append(starts, key.size)).max()) if starts.size else 0
    return {"records": int(key.size), "edges": int(u.size), "largest_bucket": largest}


@dataclasses.dataclass(frozen=True)
class MergeParams:
    edge_files: int
    gone_files: int  # then the changed groups' gone nodes, then the previous label files
    fresh_labels: str  # where the newly clustered nodes' labels go


@dataclasses.dataclass(frozen=True)
class RelabelParams:
    outputs: tuple[str, ...]  # the relabelled file of each previous label file (inputs after the remap; any further input, the fresh labels, is read for the touched rows only)
    append_fresh: bool = False  # compaction: the fresh labels also go into the last output (the previous run's small fresh file grows instead of a new file per run)
    delta_cuts: str = ""  # the touched rows' file is blocks at these stored node cuts (the members tasks' ranges)


@dataclasses.dataclass(frozen=True)
class AddedParams:
    lo: int
    hi: int
    added: tuple[tuple[int, int], ...]  # node ranges of the documents added since the previous run


@dataclasses.dataclass(frozen=True)
class HitsParams:
    lo: int
    hi: int
    added_files: int  # the inputs: this many added-record files, then the map files to scan


@shuffle.measured
def fuzzy_bucket_hits(inputs: list[str], output: str, params: HitsParams) -> dict[str, Any]:
    """Incremental: the records (every source's) of the buckets that hold an added document, in
    one key range, from a few whole map files. Each file is read once, runs of consecutive
    blocks at a time, skipping blocks no added key falls in; memory: the range's added keys,
    one run of blocks and the hits."""
    added = np.unique(shuffle.read_range(inputs[: params.added_files], params.lo, params.hi, [], RECORD_SCHEMA).column("key").to_numpy())
    pieces = []
    scanned = 0
    for uri in inputs[params.added_files :] if added.size else ():
        for table in shuffle.scan_blocks(uri, added):  # a run of consecutive blocks: sorted by key
            scanned += table.num_rows
            keys = table.column("key").to_numpy()
            lo = np.searchsorted(keys, added, side="left")
            counts = np.searchsorted(keys, added, side="right") - lo  # the rows lo .. lo + count - 1 hold that added key
            rows = np.repeat(lo - (np.cumsum(counts) - counts), counts) + np.arange(int(counts.sum()))
            if rows.size:
                pieces.append(table.take(pa.array(rows)).select(["key", "node"]))
    hits = pa.concat_tables(pieces).cast(RECORD_SCHEMA) if pieces else RECORD_SCHEMA.empty_table()
    shuffle.write_sorted(hits, output)
    return {"records": scanned, "hits": hits.num_rows}


@shuffle.measured
def fuzzy_edges_added(inputs: list[str], output: str, params: AddedParams) -> dict[str, Any]:
    """Incremental: star edges of the buckets that hold an added document only (every other
    bucket's edges are already in the previous run's components). Reads the key range of the
    bucket hits (:func:`fuzzy_bucket_hits`: every source's records of those buckets)."""
    table = shuffle.read_range(inputs, params.lo, params.hi, ["node"], RECORD_SCHEMA)
    key, node = table.column("key").to_numpy(), table.column("node").to_numpy()
    added = np.zeros(node.size, bool)
    for lo, hi in params.added:
        added |= (node >= lo) & (node < hi)
    hit = np.isin(key, np.unique(key[added]))
    key, node, added = key[hit], node[hit], added[hit]
    # The previous documents of a bucket were connected already: each added document needs an
    # edge to one document of the bucket only (the smallest), and the smallest to the smallest
    # previous one, so the edges grow with the added records, not with the buckets' sizes.
    order = np.lexsort((node, key))
    key, node, added = key[order], node[order], added[order]
    new = np.r_[True, key[1:] != key[:-1]] if key.size else np.zeros(0, bool)
    group = np.cumsum(new) - 1
    head = node[np.flatnonzero(new)][group] if key.size else node
    old = np.where(added, np.iinfo(np.int64).max, node)
    oldest = np.minimum.reduceat(old, np.flatnonzero(new))[group] if key.size else node
    to_added = added & (node != head)
    to_old = new & added & (oldest != np.iinfo(np.int64).max)  # the head is added: link it to the previous ones
    u = np.concatenate([head[to_added], node[to_old]])
    v = np.concatenate([node[to_added], oldest[to_old]])
    if u.size:
        pairs = np.unique(np.stack([u, v], axis=1), axis=0)
        u, v = pairs[:, 0], pairs[:, 1]
    shuffle.write_sorted(edge_table(u, v), output)
    return {"records": int(table.num_rows), "edges": int(u.size), "largest_bucket": 0}


# --------------------------------------------------------------------------- 3b. incremental components


@shuffle.measured(warm=(warm_scipy,))
def fuzzy_merge_labels(inputs: list[str], output: str, params: MergeParams) -> dict[str, Any]:
    """Incremental components: the previous components stay whole (no document of theirs is
    gone) and only merge through the added documents' edges. A union-find over those edges,
    each endpoint replaced by its previous label, gives every touched component its new label
    (the smallest node, as a full run would). Writes the remap ``(key, node, label, fresh)``:
    each previous label and each newly clustered node (``fresh``) with its new label, and the
    newly clustered nodes' label file."""
    from scipy.sparse import coo_matrix  # noqa: PLC0415
    from scipy.sparse.csgraph import connected_components as scipy_components  # noqa: PLC0415

    edge_files, gone_files = inputs[: params.edge_files], inputs[params.edge_files : params.edge_files + params.gone_files]
    label_files = inputs[params.edge_files + params.gone_files :]
    edges = shuffle.read_range(edge_files, 0, shuffle.KEY_SPACE, ["a", "b"], EDGE_SCHEMA)
    a, b = edges.column("a").to_numpy(), edges.column("b").to_numpy()
    ends = np.unique(np.concatenate([a, b]))
    gone = np.unique(shuffle.read_range(gone_files, 0, shuffle.KEY_SPACE, ["node"], RECORD_SCHEMA).column("node").to_numpy())
    old = np.full(ends.size, -1, np.int64)
    split = 0
    for uri in label_files:  # one partition of the previous labels at a time
        part = shuffle.read_whole(uri, LABEL_SCHEMA)
        n = part.column("node").to_numpy()
        split += int(np.isin(n, gone).sum())
        hit = np.isin(n, ends)
        old[np.searchsorted(ends, n[hit])] = part.column("label").to_numpy()[hit]
    vertex = np.where(old >= 0, old, ends)
    verts = np.unique(vertex)
    va = np.searchsorted(verts, vertex[np.searchsorted(ends, a)])
    vb = np.searchsorted(verts, vertex[np.searchsorted(ends, b)])
    if verts.size:
        graph = coo_matrix((np.ones(va.size, np.int8), (va, vb)), shape=(verts.size, verts.size))
        _, component = scipy_components(graph.tocsr(), directed=False)
        smallest = np.full(int(component.max()) + 1, np.iinfo(np.int64).max, np.int64)
        np.minimum.at(smallest, component, verts)
        label = smallest[component]
    else:
        label = verts
    fresh = ~np.isin(verts, old[old >= 0])
    shuffle.write_sorted(pa.table([pa.array(verts), pa.array(verts), pa.array(label), pa.array(fresh)], schema=REMAP_SCHEMA), output)
    labels_out = pa.table([pa.array(verts[fresh]), pa.array(verts[fresh]), pa.array(label[fresh])], schema=LABEL_SCHEMA)
    shuffle.write_sorted(labels_out, params.fresh_labels)
    # ``split``: a gone document was in a cluster, which may fall apart: the caller recomputes all.
    return {"edges": int(a.size), "touched": int(np.unique(label).size), "fresh": int(fresh.sum()), "merged": int(((label != verts) & ~fresh).sum()), "split": split}


@shuffle.measured
def fuzzy_relabel(inputs: list[str], output: str, params: RelabelParams) -> dict[str, Any]:
    """Partitions of the previous labels with the remap applied (the next run's labels, one file
    each, read and written one at a time), and one block file of the touched components' rows
    (what the members step reads: one block per members task's node range, so those rows are
    held until written; the newly clustered nodes' labels included when ``fresh``)."""
    remap_file, *label_files = inputs
    remap = storage.read_parquet(remap_file)
    fresh = remap.column("fresh").to_numpy(zero_copy_only=False)
    was, now = remap.column("node").to_numpy()[~fresh], remap.column("label").to_numpy()[~fresh]
    touched = np.unique(remap.column("label").to_numpy())
    labels = touched_members = 0
    deltas: list[pa.Table] = []
    extra = label_files[len(params.outputs) :]  # the fresh labels (already final)
    appended = None
    if params.append_fresh and extra and params.outputs:
        appended = pa.concat_tables([shuffle.read_whole(uri, LABEL_SCHEMA) for uri in extra])
    for k, (uri, out) in enumerate(zip(label_files, params.outputs + (None,) * len(extra))):
        table = shuffle.read_whole(uri, LABEL_SCHEMA)
        label = before = table.column("label").to_numpy()
        if out is not None:
            if was.size and label.size:
                pos = np.minimum(np.searchsorted(was, label), was.size - 1)
                label = np.where(was[pos] == label, now[pos], label)
            table = table.set_column(LABEL_SCHEMA.get_field_index("label"), "label", pa.array(label))
            written = table
            if appended is not None and k == len(params.outputs) - 1:
                written = pa.concat_tables([table, appended])
                _write_labels(written.take(pc.sort_indices(written, sort_keys=[("key", "ascending")])), out)
            elif np.array_equal(label, before):
                shuffle.copy_file(uri, out)  # no label of this file moved: the same bytes
            else:
                _write_labels(written, out)
            labels += written.num_rows
        hit = np.isin(label, touched)
        # added: not in the previous cluster of its (new) label: a fresh node, or one whose
        # previous cluster merged into a smaller label
        added = np.ones(int(hit.sum()), bool) if out is None else (before != label)[hit]
        delta = table.filter(pa.array(hit)).append_column("added", pa.array(added))
        touched_members += delta.num_rows
        deltas.append(delta)
    shuffle.write_blocks(pa.concat_tables(deltas) if deltas else DELTA_SCHEMA.empty_table(), output, cuts=shuffle.read_cuts(params.delta_cuts))
    return {"labels": labels, "touched_members": touched_members}


def _write_labels(table: pa.Table, uri: str) -> None:
    """A relabelled label file, in its previous file's format (read whole by the next run)."""
    if uri.endswith(shuffle.BLOCK_SUFFIX):
        shuffle.write_blocks(table, uri, cuts=[0, shuffle.KEY_SPACE])
    else:
        storage.write_parquet(table, uri, row_group_size=shuffle.ROW_GROUP_ROWS)


# --------------------------------------------------------------------------- 4. members


@dataclasses.dataclass(frozen=True)
class ShardParams:
    source: str
    first_node: int
    rows: int
    rank: int = 0
    runs: tuple[tuple[int, int], ...] = ()  # node ranges covering the shard's nodes (none: first_node + rows)


def _shard_members(nodes_file: str, params: ShardParams, labels: pa.Table) -> pa.Table:
    """A shard's labelled nodes with their id and length (``labels``: the rows of the shard's node
    ranges)."""
    if labels.num_rows == 0:
        return MEMBER_SCHEMA.empty_table()
    node = labels.column("node").to_numpy()
    label = labels.column("label").to_numpy()
    added = labels.column("added").to_numpy(zero_copy_only=False) if "added" in labels.column_names else np.zeros(node.size, bool)
    nodes_table = storage.read_parquet(nodes_file)
    if "node" in nodes_table.column_names:
        mine = nodes_table.column("node").to_numpy()
        hit = np.isin(node, mine)
        node, label, added = node[hit], label[hit], added[hit]
        rows = _rows_of(mine, node)
    else:
        rows = node - params.first_node
    table = nodes_table.take(pa.array(rows))
    rank = pa.array(np.full(node.size, params.rank, np.int32))
    return pa.table([pa.array(shuffle.hash_keys(label)), pa.array(label), pa.array(node), rank, table.column("id"), table.column("chars"), pa.array(added)], schema=MEMBER_SCHEMA)


@dataclasses.dataclass(frozen=True)
class GroupParams:
    shards: tuple[ShardParams, ...]
    label_cuts: str  # the label files (full: the labels; incremental: the touched rows) are block files cut at these stored node cuts
    member_blocks: int  # write one block for each of this many equal label-key ranges
    delta: bool = False  # the label files are the touched rows (with their ``added`` flag)


def shard_runs(first_node: int, rows: int, runs: Sequence[Sequence[int]]) -> tuple[tuple[int, int], ...]:
    """The node ranges a shard's rows are read by (its map task's runs, else its first rows)."""
    return tuple((int(a), int(b)) for a, b in runs) or ((first_node, first_node + rows),)


@shuffle.measured
def fuzzy_members_group(inputs: list[str], output: str, params: GroupParams) -> dict[str, Any]:
    """The clustered nodes of a group of shards (incremental: of the touched clusters) in one
    file, keyed by hash(label), one block per plan/verify key range; the inputs are the shards'
    node tables, then the label files, whose rows of the group's node ranges are read once."""
    k = len(params.shards)
    nodes_files, label_files = inputs[:k], inputs[k:]
    runs = [shard_runs(p.first_node, p.rows, p.runs) for p in params.shards]
    merged = _merge_runs([r for rs in runs for r in rs])
    labels = shuffle.read_ranges_blocks(label_files, shuffle.read_cuts(params.label_cuts), merged, DELTA_SCHEMA if params.delta else LABEL_SCHEMA)
    keys = labels.column("key").to_numpy()
    parts = []
    for n, p, rs in zip(nodes_files, params.shards, runs):
        bounds = np.asarray(rs, np.int64).ravel()
        parts.append(_shard_members(n, p, labels.filter(pa.array((np.searchsorted(bounds, keys, side="right") % 2) == 1))))
    out = pa.concat_tables(parts)
    shuffle.write_blocks(out, output, cuts=shuffle.partition_cuts(params.member_blocks))
    return {"members": out.num_rows, "member_chars": int(pc.sum(out.column("chars")).as_py() or 0)}


# --------------------------------------------------------------------------- 5. plan / 7. verify: which clusters to verify


@dataclasses.dataclass(frozen=True)
class VerifyParams:
    lo: int
    hi: int
    sources: tuple[str, ...]
    exempt: tuple[str, ...]
    previous: tuple[str, ...]  # the previous run's verify outputs overlapping this label range (none: verify all)
    rule: FuzzyDedupParams
    num_examples: int = 5
    excerpt_chars: int = 240
    member_files: int = 0  # verify: its inputs are this many member files, then the gathered texts
    stream_chars: int = 1 << 26  # clusters with more member text are read batch by batch
    batch_chars: int = VERIFY_BATCH_CHARS
    replay: bool = True  # a cluster that only gained members replays its previous decisions
    remap: str = ""  # incremental components: the member files hold the touched clusters only; the remap names them
    member_blocks: int = 1  # the member files are block files of this many equal key ranges
    request_cuts: str = ""  # plan: write the requests as blocks at these stored node cuts (the gather groups' ranges)
    text_files: int = 0  # verify: after the member files, this many gathered text block files, then the streamed texts' files
    text_blocks: int = 1  # the gathered text files' blocks: this many equal key ranges (the verify partitions)


def _clusters(member_files: Sequence[str], lo: int, hi: int, blocks: int) -> pl.DataFrame:
    """Members of a label range in processing order: cluster, longest first, source, id (from
    block files of ``blocks`` equal key ranges: the blocks covering the range)."""
    table = shuffle.read_ranges_blocks(member_files, shuffle.partition_cuts(blocks), [(lo, hi)], MEMBER_SCHEMA)
    frame = pl.from_arrow(table.select(["key", "label", "node", "rank", "id", "chars", "added"]))
    return frame.sort(["label", "chars", "rank", "id"], descending=[False, True, False, False])


def _member_key(rank: int, doc: str) -> str:
    return f"{rank}\x00{doc}"


def _with_member_keys(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with its rows' :func:`_member_key` as column ``mkey``."""
    return frame.with_columns(pl.concat_str([pl.col("rank").cast(pl.String), pl.lit("\x00"), pl.col("id")]).alias("mkey"))


def _member_sets(frame: pl.DataFrame) -> pl.DataFrame:
    """Per cluster: label, size and a 128-bit hash of its sorted (source rank, id) members."""
    rows = _with_member_keys(frame.select("label", "rank", "id").sort(["label", "rank", "id"]))
    grouped = rows.group_by("label", maintain_order=True).agg(pl.len().cast(pl.Int64).alias("size"), (pl.col("mkey") + pl.lit("\n")).str.join("").alias("text"))
    digests = [xxhash.xxh3_128_hexdigest(t.encode()) for t in grouped["text"].to_list()]
    return pl.DataFrame({"label": grouped["label"], "size": grouped["size"], "members": digests}, schema={"label": pl.Int64, "size": pl.Int64, "members": pl.String})


def _previous_clusters(params: VerifyParams, only: Sequence[int] | None = None) -> pl.DataFrame:
    """The previous run's cluster records whose labels fall in this task's range (and are in
    ``only``, when given)."""
    parts = []
    for uri in params.previous:
        table = storage.read_parquet(clusters_uri(uri))
        keys = shuffle.hash_keys(table.column("label").to_numpy())
        mask = (keys >= params.lo) & (keys < params.hi)
        if only is not None:
            mask &= np.isin(table.column("label").to_numpy(), np.asarray(only, np.int64))
        parts.append(pl.from_arrow(table.filter(pa.array(mask))))
    return pl.concat(parts, how="diagonal_relaxed")


def _reusable(frame: pl.DataFrame, params: VerifyParams, sets: pl.DataFrame | None = None, frame_only: bool = False) -> tuple[set[int], pl.DataFrame | None]:
    """Labels whose verdict can be copied: the previous run had a cluster with the same label
    and exactly the same (source, id) members; ids hash the text, so the verdict is the same.
    Also the previous clusters read (with ``frame_only``, only those labelled as one in
    ``frame``, which is all that reuse and replay look at). The first pass of an incremental run
    (``remap``, replaying) sees only touched clusters, each of which gained a member: nothing to
    compare."""
    if not params.previous:
        return set(), None
    before = _previous_clusters(params, frame["label"].unique().to_list() if frame_only else None)
    if params.remap and params.replay:
        return set(), before
    sets = _member_sets(frame) if sets is None else sets
    joined = sets.join(before.select("label", "size", "members"), on=["label", "size", "members"], how="inner")
    return set(joined["label"].to_list()), before


_ROW_FIELDS = ("rank", "id", "cluster_id", "representative_id", "representative_source", "containment", "jaccard")  # a removal row as published


def row_sums(table: pa.Table) -> dict[int, int]:
    """Per source rank, the sum modulo 2**128 of a 128-bit hash of each removal row as
    published. Summed over every label range, two runs' sums of a source are equal exactly when
    its rows are (but for a 2**-128 collision), wherever the rows' clusters went, so a source
    whose sum did not move keeps its removal file. (Polars' hash is the same in every process of
    one Polars version, which all tasks of a run share.)"""
    if table.num_rows == 0:
        return {}
    row = pl.struct(list(_ROW_FIELDS))
    halves = [e for seed in (1, 2) for e in ((row.hash(seed) & 0xFFFFFFFF).alias(f"lo{seed}"), (row.hash(seed) // (1 << 32)).alias(f"hi{seed}"))]
    sums = pl.from_arrow(table.select(list(_ROW_FIELDS))).select(pl.col("rank"), *halves).group_by("rank").sum()
    out = {}
    for rank, lo1, hi1, lo2, hi2 in sums.select("rank", "lo1", "hi1", "lo2", "hi2").iter_rows():
        out[int(rank)] = ((((hi1 << 32) + lo1) << 64) + (hi2 << 32) + lo2) % (1 << 128)
    return out


_PREVIOUS_ROWS: dict[tuple[str, ...], pa.Table] = {}  # one verify task's previous verify outputs, read once


def _previous_rows(params: VerifyParams, labels: set[int], columns: tuple[str, ...] | None = None) -> pa.Table:
    """The previous run's removal rows of the clusters ``labels``. Verify asks several times for
    its range's rows: the files are read once per task. Plan asks once, for a few ``columns``,
    maybe over many label ranges: each file is filtered as it is read (only the asked rows held)."""
    wanted = pa.array(sorted(labels), pa.int64())
    if columns is not None:
        parts = [t.filter(pc.is_in(t.column("label"), wanted)) for t in (_verdicts(uri, columns) for uri in params.previous)]
        return pa.concat_tables(parts) if parts else pa.schema([VERDICT_SCHEMA.field(c) for c in columns]).empty_table()
    before = _PREVIOUS_ROWS.get(params.previous)
    if before is None:
        _PREVIOUS_ROWS.clear()
        before = _PREVIOUS_ROWS[params.previous] = pa.concat_tables([_verdicts(uri) for uri in params.previous])
    return before.filter(pc.is_in(before.column("label"), wanted))


def _verdicts(uri: str, columns: Sequence[str] | None = None) -> pa.Table:
    """All removal rows of a verify output (``columns``: only those)."""
    table = shuffle.read_whole(uri, VERDICT_SCHEMA)
    return table if columns is None else table.select(list(columns))


def _replay_plan(frame: pl.DataFrame, params: VerifyParams, reuse: set[int], before: pl.DataFrame | None, columns: tuple[str, ...] | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Split the clusters not reused into those verified in full and those replayed: a cluster
    that only gained members since the previous run (same label, every previous member still in
    it) replays the previous decisions, reading only its added members and the previous run's
    retained ones (the removed ones never represent). Returns both row sets in processing order;
    the replayed rows' ``added`` flag says which members are new to the cluster, and ``text`` is
    a retained member's text where its record kept it (else null: gathered).

    Incremental components mark the added members (a cluster without any other is new); else
    the previous members are the cluster's retained keys and removal rows (``columns``: read
    file by file with those columns, as plan does)."""
    todo = frame.filter(~pl.col("label").is_in(list(reuse))) if reuse else frame
    if not params.replay or before is None or not todo.height:
        return todo, todo.clear().with_columns(pl.lit(None, pl.String).alias("text"))
    prior = before.filter(pl.col("retained").is_not_null()).join(todo.select("label").unique(), on="label", how="semi")
    keyed = _with_member_keys(todo)
    if not params.remap:
        removed = pl.from_arrow(_previous_rows(params, set(prior["label"].to_list()), columns).select(["label", "rank", "id"]))
        previous = pl.concat([_with_member_keys(removed).select("label", "mkey"), prior.select("label", pl.col("retained").alias("mkey")).explode("mkey")])
        lost = previous.join(keyed, on=["label", "mkey"], how="anti").select("label").unique()  # a previous member is gone: verify in full
        prior = prior.join(lost, on="label", how="anti")
        keyed = keyed.drop("added").join(previous.with_columns(pl.lit(False).alias("added")), on=["label", "mkey"], how="left", maintain_order="left").with_columns(pl.col("added").fill_null(True))
    kept = prior.select("label", pl.col("retained").alias("mkey"), pl.col("texts").alias("text"), pl.lit(True).alias("kept")).explode(["mkey", "text"])
    marked = keyed.join(kept, on=["label", "mkey"], how="left", maintain_order="left")
    labels, added = marked["label"].to_numpy(), marked["added"].to_numpy()
    read = added | marked["kept"].is_not_null().to_numpy()  # the rows a replay reads
    new = np.r_[True, labels[1:] != labels[:-1]]
    cluster = np.cumsum(new) - 1
    # A cluster replays when it had members before (a record) and its first row to read is a
    # previously retained member: an added member processed before every previously retained one
    # is retained itself, so that cluster is verified in full at once (no second pass).
    at = np.flatnonzero(read)
    clusters_read, first = np.unique(cluster[at], return_index=True)
    first_added = np.ones(int(new.sum()), bool)
    first_added[clusters_read] = added[at[first]]
    rows = (~first_added & np.isin(labels[new], prior["label"].to_numpy()))[cluster]
    return todo.filter(pl.Series(~rows)), marked.filter(pl.Series(rows & read)).drop("mkey", "kept")


def _warm_clusters() -> None:
    """Load once per process what the plan and verify steps' Parquet list/string readers and
    polars' string, list and join kernels load lazily on first use (tiny tables, no work)."""
    import io  # noqa: PLC0415

    frame = pl.DataFrame(
        {"label": [1, 1], "node": [1, 2], "rank": [0, 1], "id": ["a", "b"], "chars": [2, 1], "added": [False, True]},
        schema={"label": pl.Int64, "node": pl.Int64, "rank": pl.Int32, "id": pl.String, "chars": pl.Int64, "added": pl.Boolean},
    )
    records = _member_sets(frame).with_columns(pl.lit(["0\x00a"]).alias("retained"), pl.lit(["a"], pl.List(pl.String)).alias("texts"))
    for table in (records.to_arrow().cast(CLUSTER_SCHEMA), VERDICT_SCHEMA.empty_table(), MEMBER_SCHEMA.empty_table()):
        buffer = io.BytesIO()
        pq.write_table(table, buffer, compression=storage.PARQUET_COMPRESSION)
        pq.ParquetFile(io.BytesIO(buffer.getvalue())).read()
    _replay_plan(frame, VerifyParams(0, 1, ("a", "b"), (), ("warm",), FuzzyDedupParams(), remap="warm"), set(), records)
    pc.is_in(pa.array([1], pa.int64()), pa.array([1], pa.int64()))


@shuffle.measured(warm=(_warm_clusters,))
def fuzzy_plan(inputs: list[str], output: str, params: VerifyParams) -> dict[str, Any]:
    """Request the text of every member of the clusters this run must verify, keyed by node."""
    return _with_fresh_previous_rows(_plan, inputs, output, params)


def _with_fresh_previous_rows(step: Any, inputs: list[str], output: str, params: VerifyParams) -> dict[str, Any]:
    """Run a plan or verify task with its own cache of the previous run's rows: cleared before and
    after, so a worker that runs many tasks never carries one task's rows into the next."""
    _PREVIOUS_ROWS.clear()
    try:
        return step(inputs, output, params)
    finally:
        _PREVIOUS_ROWS.clear()


def _plan(inputs: list[str], output: str, params: VerifyParams) -> dict[str, Any]:
    frame = _clusters(inputs, params.lo, params.hi, params.member_blocks)
    reuse, before = _reusable(frame, params, frame_only=True)
    full, replay = _replay_plan(frame, params, reuse, before, columns=("label", "rank", "id"))
    # The clusters verify reads batch by batch (as verify finds them: verified in full, not replayed)
    big = _streamed_labels(full, params)
    gathered = replay.filter(pl.col("text").is_null())  # a replay's texts that its record did not keep
    todo = pl.concat([full, gathered.select(full.columns)]) if gathered.height else full
    node = todo["node"].to_numpy()
    pos = todo.select(pl.int_range(pl.len()).over("label"))[:, 0].to_numpy() if todo.height else np.zeros(0, np.int64)
    big_rows = np.isin(todo["label"].to_numpy(), big) if todo.height else np.zeros(0, bool)
    requests = pa.table([pa.array(node.astype(np.int64)), pa.array(shuffle.hash_keys(todo["label"].to_numpy())), pa.array(pos.astype(np.int64)), pa.array(big_rows)], schema=REQUEST_SCHEMA)
    shuffle.write_blocks(requests, output, cuts=shuffle.read_cuts(params.request_cuts))  # one block per gather group's node ranges
    # Where the requested nodes lie (a few ranges): gather runs only on shards that overlap them.
    return {"requested_members": int(node.size), "requested_runs": node_runs(node, 64)}


def _streamed_labels(todo: pl.DataFrame, params: VerifyParams) -> np.ndarray:
    """Labels of the clusters (all members in ``todo``) with more text than ``stream_chars``:
    verified batch by batch, their texts read from storage (the others' at once)."""
    capped = todo.select("label", pl.col("chars").clip(upper_bound=params.rule.max_chars_per_doc).alias("c")).group_by("label").agg(pl.col("c").sum())
    return capped.filter(pl.col("c") > params.stream_chars)["label"].to_numpy()


def streamed_uri(gather_output: str) -> str:
    """A gather task's texts of big clusters (sorted by cluster and place, read batch by batch)."""
    return gather_output.removesuffix(".blocks") + ".streamed.parquet"


@dataclasses.dataclass(frozen=True)
class GatherParams:
    source: str
    first_node: int
    rows: int
    max_chars: int
    batch_chars: int = VERIFY_BATCH_CHARS
    runs: tuple[tuple[int, int], ...] = ()


@dataclasses.dataclass(frozen=True)
class GatherGroupParams:
    shards: tuple[GatherParams, ...]
    request_cuts: str  # the plan files are block files cut at these stored node cuts
    text_blocks: int  # verify partitions: one block of gathered texts each
    hold_chars: int = 1 << 30  # texts of small clusters held before they are written (a further block file, :func:`section_uri`)


@shuffle.measured
def fuzzy_gather_group(inputs: list[str], output: str, params: GatherGroupParams) -> dict[str, Any]:
    """The requested rows' text of a group of normalized shards (the inputs: normalized shard and
    node table per shard, then the plan files, whose blocks of the group's node ranges are read
    once for the whole group). The texts go to one block per verify partition, but those of big
    clusters, which go to :func:`streamed_uri` shard by shard, sorted by cluster and place (all
    that slice reads need). Memory holds one shard and about ``hold_chars`` of small clusters'
    texts: past that, the texts held so far go to a further block file (:func:`section_uri`)."""
    k = len(params.shards)
    plan_files = inputs[2 * k :]
    runs = [shard_runs(p.first_node, p.rows, p.runs) for p in params.shards]
    merged = _merge_runs([r for rs in runs for r in rs])
    requests = shuffle.read_ranges_blocks(plan_files, shuffle.read_cuts(params.request_cuts), merged, REQUEST_SCHEMA)
    keys = requests.column("key").to_numpy()
    gathered = shards = streamed = held = 0
    small: list[pa.Table] = []
    sections: list[str] = []
    with tempfile.TemporaryDirectory(prefix="dedup-gather-") as tmp:
        local = os.path.join(tmp, "texts.parquet")
        writer = None
        try:
            for j, shard in enumerate(params.shards):
                bounds = np.asarray(runs[j], np.int64).ravel()
                mine = requests.filter(pa.array((np.searchsorted(bounds, keys, side="right") % 2) == 1)) if keys.size else requests
                out = _gather_shard(inputs[2 * j], inputs[2 * j + 1], mine, shard)
                if out is None:
                    continue
                table, big = out[0].drop_columns(["big"]), out[0].column("big")
                gathered += table.num_rows
                shards += 1
                small.append(table.filter(pc.invert(big)))
                held += int(pc.sum(pc.binary_length(small[-1].column("text"))).as_py() or 0)
                if held > params.hold_chars and j < k - 1:
                    sections.append(section_uri(output, len(sections)))
                    shuffle.write_blocks(pa.concat_tables(small), sections[-1], cuts=shuffle.partition_cuts(params.text_blocks))
                    small, held = [], 0
                if pc.any(big).as_py():
                    writer = writer or pq.ParquetWriter(local, TEXT_SCHEMA, compression=storage.PARQUET_COMPRESSION)
                    writer.write_table(table.filter(big), row_group_size=out[1])
                    streamed += int(pc.sum(big.cast(pa.int64())).as_py())
        finally:
            if writer is not None:
                writer.close()
        if writer is not None:
            storage.put_file(local, streamed_uri(output))
    texts = pa.concat_tables(small) if small else TEXT_SCHEMA.empty_table()
    shuffle.write_blocks(texts, output, cuts=shuffle.partition_cuts(params.text_blocks))
    return {"gathered": gathered, "shard_read": shards, "streamed": streamed, "sections": sections}


def section_uri(gather_output: str, k: int) -> str:
    """A gather task's ``k``-th further block file of texts (written when it held ``hold_chars``)."""
    return gather_output.removesuffix(".blocks") + f".s{k:03d}.blocks"


def _merge_runs(runs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, disjoint ranges covering ``runs``."""
    out: list[list[int]] = []
    for lo, hi in sorted(runs):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi) for lo, hi in out]


def _gather_shard(normalized_uri: str, nodes_file: str, requests: pa.Table, params: GatherParams) -> tuple[pa.Table, int] | None:
    """Texts of one shard's requested rows, sorted by (cluster key, place), with their ``big``
    flag, and a row group size of about ``batch_chars``; None when the shard has no requested
    row (it is not read)."""
    nodes_table = None
    if requests.num_rows and params.runs:
        nodes_table = storage.read_parquet(nodes_file, columns=["id", "node"])
        requests = requests.filter(pa.array(np.isin(requests.column("key").to_numpy(), nodes_table.column("node").to_numpy())))
    if requests.num_rows == 0:
        return None
    node = requests.column("key").to_numpy()
    if nodes_table is not None:
        take = pa.array(_rows_of(nodes_table.column("node").to_numpy(), node))
    else:
        nodes_table = storage.read_parquet(nodes_file, columns=["id"])
        take = pa.array(node - params.first_node)
    table = storage.read_parquet(normalized_uri, columns=["id", "text"])
    ids = table.column("id").take(take).combine_chunks().cast(pa.string())
    expected = nodes_table.column("id").take(take).combine_chunks().cast(pa.string())
    if not ids.equals(expected):
        raise DedupError(f"source {params.source!r}: row order of its minhash buckets differs from {normalized_uri}; rematerialize minhash_buckets for {params.source!r}")
    texts = pc.utf8_slice_codeunits(pc.fill_null(table.column("text").take(take).combine_chunks().cast(pa.large_string()), ""), 0, params.max_chars)
    out = pa.table([requests.column("lkey"), requests.column("pos"), pa.array(node), texts, requests.column("big")], schema=TEXT_SCHEMA.append(pa.field("big", pa.bool_())))
    out = out.take(pc.sort_indices(out, sort_keys=[("key", "ascending"), ("pos", "ascending")]))
    mean_chars = max(1, int(pc.sum(pc.utf8_length(texts)).as_py() or 0) // max(1, out.num_rows))
    return out, min(shuffle.ROW_GROUP_ROWS, max(16, params.batch_chars // mean_chars))


def _warm_ngrams() -> None:
    """Load the compiled n-gram kernels (from numba's disk cache) once per process."""
    ngram_sets(["warm up the kernels"], 3, 100)


@shuffle.measured(warm=(_warm_ngrams, _warm_clusters))
def fuzzy_verify(inputs: list[str], output: str, params: VerifyParams) -> dict[str, Any]:
    """Verify the requested clusters of a label range; copy the previous verdict of the others."""
    return _with_fresh_previous_rows(_verify, inputs, output, params)


def _verify(inputs: list[str], output: str, params: VerifyParams) -> dict[str, Any]:
    member_files, text_files = inputs[: params.member_files], inputs[params.member_files :]
    text_files, streamed_files = text_files[: params.text_files], text_files[params.text_files :]
    frame = _clusters(member_files, params.lo, params.hi, params.member_blocks)
    sizes = _member_sets(frame)
    reuse, before_clusters = _reusable(frame, params, sizes)
    rows: list[tuple] = []  # this run's decisions (in VERDICT_SCHEMA order)
    retained: dict[int, tuple[list[str], list[str]]] = {}  # per cluster verified in full: retained member keys, and texts while few
    carried: list[pa.Table] = []  # the previous rows of reused and replayed clusters, as they were
    untouched = None
    untouched_labels: set[int] = set()
    if params.remap and before_clusters is not None:
        # Incremental components: every cluster of the range that no added document reached is
        # the previous one (same label, same members): its rows and record are carried over.
        remap = storage.read_parquet(params.remap, columns=["node", "label", "fresh"])
        changed = pc.and_(pc.invert(remap.column("fresh")), pc.not_equal(remap.column("node"), remap.column("label")))
        dead = set(remap.column("node").filter(changed).to_pylist()) | set(sizes["label"].to_list())
        hit = pl.col("label").is_in(list(dead))
        untouched = before_clusters.filter(~hit)
        before_clusters = before_clusters.filter(hit)
        untouched_labels = set(untouched["label"].to_list())
    todo, replay = _replay_plan(frame, params, reuse, before_clusters)
    # Clusters with more text than stream_chars are read batch by batch (in processing order)
    # from the streamed files; the texts of all others at once, from this range's blocks (the
    # range is sized to hold them).
    big = set(shuffle.hash_keys(_streamed_labels(todo, params)).tolist())
    part = shuffle.read_ranges_blocks(text_files, shuffle.partition_cuts(params.text_blocks), [(params.lo, params.hi)], TEXT_SCHEMA)
    text_of: dict[int, str] = dict(zip(part.column("node").to_pylist(), part.column("text").to_pylist()))
    excerpts: dict[int, str] = {}  # retained members' excerpts, for the examples
    counters = {"clusters": 0, "verified_clusters": 0, "reused_clusters": len(reuse) + len(untouched_labels), "verified_members": 0, "streamed_clusters": 0, "comparisons": 0, "exempt_kept": 0, "largest_cluster": 0}
    examples: list[tuple[int, dict[str, Any]]] = []
    exempt = {params.sources.index(s) for s in params.exempt if s in params.sources}
    replayed, failed = _replay(replay, params, text_of, exempt, rows, examples)
    if reuse | untouched_labels | replayed:
        carried.append(_previous_rows(params, reuse | untouched_labels | replayed).select(VERDICT_SCHEMA.names).cast(VERDICT_SCHEMA))
    counters["replayed_clusters"], counters["replay_failed"] = len(replayed), len(failed)
    if todo.height:
        labels = todo["label"].to_numpy()
        starts = np.flatnonzero(np.r_[True, labels[1:] != labels[:-1]])
        ends = np.append(starts[1:], labels.size)
        ids, ranks, chars, nodes = todo["id"].to_list(), todo["rank"].to_list(), todo["chars"].to_list(), todo["node"].to_list()
        cluster_keys = shuffle.hash_keys(labels[starts]).tolist() if starts.size else []
        for s, e, ckey in zip(starts.tolist(), ends.tolist(), cluster_keys):
            counters["verified_clusters"] += 1
            counters["verified_members"] += e - s
            streamed = ckey in big
            counters["streamed_clusters"] += int(streamed)
            verifier = GreedyVerifier(params.rule)
            kept, kept_texts = retained[int(labels[s])] = ([], [])
            kept_chars = 0
            chunk_start = s
            while chunk_start < e:  # n-grams of about VERIFY_BATCH_CHARS at a time, in order
                chunk_end, size = chunk_start, 0
                while chunk_end < e and (chunk_end == chunk_start or size < params.batch_chars):
                    size += min(chars[chunk_end], params.rule.max_chars_per_doc)
                    chunk_end += 1
                if streamed:
                    texts = _read_batch(streamed_files, ckey, chunk_start - s, chunk_end - s, nodes[chunk_start:chunk_end])
                else:
                    texts = [text_of.get(nodes[i]) for i in range(chunk_start, chunk_end)]
                if any(t is None for t in texts):
                    raise DedupError(f"cluster {ids[s]}: member text missing from the gathered shards; rerun fuzzy_duplicates")
                grams = ngram_sets(texts, params.rule.ngram_size, params.rule.max_chars_per_doc)
                for k, i in enumerate(range(chunk_start, chunk_end)):
                    removal = verifier.offer(i, chars[i], grams[k], ranks[i] in exempt)
                    if removal is None:
                        excerpts[i] = texts[k][: params.excerpt_chars]
                        kept.append(_member_key(ranks[i], ids[i]))
                        kept_chars += len(texts[k])
                        if len(kept) * HEAD_TEXT_SHARE <= e - s and kept_chars <= params.batch_chars:  # else the record keeps no texts
                            kept_texts.append(texts[k])
                        continue
                    r = removal.representative
                    rows.append((0, ranks[i], ids[i], int(labels[s]), ids[s], ids[r], params.sources[ranks[r]], removal.containment, removal.jaccard, chars[i]))
                    _offer_example(examples, params, params.sources[ranks[i]], ids[i], params.sources[ranks[r]], ids[r], removal, texts[k], excerpts[r])
                chunk_start = chunk_end
            counters["comparisons"] += verifier.comparisons
            counters["exempt_kept"] += verifier.exempt_kept
    records = _records(sizes, retained, before_clusters, reuse | replayed, failed)
    if untouched is not None and untouched.height:
        records = pl.concat([records, untouched.select(CLUSTER_SCHEMA.names)], how="vertical_relaxed")
    counters["clusters"] = records.height
    counters["clustered_docs"] = int(records["size"].sum() or 0) if records.height else 0
    counters["largest_cluster"] = int(records["size"].max() or 0) if records.height else 0
    histogram: dict[str, int] = {}
    for size in records["size"].to_list():
        histogram[size_bin(size)] = histogram.get(size_bin(size), 0) + 1
    storage.write_parquet(records.to_arrow().cast(CLUSTER_SCHEMA), clusters_uri(output))
    columns = list(zip(*rows)) if rows else [[] for _ in VERDICT_SCHEMA]
    verdict = pa.table([pa.array(list(c), type=f.type) for c, f in zip(columns, VERDICT_SCHEMA)], schema=VERDICT_SCHEMA)
    changes = None  # no previous run: every source's rows are new
    if before_clusters is not None:
        # Carried rows are the previous ones: the change is this run's rows against the previous
        # rows of the clusters it decided again (or that are gone).
        now = row_sums(verdict)
        before = row_sums(_previous_rows(params, set(before_clusters["label"].to_list()) - reuse - replayed))
        changes = {str(r): (now.get(r, 0) - before.get(r, 0)) % (1 << 128) for r in now.keys() | before.keys()}
    if carried:
        verdict = pa.concat_tables([verdict, *carried]).combine_chunks()
    verdict = verdict.set_column(0, "key", pa.array(shuffle.prefix_keys(verdict.column("id"))))
    # Keyed by id, in blocks of equal ranges: a removals task (there are at most as many as verify
    # partitions) reads only the blocks of its id range.
    shuffle.write_keyed(verdict, output, params.text_blocks)
    by_rank = pl.from_arrow(verdict.select(["rank", "chars"])).group_by("rank").agg(pl.len().alias("n"), pl.col("chars").sum().alias("c"))
    return counters | {
        "histogram": histogram,
        "removed_by_rank": {str(r): int(n) for r, n in zip(by_rank["rank"].to_list(), by_rank["n"].to_list())},
        "removed_chars_by_rank": {str(r): int(c) for r, c in zip(by_rank["rank"].to_list(), by_rank["c"].to_list())},
        "examples": [e for _, e in sorted(examples, key=lambda kv: -kv[0])],
        "row_changes": changes,
    }


def _records(sizes: pl.DataFrame, retained: Mapping[int, tuple[list[str], list[str]]], before: pl.DataFrame | None, carried: set[int], failed: set[int]) -> pl.DataFrame:
    """The cluster records of this run's clusters: retained keys (and texts, where every retained
    member's was kept) as verified now, or the previous ones where the previous decisions stand
    (reused, replayed). A cluster whose replay failed gets no digest and no retained keys: the
    second pass verifies it in full."""
    texts = [t if len(t) == len(k) else [None] * len(k) for k, t in retained.values()]
    fresh = pl.DataFrame(
        {"label": list(retained), "retained": [k for k, _ in retained.values()], "texts": texts},
        schema={"label": pl.Int64, "retained": pl.List(pl.String), "texts": pl.List(pl.String)},
    )
    if before is not None and carried:
        fresh = pl.concat([fresh, before.filter(pl.col("label").is_in(list(carried))).select("label", "retained", "texts")])
    records = sizes.join(fresh, on="label", how="left", maintain_order="left")
    if failed:
        gone = pl.col("label").is_in(list(failed))
        records = records.with_columns(
            pl.when(gone).then(pl.lit("")).otherwise(pl.col("members")).alias("members"),
            *(pl.when(gone).then(None).otherwise(pl.col(c)).alias(c) for c in ("retained", "texts")),
        )
    return records


def _replay(replay: pl.DataFrame, params: VerifyParams, text_of: Mapping[int, str], exempt: set[int], rows: list, examples: list) -> tuple[set[int], set[int]]:
    """Clusters that only gained members: the previous decisions stand while every added member
    is removed by the previous run's retained members before it (removed members never
    represent, so no other decision can change). ``replay`` holds, per cluster, the retained and
    the added members in processing order. Appends the added members' rows (the previous ones
    stand); returns the replayed labels and the failed ones (an added member is retained, or a
    retained one removed: verify in full)."""
    replayed: set[int] = set()
    failed: set[int] = set()
    if not replay.height:
        return replayed, failed
    labels = replay["label"].to_numpy()
    starts = np.flatnonzero(np.r_[True, labels[1:] != labels[:-1]])
    ends = np.append(starts[1:], labels.size)
    ids, ranks, chars, nodes, added, kept = (replay[c].to_list() for c in ("id", "rank", "chars", "node", "added", "text"))
    for s, e in zip(starts.tolist(), ends.tolist()):
        label = int(labels[s])
        texts = [kept[i] if kept[i] is not None else text_of.get(nodes[i]) for i in range(s, e)]
        if any(t is None for t in texts):
            raise DedupError(f"cluster {ids[s]}: member text missing from the gathered shards; rerun fuzzy_duplicates")
        grams = ngram_sets(texts, params.rule.ngram_size, params.rule.max_chars_per_doc)
        verifier = GreedyVerifier(params.rule)
        new_rows, new_examples, ok = [], [], True
        for k, i in enumerate(range(s, e)):
            removal = verifier.offer(i, chars[i], grams[k], ranks[i] in exempt)
            if (removal is None) == added[i]:  # an added member retained, or a retained one removed
                ok = False
                break
            if removal is not None:
                r = removal.representative
                new_rows.append((0, ranks[i], ids[i], label, ids[s], ids[r], params.sources[ranks[r]], removal.containment, removal.jaccard, chars[i]))
                new_examples.append((params.sources[ranks[i]], ids[i], params.sources[ranks[r]], ids[r], removal, texts[k], texts[r - s][: params.excerpt_chars]))
        if not ok:
            failed.add(label)
            continue
        replayed.add(label)
        rows.extend(new_rows)
        for example in new_examples:
            _offer_example(examples, params, *example)
    return replayed, failed


def _read_batch(text_files: Sequence[str], key: int, lo: int, hi: int, nodes: Sequence[int]) -> list[str | None]:
    """Texts of members ``lo <= pos < hi`` of the cluster keyed ``key``, in processing order."""
    table = shuffle.read_slice(text_files, key, "pos", lo, hi, ["node", "text"])
    text_of = dict(zip(table.column("node").to_pylist(), table.column("text").to_pylist()))
    return [text_of.get(n) for n in nodes]


def _offer_example(heap: list, params: VerifyParams, source: str, doc: str, rep_source: str, rep: str, removal: Any, text: str, rep_text: str) -> None:
    """Keep the removals with the smallest hash of (source, id): a stable sample."""
    if not params.num_examples:
        return
    key = xxhash.xxh3_64_intdigest(f"{source}\x00{doc}".encode())
    entry = {
        "source": source,
        "id": doc,
        "representative_source": rep_source,
        "representative_id": rep,
        "containment": round(removal.containment, 4),
        "jaccard": round(removal.jaccard, 4),
        "excerpt": text[: params.excerpt_chars],
        "representative_excerpt": rep_text[: params.excerpt_chars],
        "_key": key,
    }
    if len(heap) < params.num_examples:
        heapq.heappush(heap, (-key, entry))
    elif -heap[0][0] > key:
        heapq.heapreplace(heap, (-key, entry))


# --------------------------------------------------------------------------- 8. removals and publish

PART_SCHEMA = pa.schema([(f.name, f.type) for f in VERDICT_SCHEMA if f.name not in ("key", "label", "chars")])


@dataclasses.dataclass(frozen=True)
class RemovalParams:
    lo: int
    hi: int
    ranks: tuple[int, ...] | None = None  # only these sources' rows (the others keep their files); None: all


@shuffle.measured
def fuzzy_removals(inputs: list[str], output: str, params: RemovalParams) -> dict[str, Any]:
    table = shuffle.read_range(inputs, params.lo, params.hi, PART_SCHEMA.names, VERDICT_SCHEMA).select(PART_SCHEMA.names)
    if params.ranks is not None:
        table = table.filter(pc.is_in(table.column("rank"), pa.array(params.ranks, pa.int32())))
    if table.num_rows:
        table = table.take(pc.sort_indices(table, sort_keys=[("rank", "ascending"), ("id", "ascending")]))
    shuffle.write_sorted_by_rank(table, output)
    return {"removed": table.num_rows}


@dataclasses.dataclass(frozen=True)
class PublishParams:
    ranks: tuple[int, ...]  # a group of sources, published by one task
    outputs: tuple[str, ...]
    keep: tuple[dict[str, Any] | None, ...]  # per source: the previous run's file and counts, when its removals did not move


def _to_fuzzy(table: pa.Table) -> pa.Table:
    return table.select(FUZZY_SCHEMA.names).cast(FUZZY_SCHEMA)


@shuffle.measured
def fuzzy_publish(inputs: list[str], output: str, params: PublishParams) -> dict[str, Any]:
    """A group of sources' removal files from the id-range parts, each part read once for the
    group; a source whose removals did not move since the previous run gets a byte copy of its
    previous file (the same rows give the same bytes). ``output`` names the group; the counts per
    source are the task's result."""
    built = [k for k, keep in enumerate(params.keep) if keep is None]
    made = shuffle.publish_removals(inputs, [params.ranks[k] for k in built], [params.outputs[k] for k in built], FUZZY_SCHEMA, _to_fuzzy) if built else []
    sources = dict(zip(built, (m | {"copied": 0} for m in made)))
    for k, keep in enumerate(params.keep):
        if keep is not None:
            shuffle.copy_file(keep["uri"], params.outputs[k])
            sources[k] = {"removed": int(keep["removed"]), "digest": str(keep["digest"]), "copied": 1}
    return {"sources": [sources[k] for k in range(len(params.ranks))]}


# --------------------------------------------------------------------------- the driver


SCRATCH_STEPS = ("edges", "cc", "delta", "members", "plan", "gather", "removals", "publish")


def collect_scratch(work: str, cache: str, current: Mapping[str, str], superseded: Mapping[str, str]) -> list[str]:
    """After a successful publish, remove the scratch no later run reads: every step's shuffle
    files except the verify outputs and the label files (the next incremental run copies
    verdicts from the one and merges components over the other), and
    the cached map outputs the previous run used that this run replaced (``superseded`` and
    ``current``: the entry per source; the current ones are the stored index the next run
    joins a changed source against). Entries of other runs are left alone. Returns what was
    removed."""
    removed = []
    for step in SCRATCH_STEPS:
        uri = storage.join(work, step)
        if storage.exists(uri):
            storage.remove(uri, recursive=True)
            removed.append(uri)
    for source, name in sorted(superseded.items()):
        uri = storage.join(cache, source, name)
        if name != current.get(source) and storage.exists(uri):
            storage.remove(uri, recursive=True)
            removed.append(uri)
    return removed


def _verify_partitions(members: int, member_chars: int, scale: FuzzyScale) -> int:
    """Plan and verify tasks: a power of two of label ranges, each of at most about
    ``members_per_partition`` members and ``member_chars_per_partition`` characters."""
    wanted = max(shuffle.partitions_for(members, scale.members_per_partition), shuffle.partitions_for(member_chars, scale.member_chars_per_partition))
    return 1 << max(0, (wanted - 1).bit_length())


def step_costs(results: Sequence[ShardResult]) -> dict[str, dict[str, float]]:
    """Per step (the task output's folder): tasks, CPU seconds of the tasks run now, peak RSS."""
    out: dict[str, dict[str, float]] = {}
    for r in results:
        parts = r.output.rstrip("/").split("/")
        if "cc" in parts or parts[-2] in ("labels", "delta"):
            step = "components"
        elif parts[-2] in ("edges", "members", "plan", "gather", "verify", "removals", "publish"):
            step = parts[-2]
        else:
            step = "map"
        entry = out.setdefault(step, {"tasks": 0, "cpu_s": 0.0, "max_rss_kb": 0})
        entry["tasks"] += 1
        entry["cpu_s"] = round(entry["cpu_s"] + (0.0 if r.reused else float(r.stats.get("cpu_s", 0))), 3)
        entry["max_rss_kb"] = max(entry["max_rss_kb"], int(r.stats.get("rss_kb", 0)))
    return out


def _source_fingerprint(uris: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(sorted(uris)).encode()).hexdigest()[:16]


def _pair(buckets: Mapping[str, Sequence[str]], normalized: Mapping[str, Sequence[str]]) -> dict[str, list[tuple[str, str, int]]]:
    """Per source: (bucket shard, normalized shard, rows) in basename order."""
    if set(buckets) != set(normalized):
        missing = sorted(set(buckets) ^ set(normalized))
        raise DedupError(
            f"sources {missing} have minhash buckets or normalized shards but not both; "
            "materialize minhash_buckets for every normalized source (or drop the source from both)"
        )
    out: dict[str, list[tuple[str, str, int]]] = {}
    for source in sorted(buckets):
        b = {storage.basename(u): u for u in buckets[source]}
        n = {storage.basename(u): u for u in normalized[source]}
        if set(b) != set(n):
            odd = sorted(set(b) ^ set(n))
            raise DedupError(
                f"source {source!r}: minhash_buckets and normalized are not co-partitioned (shards {odd} "
                f"are on one side only); rematerialize minhash_buckets for {source!r}"
            )
        out[source] = [(b[name], n[name], storage.parquet_num_rows(b[name])) for name in sorted(b)]
    return out


def find_fuzzy_duplicates(
    buckets: Mapping[str, Sequence[str]],
    normalized: Mapping[str, Sequence[str]],
    exempt: Collection[str],
    out_dir_uri: str,
    params: FuzzyDedupParams = FuzzyDedupParams(),
    *,
    scale: FuzzyScale = FuzzyScale(),
    runner: ShardRunner | None = None,
    cache_uri: str | None = None,
    fingerprints: Mapping[str, str] | None = None,
    previous_uri: str | None = None,
    num_examples: int = 5,
    excerpt_chars: int = 240,
) -> dict[str, Any]:
    """Candidate clusters from shared buckets, verified; writes one removal list per source.

    A cluster is processed longest first, ties by source name then id; its ``cluster_id`` is
    the id of that first member, which is always kept. Removed rows: ``id``, ``cluster_id``,
    ``representative_id``, ``representative_source``, ``containment`` and ``jaccard``.

    Incremental: ``cache_uri`` keeps each source's map output under its ``fingerprints`` entry
    (default: a hash of its shard URIs), and ``previous_uri`` (an earlier output of this
    function over the same sources) lends the verdicts of the clusters no changed source
    touches. Without them, or when the sources or task sizes differ, everything is verified;
    the removals are the same either way.
    """
    runner = runner or ShardRunner()
    shards = _pair(buckets, normalized)
    sources = tuple(shards)
    rank = {s: i for i, s in enumerate(sources)}
    fps = {s: (fingerprints or {}).get(s) or _source_fingerprint([b for b, _, _ in shards[s]]) for s in sources}
    before = None
    if previous_uri and storage.exists(storage.join(previous_uri, STATE_FILE)):
        before = storage.read_json(storage.join(previous_uri, STATE_FILE))
    if before is not None and (before.get("layout") != LAYOUT or any(k not in before for k in ("slots", "fingerprints", "next_row", "node_tables"))):
        before = None  # written by an older version: a full run (the answer is the same)
    # Slots: an unchanged source keeps its slot (node numbers). A changed one keeps its slot too,
    # and each document it still has (same id, same buckets) keeps its node; added documents get
    # nodes past the source's ``next_row``. A new source gets a fresh slot.
    old_slots = {s: int(v) for s, v in (before or {}).get("slots", {}).items()}
    next_slot = max(old_slots.values(), default=-1) + 1
    slot: dict[str, int] = {}
    added_base: dict[str, int] = {}  # changed sources that keep their nodes: first added row
    rows_of = {s: sum(rows for _, _, rows in shards[s]) for s in sources}
    next_row: dict[str, int] = {}
    for source in sources:
        if before is None:
            slot[source], next_row[source] = rank[source], rows_of[source]
        elif source in old_slots and before["fingerprints"].get(source) == fps[source]:
            slot[source], next_row[source] = old_slots[source], int(before["next_row"][source])
        elif source in old_slots and int(before["next_row"][source]) + rows_of[source] < 1 << RANK_SHIFT:
            slot[source], added_base[source] = old_slots[source], int(before["next_row"][source])
            next_row[source] = added_base[source] + rows_of[source]
        else:
            slot[source], next_slot = next_slot, next_slot + 1
            next_row[source] = rows_of[source]
    if max(slot.values(), default=0) >= 1 << (63 - RANK_SHIFT):
        slot = {s: rank[s] for s in sources}  # slots exhausted: renumber (this run verifies everything)
        next_row, added_base, before = dict(rows_of), {}, None
    work = storage.join(out_dir_uri, "_work")
    cache = cache_uri or storage.join(work, "cache")
    exempt_t = tuple(sorted(set(exempt) & set(sources)))
    results: list[ShardResult] = []

    def run(tasks: list[ShardTask]) -> list[ShardResult]:
        done = runner.map(tasks)
        results.extend(done)
        return done

    # 1. map
    group_dirs: dict[str, str] = {}
    map_tasks: list[ShardTask] = []
    shard_plan: list[tuple[str, str, str, int, int, int, int]] = []  # (source, normalized shard, node table, first node, rows, map task, shard in group)
    node_tables: dict[str, dict[str, str]] = {}
    lost_shards = False  # a changed source lost a shard name: its documents there are gone
    renumbered = False  # an unchanged source's stored index is gone: its nodes may differ from the previous run's
    maps = sum(-(-len(shards[s]) // scale.shards_per_map) for s in sources)
    for source in sources:
        base = 0
        entry = f"{fps[source]}-s{slot[source]}-g{scale.shards_per_map}-n{LAYOUT}"  # node tables with node numbers and bucket digests
        if before is not None and source not in added_base and before["fingerprints"].get(source) == fps[source]:
            kept_entry = before.get("cache_entries", {}).get(source)
            if kept_entry and storage.exists(storage.join(cache, source, kept_entry)):
                entry = kept_entry  # the stored index of an unchanged source, with its node numbers
            else:
                renumbered = True
        previous_tables: Mapping[str, str] = {}
        if source in added_base:
            previous_tables = before["node_tables"].get(source, {})
            lost_shards |= bool(set(previous_tables) - {storage.basename(b) for b, _, _ in shards[source]})
            entry += "-k" + hashlib.sha256(json.dumps([added_base[source], sorted(previous_tables.items())]).encode()).hexdigest()[:12]
        group_dir = group_dirs[source] = storage.join(cache, source, entry)
        node_tables[source] = {}
        for g in range(0, len(shards[source]), scale.shards_per_map):
            group = shards[source][g : g + scale.shards_per_map]
            out = storage.join(group_dir, f"group-{g // scale.shards_per_map:05d}.blocks")
            bases = []
            for k, (b_uri, n_uri, rows) in enumerate(group):
                bases.append(base)
                shard_plan.append((source, n_uri, nodes_uri(out, k), (slot[source] << RANK_SHIFT) + base, rows, len(map_tasks), k))
                node_tables[source][storage.basename(b_uri)] = nodes_uri(out, k)
                base += rows
            previous = tuple(previous_tables.get(storage.basename(b_uri), "") for b_uri, _, _ in group) if source in added_base else ()
            params_k = MapParams(source, slot[source], tuple(bases), previous, added_base.get(source, -1), maps, scale.records_per_partition)
            map_tasks.append(ShardTask(fuzzy_map, tuple(u for b_uri, n_uri, _ in group for u in (b_uri, n_uri)), out, params_k))
        if base >= 1 << RANK_SHIFT:
            raise DedupError(f"source {source!r} has {base} documents, more than the {1 << RANK_SHIFT} a node number holds; split the source")
    mapped = run(map_tasks)
    bands = {r.stats["bands"] for r in mapped if r.stats["bands"]}
    if len(bands) > 1:
        odd = [(t.params.source, t.inputs[0]) for t, r in zip(map_tasks, mapped) if r.stats["bands"] and r.stats["bands"] != min(bands)]
        raise DedupError(f"minhash buckets have {sorted(bands)} bands per document across shards (e.g. {odd[:3]}); rematerialize minhash_buckets of every source with the same MinHashParams")
    docs_per_source = {s: 0 for s in sources}
    chars_per_source = {s: 0 for s in sources}
    for t, r in zip(map_tasks, mapped):
        docs_per_source[t.params.source] += int(r.stats["docs"])
        chars_per_source[t.params.source] += int(r.stats["chars"])
    shard_list = []  # (source, normalized shard, node table, first node, rows, node ranges)
    for source, n_uri, nodes, first, rows, m, k in shard_plan:
        runs = mapped[m].stats.get("runs")
        shard_list.append((source, n_uri, nodes, first, rows, tuple(tuple(r) for r in runs[k]) if runs else ()))
    # Groups of shards_per_map shards: one members task (and, full, one gather task) each. The
    # steps keyed by node (labels, requests) write one block per cut of the groups' node ranges,
    # so each group reads exactly its rows from every file (not a row group of each).
    shard_groups = [list(range(g, min(g + scale.shards_per_map, len(shard_list)))) for g in range(0, len(shard_list), scale.shards_per_map)]
    group_runs = [_merge_runs([r for i in idx for r in shard_runs(*shard_list[i][3:6])]) for idx in shard_groups]
    node_cuts = storage.join(work, "members", "node_cuts.bin")
    shuffle.write_cuts(node_cuts, sorted({0, shuffle.KEY_SPACE} | {x for runs in group_runs for run_ in runs for x in run_}))

    # Incremental: the previous run's state says which sources changed.
    state: dict[str, Any] = {"layout": LAYOUT, "sources": list(sources), "fingerprints": fps, "slots": slot, "next_row": next_row, "node_tables": node_tables}
    state |= {"rule": dataclasses.asdict(params), "exempt": list(exempt_t), "cache_entries": {s: storage.basename(group_dirs[s]) for s in sources}}
    changed: list[str] | None = None
    usable = before is not None and all(storage.exists(clusters_uri(f)) for f in before.get("verify_files", [None]) if f)
    if usable and all(before.get(k) == state[k] for k in ("sources", "rule", "exempt")):
        changed = [s for s in sources if before["fingerprints"].get(s) != fps[s]]
    # Incremental components: every changed source kept its nodes and lost no document (same
    # id, same buckets), so the previous components stay whole and only merge.
    gone_files = tuple(gone_uri(t.output) for t in map_tasks if t.params.source in added_base)
    incremental = (
        changed is not None
        and set(changed) <= set(added_base)
        and not lost_shards
        and not renumbered
        and bool(before.get("label_files"))
        and all(storage.exists(f) for f in before["label_files"])
        and all(storage.exists(added_uri(t.output)) for t in map_tasks if t.params.source in added_base)
    )
    records = sum(int(r.stats["records"]) for r in mapped)
    edge_parts = shuffle.pow2_partitions(records, scale.records_per_partition)
    bounds_e = shuffle.partition_bounds(edge_parts)
    cc_stats: dict[str, Any]
    label_rows: list[int | None] = []
    if incremental:
        # 2. edges of the buckets an added document is in; 3. merge the previous components over them
        added_ranges = tuple(((slot[s] << RANK_SHIFT) + added_base[s], (slot[s] << RANK_SHIFT) + next_row[s]) for s in changed)
        # 2a. the records of the buckets an added document is in: whole map files scanned once
        # (a few per task), per key range of the added records
        added_files = tuple(added_uri(t.output) for t in map_tasks if t.params.source in added_base)
        added_records = sum(int(r.stats.get("added_records", 0)) for r in mapped)
        hit_ranges = shuffle.partition_bounds(shuffle.partitions_for(added_records, scale.records_per_partition))
        chunks: list[list[str]] = [[]]
        size = 0
        for r in mapped:
            if chunks[-1] and size + int(r.stats["records"]) > scale.scan_records_per_task:
                chunks.append([])
                size = 0
            chunks[-1].append(r.output)
            size += int(r.stats["records"])
        hits = run(
            [
                ShardTask(fuzzy_bucket_hits, (*added_files, *chunk), storage.join(work, "edges", f"hits-{p:05d}-{c:06d}.parquet"), HitsParams(lo, hi, len(added_files)))
                for p, (lo, hi) in enumerate(hit_ranges)
                for c, chunk in enumerate(chunks)
            ]
        )
        hit_parts = shuffle.partitions_for(sum(int(r.stats["hits"]) for r in hits), scale.records_per_partition)
        edge_results = run(
            [
                ShardTask(fuzzy_edges_added, tuple(r.output for r in hits), storage.join(work, "edges", "added-" + storage.shard_name(p, hit_parts)), AddedParams(lo, hi, added_ranges))
                for p, (lo, hi) in enumerate(shuffle.partition_bounds(hit_parts))
            ]
        )
        edges = sum(int(r.stats["edges"]) for r in edge_results)
        incremental = edges <= scale.merge_max_edges  # else: components over every edge
    if incremental:
        fresh_labels = storage.join(work, "labels", "fresh.parquet")
        merge_inputs = (*(r.output for r in edge_results), *gone_files, *before["label_files"])
        (merged,) = run([ShardTask(fuzzy_merge_labels, merge_inputs, storage.join(work, "cc", "remap.parquet"), MergeParams(len(edge_results), len(gone_files), fresh_labels))])
        incremental = int(merged.stats["split"]) == 0  # else: a cluster lost a member, components over every edge
    if incremental:
        old_labels = list(before["label_files"])
        old_rows = list(before.get("label_rows") or [])
        old_rows = old_rows if len(old_rows) == len(old_labels) else [None] * len(old_labels)
        # the same format as the previous file: one whose labels did not move is a byte copy
        relabelled_files = [storage.join(work, "labels", f"{i:06d}" + (shuffle.BLOCK_SUFFIX if old.endswith(shuffle.BLOCK_SUFFIX) else ".parquet")) for i, old in enumerate(old_labels)]
        fresh_count = int(merged.stats["fresh"])
        # Compaction: while the last label file is a small one of earlier fresh labels, this run's
        # fresh labels join it, so incremental runs do not add a label file each.
        append = bool(old_rows) and old_rows[-1] is not None and int(old_rows[-1]) + fresh_count <= scale.members_per_partition
        if append:
            label_files, label_rows = relabelled_files, [*old_rows[:-1], int(old_rows[-1]) + fresh_count]
        else:
            label_files, label_rows = relabelled_files + [fresh_labels], [*old_rows, fresh_count]
        # One task per RELABEL_FILES previous label files; each writes one file of touched rows.
        # The last one also reads the fresh labels (their touched rows; appended when compacting).
        starts = list(range(0, max(1, len(old_labels)), RELABEL_FILES))
        relabelled = run(
            [
                ShardTask(
                    fuzzy_relabel,
                    (merged.output, *old_labels[i : i + RELABEL_FILES], *([fresh_labels] if i == starts[-1] else [])),
                    storage.join(work, "delta", f"{i // RELABEL_FILES:06d}.blocks"),
                    RelabelParams(tuple(relabelled_files[i : i + RELABEL_FILES]), append_fresh=append and i == starts[-1], delta_cuts=node_cuts),
                )
                for i in starts
            ]
        )
        member_label_files = [r.output for r in relabelled]
        if append and storage.exists(fresh_labels):
            storage.remove(fresh_labels)  # its rows are in the last label file now
        cc_stats = {"cc_method": "incremental", "cc_rounds": 0, "touched_clusters": int(merged.stats["touched"])}
    else:
        # 2. edges
        edge_results = run(
            [
                ShardTask(fuzzy_edges, tuple(r.output for r in mapped), storage.join(work, "edges", shuffle.block_name(p, edge_parts)), RangeParams(lo, hi, edge_parts, scale.edges_per_task))
                for p, (lo, hi) in enumerate(bounds_e)
            ]
        )
        edges = sum(int(r.stats["edges"]) for r in edge_results)
        # 3. components
        label_files, cc_stats = connected_components(
            [r.output for r in edge_results],
            edges,
            work,
            runner,
            union_find_max_edges=scale.union_find_max_edges,
            edges_per_task=scale.edges_per_task,
            labels_dir=storage.join(work, "labels"),
            label_cuts=node_cuts,
        )
        labelled = sum(int(r.stats.get("nodes", 0)) for r in cc_stats["cc_results"])  # = the clustered documents
        results.extend(cc_stats.pop("cc_results"))
        member_label_files = label_files
    state["label_files"] = list(label_files)
    state["label_rows"] = label_rows if incremental else [None] * len(label_files)  # rows per label file where known (compaction)

    # 4. members (incremental: of the touched clusters only), one task per group of shards. The
    # member files hold one block per verify partition: incremental, the count is known now (the
    # previous totals); full, from the clustered documents at the corpus' mean length (a finer
    # verify partitioning, when the members' text is longer, reads its covering block and filters).
    if incremental:
        docs_before = int(before.get("clustered_docs", 0))
        estimate = docs_before + int(merged.stats["fresh"])
        member_blocks = _verify_partitions(estimate, int(before.get("member_chars", 0)) * estimate // max(1, docs_before), scale)
    else:
        mean_chars = sum(chars_per_source.values()) // max(1, sum(docs_per_source.values()))
        member_blocks = _verify_partitions(labelled, labelled * mean_chars, scale)
    members = run(
        [
            ShardTask(
                fuzzy_members_group,
                (*(shard_list[i][2] for i in idx), *member_label_files),
                storage.join(work, "members", f"g{m:06d}.blocks"),
                GroupParams(
                    tuple(ShardParams(shard_list[i][0], shard_list[i][3], shard_list[i][4], rank[shard_list[i][0]], shard_list[i][5]) for i in idx),
                    node_cuts,
                    member_blocks,
                    delta=incremental,
                ),
            )
            for m, idx in enumerate(shard_groups)
        ]
    )
    in_clusters = sum(int(r.stats["members"]) for r in members)
    member_chars = sum(int(r.stats["member_chars"]) for r in members)
    if incremental:
        # The members read were the touched clusters': the totals are the previous ones plus the
        # newly clustered documents (their characters at the previous mean).
        docs_before = int(before.get("clustered_docs", 0))
        in_clusters = docs_before + int(merged.stats["fresh"])
        member_chars = int(before.get("member_chars", 0)) * in_clusters // max(1, docs_before)
    verify_parts = _verify_partitions(in_clusters, member_chars, scale)
    state["clustered_docs"], state["member_chars"] = in_clusters, member_chars
    state["verify_partitions"] = verify_parts
    bounds = shuffle.partition_bounds(verify_parts)
    previous_files: list[tuple[str, ...]] = [()] * verify_parts
    if changed is not None:
        old_bounds = shuffle.partition_bounds(int(before["verify_partitions"]))
        # Each label range reads the previous outputs whose ranges overlap it (counts may differ).
        previous_files = [tuple(f for f, (a, b) in zip(before["verify_files"], old_bounds) if a < hi and lo < b) for lo, hi in bounds]
    member_files = tuple(r.output for r in members)
    remap_uri = merged.output if incremental else ""

    def verify_params(p: int, lo: int, hi: int) -> VerifyParams:
        return VerifyParams(
            lo,
            hi,
            sources,
            exempt_t,
            previous_files[p],
            params,
            num_examples,
            excerpt_chars,
            stream_chars=scale.cluster_chars_in_memory,
            batch_chars=scale.verify_batch_chars,
            remap=remap_uri,
            member_blocks=member_blocks,
            request_cuts=node_cuts,
            text_blocks=verify_parts,
        )

    plan_parts = verify_parts
    if incremental:
        touched_members = sum(int(r.stats["members"]) for r in members)
        plan_parts = min(verify_parts, 1 << max(0, (shuffle.partitions_for(touched_members, scale.members_per_partition) - 1).bit_length()))

    # 5. plan, 6. gather, 7. verify
    def verify_pass(prefix: str, previous: Sequence[tuple[str, ...]], replay: bool) -> tuple[list[ShardResult], list[ShardResult]]:
        def vp(p: int, lo: int, hi: int) -> VerifyParams:
            return dataclasses.replace(verify_params(p, lo, hi), previous=previous[p], replay=replay)

        # Incremental: the member files hold the touched clusters only, so a plan task covers
        # several consecutive label ranges (members_per_partition touched members each).
        spans = verify_parts // plan_parts
        plans = run(
            [
                ShardTask(
                    fuzzy_plan,
                    member_files,
                    storage.join(work, "plan", prefix + shuffle.block_name(q, plan_parts)),
                    dataclasses.replace(
                        vp(q * spans, bounds[q * spans][0], bounds[(q + 1) * spans - 1][1]), previous=tuple(dict.fromkeys(f for p in range(q * spans, (q + 1) * spans) for f in previous[p]))
                    ),
                )
                for q in range(plan_parts)
            ]
        )
        plan_files = tuple(r.output for r in plans)
        wanted = [tuple(x) for r in plans for x in r.stats.get("requested_runs", [[0, shuffle.KEY_SPACE]])]

        def requested(first: int, rows: int, runs: Sequence[tuple[int, int]]) -> bool:
            return any(a < hi and lo < b for a, b in runs or ((first, first + rows),) for lo, hi in wanted)

        def gp(i: int) -> GatherParams:
            source, _, _, first, rows, runs = shard_list[i]
            return GatherParams(source, first, rows, params.max_chars_per_doc, scale.verify_batch_chars, runs)

        wanted_shards = [i for i, (_, _, _, first, rows, runs) in enumerate(shard_list) if requested(first, rows, runs)]
        if incremental:  # few rows requested: one task per shards_per_map requested shards
            gather_groups = [wanted_shards[g : g + scale.shards_per_map] for g in range(0, len(wanted_shards), scale.shards_per_map)]
        else:  # one task per group of shards with a requested row: it reads exactly its blocks
            chosen = set(wanted_shards)
            gather_groups = [idx for idx in ([i for i in group if i in chosen] for group in shard_groups) if idx]
        gathered = run(
            [
                ShardTask(
                    fuzzy_gather_group,
                    (*(u for i in idx for u in shard_list[i][1:3]), *plan_files),
                    storage.join(work, "gather", f"{prefix}g{g:06d}.blocks"),
                    GatherGroupParams(tuple(gp(i) for i in idx), node_cuts, verify_parts, scale.member_chars_per_partition),
                )
                for g, idx in enumerate(gather_groups)
            ]
        )
        text_files = tuple(u for r in gathered for u in (*r.stats.get("sections", ()), r.output))
        streamed_files = tuple(streamed_uri(r.output) for r in gathered if int(r.stats.get("streamed", 0)))
        verified = run(
            [
                ShardTask(
                    fuzzy_verify,
                    member_files + text_files + streamed_files,
                    storage.join(work, "verify", prefix + shuffle.block_name(p, verify_parts)),
                    dataclasses.replace(vp(p, lo, hi), member_files=len(member_files), text_files=len(text_files)),
                )
                for p, (lo, hi) in enumerate(bounds)
            ]
        )
        return gathered, verified

    gathered, verified = verify_pass("", previous_files, True)
    replayed = sum(int(r.stats.get("replayed_clusters", 0)) for r in verified)
    passes = [verified]
    if any(int(r.stats.get("replay_failed", 0)) for r in verified):
        # A cluster whose added member was retained is verified in full, every other verdict
        # taken from the first pass.
        more, verified = verify_pass("full-", [(r.output,) for r in verified], False)
        gathered = gathered + more
        passes.append(verified)

    # 8. removals by id range, then one file per source. Incremental: a source whose removal rows
    # are the previous run's (its row hash sums over the label ranges moved by zero) keeps the
    # previous file.
    moved: set[int] | None = None
    kept: dict[str, dict[str, Any]] = {}
    if changed is not None and all(r.stats.get("row_changes") is not None for rs in passes for r in rs):
        sums: dict[int, int] = {}
        for r in (r for rs in passes for r in rs):
            for k, h in r.stats["row_changes"].items():
                sums[int(k)] = (sums.get(int(k), 0) + int(h)) % (1 << 128)
        moved = {k for k, h in sums.items() if h}
        for s in sources:
            old = (before or {}).get("published", {}).get(s)
            if rank[s] not in moved and old is not None and storage.exists(old["uri"]):
                kept[s] = old
        moved = {rank[s] for s in sources if s not in kept}
    removed_total = sum(int(n) for r in verified for k, n in r.stats["removed_by_rank"].items() if moved is None or int(k) in moved)
    removal_parts = min(verify_parts, shuffle.pow2_partitions(removed_total, scale.members_per_partition))  # the verify outputs' blocks cut these ranges
    ranks_filter = None if moved is None else tuple(sorted(moved))
    parts = run(
        [
            ShardTask(fuzzy_removals, tuple(r.output for r in verified), storage.join(work, "removals", shuffle.block_name(p, removal_parts)), RemovalParams(lo, hi, ranks_filter))
            for p, (lo, hi) in enumerate(shuffle.partition_bounds(removal_parts))
        ]
    )
    groups = [sources[g : g + scale.sources_per_publish] for g in range(0, len(sources), scale.sources_per_publish)]
    publish_tasks = [
        ShardTask(
            fuzzy_publish,
            tuple(r.output for r in parts),
            storage.join(work, "publish", f"group-{g:05d}"),
            PublishParams(tuple(rank[s] for s in group), tuple(removed_uri(out_dir_uri, s) for s in group), tuple(kept.get(s) for s in group)),
        )
        for g, group in enumerate(groups)
    ]
    published = {s: stats for group, r in zip(groups, run(publish_tasks)) for s, stats in zip(group, r.stats["sources"])}
    state["published"] = {s: {"uri": removed_uri(out_dir_uri, s), "removed": int(published[s]["removed"]), "digest": str(published[s]["digest"])} for s in sources}
    state["clustered_docs"] = sum(int(r.stats.get("clustered_docs", 0)) for r in verified)
    storage.write_json(storage.join(out_dir_uri, STATE_FILE), state | {"verify_files": [r.output for r in verified]})
    fs, work_path = storage.filesystem(work)
    scratch_bytes = int(fs.du(work_path)) if fs.exists(work_path) else 0  # at its largest, before the collection
    for r in passes[0] if len(passes) > 1 else ():  # the first pass's verdicts live on in the second's
        for uri in (r.output, clusters_uri(r.output)):
            if storage.exists(uri):
                storage.remove(uri)
    collect_scratch(work, cache, state["cache_entries"], (before or {}).get("cache_entries", {}))

    # Counters from what the tasks returned.
    removed_per_source = {s: int(published[s]["removed"]) for s in sources}
    removed_chars = {s: 0 for s in sources}
    histogram: dict[str, int] = {}
    totals = {"clusters": 0, "verified_clusters": 0, "reused_clusters": 0, "verified_members": 0, "streamed_clusters": 0, "comparisons": 0, "exempt_kept": 0}
    examples: list[dict[str, Any]] = []
    for r in verified:
        totals["clusters"] += int(r.stats["clusters"])
    for r in passes[0]:
        totals["reused_clusters"] += int(r.stats["reused_clusters"])
    for r in (r for rs in passes for r in rs):
        for key in ("verified_clusters", "verified_members", "streamed_clusters", "comparisons", "exempt_kept"):
            totals[key] += int(r.stats[key])
    for r in verified:
        for k, c in r.stats["removed_chars_by_rank"].items():
            removed_chars[sources[int(k)]] += int(c)
        for k, n in r.stats["histogram"].items():
            histogram[k] = histogram.get(k, 0) + int(n)
        examples.extend(r.stats["examples"])
    examples = [{k: v for k, v in e.items() if k != "_key"} for e in sorted(examples, key=lambda e: e["_key"])[:num_examples]]
    fresh = [r for r in results if not r.reused]
    return {
        "docs": sum(docs_per_source.values()),
        "docs_per_source": docs_per_source,
        "chars_per_source": chars_per_source,
        "bucket_records": records,
        "bucket_partitions": edge_parts,
        "candidate_edges": edges,
        "largest_bucket": max((int(r.stats["largest_bucket"]) for r in edge_results), default=0),
        **cc_stats,
        "docs_in_clusters": sum(int(r.stats.get("clustered_docs", 0)) for r in verified),
        "largest_cluster": max((int(r.stats["largest_cluster"]) for r in verified), default=0),
        "cluster_size_histogram": dict(sorted(histogram.items(), key=lambda kv: int(kv[0].split("-")[0]))),
        "verify_partitions": verify_parts,
        **totals,
        "replayed_clusters": replayed,
        "verify_passes": len(passes),
        "changed_sources": changed,
        "shards_read_for_text": sum(int(r.stats["shard_read"]) for r in gathered),
        "removed": sum(removed_per_source.values()),
        "removed_per_source": removed_per_source,
        "removed_chars_per_source": removed_chars,
        "removal_ratio_per_source": removal_ratios(removed_per_source, docs_per_source),
        "removed_ids_digest": {s: str(published[s]["digest"]) for s in sources},
        "scratch_bytes": scratch_bytes,
        "sources_republished": sum(1 for s in sources if not published[s]["copied"]),
        "exempt_sources": list(exempt_t),
        "examples": examples,
        "tasks": len(results),
        "task_cpu_s": round(sum(float(r.stats.get("cpu_s", 0)) for r in fresh), 3),
        "warmup_cpu_s": round(sum(float(r.stats.get("warmup_cpu_s", 0)) for r in fresh), 3),
        "max_task_rss_kb": max(int(r.stats.get("rss_kb", 0)) for r in results),
        "steps": step_costs(results),
    }
