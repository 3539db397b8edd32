"""Connected components over edge shards in storage, labelling every node with the smallest
node of its component.

Edges are stored in both directions as ``(key = hash(a), a, b)`` rows, so a task for a key
range sees every neighbour of the nodes it owns. Below ``union_find_max_edges`` one task reads
all edges and runs a union-find (scipy); above it, alternating large-star and small-star rounds
(Kiveris et al., "Connected Components in MapReduce and Beyond") run as shuffles through
storage until the graph is a forest of stars, whose centres are the component minima. No task
holds more than one key range of edges, nor more than its row bound of one: a range past it (a
heavy centre) runs as slices (:mod:`.star_rounds`). A round writes one block per destination key range
(:func:`.shuffle.write_blocks`), so each task of the next round reads exactly its own rows
from every file, not a row group of each.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from marin_assets.core.dedup import fanin, shuffle
from marin_assets.core.dedup.star_rounds import EDGE_SCHEMA, LABEL_SCHEMA, RoundParams, edge_table, star_round
from marin_assets.core.dedup.star_rounds import write_labels as _write_labels
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.runner import ShardResult, ShardTask

MAX_ROUNDS = 200
__all__ = ["EDGE_SCHEMA", "LABEL_SCHEMA", "connected_components", "edge_table", "union_find", "warm_scipy"]


class TaskMap(Protocol):
    """What runs a step's tasks: a :class:`ShardRunner`, or a caller that counts them too."""

    def map(self, tasks: list[ShardTask]) -> list[ShardResult]: ...


def warm_scipy() -> None:
    """Import scipy's graph module once per process (a library load, not the task's work)."""
    import scipy.sparse.csgraph  # noqa: F401, PLC0415


@shuffle.measured(warm=(warm_scipy,))
def union_find(inputs: list[str], output: str, params: str | None) -> dict[str, Any]:
    """All edges in one task (below the configured size): scipy's connected components
    (``params``: the stored node cuts to write the labels' blocks at, or None: sorted Parquet)."""
    from scipy.sparse import coo_matrix  # noqa: PLC0415
    from scipy.sparse.csgraph import connected_components  # noqa: PLC0415

    table = shuffle.read_range(inputs, 0, shuffle.KEY_SPACE, ["a", "b"], EDGE_SCHEMA)
    a, b = table.column("a").to_numpy(), table.column("b").to_numpy()
    nodes = np.unique(np.concatenate([a, b]))
    if nodes.size == 0:
        _write_labels(nodes, nodes, output, params or "")
        return {"nodes": 0}
    graph = coo_matrix((np.ones(a.size, np.int8), (np.searchsorted(nodes, a), np.searchsorted(nodes, b))), shape=(nodes.size, nodes.size))
    _, component = connected_components(graph.tocsr(), directed=False)
    smallest = np.full(int(component.max()) + 1, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(smallest, component, nodes)
    _write_labels(nodes, smallest[component], output, params or "")
    return {"nodes": int(nodes.size)}


def connected_components(
    edge_files: Sequence[str],
    edges: int,
    work: str,
    runner: TaskMap,
    *,
    union_find_max_edges: int,
    edges_per_task: int,
    labels_dir: str | None = None,
    label_cuts: str = "",
    max_inputs: int = fanin.MAX_INPUTS,
    merge_bytes: int = fanin.BUDGET_BYTES,
    max_task_rows: int | None = None,
) -> tuple[list[str], dict[str, Any]]:
    """Label files ``(key = node, node, label)`` for every node with an edge (under
    ``labels_dir``, default ``<work>/cc/labels``), and counters (``cc_results``: the tasks' results).
    With ``label_cuts`` (stored node cuts, :func:`.shuffle.write_cuts`) the label files are
    block files (``.blocks``) cut there, else key-sorted Parquet. No task reads more than
    ``max_inputs`` files: more edge or round files are merged first (:func:`fanin.bounded`).
    No round task holds more than ``max_task_rows`` rows (default 1.25 x ``edges_per_task``;
    0: no bound) plus the block it is reading: a range past it (a heavy centre) runs as slices."""
    labels_dir = labels_dir or storage.join(work, "cc", "labels")
    suffix = ".blocks" if label_cuts else ".parquet"
    stats: list[ShardResult] = []

    def run(tasks: list[ShardTask]) -> list[ShardResult]:
        stats.extend(runner.map(tasks))
        return stats[len(stats) - len(tasks) :]

    def merged(files: Sequence[str], folder: str, blocks: int, limit: int = max_inputs) -> tuple[str, ...]:
        return tuple(fanin.bounded(run, files, folder, limit, fanin.MergeFilesParams(blocks=blocks, budget_bytes=merge_bytes)))

    if edges <= union_find_max_edges:
        inputs = merged(edge_files, storage.join(work, "cc", "edges"), shuffle.pow2_partitions(2 * edges, edges_per_task))
        (result,) = run([ShardTask(union_find, inputs, storage.join(labels_dir, "labels" + suffix), label_cuts or None)])
        return [result.output], {"cc_method": "union_find", "cc_rounds": 0, "cc_results": stats}
    # Not rounded to a power of two: each round's P tasks read a block of each of P files (P^2
    # block reads, ~0.1 ms each); the first round reads the edge files' covering blocks.
    partitions = shuffle.tasks_for(2 * edges, edges_per_task)
    max_rows = edges_per_task + edges_per_task // 4 if max_task_rows is None else max_task_rows
    current = list(edge_files)
    from_blocks = False  # the first round reads the sorted edge files, later ones the rounds' block files

    def step(inputs: Sequence[str], folder: str, mode: str, blocks: bool) -> list[ShardResult]:
        # the round files are cut at the partitions' bounds: merged ones too (a task reads its
        # block of each); one input fewer than the bound: a slice task reads its node table too
        given = tuple(inputs)
        inputs = merged(inputs, storage.join(work, "cc", storage.basename(folder) + "-in"), partitions, max(2, max_inputs - 1))
        blocks = blocks or inputs != given  # merged files are cut at the partitions: a task reads its block of each
        name = shuffle.block_name if mode != "labels" or label_cuts else storage.shard_name
        params = [RoundParams(p, partitions, mode, blocks, label_cuts, max_rows=max_rows) for p in range(partitions)]
        results = run([ShardTask(star_round, inputs, storage.join(folder, name(p, partitions)), params[p]) for p in range(partitions)])
        return _with_slices(run, results, params, inputs, folder, edges_per_task)

    for rnd in range(MAX_ROUNDS):
        large = step(current, storage.join(work, "cc", f"round-{rnd:03d}-large"), "large", from_blocks)
        if sum(int(r.stats.get("unconverged", 0)) for r in large) == 0:
            break
        small = step([r.output for r in large], storage.join(work, "cc", f"round-{rnd:03d}-small"), "small", True)
        current, from_blocks = [r.output for r in small], True
    else:  # pragma: no cover - the rounds converge in O(log^2 n)
        raise RuntimeError(f"connected components did not converge in {MAX_ROUNDS} rounds")
    labels = step(current, labels_dir, "labels", from_blocks)
    return [r.output for r in labels], {"cc_method": "star_rounds", "cc_rounds": rnd + 1, "cc_results": stats}


def _with_slices(run: Any, results: list[ShardResult], params: Sequence[RoundParams], inputs: Sequence[str], folder: str, edges_per_task: int) -> list[ShardResult]:
    """A round's results, where a range held more rows than its bound (a heavy centre) replaced
    by its slices': each slice task holds ~``edges_per_task`` of the range's rows (by a hash of
    the edge) and the range's node table, and writes the same edges the range would have."""
    slices: list[ShardTask] = []
    for result, param in zip(results, params):
        if "split" not in result.stats:
            continue
        count = shuffle.tasks_for(int(result.stats["rows_read"]), edges_per_task)
        for g in range(count):
            out = storage.join(folder, f"slice-{param.partition:05d}-{g:05d}-of-{count:05d}{shuffle.BLOCK_SUFFIX}")
            slices.append(ShardTask(star_round, (*inputs, result.stats["split"]), out, dataclasses.replace(param, slice=g, slices=count)))
    if not slices:
        return results
    return [r for r in results if "split" not in r.stats] + run(slices)
