"""Global exact dedup as a shuffle over id ranges.

1. map, one task per group of normalized shards: ``(key, id, rank, chars)`` keyed by an
   order-keeping prefix key of the id (``rank`` is the source's place in the keep order), in
   blocks of equal key ranges, so a reduce task reads only the blocks of its range; more than
   ``max_inputs`` map files are merged first (:func:`fanin.bounded`), as are the reduce parts
   before publishing, so no task reads more files than that however many shards the pool has;
2. reduce, one task per id range (the count follows the number of ids, ``ids_per_partition``
   each): the copy of the first source in keep order survives, the others are written as
   ``(rank, id, kept_rank, chars)`` sorted by source then id;
3. publish, one task per group of ``sources_per_publish`` sources: each range read once for the
   group, each source's rows streamed in range order into ``<out>/<source>/removed.parquet``
   (``id``, ``kept_source``), sorted by id.

No process holds more than one id range or one range's removals of a group of sources.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from marin_assets.core.dedup import fanin, manifest, shuffle
from marin_assets.core.dedup.decisions import (
    EXACT_SCHEMA,
    DedupError,
    ExactDedupParams,
    keep_order,
    removed_uri,
)
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.runner import ShardResult, ShardRunner, ShardTask

MAP_SCHEMA = pa.schema([("key", pa.int64()), ("id", pa.string()), ("rank", pa.int32()), ("chars", pa.int64())])


@dataclasses.dataclass(frozen=True)
class MapParams:
    source: str
    rank: int
    with_lengths: bool = False  # inputs: the normalized shards, then as many minhash shards
    maps: int = 1  # map tasks in all and ids per reduce task: the reduce tasks this map's blocks expect
    ids_per_partition: int = 8_000_000


@dataclasses.dataclass(frozen=True)
class ReduceParams:
    lo: int
    hi: int


@dataclasses.dataclass(frozen=True)
class PublishParams:
    ranks: tuple[int, ...]  # a group of sources, published by one task
    outputs: tuple[str, ...]
    order: tuple[str, ...]


def doc_lengths(source: str, normalized_uri: str, minhash_uri: str | None, rows: int) -> pa.Array:
    """Characters per document: the ``chars`` column minhash_buckets records, else the text."""
    if minhash_uri is not None:
        try:
            chars = storage.read_parquet_columns(minhash_uri, ["chars"]).column("chars").combine_chunks()
            if len(chars) == rows:
                return chars.cast(pa.int64())
        except (KeyError, ValueError, pa.ArrowInvalid):
            pass
    try:
        text = storage.read_parquet_columns(normalized_uri, ["text"]).column("text")
    except (KeyError, ValueError, pa.ArrowInvalid) as exc:
        raise DedupError(f"source {source!r}: cannot read column 'text' from {normalized_uri} ({exc}); rematerialize the normalized partition {source!r}") from exc
    return pc.fill_null(pc.utf8_length(text), 0).combine_chunks().cast(pa.int64())


@shuffle.measured
def exact_map(inputs: list[str], output: str, params: MapParams) -> dict[str, Any]:
    """A group of normalized shards of one source (plus, optionally, their minhash shards for
    lengths) -> one block file of id records, cut at equal key ranges (as many as the reduce
    tasks, expected from this map's ids, need to each read exactly their blocks)."""
    normalized = inputs[: len(inputs) // 2] if params.with_lengths else inputs
    pieces = []
    for k, normalized_uri in enumerate(normalized):
        try:
            ids = storage.read_parquet_columns(normalized_uri, ["id"]).column("id").combine_chunks().cast(pa.string())
        except (KeyError, ValueError, pa.ArrowInvalid) as exc:
            raise DedupError(
                f"source {params.source!r}: cannot read column 'id' from {normalized_uri} ({exc}); rematerialize the "
                f"normalized partition {params.source!r}"
            ) from exc
        chars = doc_lengths(params.source, normalized_uri, inputs[len(normalized) + k] if params.with_lengths else None, len(ids))
        pieces.append(pa.table([pa.array(shuffle.prefix_keys(ids)), ids, pa.array(np.full(len(ids), params.rank, np.int32)), chars], schema=MAP_SCHEMA))
    table = pa.concat_tables(pieces) if pieces else MAP_SCHEMA.empty_table()
    shuffle.write_keyed(table, output, shuffle.pow2_partitions(table.num_rows * params.maps, params.ids_per_partition))
    return {"docs": table.num_rows, "chars": int(pc.sum(table.column("chars")).as_py() or 0)}


REMOVED_SCHEMA = pa.schema([("rank", pa.int32()), ("id", pa.string()), ("kept_rank", pa.int32()), ("chars", pa.int64())])


@shuffle.measured
def exact_reduce(inputs: list[str], output: str, params: ReduceParams) -> dict[str, Any]:
    """Decide one id range: every copy but the keeper's is removed."""
    frame = pl.from_arrow(shuffle.read_range(inputs, params.lo, params.hi, ["id", "rank", "chars"], MAP_SCHEMA))
    pairs = frame.unique(["id", "rank"], keep="first")
    keeper = pairs.group_by("id").agg(pl.col("rank").min().alias("kept_rank"), pl.len().alias("copies"))
    dropped = pairs.join(keeper, on="id").filter(pl.col("rank") != pl.col("kept_rank")).select("rank", "id", "kept_rank", "chars").sort(["rank", "id"])
    shuffle.write_sorted_by_rank(dropped.to_arrow().cast(REMOVED_SCHEMA), output)
    by_rank = dropped.group_by("rank").agg(pl.len().alias("n"), pl.col("chars").sum().alias("chars"))
    pairs_count = dropped.group_by("rank", "kept_rank").len()
    return {
        "docs": frame.height,
        "unique_ids": keeper.height,
        "within_source_repeats": frame.height - pairs.height,
        "ids_in_several_sources": int((keeper["copies"] > 1).sum()),
        "removed_by_rank": {str(r): int(n) for r, n in zip(by_rank["rank"].to_list(), by_rank["n"].to_list())},
        "removed_chars_by_rank": {str(r): int(c) for r, c in zip(by_rank["rank"].to_list(), by_rank["chars"].to_list())},
        "pairs": {f"{r}<-{k}": int(n) for r, k, n in zip(pairs_count["rank"].to_list(), pairs_count["kept_rank"].to_list(), pairs_count["len"].to_list())},
    }


@shuffle.measured
def exact_publish(inputs: list[str], output: str, params: PublishParams) -> dict[str, Any]:
    """A group of sources' removal files, each part read once for the group (``output`` names
    the group; the counts per source are the task's result)."""
    order = pa.array(list(params.order), pa.string())

    def convert(table: pa.Table) -> pa.Table:
        return pa.table([table.column("id"), order.take(table.column("kept_rank"))], schema=EXACT_SCHEMA)

    return {"sources": shuffle.publish_removals(inputs, params.ranks, params.outputs, EXACT_SCHEMA, convert)}


def find_exact_duplicates(
    sources: Mapping[str, Sequence[str]],
    out_dir_uri: str,
    params: ExactDedupParams = ExactDedupParams(),
    *,
    ids_per_partition: int = 8_000_000,
    runner: ShardRunner | None = None,
    work_dir: str | None = None,
    lengths: Mapping[str, Sequence[str]] | None = None,
    shards_per_map: int = 16,
    sources_per_publish: int = 16,
    max_inputs: int = fanin.MAX_INPUTS,
) -> dict[str, Any]:
    """Ids present in several sources: every source but the keeper lists the id as removed.

    ``lengths``: optional minhash shards per source (co-partitioned) whose ``chars`` column
    gives document lengths without reading the text. ``work_dir``: where the shuffle files go
    (default ``<out>/_work``).
    """
    runner = runner or ShardRunner()
    shards = {s: sorted(sources[s], key=storage.basename) for s in sorted(sources)}
    order = keep_order(shards, params)
    rank = {s: i for i, s in enumerate(order)}
    work = work_dir or storage.join(out_dir_uri, "_work")
    length_shards = {s: {storage.basename(u): u for u in us} for s, us in (lengths or {}).items()}
    map_tasks = []
    maps = sum(-(-len(uris) // shards_per_map) for uris in shards.values())
    for source, uris in shards.items():
        for g in range(0, len(uris), shards_per_map):
            group = tuple(uris[g : g + shards_per_map])
            extra = tuple(length_shards.get(source, {}).get(storage.basename(u)) for u in group)
            with_lengths = all(e is not None for e in extra)
            out = storage.join(work, "map", f"{rank[source]:05d}-{g // shards_per_map:05d}.blocks")
            map_tasks.append(ShardTask(exact_map, group + extra if with_lengths else group, out, MapParams(source, rank[source], with_lengths, maps, ids_per_partition)))
    def run(tasks: list[ShardTask]) -> list[ShardResult]:  # inputs many tasks share go by one manifest per step
        return runner.map(manifest.name_inputs(tasks, storage.join(work, "manifests")))

    mapped = run(map_tasks)
    docs = sum(int(r.stats["docs"]) for r in mapped)
    partitions = shuffle.pow2_partitions(docs, ids_per_partition)  # the map files' blocks cut these ranges
    merges: list[ShardResult] = []

    def merge(tasks: list[ShardTask]) -> list[ShardResult]:
        merges.extend(run(tasks))
        return merges[len(merges) - len(tasks) :]

    map_files = tuple(fanin.bounded(merge, [r.output for r in mapped], storage.join(work, "map-merged"), max_inputs, fanin.MergeFilesParams(blocks=partitions)))
    reduce_tasks = [
        ShardTask(exact_reduce, map_files, storage.join(work, "reduce", shuffle.block_name(p, partitions)), ReduceParams(lo, hi))
        for p, (lo, hi) in enumerate(shuffle.partition_bounds(partitions))
    ]
    reduced = run(reduce_tasks)
    parts = tuple(fanin.bounded(merge, [r.output for r in reduced], storage.join(work, "reduce-merged"), max_inputs, fanin.MergeFilesParams(ranks=len(order))))
    groups = [list(shards)[g : g + sources_per_publish] for g in range(0, len(shards), sources_per_publish)]
    published = run(
        [
            ShardTask(exact_publish, parts, storage.join(work, "publish", f"group-{g:05d}"), PublishParams(tuple(rank[s] for s in group), tuple(removed_uri(out_dir_uri, s) for s in group), tuple(order)))
            for g, group in enumerate(groups)
        ]
    )
    per_source_stats = {s: stats for group, r in zip(groups, published) for s, stats in zip(group, r.stats["sources"])}
    fs, work_path = storage.filesystem(work)
    scratch_bytes = sum(int(fs.du(f"{work_path}/{p}")) for p in ("map", "map-merged", "reduce", "reduce-merged", "manifests") if fs.exists(f"{work_path}/{p}"))
    for step in ("map", "map-merged", "reduce", "reduce-merged", "publish", "manifests"):  # scratch: nothing reads it once every source is published
        if storage.exists(storage.join(work, step)):
            storage.remove(storage.join(work, step), recursive=True)

    counters = {"docs": 0, "unique_ids": 0, "within_source_repeats": 0, "ids_in_several_sources": 0}
    removed_chars: dict[str, int] = {s: 0 for s in shards}
    pair_counts: dict[str, int] = {}
    for r in reduced:
        for key in counters:
            counters[key] += int(r.stats[key])
        for k, c in r.stats["removed_chars_by_rank"].items():
            removed_chars[order[int(k)]] += int(c)
        for k, n in r.stats["pairs"].items():
            a, b = k.split("<-")
            name = f"{order[int(a)]} <- {order[int(b)]}"
            pair_counts[name] = pair_counts.get(name, 0) + int(n)
    per_source = {s: int(per_source_stats[s]["removed"]) for s in shards}
    docs_per_source = {s: 0 for s in shards}
    for task, r in zip(map_tasks, mapped):  # the map tasks counted them: no footer is read again
        docs_per_source[task.params.source] += int(r.stats["docs"])
    digests = {s: str(per_source_stats[s]["digest"]) for s in shards}
    return {
        **counters,
        "removed": sum(per_source.values()),
        "removed_per_source": per_source,
        "docs_per_source": docs_per_source,
        "removed_chars_per_source": removed_chars,
        "removed_ids_digest": digests,
        "top_source_pairs": dict(sorted(pair_counts.items(), key=lambda kv: (-kv[1], kv[0]))[:10]),
        "keep_order": order,
        "scratch_bytes": scratch_bytes,
        "partitions": partitions,
        "tasks": len(mapped) + len(merges) + len(reduced) + len(published),
        "task_cpu_s": round(sum(float(r.stats.get("cpu_s", 0)) for r in [*mapped, *merges, *reduced, *published] if not r.reused), 3),
        "warmup_cpu_s": round(sum(float(r.stats.get("warmup_cpu_s", 0)) for r in [*mapped, *merges, *reduced, *published] if not r.reused), 3),
        "max_task_rss_kb": max(int(r.stats.get("rss_kb", 0)) for r in [*mapped, *merges, *reduced, *published]) if shards else 0,
    }
