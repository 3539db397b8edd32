"""Step 8, removals by id range and publish: one removal file per source."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from marin_assets.core.dedup import shuffle
from marin_assets.core.dedup.decisions import (
    FUZZY_SCHEMA,
    removed_uri,
)
from marin_assets.core.dedup.fuzzy.layout import VERDICT_SCHEMA
from marin_assets.core.dedup.fuzzy.state import FuzzyRun
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.runner import ShardResult, ShardTask

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


# --------------------------------------------------------------------------- scheduling


def _kept_sources(run: FuzzyRun, passes: Sequence[Sequence[ShardResult]]) -> tuple[dict[str, dict[str, Any]], set[int] | None]:
    """Incremental: the sources whose removal rows are the previous run's (their row hash sums
    over the label ranges moved by zero) keep the previous file; the ranks of the others (None:
    every source is published)."""
    if not all(r.stats.get("row_changes") is not None for rs in passes for r in rs):
        return {}, None
    sums: dict[int, int] = {}
    for r in (r for rs in passes for r in rs):
        for k, h in r.stats["row_changes"].items():
            sums[int(k)] = (sums.get(int(k), 0) + int(h)) % (1 << 128)
    moved = {k for k, h in sums.items() if h}
    rank = run.rank
    kept = {}
    for s in run.sources:
        old = (run.before or {}).get("published", {}).get(s)
        if rank[s] not in moved and old is not None and storage.exists(old["uri"]):
            kept[s] = old
    return kept, {rank[s] for s in run.sources if s not in kept}


def run_publish(run: FuzzyRun, passes: Sequence[Sequence[ShardResult]], final: Sequence[ShardResult], against_previous: bool, verify_parts: int) -> dict[str, dict[str, Any]]:
    """Removals by id range, then one file per source (a group of sources per task); per source
    its count, digest and whether it was copied. ``final``: per label range, its last verify
    result (``passes``: every pass's, whose row changes add up)."""
    rank, scale = run.rank, run.scale
    kept, moved = _kept_sources(run, passes) if against_previous else ({}, None)
    removed_total = sum(int(n) for r in final for k, n in r.stats["removed_by_rank"].items() if moved is None or int(k) in moved)
    removal_parts = min(verify_parts, shuffle.pow2_partitions(removed_total, scale.members_per_task))  # the verify outputs' blocks cut these ranges
    verified = tuple(run.merged([r.output for r in final], storage.join(run.work, "removals", "verified"), blocks=removal_parts))
    ranks_filter = None if moved is None else tuple(sorted(moved))
    parts = run.run(
        [
            ShardTask(fuzzy_removals, verified, storage.join(run.work, "removals", shuffle.block_name(p, removal_parts)), RemovalParams(lo, hi, ranks_filter))
            for p, (lo, hi) in enumerate(shuffle.partition_bounds(removal_parts))
        ]
    )
    sources = run.sources
    groups = [sources[g : g + scale.sources_per_publish] for g in range(0, len(sources), scale.sources_per_publish)]
    part_files = tuple(run.merged([r.output for r in parts], storage.join(run.work, "publish", "parts"), ranks=len(sources)))
    tasks = [
        ShardTask(
            fuzzy_publish,
            part_files,
            storage.join(run.work, "publish", f"group-{g:05d}"),
            PublishParams(tuple(rank[s] for s in group), tuple(removed_uri(run.out_dir, s) for s in group), tuple(kept.get(s) for s in group)),
        )
        for g, group in enumerate(groups)
    ]
    return {s: stats for group, r in zip(groups, run.run(tasks)) for s, stats in zip(group, r.stats["sources"])}
