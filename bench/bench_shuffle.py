"""The fuzzy map step's bucket records grouped by key into P partitions two ways, on the same
corpus and the same local Ray cluster: the project's block files against Ray Data's hash shuffle.

Which shuffle: fuzzy dedup's map -> edges, the largest of the dedup shuffles (every document
gives one record per band, 26 of them, where exact dedup's map gives one id record), records
``(key, node)`` keyed by hash(band, bucket). The input of both is the same: the records of each
real map task (``fuzzy_map`` over the real-shape corpus of ``bench_dedup``, groups of 4 shards),
one Parquet file per map task, written before the runs. Cases (each run a fresh child process
that starts its own Ray cluster of 2 CPUs on 127.0.0.1):

* ``blocks`` (the project's): one task per map file writes its rows as a block file
  (``shuffle.write_keyed``), merge tasks bring the files to at most 16 per reader
  (``fanin.bounded``, the dedup bench's bound), then P reduce tasks each read their key range
  (``shuffle.read_range``) and write one partition file; ``ShardRunner`` on Ray, workers never
  recycled, as in production.
* ``ray-data``: ``ray.data.read_parquet`` of the same files, ``repartition(P, keys=["key"])``
  under ``ShuffleStrategy.HASH_SHUFFLE`` (Ray Data's documented key-partitioning shuffle), then
  ``write_parquet``: P partition files.

Printed per case and scale: wall time (median and range over interleaved rounds), the driver's
peak (VmHWM), every Ray worker process's peak (VmHWM of the whole process, library loads
included, polled from ``/proc`` while the run goes; for ``blocks`` also the largest task's own
peak, reset at its start), the CPU seconds of all the cluster's processes, the bytes Ray
spilled from its object store to local disk, the bytes the block files put in the bucket, and
whether each wrote exactly the input's rows with every key in one partition (checked in the
parent). ``blocks`` then reruns after losing half its reduce outputs (a killed run): the tasks
it ran again and the time. Goals: both outputs right; ``blocks`` at least as fast as
``ray-data`` at the smallest scale; its largest task's own peak within 1.3x from the smallest to
the largest scale (the dedup goal; Ray Data's largest worker beside it, printed).

Usage: ``python -m bench.bench_shuffle [--scales 1,4,16] [--rounds N] [--big-rounds N]
[--strategies hash_shuffle,shuffle_v2]`` (also ``python -m bench --only shuffle``; ``--quick``:
1x and 4x, one round; ``shuffle_v2`` is Ray 2.60's default strategy).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import os
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import bench_dedup, harness  # noqa: E402
from marin_assets.core.dedup import fanin, shuffle  # noqa: E402
from marin_assets.core.dedup.fuzzy.layout import RECORD_SCHEMA  # noqa: E402
from marin_assets.core.dedup.fuzzy.map import MapParams, fuzzy_map  # noqa: E402
from marin_assets.core.runtime import storage  # noqa: E402
from marin_assets.core.runtime.runner import LOCAL, WORKER_ENV, ShardRunner, ShardTask  # noqa: E402

CPUS = 2
RECORDS_PER_PARTITION = 10_000  # P: records / this, a power of two up (8 at 1x, 64 at 4x, 128 at 16x)
MAX_INPUTS = bench_dedup.SCALE.max_inputs_per_task  # 16: the dedup bench's bound on files per task
OBJECT_STORE_MIB = 256  # Ray's object store of the local cluster (the records are 1-20 MB)
POLL_S = 0.05


# --------------------------------------------------------------------------- processes' peaks


@dataclasses.dataclass(frozen=True)
class Proc:
    """A process as read from ``/proc``: its command line, peak resident size (VmHWM, KiB), its
    resident private memory now (RssAnon, KiB: without the object store's shared pages it maps)
    and CPU seconds (user + system) so far."""

    command: str
    hwm_kib: int
    anon_kib: int
    cpu_s: float


def process_tree(root: int) -> dict[int, Proc]:
    """Every live descendant of process ``root`` (children, their children, ...), by pid."""
    stats: dict[int, list[str]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    stats[int(entry)] = handle.read().rsplit(")", 1)[1].split()  # fields after the name: state, ppid, ...
            except (OSError, IndexError):
                continue
    tree, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, fields in stats.items() if int(fields[1]) in frontier} - tree
        tree |= frontier
    ticks = os.sysconf("SC_CLK_TCK")
    found = {}
    for pid in tree:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                command = handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
            with open(f"/proc/{pid}/status") as handle:
                fields = {k: v.split()[0] for k, _, v in (line.partition(":") for line in handle) if k in ("VmHWM", "RssAnon")}
        except OSError:
            continue
        found[pid] = Proc(command, int(fields.get("VmHWM", 0)), int(fields.get("RssAnon", 0)), (int(stats[pid][11]) + int(stats[pid][12])) / ticks)  # utime, stime
    return found


def is_ray_worker(command: str) -> bool:
    """A Ray worker process (task or actor), not one of Ray's own services."""
    return command.startswith("ray::") or "default_worker.py" in command


class TreeWatch:
    """This process's descendants polled every ``interval_s`` while a run goes: each one's
    largest VmHWM and RssAnon seen, its latest CPU seconds (a process that exits keeps its last
    reading, at most ``interval_s`` old) and the names a Ray worker ran under (``ray::<task or
    actor>``)."""

    def __init__(self, interval_s: float = POLL_S) -> None:
        self.seen: dict[int, Proc] = {}
        self.names: dict[int, set[str]] = {}
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._lock = threading.Lock()

    def poll(self) -> None:
        with self._lock:
            for pid, proc in process_tree(os.getpid()).items():
                before = self.seen.get(pid)
                self.seen[pid] = dataclasses.replace(proc, hwm_kib=max(proc.hwm_kib, before.hwm_kib if before else 0), anon_kib=max(proc.anon_kib, before.anon_kib if before else 0))
                if proc.command.startswith("ray::") and not proc.command.startswith("ray::IDLE"):
                    self.names.setdefault(pid, set()).add(re.match(r"ray::\w*", proc.command).group())  # the task or actor, not its arguments

    def cpu_s(self) -> float:
        """CPU seconds of the descendants so far (polled now)."""
        self.poll()
        return sum(p.cpu_s for p in self.seen.values())

    def figures(self) -> dict[str, Any]:
        self.poll()
        workers = {pid: p.hwm_kib for pid, p in self.seen.items() if is_ray_worker(p.command)}
        largest = max(workers, key=workers.__getitem__, default=0)
        return {
            "workers": len(workers),
            "worker_kib": workers.get(largest, 0),
            "workers_sum_kib": sum(workers.values()),
            "worker_anon_kib": max((p.anon_kib for p in self.seen.values() if is_ray_worker(p.command)), default=0),
            "largest_worker": ", ".join(sorted(self.names.get(largest, ()))) or "idle",
        }

    def __enter__(self) -> TreeWatch:
        def loop() -> None:
            while not self._stop.wait(self.interval_s):
                self.poll()

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@contextlib.contextmanager
def measured_run(watch: TreeWatch) -> Iterator[dict[str, float]]:
    """:func:`harness.timed` plus the CPU seconds the Ray cluster's processes spent meanwhile and
    the driver's peak at its end."""
    cluster: dict[str, float] = {}
    start = watch.cpu_s()
    with harness.timed():
        yield cluster
    cluster["cluster_cpu_s"] = watch.cpu_s() - start
    cluster["driver_kib"] = harness.proc_status_kib("VmHWM")


def spilled_bytes() -> int:
    """Bytes Ray spilled from the object store to local disk so far (its memory summary)."""
    import ray  # noqa: PLC0415
    from ray._private.internal_api import memory_summary  # noqa: PLC0415

    found = re.search(r"Spilled (\d+) MiB", memory_summary(ray.get_runtime_context().gcs_address, stats_only=True))
    return int(found.group(1)) << 20 if found else 0


@contextlib.contextmanager
def ray_cluster() -> Iterator[None]:
    import ray  # noqa: PLC0415

    ray.init(num_cpus=CPUS, object_store_memory=OBJECT_STORE_MIB << 20, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    try:
        yield
    finally:
        ray.shutdown()


# --------------------------------------------------------------------------- the output check


def fresh(folder: str) -> str:
    """A new, empty folder for one run under ``folder`` (no run reuses another's files)."""
    os.makedirs(folder, exist_ok=True)
    return tempfile.mkdtemp(prefix="run-", dir=folder)


def records_in(files: Sequence[str]) -> int:
    return sum(pq.read_metadata(f).num_rows for f in files)


def check_runs(result: harness.Result, digest: str) -> None:
    """Each run's partition files checked against the input's digest here, in the parent (the
    check's memory is no part of a run's), then removed."""
    for measured in result.cases.values():
        for run in measured.runs:
            check = partitions_check(run["outputs"])
            run.update(check, equal=check["digest"] == digest and check["grouped"])
            shutil.rmtree(run["work"], ignore_errors=True)


def partitions_check(files: Sequence[str]) -> dict[str, Any]:
    """The partition files' rows as a digest of their sorted (key, node) pairs, and whether every
    key lies in one file only (grouped by key)."""
    tables = [pq.read_table(f, columns=["key", "node"]) for f in files]
    distinct = [np.unique(t.column("key").to_numpy()) for t in tables]
    every = np.concatenate(distinct) if distinct else np.zeros(0, np.int64)
    table = pa.concat_tables(tables) if tables else RECORD_SCHEMA.empty_table()
    return {"digest": rows_digest(table), "grouped": bool(every.size == np.unique(every).size), "files": len(files), "rows": table.num_rows}


def rows_digest(table: pa.Table) -> str:
    """sha256 of a table's (key, node) pairs in sorted order: equal exactly for equal multisets."""
    key, node = table.column("key").to_numpy().astype(np.int64), table.column("node").to_numpy().astype(np.int64)
    order = np.lexsort((node, key))
    return hashlib.sha256(key[order].tobytes() + node[order].tobytes()).hexdigest()


# --------------------------------------------------------------------------- the project's block files


@shuffle.measured
def map_blocks(inputs: list[str], output: str, partitions: int) -> dict[str, Any]:
    """A map task's write: its records as a block file cut for ``partitions`` readers."""
    return {"rows": shuffle.write_keyed(pq.read_table(inputs[0]), output, partitions)}


@shuffle.measured
def reduce_range(inputs: list[str], output: str, bounds: tuple[int, int]) -> dict[str, Any]:
    """A reduce task: its key range of every (merged) block file, written as one partition file."""
    table = shuffle.read_range(inputs, bounds[0], bounds[1], ["node"], RECORD_SCHEMA)
    storage.write_parquet(table, output)
    return {"rows": table.num_rows}


def block_shuffle(runner: ShardRunner, inputs: Sequence[str], work: str, partitions: int) -> tuple[list[Any], int]:
    """Map writes, merges to the bound, reduces: every task's result (reused ones included) and
    the most input files one task read."""
    done: list[Any] = []
    widest = 0

    def run(tasks: list[ShardTask]) -> list[Any]:
        nonlocal widest
        widest = max([widest, *(len(t.inputs) for t in tasks)])
        done.extend(runner.map(tasks))
        return done[-len(tasks) :]

    mapped = run([ShardTask(map_blocks, (uri,), storage.join(work, "map", f"map-{m:05d}{shuffle.BLOCK_SUFFIX}"), partitions) for m, uri in enumerate(inputs)])
    merged = fanin.bounded(run, [r.output for r in mapped], storage.join(work, "merged"), MAX_INPUTS, fanin.MergeFilesParams(blocks=partitions, budget_bytes=bench_dedup.SCALE.merge_bytes))
    run([ShardTask(reduce_range, tuple(merged), part_uri(work, p, partitions), b) for p, b in enumerate(shuffle.partition_bounds(partitions))])
    return done, widest


def part_uri(work: str, p: int, partitions: int) -> str:
    return storage.join(work, "out", storage.shard_name(p, partitions))


def blocks_run(inputs: list[str], partitions: int, folder: str) -> dict[str, Any]:
    """One run of the project's shuffle (in a child, in a fresh folder under ``folder``); then a
    rerun after half the reduce outputs were lost, as after a killed run."""
    work = fresh(folder)
    runner = ShardRunner(ray_address=LOCAL, max_in_flight=2 * CPUS, worker_max_tasks=0)
    with ray_cluster(), TreeWatch() as watch:
        with measured_run(watch) as cluster:
            results, widest = block_shuffle(runner, inputs, work, partitions)
        spilled, processes = spilled_bytes(), watch.figures()
        for p in range(partitions // 2, partitions):
            for uri in (part_uri(work, p, partitions), storage.shard_stats_uri(part_uri(work, p, partitions))):
                storage.remove(uri)
        started = time.perf_counter()
        rerun, _ = block_shuffle(runner, inputs, work, partitions)
        rerun_s = time.perf_counter() - started
    scratch = sum(os.path.getsize(os.path.join(d, f)) for sub in ("map", "merged") for d, _, names in os.walk(os.path.join(work, sub)) for f in names if f.endswith(shuffle.BLOCK_SUFFIX))
    return {
        "items": records_in(inputs),
        "work": work,
        "outputs": [part_uri(work, p, partitions) for p in range(partitions)],
        **processes,
        **cluster,
        "task_kib": max(r.peak_rss_bytes for r in results) // 1024,
        "tasks": len(results),
        "widest": widest,
        "spilled": spilled,
        "scratch": scratch,
        "rerun_s": rerun_s,
        "rerun_done": sum(not r.reused for r in rerun),
        "rerun_tasks": len(rerun),
    }


# --------------------------------------------------------------------------- Ray Data


def ray_data_run(inputs: list[str], partitions: int, folder: str, strategy: str = "hash_shuffle") -> dict[str, Any]:
    """One run of Ray Data's key shuffle (in a child, in a fresh folder under ``folder``): read,
    repartition by key, write."""
    import ray.data  # noqa: PLC0415
    from ray.data.context import DataContext, ShuffleStrategy  # noqa: PLC0415

    work = fresh(folder)
    out = os.path.join(work, "out")
    with ray_cluster(), TreeWatch() as watch:
        context = DataContext.get_current()
        context.shuffle_strategy = ShuffleStrategy(strategy)
        context.enable_progress_bars = False
        with measured_run(watch) as cluster:
            ray.data.read_parquet(inputs).repartition(partitions, keys=["key"]).write_parquet(out)
        spilled, processes = spilled_bytes(), watch.figures()
    files = sorted(os.path.join(out, f) for f in os.listdir(out) if f.endswith(".parquet"))
    return {"items": records_in(inputs), "work": work, "outputs": files, **processes, **cluster, "spilled": spilled}


# --------------------------------------------------------------------------- in the parent


def prepare(root: str, scale: int) -> tuple[list[str], int, str]:
    """The real-shape corpus at ``scale`` and its real map tasks' records (``fuzzy_map``, groups
    of ``shards_per_map`` shards of a source), one Parquet file per map task; the partitions P
    and the records' digest."""
    layout = bench_dedup.write_corpus(storage.join(root, "corpus"), bench_dedup.real_shape_sources(scale, seed=scale))
    per = bench_dedup.SCALE.shards_per_map
    groups = []
    for slot, source in enumerate(sorted(layout["buckets"])):
        shards = list(zip(layout["buckets"][source], layout["normalized"][source]))
        starts = np.cumsum([0] + [storage.parquet_num_rows(n) for _, n in shards]).tolist()
        groups.extend((source, slot, shards[k : k + per], tuple(starts[k : min(k + per, len(shards))])) for k in range(0, len(shards), per))
    files, tables = [], []
    for m, (source, slot, shards, bases) in enumerate(groups):
        out = storage.join(root, "mapped", f"map-{m:05d}{shuffle.BLOCK_SUFFIX}")
        fuzzy_map([u for pair in shards for u in pair], out, MapParams(source, slot, bases, maps=len(groups)))
        tables.append(shuffle.read_whole(out, RECORD_SCHEMA))
        files.append(storage.join(root, "records", f"map-{m:05d}.parquet"))
        storage.write_parquet(tables[-1], files[-1])
    records = pa.concat_tables(tables)
    return files, shuffle.pow2_partitions(records.num_rows, RECORDS_PER_PARTITION), rows_digest(records)


def mib(kib: float) -> str:
    return f"{kib / 1024:.0f}"


def report(result: harness.Result, labels: Sequence[str]) -> None:
    """Per case: the cluster's CPU, memory, spill, the output check (the blocks: their tasks,
    scratch and rerun)."""
    for label in labels:
        m = result[label]
        first = m.runs[0]
        equal = all(r["equal"] for r in m.runs)
        cpu = m.values("cluster_cpu_s")
        print(
            f"  {label:<22} cluster CPU {statistics.median(cpu):.1f} s [{min(cpu):.1f}..{max(cpu):.1f}]; driver peak {mib(max(m.values('driver_kib')))} MiB; "
            f"{int(m.median('workers'))} Ray worker processes, the largest's peak {mib(max(m.values('worker_kib')))} MiB ({largest_worker(m)}; private memory of any worker at most {mib(max(m.values('worker_anon_kib')))} MiB), their peaks summed "
            f"{mib(max(m.values('workers_sum_kib')))} MiB; spilled {max(m.values('spilled')) / 2**20:.0f} MiB; {first['files']} partition files, "
            f"{first['rows']:,} rows, equal to the input's and grouped by key: {equal}"
        )
        if "task_kib" in first:
            print(
                f"  {'':<22} largest task's own peak {mib(max(m.values('task_kib')))} MiB; {first['tasks']} tasks, at most {first['widest']} input files per task; "
                f"block files in the bucket {first['scratch'] / 2**20:.1f} MiB; rerun after losing half the reduce outputs: {first['rerun_done']} of "
                f"{first['rerun_tasks']} tasks run again, {statistics.median(m.values('rerun_s')):.2f} s"
            )


def largest_worker(m: harness.Measured) -> str:
    """What the largest worker process of the case's largest run ran."""
    return max(m.runs, key=lambda r: r["worker_kib"])["largest_worker"]


def ray_data_label(strategy: str) -> str:
    return "ray-data" if strategy == "hash_shuffle" else f"ray-data {strategy}"


def scale_cases(root: str, scale: int, strategies: Sequence[str]) -> tuple[list[harness.Case], str]:
    files, partitions, digest = prepare(storage.join(root, f"{scale}x"), scale)
    kwargs = {"inputs": files, "partitions": partitions}
    env = dict(WORKER_ENV)  # both clusters' workers start with the allocator settings production's tasks get
    cases = [harness.Case(f"blocks {scale}x", "bench.bench_shuffle:blocks_run", {**kwargs, "folder": storage.join(root, f"{scale}x", "blocks")}, env, timeout_s=900)]
    for strategy in strategies:
        work = storage.join(root, f"{scale}x", strategy)
        cases.append(harness.Case(f"{ray_data_label(strategy)} {scale}x", "bench.bench_shuffle:ray_data_run", {**kwargs, "folder": work, "strategy": strategy}, env, timeout_s=900))
    print(f"  {scale}x: {len(files)} map files, {sum(pq.read_metadata(f).num_rows for f in files):,} records, P = {partitions}", file=sys.stderr, flush=True)
    return cases, digest


def growth(results: dict[int, harness.Result], strategies: Sequence[str], lo: int, hi: int) -> None:
    """The largest peaks from the smallest to the largest scale, the wall times beside them; the
    block files' largest task held to the dedup goal (at most 1.3x), the rest printed beside it."""
    print(f"\n  peak growth {lo}x -> {hi}x (median wall {lo}x -> {hi}x):")
    rows = [("blocks", "worker_kib", "largest worker process (VmHWM)"), ("blocks", "worker_anon_kib", "most private memory of a worker (RssAnon)")]
    for strategy in strategies:
        rows += [(ray_data_label(strategy), "worker_kib", "largest worker process (VmHWM)"), (ray_data_label(strategy), "worker_anon_kib", "most private memory of a worker (RssAnon)")]
    for case, key, what in [("blocks", "task_kib", "largest task's own peak"), *rows]:
        a, b = (max(results[s][f"{case} {s}x"].values(key)) for s in (lo, hi))
        wa, wb = (results[s][f"{case} {s}x"].median("seconds") for s in (lo, hi))
        shown = f"{mib(a)} -> {mib(b)} MiB ({b / a:.2f}x; wall {wa:.1f} -> {wb:.1f} s)"
        if key == "task_kib":
            harness.absolute_goal(f"blocks: largest task's own peak {hi}x <= 1.3x {lo}x", shown, b <= 1.3 * a)
        else:
            print(f"    {case:<20} {what:<42} {shown}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scales", default=harness.pick("1,4,16", "1,4"))
    parser.add_argument("--rounds", type=int, default=harness.pick(3, 1), help="interleaved rounds at the smallest scale")
    parser.add_argument("--big-rounds", type=int, default=1, help="interleaved rounds at the larger scales")
    parser.add_argument("--strategies", default="hash_shuffle", help="Ray Data shuffle strategies to run, e.g. hash_shuffle,shuffle_v2")
    args = parser.parse_args(argv)
    scales = [int(x) for x in args.scales.split(",")]
    strategies = [x for x in args.strategies.split(",") if x]
    root = tempfile.mkdtemp(prefix="bench-shuffle-")
    results: dict[int, harness.Result] = {}
    try:
        for scale in scales:
            cases, digest = scale_cases(root, scale, strategies)
            results[scale] = harness.compare(
                f"fuzzy bucket records grouped by key, {scale}x (real-shape corpus): the project's block files vs Ray Data's key shuffle; local Ray, {CPUS} CPUs "
                f"(load {os.getloadavg()[0]:.1f})",
                cases, args.rounds if scale == scales[0] else args.big_rounds, unit="records",
            )  # fmt: skip
            check_runs(results[scale], digest)
            report(results[scale], [c.label for c in cases])
            for case in cases:
                equal = all(r["equal"] for r in results[scale][case.label].runs)
                harness.absolute_goal(f"{case.label}: the partitions hold exactly the input's records, each key in one partition", str(equal), equal)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    lo, hi = scales[0], scales[-1]
    if "hash_shuffle" in strategies:
        harness.speed_goal(f"blocks {lo}x", f"ray-data {lo}x", 1.0, f"blocks at least as fast as ray-data at {lo}x (records per wall second)").check(results[lo])
    if lo != hi:
        growth(results, strategies, lo, hi)
    return 0


if __name__ == "__main__":
    sys.exit(harness.exit_status(main()))
