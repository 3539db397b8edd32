"""Step 1, map: a group of minhash shards of one source -> bucket records keyed by hash(band, bucket) and a node table per shard."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from marin_assets.core.dedup import shuffle
from marin_assets.core.dedup.decisions import (
    DedupError,
)
from marin_assets.core.dedup.exact import doc_lengths
from marin_assets.core.dedup.fuzzy.layout import NODE_SCHEMA, RANK_SHIFT, RECORD_SCHEMA, added_uri, gone_uri, node_runs, nodes_uri
from marin_assets.core.runtime import storage


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
