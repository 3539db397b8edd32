"""Incremental planner, edges: the records of the buckets that hold an added document, and their star edges only."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from marin_assets.core.dedup import shuffle
from marin_assets.core.dedup.components import edge_table
from marin_assets.core.dedup.fuzzy.layout import RANK_SHIFT, RECORD_SCHEMA, added_uri
from marin_assets.core.dedup.fuzzy.state import FuzzyRun, Mapped
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.runner import ShardResult, ShardTask


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


# --------------------------------------------------------------------------- scheduling


def _scan_chunks(mapped: Mapped, per_task: int, files: int) -> list[list[str]]:
    """The map files in runs of about ``per_task`` records (and at most ``files``): one
    bucket-hits task scans a run."""
    chunks: list[list[str]] = [[]]
    size = 0
    for r in mapped.results:
        if chunks[-1] and (size + int(r.stats["records"]) > per_task or len(chunks[-1]) >= files):
            chunks.append([])
            size = 0
        chunks[-1].append(r.output)
        size += int(r.stats["records"])
    return chunks


def run_added_edges(run: FuzzyRun, mapped: Mapped, changed: Sequence[str]) -> list[ShardResult]:
    """Incremental edges: the records of the buckets an added document is in (whole map files
    scanned once, a few per task, per key range of the added records), then their star edges."""
    scale, work = run.scale, run.work
    added_ranges = tuple(((run.slot[s] << RANK_SHIFT) + run.added_base[s], (run.slot[s] << RANK_SHIFT) + run.next_row[s]) for s in changed)
    added_records = sum(int(r.stats.get("added_records", 0)) for r in mapped.results)
    hit_ranges = shuffle.partition_bounds(shuffle.tasks_for(added_records, scale.records_per_task))
    # a bucket-hits task reads the added records (merged to half its inputs) and a run of map files
    added_files = tuple(added_uri(t.output) for t in mapped.tasks if t.params.source in run.added_base)
    added_files = tuple(run.merged(added_files, storage.join(work, "edges", "added"), max(2, scale.max_inputs_per_task // 2), blocks=len(hit_ranges)))
    chunks = _scan_chunks(mapped, scale.scan_records_per_task, max(1, scale.max_inputs_per_task - len(added_files)))
    hits = run.run(
        [
            ShardTask(fuzzy_bucket_hits, (*added_files, *chunk), storage.join(work, "edges", f"hits-{p:05d}-{c:06d}.parquet"), HitsParams(lo, hi, len(added_files)))
            for p, (lo, hi) in enumerate(hit_ranges)
            for c, chunk in enumerate(chunks)
        ]
    )
    hit_parts = shuffle.tasks_for(sum(int(r.stats["hits"]) for r in hits), scale.records_per_task)
    hit_files = tuple(run.merged([r.output for r in hits], storage.join(work, "edges", "hits"), blocks=hit_parts))
    return run.run(
        [
            ShardTask(fuzzy_edges_added, hit_files, storage.join(work, "edges", "added-" + storage.shard_name(p, hit_parts)), AddedParams(lo, hi, added_ranges))
            for p, (lo, hi) in enumerate(shuffle.partition_bounds(hit_parts))
        ]
    )
