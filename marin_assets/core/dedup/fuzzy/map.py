"""Step 1, map: a group of minhash shards of one source -> bucket records keyed by hash(band, bucket) and a node table per shard."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterator, Mapping
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
from marin_assets.core.dedup.fuzzy.layout import LAYOUT, NODE_SCHEMA, RANK_SHIFT, RECORD_SCHEMA, added_uri, gone_uri, merge_runs, node_runs, nodes_uri, shard_runs
from marin_assets.core.dedup.fuzzy.state import FuzzyRun, Mapped, Shards
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.runner import ShardResult, ShardTask


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
    records_per_task: int = 16_000_000


def _kept_nodes(previous: str, ids: pa.Array, digest: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the previous run's node of the same document (-1: added), and the previous
    nodes of the documents that are gone (not found, or found with other buckets)."""
    if not previous or not storage.exists(previous):
        return np.full(len(ids), -1, np.int64), np.zeros(0, np.int64)
    old = storage.read_parquet_object(previous)
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
    table = storage.read_parquet_object(buckets_uri)
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
    shuffle.write_keyed(records, output, shuffle.pow2_partitions(records.num_rows * params.maps, params.records_per_task))
    return totals | {"bands": min(bands) if bands else 0, "runs": runs}


# --------------------------------------------------------------------------- scheduling


def _cache_entry(run: FuzzyRun, source: str) -> tuple[str, Mapping[str, str], bool]:
    """A source's map output folder in the cache, the previous run's node tables by shard name
    (a changed source that keeps its nodes), and whether its stored index had to be rebuilt
    (an unchanged source whose entry is gone: its nodes may differ from the previous run's)."""
    before, fp = run.before, run.fingerprints[source]
    entry = f"{fp}-s{run.slot[source]}-g{run.scale.shards_per_map}-n{LAYOUT}"  # node tables with node numbers and bucket digests
    renumbered = False
    if before is not None and source not in run.added_base and before["fingerprints"].get(source) == fp:
        kept_entry = before.get("cache_entries", {}).get(source)
        if kept_entry and storage.exists(storage.join(run.cache, source, kept_entry)):
            entry = kept_entry  # the stored index of an unchanged source, with its node numbers
        else:
            renumbered = True
    previous_tables: Mapping[str, str] = {}
    if source in run.added_base:
        previous_tables = before["node_tables"].get(source, {})
        entry += "-k" + hashlib.sha256(json.dumps([run.added_base[source], sorted(previous_tables.items())]).encode()).hexdigest()[:12]
    return storage.join(run.cache, source, entry), previous_tables, renumbered


def _map_tasks(run: FuzzyRun) -> tuple[list[ShardTask], bool, bool]:
    """One map task per ``shards_per_map`` shards of a source; whether a changed source lost a
    shard name, and whether a stored index was rebuilt. Fills the state's cache entries."""
    scale = run.scale
    tasks: list[ShardTask] = []
    lost_shards = renumbered = False
    maps = sum(-(-len(run.shards[s]) // scale.shards_per_map) for s in run.sources)
    entries: dict[str, str] = {}
    for source in run.sources:
        group_dir, previous_tables, rebuilt = _cache_entry(run, source)
        renumbered |= rebuilt
        lost_shards |= bool(set(previous_tables) - {storage.basename(b) for b, _, _ in run.shards[source]})
        entries[source] = storage.basename(group_dir)
        base = 0
        for g in range(0, len(run.shards[source]), scale.shards_per_map):
            group = run.shards[source][g : g + scale.shards_per_map]
            out = storage.join(group_dir, f"group-{g // scale.shards_per_map:05d}.blocks")
            bases = []
            for _, _, rows in group:
                bases.append(base)
                base += rows
            previous = tuple(previous_tables.get(storage.basename(b_uri), "") for b_uri, _, _ in group) if source in run.added_base else ()
            params = MapParams(source, run.slot[source], tuple(bases), previous, run.added_base.get(source, -1), maps, scale.records_per_task)
            tasks.append(ShardTask(fuzzy_map, tuple(u for b_uri, n_uri, _ in group for u in (b_uri, n_uri)), out, params))
        if base >= 1 << RANK_SHIFT:
            raise DedupError(f"source {source!r} has {base} documents, more than the {1 << RANK_SHIFT} a node number holds; split the source")
    run.state["cache_entries"] = entries
    return tasks, lost_shards, renumbered


def node_tables(run: FuzzyRun, mapped: Mapped) -> Iterator[tuple[str, dict[str, str]]]:
    """Per source, each bucket shard's node table by shard name, for the state (the next run
    joins a changed source's shards against them), one source at a time as the state is written."""
    shards = iter(mapped.shards)  # in the run's source and shard order, as the map tasks were made
    for source in run.sources:
        yield source, {storage.basename(b_uri): next(shards)[2] for b_uri, _, _ in run.shards[source]}


def _own_runs(run: FuzzyRun, tasks: list[ShardTask], mapped: list[ShardResult]) -> dict[int, tuple[tuple[int, int], ...]]:
    """By shard index, the node ranges of the shards whose nodes are not their first rows (a
    changed source's); the results' ranges are dropped as they are read (not held twice)."""
    own: dict[int, tuple[tuple[int, int], ...]] = {}
    rows = (rows for s in run.sources for _, _, rows in run.shards[s])
    i = 0
    for t, r in zip(tasks, mapped):
        runs = r.stats.pop("runs", None)
        for k, base in enumerate(t.params.bases):
            first = (t.params.slot << RANK_SHIFT) + base
            mine = tuple(tuple(x) for x in runs[k]) if runs else ()
            if mine != ((first, first + next(rows)),):
                own[i] = mine
            i += 1
    return own


def run_map(run: FuzzyRun) -> Mapped:
    """The map step, then the shards' numbering as the later steps read it: groups of
    ``shards_per_map`` shards (one members task and, full, one gather task each); the steps
    keyed by node (labels, requests) write one block per cut of the groups' node ranges, so
    each group reads exactly its rows from every file (not a row group of each)."""
    tasks, lost_shards, renumbered = _map_tasks(run)
    mapped = run.run(tasks)
    bands = {r.stats["bands"] for r in mapped if r.stats["bands"]}
    if len(bands) > 1:
        odd = [(t.params.source, t.inputs[0]) for t, r in zip(tasks, mapped) if r.stats["bands"] and r.stats["bands"] != min(bands)]
        raise DedupError(f"minhash buckets have {sorted(bands)} bands per document across shards (e.g. {odd[:3]}); rematerialize minhash_buckets of every source with the same MinHashParams")
    docs = {s: 0 for s in run.sources}
    chars = {s: 0 for s in run.sources}
    for t, r in zip(tasks, mapped):
        docs[t.params.source] += int(r.stats["docs"])
        chars[t.params.source] += int(r.stats["chars"])
    shards = Shards(run, [t.output for t in tasks], _own_runs(run, tasks, mapped))
    per = run.scale.shards_per_map
    groups = [range(g, min(g + per, len(shards))) for g in range(0, len(shards), per)]
    group_runs = [merge_runs([r for i in idx for r in shard_runs(int(shards.first[i]), int(shards.rows[i]), shards.runs_of(i))]) for idx in groups]
    node_cuts = storage.join(run.work, "members", "node_cuts.bin")
    shuffle.write_cuts(node_cuts, sorted({0, shuffle.KEY_SPACE} | {x for runs in group_runs for run_ in runs for x in run_}))
    return Mapped(tasks, mapped, shards, groups, node_cuts, docs, chars, lost_shards, renumbered)
