"""One large-star, small-star or labelling round over one key range of edges, bounded in rows
whatever a node's degree.

A round's task for key range ``p`` needs, per node ``a`` it owns, only the smallest neighbour
(and whether it has more than one): every edge it writes follows from the row ``(a, b)`` and
that minimum. So a task reads its rows file by file; while they stay within ``max_rows`` it
runs the round on them (as it always did), and past it (a heavy centre: a star's spokes all
keyed by the centre) it keeps only each node's smallest and largest neighbour, writes that
node table, and returns ``split``. The driver then runs the range as ``k`` slice tasks, each
holding the rows whose ``hash(a, b)`` falls in its slice plus the node table: the same edges,
~``rows / k`` rows per task. A labelling round needs no slices: its labels are the node table's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from marin_assets.core.dedup import shuffle
from marin_assets.core.runtime import storage

EDGE_SCHEMA = pa.schema([("key", pa.int64()), ("a", pa.int64()), ("b", pa.int64())])
LABEL_SCHEMA = pa.schema([("key", pa.int64()), ("node", pa.int64()), ("label", pa.int64())])
NODE_SCHEMA = pa.schema([("node", pa.int64()), ("low", pa.int64()), ("high", pa.int64())])  # smallest and largest neighbour


def edge_table(a: np.ndarray, b: np.ndarray) -> pa.Table:
    """Both directions of the undirected edges ``(a, b)``, keyed by their first endpoint."""
    first = np.concatenate([a, b]).astype(np.int64)
    second = np.concatenate([b, a]).astype(np.int64)
    return pa.table([pa.array(shuffle.hash_keys(first)), pa.array(first), pa.array(second)], schema=EDGE_SCHEMA)


def write_labels(node: np.ndarray, label: np.ndarray, output: str, label_cuts: str = "") -> None:
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
    max_rows: int = 0  # rows one task holds at most (0: no bound); past it the range is split
    slice: int = 0  # a slice task: its slice of ``slices`` (the last input is the range's node table)
    slices: int = 0

    @property
    def bounds(self) -> list[tuple[int, int]]:
        return shuffle.partition_bounds(self.partitions)


def slice_of(a: np.ndarray, b: np.ndarray, slices: int) -> np.ndarray:
    """Each row's slice: a hash of the whole edge, so one node's rows spread over every slice."""
    with np.errstate(over="ignore"):
        mixed = shuffle.fmix64(a.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) ^ b.astype(np.uint64))
    return (mixed % np.uint64(slices)).astype(np.int64)


def _pieces(inputs: Sequence[str], params: RoundParams) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The range's rows ``(a, b)`` without self-loops (a slice task: its slice's only), a few
    files at a time (as many as are read at once), so a task never holds more than it keeps."""
    step = max(1, shuffle.read_threads(inputs))
    for i in range(0, len(inputs), step):
        chunk = inputs[i : i + step]
        if params.from_blocks:
            table = shuffle.read_blocks(chunk, params.partition, EDGE_SCHEMA, params.partitions)
        else:
            table = shuffle.read_range(chunk, *params.bounds[params.partition], ["a", "b"], EDGE_SCHEMA)
        a, b = table.column("a").to_numpy(), table.column("b").to_numpy()
        keep = a != b
        if params.slices:
            keep &= slice_of(a, b, params.slices) == params.slice
        yield a[keep], b[keep]


def _unique_sorted(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows sorted by ``(a, b)``."""
    order = np.lexsort((b, a))
    a, b = a[order], b[order]
    if a.size:
        fresh = np.r_[True, (a[1:] != a[:-1]) | (b[1:] != b[:-1])]
        a, b = a[fresh], b[fresh]
    return a, b


def node_table(a: np.ndarray, low: np.ndarray, high: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per node of ``a``: the smallest of ``low`` and the largest of ``high``, sorted by node."""
    if not a.size:
        return a, low, high
    order = np.argsort(a, kind="stable")
    a, low, high = a[order], low[order], high[order]
    starts = np.flatnonzero(np.r_[True, a[1:] != a[:-1]])
    return a[starts], np.minimum.reduceat(low, starts), np.maximum.reduceat(high, starts)


def _read_rows(inputs: Sequence[str], params: RoundParams) -> tuple[tuple[np.ndarray, np.ndarray] | None, tuple[np.ndarray, ...] | None, int, int]:
    """The range's distinct rows, or (past ``max_rows`` rows) only its node table; the rows
    read, and the most rows held at once."""
    held: list[tuple[np.ndarray, np.ndarray]] = []
    nodes: tuple[np.ndarray, ...] | None = None
    rows = kept = peak = 0
    for a, b in _pieces(inputs, params):
        rows += a.size
        if nodes is None and (not params.max_rows or kept + a.size <= params.max_rows):
            held.append((a, b))
            kept += a.size
            peak = kept
            continue
        if nodes is None:  # past the bound: the rows held so far become the node table
            peak = kept + a.size
            held_a = np.concatenate([x for x, _ in held]) if held else np.zeros(0, np.int64)
            held_b = np.concatenate([y for _, y in held]) if held else np.zeros(0, np.int64)
            nodes, held = node_table(held_a, held_b, held_b), []
        peak = max(peak, nodes[0].size + a.size)
        nodes = node_table(np.concatenate([nodes[0], a]), np.concatenate([nodes[1], b]), np.concatenate([nodes[2], b]))
    if nodes is not None:
        return None, nodes, rows, peak
    a = np.concatenate([x for x, _ in held]) if held else np.zeros(0, np.int64)
    b = np.concatenate([y for _, y in held]) if held else np.zeros(0, np.int64)
    return _unique_sorted(a, b), None, rows, peak


def _node_rows(nodes: tuple[np.ndarray, ...], a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``a``: its node's smallest and largest neighbour."""
    at = np.searchsorted(nodes[0], a)
    return nodes[1][at], nodes[2][at]


def _emit(a: np.ndarray, b: np.ndarray, nodes: tuple[np.ndarray, ...], params: RoundParams, output: str, node_level: bool) -> dict[str, Any]:
    """The round's output for rows ``(a, b)`` given their nodes' neighbour range; the per-node
    parts (labels, a node's own edge to its centre, the unconverged count) only with ``node_level``."""
    node, low, high = nodes
    if params.mode == "labels":
        write_labels(node, np.minimum(node, low), output, params.label_cuts)
        return {"nodes": int(node.size)}
    row_low, _ = _node_rows(nodes, a)
    if params.mode == "large":
        # Unconverged: a node that is not its star's centre yet has more than one neighbour.
        unconverged = int(((low < node) & (low != high)).sum()) if node_level else 0
        up = b > a
        shuffle.write_blocks(edge_table(b[up], np.minimum(row_low, a)[up]), output, params.bounds)
        return {"edges_in": int(a.size), "unconverged": unconverged}
    # Small-star: each smaller neighbour, and the node itself, goes to the smallest neighbour.
    down = b < a
    moved_b, moved_m = b[down], row_low[down]
    spoke = moved_b != moved_m
    own = (low < node) if node_level else np.zeros(node.size, bool)
    first = np.concatenate([moved_b[spoke], node[own]])
    second = np.concatenate([moved_m[spoke], low[own]])
    shuffle.write_blocks(edge_table(first, second), output, params.bounds)
    return {"edges_in": int(a.size)}


def nodes_uri(output: str) -> str:
    """Where a split range's task writes its node table."""
    return output + ".nodes.parquet"


@shuffle.measured
def star_round(inputs: list[str], output: str, params: RoundParams) -> dict[str, Any]:
    """One large-star or small-star step over one key range (or one slice of it), or the final
    labelling. Returns ``split`` (the node table's uri) when the range held more than
    ``max_rows`` rows and was not a labelling round: the driver runs its slices."""
    if params.slices:
        table = storage.read_parquet(inputs[-1])
        nodes = tuple(table.column(c).to_numpy() for c in NODE_SCHEMA.names)
        rows, _, read, peak = _read_rows(inputs[:-1], dataclasses.replace(params, max_rows=0))
        stats = _emit(*rows, nodes, params, output, node_level=params.slice == 0)
        return {**stats, "rows_held": peak + int(nodes[0].size), "rows_read": read}
    rows, nodes, read, peak = _read_rows(inputs, params)
    if rows is None:
        if params.mode == "labels":
            return {**_emit(nodes[0][:0], nodes[0][:0], nodes, params, output, True), "rows_held": peak, "rows_read": read}
        storage.write_parquet(pa.table(list(nodes), schema=NODE_SCHEMA), nodes_uri(output))
        return {"split": nodes_uri(output), "rows_held": peak, "rows_read": read}
    return {**_emit(*rows, node_table(rows[0], rows[1], rows[1]), params, output, True), "rows_held": peak, "rows_read": read}
