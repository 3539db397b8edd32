"""Step 2, edges: star edges of every bucket shared by several documents, per key range."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from marin_assets.core.dedup import shuffle
from marin_assets.core.dedup.components import edge_table
from marin_assets.core.dedup.fuzzy.layout import RECORD_SCHEMA


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
