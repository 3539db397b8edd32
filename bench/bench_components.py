"""Connected components with a heavy centre: one star-shaped component of 10^6 nodes against
1,000 components of 1,000 nodes with as many edges, at the same task size.

The component rounds key every edge by its first endpoint, so a star's spokes all land in its
centre's key range. A range past 1.25 x ``edges_per_task`` rows runs as slices (by a hash of
the edge, each with the range's node table). Cases: ``ordinary`` (1,000 components), ``star``
(one 10^6-node component), ``star-unsplit`` (the same, with no row bound: how the rounds ran
before). Each runs the rounds on two worker processes; the figures are the largest task's
rows held and its peak RSS (each task's own VmHWM). Goals: the star's largest task within 1.3x
of the ordinary run's, in rows and in peak.

Usage: ``python -m bench.bench_components [--rounds N] [--nodes N] [--edges-per-task N]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile

import numpy as np

from bench import harness


def components(shape: str, nodes: int, edges_per_task: int, bounded: bool) -> dict:
    """One run in a child: the shape's edges as 16 edge files, then the component rounds."""
    from marin_assets.core.dedup import shuffle  # noqa: PLC0415
    from marin_assets.core.dedup.components import connected_components, edge_table  # noqa: PLC0415
    from marin_assets.core.runtime.runner import ShardRunner  # noqa: PLC0415

    order = np.random.default_rng(0).permutation(nodes)
    heads = np.full(nodes, order[0]) if shape == "star" else order[np.arange(nodes) // 1000 * 1000]
    spoke = heads != order
    u, v = heads[spoke], order[spoke]
    with tempfile.TemporaryDirectory(prefix="bench-components-") as tmp:
        files = [f"{tmp}/edges-{k:02d}.parquet" for k in range(16)]
        for k, uri in enumerate(files):
            shuffle.write_sorted(edge_table(u[k::16], v[k::16]), uri)
        with harness.timed():
            _, stats = connected_components(
                files, int(u.size), f"{tmp}/cc", ShardRunner(processes=2), union_find_max_edges=0, edges_per_task=edges_per_task, max_task_rows=None if bounded else 0
            )
    results = stats["cc_results"]
    return {
        "items": nodes,
        "rows": max(int(r.stats.get("rows_held", 0)) for r in results),
        "task_peak_kib": max(r.peak_rss_bytes for r in results) // 1024,
        "tasks": len(results),
        "sliced": sum("split" in r.stats for r in results),
        "rounds": stats["cc_rounds"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=harness.pick(3, 1))
    parser.add_argument("--nodes", type=int, default=1_000_000)
    parser.add_argument("--edges-per-task", type=int, default=100_000)
    args = parser.parse_args()
    kwargs = {"nodes": args.nodes, "edges_per_task": args.edges_per_task}
    cases = [
        harness.Case("ordinary", "bench.bench_components:components", {"shape": "ordinary", "bounded": True, **kwargs}),
        harness.Case("star", "bench.bench_components:components", {"shape": "star", "bounded": True, **kwargs}),
        harness.Case("star-unsplit", "bench.bench_components:components", {"shape": "star", "bounded": False, **kwargs}),
    ]
    result = harness.compare(f"components: {args.nodes:,} nodes, {args.edges_per_task:,} edges per task, 2 worker processes", cases, args.rounds, unit="nodes")
    for case in cases:
        m = result[case.label]
        print(f"  {case.label:<14} largest task {int(statistics.median(m.values('rows'))):,} rows, peak {max(m.values('task_peak_kib')) / 1024:.0f} MiB; {int(m.median('tasks'))} tasks, {int(m.median('sliced'))} ranges sliced, {int(m.median('rounds'))} rounds")
    rows = statistics.median(result["star"].values("rows")) / statistics.median(result["ordinary"].values("rows"))
    harness.absolute_goal("largest task's rows, star / ordinary <= 1.3x", f"{rows:.2f}x", rows <= 1.3)
    harness.memory_goal("star", "ordinary", 1.3, "largest task's peak, star / ordinary <= 1.3x", key="task_peak_kib").check(result)


if __name__ == "__main__":
    sys.exit(harness.exit_status(main()))
