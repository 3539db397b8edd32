"""Incremental planner, edges: the records of the buckets that hold an added document, and their star edges only."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pyarrow as pa

from marin_assets.core.dedup import shuffle
from marin_assets.core.dedup.components import edge_table
from marin_assets.core.dedup.fuzzy.layout import RECORD_SCHEMA


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
