"""Step 4, members: the clustered nodes of a group of shards, keyed by hash(label)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from marin_assets.core.dedup import shuffle
from marin_assets.core.dedup.components import LABEL_SCHEMA
from marin_assets.core.dedup.fuzzy.layout import DELTA_SCHEMA, MEMBER_SCHEMA, merge_runs, rows_of, shard_runs
from marin_assets.core.runtime import storage


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
