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
request model, counting requests), with the shard target, buffers and fan-in scaled down by the
same factor so each scale has the production's ratios of flushes to shards. Per phase: requests
of the largest task and their ratio 16x/1x, and the full-pool latency projected at 30 ms per
request (requests per task x full-pool tasks) beside the CPU core-hours measured here.

``BENCH_QUICK=1``: the 5 largest and 5 smallest sources (pool compaction: 2,000 shards of the
largest), scales 1x and 4x.
"""

from __future__ import annotations

import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import dagster as dg
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import rehearse_global, slow_store
from bench.harness import MIB, pick
from bench.rehearse_global import per_shard_output, sample_answer, uncounted
from bench.rehearse_kit import (
    DOCS_PER_SHARD,
    FILE_BYTES,
    POOL_MIB,
    REQUEST_S,
    SHARD_BYTES,
    CountingRunner,
    DryRunner,
    SourceSize,
    global_step,
    pool_sources,
    print_drivers,
    shard_names,
    source_step,
    step,
    write_corpus,
)  # fmt: skip
from marin_assets.core import specs
from marin_assets.core.dedup import minhash
from marin_assets.core.embed import quality, topics
from marin_assets.core.ingest import normalize
from marin_assets.core.pool import curated as pool
from marin_assets.core.runtime import stages, storage
from marin_assets.core.runtime.runner import ShardTask
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


def rehearse_normalize(root: str, sources: list[SourceSize], instance: dg.DagsterInstance) -> dict[str, Any]:
    params = normalize.NormalizeParams()
    seen = {"tasks": 0, "spec": 0, "inputs": 0, "rows": 0, "cpu": 0.0, "peak": 0, "requests": 0}
    real_sizes = normalize.uncompressed_bytes
    for src in sources:
        files = [f"{root}/raw/{src.name}/file-{i:06d}.parquet" for i in range(src.files)]
        file_bytes = src.shards * SHARD_BYTES // src.files

        def footer(uri: str, fmt: str | None, size: int = file_bytes) -> int:
            slow_store.SlowStore.request("stat")  # the object's size, then its Parquet footer
            slow_store.SlowStore.request("get")
            return size

        def body(context: Any, src: SourceSize = src, files: list[str] = files, file_bytes: int = file_bytes) -> None:
            runner = DryRunner(normalize_answer(file_bytes, params), seen, progress=step_progress())
            normalize.normalize_source(src.name, files, f"{root}/normalized/{src.name}", params, runner=runner, progress=step_log(context))

        normalize.uncompressed_bytes = footer
        try:
            source_step(instance, specs.NORMALIZED.name, body, seen)
        finally:
            normalize.uncompressed_bytes = real_sizes
    return seen


def rehearse_per_shard(root: str, sources: list[SourceSize], instance: dg.DagsterInstance) -> dict[str, Any]:
    """``run_shards``, the driver of minhash_buckets, contamination, embeddings, topics, quality_scores
    and pool: list the source's shards once, one task each, a manifest of every shard's counters."""
    seen = {"tasks": 0, "spec": 0, "inputs": 0, "rows": 0, "cpu": 0.0, "peak": 0, "requests": 0}
    layout = storage.Layout(f"{root}/prefix")
    real_list = storage.list_shards
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

        storage.list_shards = listing
        try:
            source_step(instance, specs.MINHASH_BUCKETS.name, body, seen)
        finally:
            storage.list_shards = real_list
    return seen


def rehearse_quality_bands(root: str, sources: list[SourceSize], instance: dg.DagsterInstance) -> dict[str, Any]:
    """The histogram of every shard's (topic, score) pairs, by tasks; tasks add up their parts, the
    step adds up those. Shards named by the quality_scores manifests, as the step reads them."""
    seen = {"tasks": 0, "spec": 0, "inputs": 0}
    params = quality.BandParams()
    real_load = quality.ScoreHistogram.load
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

    quality.ScoreHistogram.load = load
    try:
        global_step(instance, specs.QUALITY_BANDS.name, body, seen)
    finally:
        quality.ScoreHistogram.load = real_load
    return seen


def rehearse_topic_sample(root: str, sources: list[SourceSize], instance: dg.DagsterInstance) -> dict[str, Any]:
    """topic_model's sample of 10^7 rows: shards and quotas from the embeddings manifests (the
    embedding tasks' row counts), rows drawn by tasks, their parts put together by tasks."""
    seen = {"tasks": 0, "spec": 0, "inputs": 0}
    embedded = {src.name: per_shard_output(root, specs.EMBEDDINGS.name, src) for src in sources}

    def body(context: Any) -> None:
        shards = rehearse_global.embedded_sources(embedded, root)
        topics.sample_embeddings(shards, topics.TopicParams(), DryRunner(uncounted(sample_answer), seen, progress=step_progress()), f"{root}/topic_model/_sample")

    global_step(instance, specs.TOPIC_MODEL.name, body, seen)
    return seen


def rehearse_compaction(root: str, src: SourceSize, instance: dg.DagsterInstance) -> dict[str, Any]:
    """pool's compaction of one source (its ~200 group files per shard merged), as its step runs it:
    the step reads every shard index (counted), plans the merged files, submits merges and deletes."""
    import pyarrow as pa

    seen = {"tasks": 0, "spec": 0, "inputs": 0}
    groups = quality.all_groups()
    docs, tokens = DOCS_PER_SHARD // len(groups), SHARD_BYTES // 4 // len(groups)
    real_read = pool.read_pool_index

    def read_index(uris: Any) -> pa.Table:  # what the shard indexes hold: a row per group and shard
        import pyarrow.compute as pc

        for _ in uris:
            slow_store.SlowStore.request("get")
        n = len(uris) * len(groups)
        group = pa.array(groups).take(pa.array(np.tile(np.arange(len(groups)), len(uris))))
        shard = pa.array([storage.basename(u) for u in uris]).take(pa.array(np.repeat(np.arange(len(uris)), len(groups))))
        files = pc.binary_join_element_wise(group, pa.scalar(f"/{pool.source_slug(src.name)}-"), shard, "")  # pool.pool_file
        return pa.table([group, files, pa.array([src.name] * n), pa.array(np.full(n, docs)), pa.array(np.full(n, tokens))],
                        schema=pool.INDEX_SCHEMA)  # fmt: skip

    def answer(task: ShardTask) -> dict[str, Any]:
        if task.fn.__name__ == "merge_group_files":
            return {"rows": [count * docs for _, count in task.params.merged], "inputs": len(task.inputs)}
        return {"removed": len(task.inputs)}

    def body(context: Any) -> None:
        uris = shard_names(root, "pool_index", src)
        pool.compact_pool(uris, f"{root}/pool_index/{src.name}", f"{root}/pool", src.name, pool.CompactParams(),
                          DryRunner(answer, seen, progress=step_progress()))  # fmt: skip

    pool.read_pool_index = read_index
    try:
        global_step(instance, specs.POOL.name, body, seen)
    finally:
        pool.read_pool_index = real_read
    return seen


def event_log_before_after(root: str, src: SourceSize, instance: dg.DagsterInstance) -> None:
    """One source's per-shard map in a Dagster step, with the wiring before this change (a log line
    per task, an observation every 10 tasks) and with the bounded one: event rows and step CPU per task."""
    layout = storage.Layout(f"{root}/compare")
    names = [storage.join(root, "normalized", src.name, storage.shard_name(i, src.shards)) for i in range(src.shards)]
    real_list = storage.list_shards
    for label, bounded in (("before", False), ("after", True), ("before", False), ("after", True)):
        seen = {"tasks": 0, "spec": 0, "inputs": 0}

        def body(context: Any, bounded: bool = bounded, seen: dict = seen, label: str = label) -> None:
            progress = step_progress() if bounded else step_progress(every=10, seconds=math.inf, most=10**9)
            runner = DryRunner(lambda task: {"docs": DOCS_PER_SHARD}, seen, progress=progress)
            upstream = stages.StageInput(storage.join(root, "normalized", src.name), "0" * 16, specs.NORMALIZED.name)
            stages.run_shards(specs.MINHASH_BUCKETS, storage.Layout(f"{layout.root}/{label}-{time.monotonic_ns()}"), source=src.name,
                              inputs=[upstream], shard_fn=minhash.minhash_shard, params=minhash.MinHashParams(), runner=runner,
                              progress=step_log(context) if bounded else context.log.info)  # fmt: skip

        storage.list_shards = lambda uri: names
        try:
            rows, cpu, _ = step(instance, specs.MINHASH_BUCKETS.name, body)
        finally:
            storage.list_shards = real_list
        print(f"rehearse event log {label}: {src.name} {src.shards:,} tasks in one Dagster step: {rows:,} event rows "
              f"({rows / src.shards:.3f} per task), step CPU {1000 * cpu / src.shards:.2f} ms per task", flush=True)  # fmt: skip


def normalize_at(work: Path, scale: int) -> tuple[dict[str, list[int]], float, float]:
    """normalize at ``scale`` x 1x: its requests per task by phase, driver requests, CPU seconds per MiB."""
    base_files, file_mib = 4, 2
    corpus = work / f"in-{scale}x"
    corpus.mkdir(parents=True, exist_ok=True)
    files = write_corpus(corpus, base_files * scale, file_mib * MIB, seed=scale)
    # 1x: 8 MiB in 64 shards, 2 flushes per file: the production's ratio of flushes to shards, and a
    # fan-in of 16 so the middle level runs from 4x on, as it does for the pool's large sources.
    params = normalize.NormalizeParams(target_shard_bytes=128 * 1024, scatter_buffer_bytes=1 * MIB, gather_fan_in=16)
    per_phase: dict[str, list[int]] = {}
    before, cpu = slow_store.SlowStore.total(), time.process_time()
    normalize.normalize_source("s", files, f"{slow_store.PROTOCOL}://{work}/out-{scale}x", params, runner=CountingRunner(per_phase))
    cpu = time.process_time() - cpu
    driver = slow_store.SlowStore.total() - before - sum(sum(v) for v in per_phase.values())
    return per_phase, driver, cpu / (base_files * scale * file_mib)


def main() -> int:
    started = time.perf_counter()
    sources = pool_sources()
    print(f"rehearse: {len(sources)} sources, {sum(s.shards for s in sources):,} shards, "
          f"{sum(s.files for s in sources):,} provider files of {FILE_BYTES / 2**30:.1f} GiB", flush=True)  # fmt: skip
    ok = True
    with tempfile.TemporaryDirectory(prefix="rehearse-") as tmp, dg.DagsterInstance.ephemeral() as instance:
        root = f"{slow_store.PROTOCOL}://{tmp}"
        drivers = {"normalize": rehearse_normalize(root, sources, instance), "per_shard_map": rehearse_per_shard(root, sources, instance),
                   "quality_bands": rehearse_quality_bands(root, sources, instance), "topic_model sample": rehearse_topic_sample(root, sources, instance),
                   "pool compaction (largest source)": rehearse_compaction(root, pick(sources[0], SourceSize(sources[0].name, 2000)), instance)}
        drivers |= rehearse_global.rehearse_global_stages(root, sources, instance)
        for stage, seen in drivers.items():
            ok &= print_drivers(stage, seen, 1 if stage.startswith("pool compaction") else len(sources), per_source=stage not in ("normalize", "per_shard_map"))
        event_log_before_after(root, SourceSize("probe", pick(2000, 500)), instance)
        for stage, why in rehearse_global.NOT_MEASURED.items():
            print(f"rehearse driver {stage}: not measured ({why})", flush=True)
        scales = pick([1, 4, 16], [1, 4])
        runs = {s: normalize_at(Path(tmp), s) for s in scales}
    full = drivers["normalize"]["phases"]  # tasks per phase at the rehearsed sources' counts
    top = max(scales)
    for phase in ("scatter_file", "regroup_chunk", "gather_shard"):
        largest = {s: max(runs[s][0].get(phase, [0])) for s in scales}
        ratio = largest[top] / max(1, largest[1])
        hours = full[phase] * largest[top] * REQUEST_S / 3600
        print(f"rehearse tasks normalize.{phase}: largest task requests " + " ".join(f"{s}x={largest[s]}" for s in scales)
              + f" ratio {top}x/1x={ratio:.2f} {'PASS' if ratio <= 1.3 else 'MISS'}; {pick('full pool', 'rehearsed sources')} {full[phase]:,} tasks x "
              f"{largest[top]} requests x 30 ms = {hours:,.0f} task-hours of request latency (projected)", flush=True)  # fmt: skip
        ok &= ratio <= 1.3
    cpu_per_mib = runs[top][2]
    print(f"rehearse tasks normalize: CPU {cpu_per_mib:.3f} s/MiB here (128 KiB shards: per-task costs dominate) -> "
          f"{cpu_per_mib * POOL_MIB / 3600:,.0f} core-hours; at 32 MiB shards (make bench-scale, docs/scale.md) 0.015 s/MiB -> "
          f"~410 core-hours; driver-side requests at {top}x: {runs[top][1]:.0f}", flush=True)  # fmt: skip
    print(f"rehearse: {time.perf_counter() - started:.0f} s; {'every goal met' if ok else 'some goals MISSED'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
