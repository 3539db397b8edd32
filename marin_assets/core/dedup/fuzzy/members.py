"""Step 4, members: the clustered nodes of a group of shards, keyed by hash(label)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from marin_assets.core.dedup import manifest, shuffle
from marin_assets.core.dedup.components import LABEL_SCHEMA
from marin_assets.core.dedup.fuzzy.layout import DELTA_SCHEMA, MEMBER_SCHEMA, merge_runs, rows_of, shard_runs
from marin_assets.core.dedup.fuzzy.state import Components, FuzzyRun, Mapped, Members, verify_partitions
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.runner import ShardResult, ShardTask


@dataclasses.dataclass(frozen=True, slots=True)  # one per shard in a step's tasks: no dict each
class ShardParams:
    source: str
    first_node: int
    rows: int
    rank: int = 0
    runs: tuple[tuple[int, int], ...] | None = ()  # node ranges covering the shard's nodes (empty or None: first_node + rows)


def _shard_members(nodes_file: str, params: ShardParams, labels: pa.Table) -> pa.Table:
    """A shard's labelled nodes with their id and length (``labels``: the rows of the shard's node
    ranges)."""
    if labels.num_rows == 0:
        return MEMBER_SCHEMA.empty_table()
    node = labels.column("node").to_numpy()
    label = labels.column("label").to_numpy()
    added = labels.column("added").to_numpy(zero_copy_only=False) if "added" in labels.column_names else np.zeros(node.size, bool)
    nodes_table = storage.read_parquet_object(nodes_file)
    if "node" in nodes_table.column_names:
        mine = nodes_table.column("node").to_numpy()
        hit = np.isin(node, mine)
        node, label, added = node[hit], label[hit], added[hit]
        rows = rows_of(mine, node)
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


@shuffle.measured
def fuzzy_members_group(inputs: list[str], output: str, params: GroupParams) -> dict[str, Any]:
    """The clustered nodes of a group of shards (incremental: of the touched clusters) in one
    file, keyed by hash(label), one block per plan/verify key range; the inputs are the shards'
    node tables, then the label files, whose rows of the group's node ranges are read once."""
    k = len(params.shards)
    nodes_files, label_files = inputs[:k], inputs[k:]
    runs = [shard_runs(p.first_node, p.rows, p.runs) for p in params.shards]
    merged = merge_runs([r for rs in runs for r in rs])
    labels = shuffle.read_ranges_blocks(label_files, shuffle.read_cuts(params.label_cuts), merged, DELTA_SCHEMA if params.delta else LABEL_SCHEMA)
    keys = labels.column("key").to_numpy()
    parts = []
    for n, p, rs in zip(nodes_files, params.shards, runs):
        bounds = np.asarray(rs, np.int64).ravel()
        parts.append(_shard_members(n, p, labels.filter(pa.array((np.searchsorted(bounds, keys, side="right") % 2) == 1))))
    out = pa.concat_tables(parts)
    shuffle.write_blocks(out, output, cuts=shuffle.partition_cuts(params.member_blocks))
    return {"members": out.num_rows, "member_chars": int(pc.sum(out.column("chars")).as_py() or 0)}


# --------------------------------------------------------------------------- scheduling


def _clustered_estimate(run: FuzzyRun, merged: ShardResult) -> tuple[int, int]:
    """Incremental: the clustered documents and their characters, from the previous run's totals
    plus the newly clustered documents (their characters at the previous mean)."""
    docs_before = int(run.before.get("clustered_docs", 0))
    docs = docs_before + int(merged.stats["fresh"])
    return docs, int(run.before.get("member_chars", 0)) * docs // max(1, docs_before)


def run_members(run: FuzzyRun, mapped: Mapped, comps: Components, changed: Sequence[str] | None) -> Members:
    """Members (incremental: of the touched clusters only), one task per group of shards. The
    member files hold one block per verify partition: incremental, the count is known now (the
    previous totals); full, from the clustered documents at the corpus' mean length (a finer
    verify partitioning, when the members' text is longer, reads its covering block and filters)."""
    scale, rank, shards = run.scale, run.rank, mapped.shards
    if comps.merged is not None:
        member_blocks = verify_partitions(*_clustered_estimate(run, comps.merged), scale)
    else:
        mean_chars = sum(mapped.chars_per_source.values()) // max(1, sum(mapped.docs_per_source.values()))
        member_blocks = verify_partitions(comps.labelled, comps.labelled * mean_chars, scale)
    label_files = run.merged(comps.member_label_files, storage.join(run.work, "members", "labels"), scale.max_inputs_per_task - scale.shards_per_map, cuts=mapped.node_cuts)
    labels = (manifest.reference_to(label_files, storage.join(run.work, "manifests")),) if len(label_files) >= manifest.MIN_INPUTS else tuple(label_files)  # every task reads them all
    members = run.run(
        [
            ShardTask(
                fuzzy_members_group,
                (*(shards[i][2] for i in idx), *labels),
                storage.join(run.work, "members", f"g{m:06d}.blocks"),
                GroupParams(tuple(ShardParams(shards[i][0], shards[i][3], shards[i][4], rank[shards[i][0]], shards[i][5]) for i in idx), mapped.node_cuts, member_blocks, delta=comps.incremental),
            )
            for m, idx in enumerate(mapped.groups)
        ]
    )
    in_clusters = sum(int(r.stats["members"]) for r in members)
    member_chars = sum(int(r.stats["member_chars"]) for r in members)
    if comps.merged is not None:
        in_clusters, member_chars = _clustered_estimate(run, comps.merged)
    verify_parts = verify_partitions(in_clusters, member_chars, scale)
    run.state |= {"clustered_docs": in_clusters, "member_chars": member_chars, "verify_partitions": verify_parts}
    bounds = shuffle.partition_bounds(verify_parts)
    previous_files: list[tuple[str, ...]] = [()] * verify_parts
    if changed is not None:
        old_bounds = shuffle.partition_bounds(int(run.before["verify_partitions"]))
        # Each label range reads the previous outputs whose ranges overlap it (counts may differ).
        previous_files = [tuple(f for f, (a, b) in zip(run.before["verify_files"], old_bounds) if a < hi and lo < b) for lo, hi in bounds]
    plan_parts = verify_parts
    if comps.incremental:  # the member files hold the touched clusters only: a plan task covers several label ranges
        touched_members = sum(int(r.stats["members"]) for r in members)
        plan_parts = min(verify_parts, 1 << max(0, (shuffle.tasks_for(touched_members, scale.members_per_task) - 1).bit_length()))
    # plan and verify read every member file (verify a quarter of its inputs: texts and big clusters' texts too)
    files = run.merged([r.output for r in members], storage.join(run.work, "members", "merged"), max(2, scale.max_inputs_per_task // 4), blocks=member_blocks)
    return Members(tuple(files), member_blocks, verify_parts, plan_parts, previous_files)
