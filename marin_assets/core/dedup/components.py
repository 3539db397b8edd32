"""Connected components over edge shards in storage, labelling every node with the smallest
node of its component.

Edges are stored in both directions as ``(key = hash(a), a, b)`` rows, so a task for a key
range sees every neighbour of the nodes it owns. Below ``union_find_max_edges`` one task reads
all edges and runs a union-find (scipy); above it, alternating large-star and small-star rounds
(Kiveris et al., "Connected Components in MapReduce and Beyond") run as shuffles through
storage until the graph is a forest of stars, whose centres are the component minima. No task
holds more than one key range of edges. A round writes one block per destination key range
(:func:`.shuffle.write_blocks`), so each task of the next round reads exactly its own rows
from every file, not a row group of each.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from marin_assets.core.dedup import fanin, shuffle
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.runner import ShardResult, ShardTask

EDGE_SCHEMA = pa.schema([("key", pa.int64()), ("a", pa.int64()), ("b", pa.int64())])
LABEL_SCHEMA = pa.schema([("key", pa.int64()), ("node", pa.int64()), ("label", pa.int64())])
MAX_ROUNDS = 200


class TaskMap(Protocol):
    """What runs a step's tasks: a :class:`ShardRunner`, or a caller that counts them too."""

    def map(self, tasks: list[ShardTask]) -> list[ShardResult]: ...


def edge_table(a: np.ndarray, b: np.ndarray) -> pa.Table:
    """Both directions of the undirected edges ``(a, b)``, keyed by their first endpoint."""
    first = np.concatenate([a, b]).astype(np.int64)
    second = np.concatenate([b, a]).astype(np.int64)
    return pa.table([pa.array(shuffle.hash_keys(first)), pa.array(first), pa.array(second)], schema=EDGE_SCHEMA)


def _write_labels(node: np.ndarray, label: np.ndarray, output: str, label_cuts: str = "") -> None:
    """Labels keyed by node: sorted Parquet, or (``label_cuts``: the stored cuts of the members
    tasks' node ranges) one block per range, so each members task reads exactly its rows."""
    table = pa.table([pa.array(node.astype(np.int64)), pa.array(node.astype(np.int64)), pa.array(label.astype(np.int64))], schema=LABEL_SCHEMA)
    if label_cuts:
        shuffle.write_blocks(table, output, cuts=shuffle.read_cuts(label_cuts))
    else:
        shuffle.write_sorted(table, output)


@dataclasses.dataclass(frozen=True)
class RoundParams:
    partition: int  # this task's key range, of ``partitions`` equal ones (the blocks a round writes)
    partitions: int
    mode: str  # "large", "small" or "labels"
    from_blocks: bool  # inputs are the last round's block files (else the sorted edge files)
    label_cuts: str = ""  # mode "labels": write blocks at these stored node cuts (else sorted Parquet)

    @property
    def bounds(self) -> list[tuple[int, int]]:
        return shuffle.partition_bounds(self.partitions)


def _grouped(inputs: Sequence[str], params: RoundParams) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Unique directed edges of a key range sorted by ``a``, each row's group start, and the
    per-row minimum of its group's ``a`` and neighbours."""
    if params.from_blocks:
        table = shuffle.read_blocks(inputs, params.partition, EDGE_SCHEMA)
    else:
        table = shuffle.read_range(inputs, *params.bounds[params.partition], ["a", "b"], EDGE_SCHEMA)
    a = table.column("a").to_numpy()
    b = table.column("b").to_numpy()
    keep = a != b
    a, b = a[keep], b[keep]
    order = np.lexsort((b, a))
    a, b = a[order], b[order]
    if a.size:
        fresh = np.ones(a.size, bool)
        fresh[1:] = (a[1:] != a[:-1]) | (b[1:] != b[:-1])
        a, b = a[fresh], b[fresh]
    starts = np.flatnonzero(np.r_[True, a[1:] != a[:-1]]) if a.size else np.zeros(0, np.int64)
    group_min = np.minimum.reduceat(b, starts) if a.size else np.zeros(0, np.int64)
    sizes = np.diff(np.append(starts, a.size))
    m = np.minimum(np.repeat(group_min, sizes), a)
    return a, b, m, sizes


@shuffle.measured
def star_round(inputs: list[str], output: str, params: RoundParams) -> dict[str, Any]:
    """One large-star or small-star step over one key range, or the final labelling."""
    a, b, m, sizes = _grouped(inputs, params)
    if params.mode == "labels":
        starts = np.flatnonzero(np.r_[True, a[1:] != a[:-1]]) if a.size else np.zeros(0, np.int64)
        _write_labels(a[starts], m[starts], output, params.label_cuts)
        return {"nodes": int(starts.size)}
    if params.mode == "large":
        # Unconverged: a node that is not its star's centre yet has more than one neighbour.
        starts = np.flatnonzero(np.r_[True, a[1:] != a[:-1]]) if a.size else np.zeros(0, np.int64)
        unconverged = int(((m[starts] < a[starts]) & (sizes > 1)).sum())
        up = b > a
        shuffle.write_blocks(edge_table(b[up], m[up]), output, params.bounds)
        return {"edges_in": int(a.size), "unconverged": unconverged}
    down = b < a
    lower_min = np.minimum(m, a)  # m already includes every neighbour; restrict to the lower ones
    # Small-star: m over {a} and its smaller neighbours, which is the group min when any exist.
    has_lower = np.zeros(a.size, bool)
    if a.size:
        starts = np.flatnonzero(np.r_[True, a[1:] != a[:-1]])
        group = np.repeat(np.arange(starts.size), np.diff(np.append(starts, a.size)))
        has_lower = np.bincount(group, weights=down, minlength=starts.size)[group] > 0
    centre = np.where(has_lower, lower_min, a)
    moved_b, moved_m = b[down], centre[down]
    spoke = moved_b != moved_m
    own = has_lower & np.r_[True, a[1:] != a[:-1]] if a.size else has_lower
    first = np.concatenate([moved_b[spoke], a[own]])
    second = np.concatenate([moved_m[spoke], centre[own]])
    shuffle.write_blocks(edge_table(first, second), output, params.bounds)
    return {"edges_in": int(a.size)}


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
) -> tuple[list[str], dict[str, Any]]:
    """Label files ``(key = node, node, label)`` for every node with an edge (under
    ``labels_dir``, default ``<work>/cc/labels``), and counters (``cc_results``: the tasks' results).
    With ``label_cuts`` (stored node cuts, :func:`.shuffle.write_cuts`) the label files are
    block files (``.blocks``) cut there, else key-sorted Parquet. No task reads more than
    ``max_inputs`` files: more edge or round files are merged first (:func:`fanin.bounded`)."""
    labels_dir = labels_dir or storage.join(work, "cc", "labels")
    suffix = ".blocks" if label_cuts else ".parquet"
    stats: list[ShardResult] = []

    def run(tasks: list[ShardTask]) -> list[ShardResult]:
        stats.extend(runner.map(tasks))
        return stats[len(stats) - len(tasks) :]

    def merged(files: Sequence[str], folder: str, blocks: int) -> tuple[str, ...]:
        return tuple(fanin.bounded(run, files, folder, max_inputs, fanin.MergeFilesParams(blocks=blocks, budget_bytes=merge_bytes)))

    if edges <= union_find_max_edges:
        inputs = merged(edge_files, storage.join(work, "cc", "edges"), shuffle.pow2_partitions(2 * edges, edges_per_task))
        (result,) = run([ShardTask(union_find, inputs, storage.join(labels_dir, "labels" + suffix), label_cuts or None)])
        return [result.output], {"cc_method": "union_find", "cc_rounds": 0, "cc_results": stats}
    # Not rounded to a power of two: each round's P tasks read a block of each of P files (P^2
    # block reads, ~0.1 ms each); the first round reads the edge files' covering blocks.
    partitions = shuffle.partitions_for(2 * edges, edges_per_task)
    current = list(edge_files)
    from_blocks = False  # the first round reads the sorted edge files, later ones the rounds' block files

    def step(inputs: Sequence[str], folder: str, mode: str, blocks: bool) -> list[ShardResult]:
        # the round files are cut at the partitions' bounds: merged ones too (a task reads its block of each)
        inputs = merged(inputs, storage.join(work, "cc", storage.basename(folder) + "-in"), partitions)
        name = shuffle.block_name if mode != "labels" or label_cuts else storage.shard_name
        return run([ShardTask(star_round, inputs, storage.join(folder, name(p, partitions)), RoundParams(p, partitions, mode, blocks, label_cuts)) for p in range(partitions)])

    for rnd in range(MAX_ROUNDS):
        large = step(current, storage.join(work, "cc", f"round-{rnd:03d}-large"), "large", from_blocks)
        if sum(int(r.stats["unconverged"]) for r in large) == 0:
            break
        small = step([r.output for r in large], storage.join(work, "cc", f"round-{rnd:03d}-small"), "small", True)
        current, from_blocks = [r.output for r in small], True
    else:  # pragma: no cover - the rounds converge in O(log^2 n)
        raise RuntimeError(f"connected components did not converge in {MAX_ROUNDS} rounds")
    labels = step(current, labels_dir, "labels", from_blocks)
    return [r.output for r in labels], {"cc_method": "star_rounds", "cc_rounds": rnd + 1, "cc_results": stats}
