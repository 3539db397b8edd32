"""Incremental components: the previous labels merged over the added documents' edges, and the label files rewritten."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from marin_assets.core.dedup import shuffle
from marin_assets.core.dedup.components import EDGE_SCHEMA, LABEL_SCHEMA, warm_scipy
from marin_assets.core.dedup.fuzzy.layout import DELTA_SCHEMA, RECORD_SCHEMA, RELABEL_FILES, REMAP_SCHEMA, gone_uri, keep_cuts
from marin_assets.core.dedup.fuzzy.state import Components, FuzzyRun, Mapped
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.runner import ShardResult, ShardTask


@dataclasses.dataclass(frozen=True)
class MergeParams:
    edge_files: int
    gone_files: int  # then the changed groups' gone nodes, then the previous label files
    fresh_labels: str  # where the newly clustered nodes' labels go
    label_cuts: tuple[str, ...] = ()  # per previous label file: the stored cuts of its blocks ("": read whole)


@dataclasses.dataclass(frozen=True)
class RelabelParams:
    outputs: tuple[str, ...]  # the relabelled file of each previous label file (inputs after the remap; any further input, the fresh labels, is read for the touched rows only)
    append_fresh: bool = False  # compaction: the fresh labels also go into the last output (the previous run's small fresh file grows instead of a new file per run)
    delta_cuts: str = ""  # the touched rows' file is blocks at these stored node cuts (the members tasks' ranges)
    cuts: tuple[str, ...] = ()  # per output: the stored cuts to write its blocks at (its previous file's; "": one block)


# --------------------------------------------------------------------------- 3b. incremental components


@shuffle.measured(warm=(warm_scipy,))
def fuzzy_merge_labels(inputs: list[str], output: str, params: MergeParams) -> dict[str, Any]:
    """Incremental components: the previous components stay whole (no document of theirs is
    gone) and only merge through the added documents' edges. A union-find over those edges,
    each endpoint replaced by its previous label, gives every touched component its new label
    (the smallest node, as a full run would). Writes the remap ``(key, node, label, fresh)``:
    each previous label and each newly clustered node (``fresh``) with its new label, and the
    newly clustered nodes' label file."""
    from scipy.sparse import coo_matrix  # noqa: PLC0415
    from scipy.sparse.csgraph import connected_components as scipy_components  # noqa: PLC0415

    ends, gone, found, read = _previous_labels(inputs, params.edge_files, params.gone_files, params.label_cuts)
    a, b = found.pop("a"), found.pop("b")
    n, labels = found["node"], found["label"]
    split = int(np.isin(n, gone).sum())
    hit = np.isin(n, ends)
    old = np.full(ends.size, -1, np.int64)
    old[np.searchsorted(ends, n[hit])] = labels[hit]
    vertex = np.where(old >= 0, old, ends)
    verts = np.unique(vertex)
    va = np.searchsorted(verts, vertex[np.searchsorted(ends, a)])
    vb = np.searchsorted(verts, vertex[np.searchsorted(ends, b)])
    if verts.size:
        graph = coo_matrix((np.ones(va.size, np.int8), (va, vb)), shape=(verts.size, verts.size))
        _, component = scipy_components(graph.tocsr(), directed=False)
        smallest = np.full(int(component.max()) + 1, np.iinfo(np.int64).max, np.int64)
        np.minimum.at(smallest, component, verts)
        label = smallest[component]
    else:
        label = verts
    fresh = ~np.isin(verts, old[old >= 0])
    shuffle.write_sorted(pa.table([pa.array(verts), pa.array(verts), pa.array(label), pa.array(fresh)], schema=REMAP_SCHEMA), output)
    labels_out = pa.table([pa.array(verts[fresh]), pa.array(verts[fresh]), pa.array(label[fresh])], schema=LABEL_SCHEMA)
    shuffle.write_sorted(labels_out, params.fresh_labels)
    # ``split``: a gone document was in a cluster, which may fall apart: the caller recomputes all.
    return {"edges": int(a.size), "touched": int(np.unique(label).size), "fresh": int(fresh.sum()), "merged": int(((label != verts) & ~fresh).sum()), "split": split, "label_rows_read": read}


def _previous_labels(inputs: Sequence[str], edge_files: int, gone_files: int, label_cuts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray], int]:
    """The added edges' endpoints, the gone nodes, the added edges (``a``, ``b``) and the rows of
    the previous label files (after the edge and gone files in ``inputs``) whose node is either:
    only the blocks that hold them are read, one file at a time; and the label rows read."""
    edges = shuffle.read_range(inputs[:edge_files], 0, shuffle.KEY_SPACE, ["a", "b"], EDGE_SCHEMA)
    a, b = edges.column("a").to_numpy(), edges.column("b").to_numpy()
    ends = np.unique(np.concatenate([a, b]))
    gone = np.unique(shuffle.read_range(inputs[edge_files : edge_files + gone_files], 0, shuffle.KEY_SPACE, ["node"], RECORD_SCHEMA).column("node").to_numpy())
    wanted = np.union1d(ends, gone)  # only the label blocks that hold these nodes are read
    label_files = inputs[edge_files + gone_files :]
    nodes, labels, read = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], 0
    for uri, cuts in zip(label_files, label_cuts or ("",) * len(label_files)):
        part = _label_rows(uri, cuts, wanted)
        read += part.num_rows
        n = part.column("node").to_numpy()
        keep = np.isin(n, wanted)
        nodes.append(n[keep])
        labels.append(part.column("label").to_numpy()[keep])
    return ends, gone, {"a": a, "b": b, "node": np.concatenate(nodes), "label": np.concatenate(labels)}, read


@shuffle.measured
def fuzzy_label_lookup(inputs: list[str], output: str, params: MergeParams) -> dict[str, Any]:
    """The rows of a group of previous label files whose node is an added edge's endpoint or a
    gone node (what :func:`fuzzy_merge_labels` looks up), so that task reads at most the file
    bound however many label files the previous run left."""
    _, _, found, read = _previous_labels(inputs, params.edge_files, params.gone_files, params.label_cuts)
    node = found["node"]
    shuffle.write_sorted(pa.table([pa.array(node), pa.array(node), pa.array(found["label"])], schema=LABEL_SCHEMA), output)
    return {"rows": int(node.size), "label_rows_read": read}


def _label_rows(uri: str, cuts_uri: str, nodes: np.ndarray) -> pa.Table:
    """The rows of a previous label file in the blocks that hold any of the sorted ``nodes``
    (keyed by node; without stored cuts, or a Parquet file: every row)."""
    if not cuts_uri or not uri.endswith(shuffle.BLOCK_SUFFIX):
        return shuffle.read_whole(uri, LABEL_SCHEMA)
    cuts = shuffle.read_cuts(cuts_uri)
    blocks = np.unique(np.searchsorted(cuts, nodes.astype(np.uint64), side="right") - 1)
    blocks = blocks[(blocks >= 0) & (blocks < cuts.size - 1)]
    if blocks.size == 0:
        return LABEL_SCHEMA.empty_table()
    breaks = np.flatnonzero(np.diff(blocks) > 1)
    spans = list(zip(np.r_[blocks[0], blocks[breaks + 1]].tolist(), (np.r_[blocks[breaks], blocks[-1]] + 1).tolist()))
    return shuffle.read_block_spans([uri], spans, LABEL_SCHEMA, cuts.size - 1).select(LABEL_SCHEMA.names).cast(LABEL_SCHEMA)


@shuffle.measured
def fuzzy_relabel(inputs: list[str], output: str, params: RelabelParams) -> dict[str, Any]:
    """Partitions of the previous labels with the remap applied (the next run's labels, one file
    each, read and written one at a time), and one block file of the touched components' rows
    (what the members step reads: one block per members task's node range, so those rows are
    held until written; the newly clustered nodes' labels included when ``fresh``)."""
    remap_file, *label_files = inputs
    remap = storage.read_parquet(remap_file)
    fresh = remap.column("fresh").to_numpy(zero_copy_only=False)
    was, now = remap.column("node").to_numpy()[~fresh], remap.column("label").to_numpy()[~fresh]
    touched = np.unique(remap.column("label").to_numpy())
    labels = touched_members = 0
    deltas: list[pa.Table] = []
    extra = label_files[len(params.outputs) :]  # the fresh labels (already final)
    appended = None
    if params.append_fresh and extra and params.outputs:
        appended = pa.concat_tables([shuffle.read_whole(uri, LABEL_SCHEMA) for uri in extra])
    cuts = params.cuts or ("",) * len(params.outputs)
    for k, (uri, out) in enumerate(zip(label_files, params.outputs + (None,) * len(extra))):
        table = shuffle.read_whole(uri, LABEL_SCHEMA)
        label = before = table.column("label").to_numpy()
        if out is not None:
            if was.size and label.size:
                pos = np.minimum(np.searchsorted(was, label), was.size - 1)
                label = np.where(was[pos] == label, now[pos], label)
            table = table.set_column(LABEL_SCHEMA.get_field_index("label"), "label", pa.array(label))
            written = table
            if appended is not None and k == len(params.outputs) - 1:
                written = pa.concat_tables([table, appended])
                _write_labels(written.take(pc.sort_indices(written, sort_keys=[("key", "ascending")])), out, cuts[k])
            elif np.array_equal(label, before):
                shuffle.copy_file(uri, out)  # no label of this file moved: the same bytes
            else:
                _write_labels(written, out, cuts[k])
            labels += written.num_rows
        hit = np.isin(label, touched)
        # added: not in the previous cluster of its (new) label: a fresh node, or one whose
        # previous cluster merged into a smaller label
        added = np.ones(int(hit.sum()), bool) if out is None else (before != label)[hit]
        delta = table.filter(pa.array(hit)).append_column("added", pa.array(added))
        touched_members += delta.num_rows
        deltas.append(delta)
    shuffle.write_blocks(pa.concat_tables(deltas) if deltas else DELTA_SCHEMA.empty_table(), output, cuts=shuffle.read_cuts(params.delta_cuts))
    return {"labels": labels, "touched_members": touched_members}


def _write_labels(table: pa.Table, uri: str, cuts: str = "") -> None:
    """A relabelled label file, in its previous file's format and cuts (so the next run's merge
    reads only the blocks it needs)."""
    if uri.endswith(shuffle.BLOCK_SUFFIX):
        shuffle.write_blocks(table, uri, cuts=shuffle.read_cuts(cuts) if cuts else [0, shuffle.KEY_SPACE])
    else:
        storage.write_parquet(table, uri, row_group_size=shuffle.ROW_GROUP_ROWS)


# --------------------------------------------------------------------------- scheduling


def run_merge(run: FuzzyRun, mapped: Mapped, edge_results: Sequence[ShardResult]) -> ShardResult:
    """One task: the remap of the previous labels over the added documents' edges. No task
    reads more than ``max_inputs_per_task`` files: the added edges' and gone nodes' files are
    merged to at most a quarter of it each (at least 2: the bound holds from 6 files up), and
    past the bound, lookup tasks first keep the rows the remap needs of each group of previous
    label files (levels until few enough)."""
    work, limit = run.work, run.scale.max_inputs_per_task
    edge_files = tuple(run.merged([r.output for r in edge_results], storage.join(work, "cc", "added-edges"), max(2, limit // 4)))
    gone_files = tuple(run.merged([gone_uri(t.output) for t in mapped.tasks if t.params.source in run.added_base], storage.join(work, "cc", "gone"), max(2, limit // 4)))
    label_files, cuts = list(run.before["label_files"]), _previous_cuts(run)
    per, level, read = max(2, limit - len(edge_files) - len(gone_files)), 0, 0
    while len(label_files) > per:
        starts = range(0, len(label_files), per)
        params = [MergeParams(len(edge_files), len(gone_files), "", tuple(cuts[i : i + per])) for i in starts]
        lookups = run.run([ShardTask(fuzzy_label_lookup, (*edge_files, *gone_files, *label_files[i : i + per]), storage.join(work, "cc", f"lookup-{level}", f"{i // per:06d}.parquet"), p) for i, p in zip(starts, params)])
        label_files, cuts, level = [r.output for r in lookups], [""] * len(lookups), level + 1
        read = read or sum(int(r.stats["label_rows_read"]) for r in lookups)  # the first level read the previous files
    params = MergeParams(len(edge_files), len(gone_files), storage.join(work, "labels", "fresh.parquet"), tuple(cuts))
    (merged,) = run.run([ShardTask(fuzzy_merge_labels, (*edge_files, *gone_files, *label_files), storage.join(work, "cc", "remap.parquet"), params)])
    if read:  # the previous label files' rows were read by the lookups
        merged.stats["label_rows_read"] = read
    return merged


def _previous_cuts(run: FuzzyRun) -> list[str]:
    """Per previous label file, the stored cuts of its blocks ("": unknown, read whole)."""
    cuts = list(run.before.get("label_cuts") or [])
    return cuts if len(cuts) == len(run.before["label_files"]) else [""] * len(run.before["label_files"])


def run_relabel(run: FuzzyRun, mapped: Mapped, merged: ShardResult, edge_results: list[ShardResult]) -> Components:
    """The previous label files with the remap applied (one task per RELABEL_FILES of them),
    each task also writing the touched clusters' rows for the members step. While the last
    label file is a small one of earlier fresh labels, this run's fresh labels join it, so
    incremental runs do not add a label file each."""
    work = run.work
    fresh_labels = storage.join(work, "labels", "fresh.parquet")
    old_labels = list(run.before["label_files"])
    old_rows = list(run.before.get("label_rows") or [])
    old_rows = old_rows if len(old_rows) == len(old_labels) else [None] * len(old_labels)
    # the same format as the previous file: one whose labels did not move is a byte copy
    relabelled_files = [storage.join(work, "labels", f"{i:06d}" + (shuffle.BLOCK_SUFFIX if old.endswith(shuffle.BLOCK_SUFFIX) else ".parquet")) for i, old in enumerate(old_labels)]
    old_cuts = keep_cuts(_previous_cuts(run), storage.join(work, "labels"))
    fresh_count = int(merged.stats["fresh"])
    append = bool(old_rows) and old_rows[-1] is not None and int(old_rows[-1]) + fresh_count <= run.scale.members_per_task
    if append:
        label_files, label_rows = relabelled_files, [*old_rows[:-1], int(old_rows[-1]) + fresh_count]
    else:
        label_files, label_rows = relabelled_files + [fresh_labels], [*old_rows, fresh_count]
    # The last task also reads the fresh labels (their touched rows; appended when compacting).
    per = max(1, min(RELABEL_FILES, run.scale.max_inputs_per_task - 2))  # the remap and the fresh labels besides
    starts = list(range(0, max(1, len(old_labels)), per))
    relabelled = run.run(
        [
            ShardTask(
                fuzzy_relabel,
                (merged.output, *old_labels[i : i + per], *([fresh_labels] if i == starts[-1] else [])),
                storage.join(work, "delta", f"{i // per:06d}.blocks"),
                RelabelParams(tuple(relabelled_files[i : i + per]), append_fresh=append and i == starts[-1], delta_cuts=mapped.node_cuts, cuts=tuple(old_cuts[i : i + per])),
            )
            for i in starts
        ]
    )
    if append and storage.exists(fresh_labels):
        storage.remove(fresh_labels)  # its rows are in the last label file now
    run.state["label_files"], run.state["label_rows"] = list(label_files), label_rows
    run.state["label_cuts"] = (old_cuts if append else [*old_cuts, ""])[: len(label_files)]
    stats = {"cc_method": "incremental", "cc_rounds": 0, "touched_clusters": int(merged.stats["touched"]), "label_rows_read": int(merged.stats.get("label_rows_read", 0))}
    return Components(edge_results, sum(int(r.stats["edges"]) for r in edge_results), [r.output for r in relabelled], stats, merged=merged)
