"""Connected components by star rounds: union-find's labels, heavy centres split across tasks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from marin_assets.core.dedup import shuffle as dedup_shuffle
from marin_assets.core.runtime.runner import ShardRunner


@pytest.mark.system
def test_star_rounds_label_components_like_union_find(tmp_path: Path) -> None:
    from marin_assets.core.dedup.components import LABEL_SCHEMA, connected_components, edge_table
    from marin_assets.core.runtime.runner import ShardRunner

    rng = np.random.default_rng(7)
    u = rng.integers(0, 3000, 2500)
    v = rng.integers(0, 3000, 2500)
    chain = np.arange(1000, 1400)  # a long path: the worst case for label propagation
    hub = rng.integers(0, 3000, 1500)  # a heavy centre: more spokes than a round task holds
    u, v = np.concatenate([u, chain[:-1], np.full(hub.size, 2999)]), np.concatenate([v, chain[1:], hub])
    files = []
    for k in range(3):
        uri = str(tmp_path / f"edges-{k}.parquet")
        dedup_shuffle.write_sorted(edge_table(u[k::3], v[k::3]), uri)
        files.append(uri)

    def labels(files: list[str], work: str, **sizes) -> dict[int, int]:
        out, stats = connected_components(files, len(u), work, ShardRunner(), **sizes)
        table = dedup_shuffle.read_range(out, 0, dedup_shuffle.KEY_SPACE, ["node", "label"])
        return dict(zip(table.column("node").to_pylist(), table.column("label").to_pylist())), stats

    one, one_stats = labels(files, str(tmp_path / "uf"), union_find_max_edges=10**9, edges_per_task=10**9)
    many, many_stats = labels(files, str(tmp_path / "stars"), union_find_max_edges=0, edges_per_task=500)
    assert one_stats["cc_method"] == "union_find" and many_stats["cc_method"] == "star_rounds"
    assert len(many_stats["cc_results"]) > 10
    split = [r for r in many_stats["cc_results"] if "split" in r.stats]
    assert split and max(r.stats["rows_held"] for r in many_stats["cc_results"]) < 1000  # the hub's range ran as slices
    assert one == many
    assert set(one) == set(u.tolist()) | set(v.tolist()) - {x for x, y in zip(u.tolist(), v.tolist()) if x == y and (u == x).sum() + (v == x).sum() == 2}
    assert one[1399] == 1000 or one[1399] < 1000  # the path's end is labelled with its component's minimum
    # Labels as block files cut at members tasks' node ranges: each range's blocks hold exactly the
    # rows the sorted label files give for it, with either method
    runs = [[(0, 700)], [(700, 1200), (2600, 3000)], [(1200, 2600)]]
    cuts_uri = str(tmp_path / "node_cuts.bin")
    dedup_shuffle.write_cuts(cuts_uri, sorted({0, dedup_shuffle.KEY_SPACE} | {x for r in runs for run in r for x in run}))
    for name, sizes in (("uf", {"union_find_max_edges": 10**9, "edges_per_task": 10**9}), ("stars", {"union_find_max_edges": 0, "edges_per_task": 500})):
        sorted_files, _ = connected_components(files, len(u), str(tmp_path / name), ShardRunner(), **sizes)
        block_files, _ = connected_components(files, len(u), str(tmp_path / f"{name}-blocks"), ShardRunner(), **sizes, label_cuts=cuts_uri)
        assert all(f.endswith(".blocks") for f in block_files) and len(block_files) == len(sorted_files)
        for r in runs:
            got = dedup_shuffle.read_ranges_blocks(block_files, dedup_shuffle.read_cuts(cuts_uri), r, LABEL_SCHEMA)
            want = dedup_shuffle.read_ranges(sorted_files, r, ["node", "label"], LABEL_SCHEMA)
            assert got.num_rows == want.num_rows > 0
            assert sorted(zip(got.column("node").to_pylist(), got.column("label").to_pylist())) == sorted(zip(want.column("node").to_pylist(), want.column("label").to_pylist()))
        whole = pa.concat_tables([dedup_shuffle.read_whole(f, LABEL_SCHEMA) for f in block_files])
        assert dict(zip(whole.column("node").to_pylist(), whole.column("label").to_pylist())) == one


def component_labels(files: list[str], edges: int, work: str, runner: ShardRunner | None = None, **sizes) -> tuple[dict[int, int], dict]:
    """Every node's label from :func:`connected_components` over edge files, and its counters."""
    from marin_assets.core.dedup.components import connected_components

    out, stats = connected_components(files, edges, work, runner or ShardRunner(), **sizes)
    table = dedup_shuffle.read_range(out, 0, dedup_shuffle.KEY_SPACE, ["node", "label"])
    return dict(zip(table.column("node").to_pylist(), table.column("label").to_pylist())), stats


def edge_files(root: Path, u: np.ndarray, v: np.ndarray, files: int) -> list[str]:
    """The undirected edges ``(u, v)`` as ``files`` key-sorted edge files (as edges tasks write them)."""
    from marin_assets.core.dedup.components import edge_table

    root.mkdir(parents=True, exist_ok=True)
    uris = [str(root / f"edges-{k}.parquet") for k in range(files)]
    for k, uri in enumerate(uris):
        dedup_shuffle.write_sorted(edge_table(u[k::files], v[k::files]), uri)
    return uris


@pytest.mark.parametrize("seed", [1, pytest.param(2, marks=pytest.mark.system), pytest.param(3, marks=pytest.mark.system)])
def test_heavy_centres_split_across_tasks_give_the_same_components_and_rounds(tmp_path: Path, seed: int) -> None:
    """Random graphs with a few centres of hundreds to thousands of spokes: the rounds with heavy
    ranges run as slices label every node as the unbounded rounds and union-find do, in as many rounds."""
    rng = np.random.default_rng(seed)
    n = 3000
    u, v = rng.integers(0, n, 1500), rng.integers(0, n, 1500)
    for centre, spokes in ((int(rng.integers(n)), 4000), (int(rng.integers(n)), 700), (int(rng.integers(n)), 300)):
        u, v = np.concatenate([u, np.full(spokes, centre)]), np.concatenate([v, rng.integers(0, n, spokes)])
    files = edge_files(tmp_path / "edges", u, v, 10)
    rounds = {"union_find_max_edges": 0, "edges_per_task": 1000}
    one, _ = component_labels(files, len(u), str(tmp_path / "uf"), union_find_max_edges=10**9, edges_per_task=10**9)
    whole, whole_stats = component_labels(files, len(u), str(tmp_path / "whole"), **rounds, max_task_rows=0)
    split, split_stats = component_labels(files, len(u), str(tmp_path / "split"), **rounds)
    assert split == whole == one
    assert split_stats["cc_rounds"] == whole_stats["cc_rounds"]
    held = [r.stats["rows_held"] for r in split_stats["cc_results"] if "rows_held" in r.stats]
    assert any("split" in r.stats for r in split_stats["cc_results"])
    # at most the bound (1.25 x edges_per_task) and the block being read; unbounded, the centre's range
    assert max(held) <= 2 * 1000 < 4000 <= max(r.stats["rows_held"] for r in whole_stats["cc_results"] if "rows_held" in r.stats)


def largest_round_task(stats: dict) -> tuple[int, int]:
    """The most rows one component task held and the largest task peak (VmHWM, bytes)."""
    results = stats["cc_results"]
    return max(r.stats.get("rows_held", 0) for r in results), max(r.peak_rss_bytes for r in results)


@pytest.mark.system
def test_a_star_of_a_million_nodes_runs_within_the_bound_of_ordinary_components(tmp_path: Path) -> None:
    """One component of 10^6 nodes around one centre (its edges fed to the component step
    directly), against 1,000 components of 1,000 nodes with as many edges and the same task size:
    the largest task holds no more rows and peaks no higher than 1.3x the ordinary run's (each
    task in a worker process of its own, so each peak is the task's)."""
    n, sizes = 1_000_000, {"union_find_max_edges": 0, "edges_per_task": 100_000}
    nodes = np.random.default_rng(0).permutation(n)
    runner = ShardRunner(processes=2)
    star = edge_files(tmp_path / "star", np.full(n - 1, nodes[0]), nodes[1:], 16)
    labels, stats = component_labels(star, n - 1, str(tmp_path / "star-cc"), runner, **sizes)
    assert len(labels) == n and set(labels.values()) == {0}
    assert any("split" in r.stats for r in stats["cc_results"])
    heads = nodes[np.arange(n) // 1000 * 1000]
    spoke = heads != nodes
    ordinary = edge_files(tmp_path / "ordinary", heads[spoke], nodes[spoke], 16)
    base_labels, base_stats = component_labels(ordinary, int(spoke.sum()), str(tmp_path / "ordinary-cc"), runner, **sizes)
    assert len(base_labels) == n and len(set(base_labels.values())) == 1000
    (rows, peak), (base_rows, base_peak) = largest_round_task(stats), largest_round_task(base_stats)
    assert rows <= 1.3 * base_rows and peak <= 1.3 * base_peak, (rows, base_rows, peak >> 20, base_peak >> 20)

