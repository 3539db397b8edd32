"""`make rehearse`: the full pool's shape on this machine, stage by stage, each figure against its goal.

Part 1, the drivers at the full pool's counts: 146 sources sized by the catalog's
``rough_tokens_b`` into 372,529 shards of 256 MiB (~26,800 documents each), provider files of
``REHEARSE_FILE_GIB`` (1 GiB) of text. Each source's step runs the real step code (normalize's
planning, the per-shard stages' ``run_shards``) inside a real Dagster step with the real progress
and log wiring, on metadata only: the shard runner is a dry one that submits nothing and answers
each task with the counters such a task returns (no text is read or written). Per stage: tasks,
driver peak memory (VmHWM, reset before each step; the largest step), driver CPU (planning and
submission, all steps), the largest task spec (pickled, as Ray ships it), the most inputs one task
names, driver-side requests (to a store that counts them) and event-log rows (all steps).

Part 2, tasks against a slow store: normalize on a generated corpus at 1x, 4x and 16x, its input
and output on ``slowstore://`` (``bench/slow_store.py``: the local disk behind an object store's
request model, counting requests), with the production's sizes / 1024 and a fan-in of 16, so that
1x already has a middle level whose tasks read the full fan-in, as the pool's large sources do.
Per phase and middle level: requests of the largest task at each scale, and the full pool's
request latency projected at 30 ms per request (the full pool's files read in that phase x the
requests per file measured here); then the stage's largest task over every phase, whose ratio
16x/1x is the goal (<= 1.3), beside the CPU core-hours measured here.

``BENCH_QUICK=1``: the 5 largest and 5 smallest sources (pool compaction: the largest, at its
full count), scales 1x and 4x. ``--only fuzzy``: only fuzzy dedup's driver rows (at the pool's
shards and at twice them; exits 1 when one misses its goal).
"""

from __future__ import annotations

import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest import mock

import dagster as dg
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import rehearse_global, rehearse_tasks, slow_store
from bench.harness import MIB, pick
from bench.rehearse_global import per_shard_output
from bench.rehearse_kit import (
    DOCS_PER_SHARD,
    FILE_BYTES,
    POOL_MIB,
    REQUEST_S,
    SHARD_BYTES,
    CountingRunner,
    DryRunner,
    SourceSize,
    counted_map,
    global_step,
    pool_sources,
    print_drivers,
    source_step,
    step,
    write_corpus,
)  # fmt: skip
from marin_assets.core import specs
from marin_assets.core.dedup import minhash
from marin_assets.core.embed import quality
from marin_assets.core.ingest import normalize
from marin_assets.core.pool import curated as pool
from marin_assets.core.pool import tokens
from marin_assets.core.runtime import stages, storage
from marin_assets.core.runtime.runner import ShardResult, ShardTask
from marin_assets.defs.ray import step_log, step_progress


def normalize_answer(file_bytes: int, params: normalize.NormalizeParams) -> Any:
    docs_per_file = max(1, file_bytes * DOCS_PER_SHARD // SHARD_BYTES)

    def answer(task: ShardTask) -> dict[str, Any]:
        name = task.fn.__name__
        if name == "measure_files":
            return {"sizes": [file_bytes] * len(task.inputs)}
        if name == "scatter_file":
            return {"rows_in": docs_per_file, "rows_out": docs_per_file, "bytes_in": file_bytes,
                    "flushes": -(-file_bytes // normalize.flush_bytes(params))}  # fmt: skip
        if name == "regroup_chunk":
            return {"rows": DOCS_PER_SHARD}
        return {"rows": DOCS_PER_SHARD, "duplicates": 0, "bytes_out": SHARD_BYTES // 3, "rows_in": DOCS_PER_SHARD, "rows_out": DOCS_PER_SHARD}

    return answer


def phase_of(task: ShardTask) -> str:
    """A normalize task's phase; a middle task's with its level of the gather tree."""
    name = task.fn.__name__
    return f"{name} level {task.params.level}" if name == "regroup_chunk" else name


class PhaseDryRunner(DryRunner):
    """The dry runner, also counting tasks and their inputs by phase and middle level (``seen['levels']``)."""

    def map(self, tasks: Any, on_done: Any = None) -> list[Any]:
        levels = self._seen.setdefault("levels", {})
        for task in tasks:
            tasks_inputs = levels.setdefault(phase_of(task), [0, 0])
            tasks_inputs[0] += 1
            tasks_inputs[1] += len(task.inputs)
        return super().map(tasks, on_done)


class PhaseCountingRunner(CountingRunner):
    """Each task in this process, its requests by phase and middle level (and ``inputs``: its inputs)."""

    def __init__(self, per_phase: dict[str, list[int]], inputs: dict[str, list[int]]) -> None:
        super().__init__(per_phase)
        object.__setattr__(self, "inputs", inputs)

    def map(self, tasks: Any, on_done: Any = None) -> list[Any]:
        results = []
        for task in tasks:
            counts: dict[str, list[int]] = {}
            results += counted_map([task], counts)
            self._per_phase.setdefault(phase_of(task), []).extend(counts[task.fn.__name__])
            self.inputs.setdefault(phase_of(task), []).append(len(task.inputs))
        return results


def rehearse_normalize(root: str, sources: list[SourceSize], instance: dg.DagsterInstance) -> dict[str, Any]:
    params = normalize.NormalizeParams()
    seen = {"tasks": 0, "spec": 0, "inputs": 0, "rows": 0, "cpu": 0.0, "peak": 0, "requests": 0}
    for src in sources:
        files = [f"{root}/raw/{src.name}/file-{i:06d}.parquet" for i in range(src.files)]
        file_bytes = src.shards * SHARD_BYTES // src.files

        def footer(uri: str, fmt: str | None, size: int = file_bytes) -> int:
            slow_store.SlowStore.request("stat")  # the object's size, then its Parquet footer
            slow_store.SlowStore.request("get")
            return size

        def body(context: Any, src: SourceSize = src, files: list[str] = files, file_bytes: int = file_bytes) -> None:
            runner = PhaseDryRunner(normalize_answer(file_bytes, params), seen, progress=step_progress())
            normalize.normalize_source(src.name, files, f"{root}/normalized/{src.name}", params, runner=runner, progress=step_log(context))

        with mock.patch.object(normalize, "uncompressed_bytes", footer):
            source_step(instance, specs.NORMALIZED.name, body, seen)
    return seen


def rehearse_per_shard(root: str, sources: list[SourceSize], instance: dg.DagsterInstance) -> dict[str, Any]:
    """``run_shards``, the driver of minhash_buckets, contamination, embeddings, topics, quality_scores
    and pool: list the source's shards once, one task each, a manifest of every shard's counters."""
    seen = {"tasks": 0, "spec": 0, "inputs": 0, "rows": 0, "cpu": 0.0, "peak": 0, "requests": 0}
    layout = storage.Layout(f"{root}/prefix")
    answer = lambda task: {"docs": DOCS_PER_SHARD, "buckets": DOCS_PER_SHARD * 20}
    for src in sources:
        names = [storage.join(root, "normalized", src.name, storage.shard_name(i, src.shards)) for i in range(src.shards)]

        def listing(uri: str, names: list[str] = names) -> list[str]:
            for _ in range(1 + len(names) // 1000):  # one page per 1,000 objects
                slow_store.SlowStore.request("list")
            return names

        def body(context: Any, src: SourceSize = src) -> None:
            runner = DryRunner(answer, seen, progress=step_progress())
            upstream = stages.StageInput(storage.join(root, "normalized", src.name), "0" * 16, specs.NORMALIZED.name)
            stages.run_shards(specs.MINHASH_BUCKETS, layout, source=src.name, inputs=[upstream], shard_fn=minhash.minhash_shard,
                              params=minhash.MinHashParams(), runner=runner, progress=step_log(context))  # fmt: skip

        with mock.patch.object(storage, "list_shards", listing):
            source_step(instance, specs.MINHASH_BUCKETS.name, body, seen)
    return seen


def rehearse_quality_bands(root: str, sources: list[SourceSize], instance: dg.DagsterInstance) -> dict[str, Any]:
    """The histogram of every shard's (topic, score) pairs, by tasks; tasks add up their parts, the
    step adds up those. Shards named by the quality_scores manifests, as the step reads them."""
    seen = {"tasks": 0, "spec": 0, "inputs": 0}
    params = quality.BandParams()
    scores = {src.name: per_shard_output(root, specs.QUALITY_SCORES.name, src) for src in sources}
    topics_dir = {src.name: storage.join(root, specs.TOPICS.name, src.name) for src in sources}

    def load(uri: str) -> quality.ScoreHistogram:
        slow_store.SlowStore.request("get")
        return quality.ScoreHistogram(params.n_topics, params.histogram_bins)

    def answer(task: ShardTask) -> dict[str, Any]:
        if task.fn is quality.add_histograms:
            return {"parts": len(task.inputs)}
        return {"shards": len(task.inputs) // 2, "rows": DOCS_PER_SHARD * len(task.inputs) // 2, "invalid": 0, "topics": list(range(params.n_topics))}

    def body(context: Any) -> None:
        pairs = {s: [(storage.join(topics_dir[s], storage.basename(u)), u) for u in stages.shards_of(inp)[0]] for s, inp in scores.items()}
        quality.score_histogram_by_tasks(pairs, f"{root}/bands/_histograms", params, DryRunner(answer, seen, progress=step_progress()))

    with mock.patch.object(quality.ScoreHistogram, "load", load):
        global_step(instance, specs.QUALITY_BANDS.name, body, seen)
    return seen


def rehearse_compaction(root: str, src: SourceSize, instance: dg.DagsterInstance) -> dict[str, Any]:
    """pool's compaction of one source (its ~200 group files per shard merged), as its step runs it
    after the map: merges planned from the shards' names, the index written from what the merges
    return, then the batched deletes. The shards' results are the map's (kept documents, tokens)."""
    seen = {"tasks": 0, "spec": 0, "inputs": 0}
    groups = quality.all_groups()
    docs, tokens = DOCS_PER_SHARD // len(groups), SHARD_BYTES // 4 // len(groups)  # per group and shard
    params = pool.CompactParams()

    def answer(task: ShardTask) -> dict[str, Any]:  # what a merge returns: its files of at most 2^28 tokens
        if task.fn is not pool.merge_group_files:
            return {"removed": len(task.inputs)}
        shards, merged = task.inputs.stop - task.inputs.first, []
        for group in task.params.groups:
            left_docs, left_tokens = shards * docs, shards * tokens
            for part in range(-(-left_tokens // params.group_file_tokens)):
                size = min(left_tokens, params.group_file_tokens)
                count = left_docs if size == left_tokens else left_docs * size // left_tokens
                merged.append([group, pool.merged_file(group, src.name, task.params.number, part), count, size])
                left_docs, left_tokens = left_docs - count, left_tokens - size
        return {"merged": merged, "inputs": len(task.inputs), "read": len(task.inputs)}

    def body(context: Any) -> None:
        index_dir = f"{root}/pool_index/{src.name}"
        counters = {"source": src.name, "documents": DOCS_PER_SHARD, "dropped_contaminated": 0, "dropped_fuzzy_duplicate": 0, "dropped_exact_duplicate": 0,
                    "bad_rows_null_text": 0, "bad_rows_missing_attributes": 0, "kept": docs * len(groups), "tokens": tokens * len(groups),
                    "tokenizer": f"{tokens.MARIN_TOKENIZER}@{'0' * 40}", "fuzzy_exempt": False}  # a pool task's counters
        shards = [ShardResult(storage.join(index_dir, name := storage.shard_name(i, src.shards)), {**counters, "shard": name}, False)
                  for i in range(src.shards)]  # fmt: skip
        pool.compact_pool(shards, index_dir, f"{root}/pool", src.name, groups, params, DryRunner(answer, seen, progress=step_progress()))

    global_step(instance, specs.POOL.name, body, seen)
    return seen


def event_log_before_after(root: str, src: SourceSize, instance: dg.DagsterInstance) -> None:
    """One source's per-shard map in a Dagster step, with the wiring before this change (a log line
    per task, an observation every 10 tasks) and with the bounded one: event rows and step CPU per task."""
    layout = storage.Layout(f"{root}/compare")
    names = [storage.join(root, "normalized", src.name, storage.shard_name(i, src.shards)) for i in range(src.shards)]
    for label, bounded in (("before", False), ("after", True), ("before", False), ("after", True)):
        seen = {"tasks": 0, "spec": 0, "inputs": 0}

        def body(context: Any, bounded: bool = bounded, seen: dict = seen, label: str = label) -> None:
            progress = step_progress() if bounded else step_progress(every=10, seconds=math.inf, most=10**9)
            runner = DryRunner(lambda task: {"docs": DOCS_PER_SHARD}, seen, progress=progress)
            upstream = stages.StageInput(storage.join(root, "normalized", src.name), "0" * 16, specs.NORMALIZED.name)
            stages.run_shards(specs.MINHASH_BUCKETS, storage.Layout(f"{layout.root}/{label}-{time.monotonic_ns()}"), source=src.name,
                              inputs=[upstream], shard_fn=minhash.minhash_shard, params=minhash.MinHashParams(), runner=runner,
                              progress=step_log(context) if bounded else context.log.info)  # fmt: skip

        with mock.patch.object(storage, "list_shards", lambda uri: names):
            rows, cpu, _ = step(instance, specs.MINHASH_BUCKETS.name, body)
        print(f"rehearse event log {label}: {src.name} {src.shards:,} tasks in one Dagster step: {rows:,} event rows "
              f"({rows / src.shards:.3f} per task), step CPU {1000 * cpu / src.shards:.2f} ms per task", flush=True)  # fmt: skip


def normalize_at(work: Path, scale: int) -> tuple[dict[str, list[int]], float, float, dict[str, list[int]]]:
    """normalize at ``scale`` x 1x: its requests per task by phase and level, driver requests, CPU
    seconds per MiB, and each task's inputs by phase and level."""
    base_files, file_mib = 8, 1
    corpus = work / f"in-{scale}x"
    corpus.mkdir(parents=True, exist_ok=True)
    files = write_corpus(corpus, base_files * scale, file_mib * MIB, seed=scale)
    # The production's sizes / 1024 (shards of 256 KiB, flushes of 128 KiB, read batches of 64 KiB,
    # files of 1 MiB: 8 flushes a file, 2 a shard) and a fan-in of 16: at 1x 64 flushes, one middle
    # level whose tasks read the full fan-in, as the pool's large sources have (stack-v3: ~102,000
    # flushes, 100 chunks of 1,024); a second level from 256 flushes on (16x: 1,024 flushes).
    params = normalize.NormalizeParams(target_shard_bytes=256 * 1024, scatter_buffer_bytes=128 * 1024, batch_bytes=64 * 1024, gather_fan_in=16)
    per_phase: dict[str, list[int]] = {}
    inputs: dict[str, list[int]] = {}
    # Files sized per task scaled with the fan-in (1,024 -> 16: 256 -> 4), and by tasks from 1x on as a large source's are.
    before, cpu = slow_store.SlowStore.total(), time.process_time()
    with mock.patch.object(normalize, "SIZES_IN_DRIVER", 4), mock.patch.object(normalize, "FILES_PER_SIZING_TASK", 4):
        normalize.normalize_source("s", files, f"{slow_store.PROTOCOL}://{work}/out-{scale}x", params, runner=PhaseCountingRunner(per_phase, inputs))
    cpu = time.process_time() - cpu
    driver = slow_store.SlowStore.total() - before - sum(sum(v) for v in per_phase.values())
    return per_phase, driver, cpu / (base_files * scale * file_mib), inputs


PHASES = ("measure_files", "scatter_file", "regroup_chunk", "gather_shard", "single_shard")


def requests_fit(requests: list[int], inputs: list[int]) -> tuple[float, float]:
    """Requests of a task as (per task, per file read), fitted over a phase's tasks (all per file
    where every task read as many files)."""
    if len(set(inputs)) > 1:
        per_file, per_task = np.polyfit(inputs, requests, 1)
        return max(0.0, float(per_task)), float(per_file)
    return 0.0, sum(requests) / max(1, sum(inputs))


def print_normalize_tasks(runs: dict[int, tuple[dict[str, list[int]], float, float, dict[str, list[int]]]],
                          full: dict[str, list[int]]) -> bool:  # fmt: skip
    """A row per phase and middle level: the largest task's requests at each scale, then the
    full-pool tasks and inputs (``full``: phase -> [tasks, inputs]) and their request latency
    projected at the requests per task and per file read fitted over every scale's tasks; then the stage's largest task over all phases against its goal."""
    scales = sorted(runs)
    top = max(scales)
    phases = sorted({p for s in scales for p in runs[s][0]} | set(full), key=lambda p: (PHASES.index(p.split()[0]), p))
    largest = {p: {s: max(runs[s][0].get(p, [0])) for s in scales} for p in phases}
    fits = {p: requests_fit([r for s in scales for r in runs[s][0].get(p, [])], [n for s in scales for n in runs[s][3].get(p, [])])
            for p in phases}  # fmt: skip
    hours = {p: (fits[p][0] * full.get(p, [0, 0])[0] + fits[p][1] * full.get(p, [0, 0])[1]) * REQUEST_S / 3600 for p in phases}
    where = pick("full pool", "rehearsed sources")
    for p in phases:
        tasks, inputs = full.get(p, [0, 0])
        print(f"rehearse tasks normalize.{p}: largest task requests " + " ".join(f"{s}x={largest[p][s]}" for s in scales)
              + f" (most inputs {max(runs[top][3].get(p, [0]))} at {top}x); {where} {tasks:,} tasks x {fits[p][0]:.1f} + {inputs:,} "
              f"files read x {fits[p][1]:.1f} requests x 30 ms = {hours[p]:,.0f} task-hours of request latency "
              f"(projected{'; not run here' if not largest[p][top] else ''})", flush=True)  # fmt: skip
    stage = {s: max(largest[p][s] for p in phases) for s in scales}
    ratio = stage[top] / max(1, stage[scales[0]])
    cpu_per_mib = runs[top][2]
    print("rehearse tasks normalize (largest task of every phase): requests " + " ".join(f"{s}x={stage[s]}" for s in scales)
          + f" ratio {top}x/1x={ratio:.2f} {'PASS' if ratio <= 1.3 else 'MISS'}; {where}: {sum(hours.values()):,.0f} task-hours of "
          f"request latency at 30 ms (projected) beside CPU {cpu_per_mib * POOL_MIB / 3600:,.0f} core-hours at {cpu_per_mib:.3f} s/MiB "
          f"here (256 KiB shards: per-task costs dominate; at 32 MiB shards, make bench-scale, 0.015 s/MiB: ~410 core-hours); "
          f"driver-side requests at {top}x: {runs[top][1]:.0f}", flush=True)  # fmt: skip
    return ratio <= 1.3


def driver_goals(stage: str) -> dict[str, float]:
    return {"driver_peak_mib": rehearse_global.FUZZY_DRIVER_PEAK_MIB} if stage.startswith("fuzzy") else {}


def fuzzy_rows(sources: list[SourceSize]) -> int:
    """``--only fuzzy``: fuzzy dedup's driver at the pool's shards and at twice them."""
    ok = True
    with tempfile.TemporaryDirectory(prefix="rehearse-") as tmp, dg.DagsterInstance.ephemeral() as instance:
        rows = rehearse_global.rehearse_global_stages(f"{slow_store.PROTOCOL}://{tmp}", sources, instance, only=tuple(rehearse_global.FUZZY_ROWS))
    for stage, seen in rows.items():
        ok &= print_drivers(stage, seen, len(sources), per_source=True, goals=driver_goals(stage))
    return 0 if ok else 1


def main() -> int:
    started = time.perf_counter()
    sources = pool_sources()
    if sys.argv[1:] == ["--only", "fuzzy"]:
        return fuzzy_rows(sources)
    print(f"rehearse: {len(sources)} sources, {sum(s.shards for s in sources):,} shards, "
          f"{sum(s.files for s in sources):,} provider files of {FILE_BYTES / 2**30:.1f} GiB", flush=True)  # fmt: skip
    ok = True
    with tempfile.TemporaryDirectory(prefix="rehearse-") as tmp, dg.DagsterInstance.ephemeral() as instance:
        root = f"{slow_store.PROTOCOL}://{tmp}"
        drivers = {"normalize": rehearse_normalize(root, sources, instance), "per_shard_map": rehearse_per_shard(root, sources, instance),
                   "quality_bands": rehearse_quality_bands(root, sources, instance),
                   "pool compaction (largest source)": rehearse_compaction(root, sources[0], instance)}
        drivers |= rehearse_global.rehearse_global_stages(root, sources, instance)
        for stage, seen in drivers.items():
            ok &= print_drivers(stage, seen, 1 if stage.startswith("pool compaction") else len(sources), per_source=stage not in ("normalize", "per_shard_map"), goals=driver_goals(stage))
        event_log_before_after(root, SourceSize("probe", pick(2000, 500)), instance)
        for stage, why in rehearse_global.NOT_MEASURED.items():
            print(f"rehearse driver {stage}: not measured ({why})", flush=True)
        ok &= rehearse_global.measure_fit(Path(tmp))
        scales = pick([1, 4, 16], [1, 4])
        runs = {s: normalize_at(Path(tmp), s) for s in scales}
    ok &= print_normalize_tasks(runs, drivers["normalize"]["levels"])
    ok &= rehearse_tasks.every_stage()
    print(f"rehearse: {time.perf_counter() - started:.0f} s; {'every goal met' if ok else 'some goals MISSED'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
