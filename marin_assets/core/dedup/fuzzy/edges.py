"""Step 2, edges: star edges of every bucket shared by several documents, per key range."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from marin_assets.core.dedup import shuffle
from marin_assets.core.dedup.components import connected_components, edge_table
from marin_assets.core.dedup.fuzzy.layout import RECORD_SCHEMA, keep_cuts
from marin_assets.core.dedup.fuzzy.state import Components, FuzzyRun, Mapped
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.runner import ShardTask


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


# --------------------------------------------------------------------------- scheduling


def run_full_components(run: FuzzyRun, mapped: Mapped) -> Components:
    """Edges per key range of the bucket records, then connected components over every edge;
    the label files are blocks at the members groups' node cuts."""
    scale, work = run.scale, run.work
    edge_parts = shuffle.pow2_partitions(mapped.records, scale.records_per_task)
    map_files = tuple(run.merged([r.output for r in mapped.results], storage.join(work, "edges"), blocks=edge_parts))
    edge_results = run.run(
        [
            ShardTask(fuzzy_edges, map_files, storage.join(work, "edges", shuffle.block_name(p, edge_parts)), RangeParams(lo, hi, edge_parts, scale.edges_per_task))
            for p, (lo, hi) in enumerate(shuffle.partition_bounds(edge_parts))
        ]
    )
    edges = sum(int(r.stats["edges"]) for r in edge_results)
    label_files, cc_stats = connected_components(
        [r.output for r in edge_results],
        edges,
        work,
        run,  # as the runner: its tasks are counted with the run's
        union_find_max_edges=scale.union_find_max_edges,
        edges_per_task=scale.edges_per_task,
        labels_dir=storage.join(work, "labels"),
        label_cuts=mapped.node_cuts,
        max_inputs=scale.max_inputs_per_task,
        merge_bytes=scale.merge_bytes,
    )
    labelled = sum(int(r.stats.get("nodes", 0)) for r in cc_stats["cc_results"])  # = the clustered documents
    cc_stats.pop("cc_results")  # already in the run's results
    run.state["label_files"] = list(label_files)
    run.state["label_cuts"] = keep_cuts([mapped.node_cuts] * len(label_files), storage.join(work, "labels"))  # the next run's merge reads only the blocks it needs
    run.state["label_rows"] = [None] * len(label_files)  # rows per label file where known (compaction)
    return Components(edge_results, edges, list(label_files), cc_stats, labelled=labelled)
