"""What every part of `make rehearse` shares: the pool's counts, the dry runner, a Dagster step
that measures its driver, the goals and their verdicts, and the runner that counts a task's requests.

Each stage's rehearsal (``bench/rehearse.py`` and its sibling modules) builds on these, so a new
stage's row is a function that sizes its inputs and calls ``source_step`` or ``global_step``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pickle
import random
import time
from pathlib import Path
from typing import Any

import dagster as dg

from bench import slow_store
from bench.harness import MIB, QUICK
from marin_assets.core.ingest.recipes import checked_catalog
from marin_assets.core.dedup import manifest
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.runner import (
    ShardResult,
    ShardRunner,
    ShardTask,
    _execute,
    finished_before,
    peak_rss_bytes,
    reset_peak_rss,
)

POOL_SHARDS = 372_529
SHARD_BYTES = 256 * MIB
DOCS_PER_SHARD = 26_800
POOL_MIB = POOL_SHARDS * 256
FILE_BYTES = int(float(os.environ.get("REHEARSE_FILE_GIB", "1")) * 1024 * MIB)
REQUEST_S = 0.030
GOALS = {  # acceptance 1 of the rehearsal, per stage
    "driver_peak_mib": 2048, "planning_cpu_min": 10, "largest_spec_kib": 64,
    "event_rows": 20_000, "driver_requests_per_source": 100, "most_inputs": 2048,
}


@dataclasses.dataclass(frozen=True)
class SourceSize:
    name: str
    shards: int

    @property
    def files(self) -> int:
        return max(1, -(-self.shards * SHARD_BYTES // FILE_BYTES))


def pool_sources() -> list[SourceSize]:
    """The catalog's sources with their share of the pool's shards (each at least one)."""
    catalog = checked_catalog(None, strict=False)
    tokens = {s.name: s.rough_tokens_b for s in catalog.sources}
    total = math.fsum(tokens.values())
    sized = sorted((SourceSize(n, max(1, round(POOL_SHARDS * t / total))) for n, t in tokens.items()), key=lambda s: -s.shards)
    return sized[:5] + sized[-5:] if QUICK else sized


# --------------------------------------------------------------------------- part 1: drivers at full counts


class DryRunner(ShardRunner):
    """Runs no task: answers each with the counters its stage returns, and measures the specs."""

    def __init__(self, answer: Any, seen: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        object.__setattr__(self, "_answer", answer)
        object.__setattr__(self, "_seen", seen)

    def map(self, tasks: Any, on_done: Any = None) -> list[ShardResult]:
        seen = self._seen
        finished_before(tasks)  # the real check for finished shards (listings against the store)
        results = []
        done = counting_progress(on_done, self.progress, len(tasks))
        for task in tasks:
            seen["tasks"] += 1
            seen.setdefault("phases", {}).setdefault(task.fn.__name__, 0)
            seen["phases"][task.fn.__name__] += 1
            seen["spec"] = max(seen["spec"], len(pickle.dumps(task)))
            seen["inputs"] = max(seen["inputs"], manifest.count(task.inputs) if isinstance(task.inputs, tuple) else len(task.inputs))  # a manifest reference stands for many; numbered inputs know their length
            result = ShardResult(task.output, self._answer(task), reused=False)
            done(result)
            results.append(result)
        return results


def counting_progress(on_done: Any, progress: Any, total: int) -> Any:
    count = 0

    def done(result: ShardResult) -> None:
        nonlocal count
        count += 1
        if on_done:
            on_done(result)
        if progress:
            progress(count, total, result)

    return done


def step(instance: dg.DagsterInstance, name: str, body: Any) -> tuple[int, float, int]:
    """``body(context)`` as a Dagster step; its event-log rows, driver CPU seconds and peak."""
    figures: dict[str, Any] = {}

    @dg.asset(name=name)
    def step(context) -> None:  # unannotated: Dagster checks the annotation, a string under __future__
        reset_peak_rss()
        cpu = time.process_time()
        body(context)
        figures["cpu"], figures["peak"] = time.process_time() - cpu, peak_rss_bytes()

    quiet = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
    result = dg.materialize([step], instance=instance, run_config=quiet)
    assert result.success
    return len(instance.all_logs(result.run_id)), figures["cpu"], figures["peak"]


def source_step(instance: dg.DagsterInstance, name: str, body: Any, seen: dict[str, Any]) -> None:
    """One source's step: event rows and CPU add up over sources; peak and requests are the largest."""
    before = slow_store.SlowStore.total()
    rows, cpu, peak = step(instance, name, body)
    seen["requests"] = max(seen["requests"], slow_store.SlowStore.total() - before)
    seen["rows"] += rows
    seen["cpu"] += cpu
    seen["peak"] = max(seen["peak"], peak)


def global_step(instance: dg.DagsterInstance, name: str, body: Any, seen: dict[str, Any]) -> None:
    before = slow_store.SlowStore.total()
    rows, cpu, peak = step(instance, name, body)
    seen.update(rows=rows, cpu=cpu, peak=peak, requests=slow_store.SlowStore.total() - before)


def shard_names(root: str, stage: str, src: SourceSize) -> list[str]:
    for _ in range(1 + src.shards // 1000):  # listing the source's shards: a page per 1,000
        slow_store.SlowStore.request("list")
    return [storage.join(root, stage, src.name, storage.shard_name(i, src.shards)) for i in range(src.shards)]


def verdict(value: float, limit: float) -> str:
    return f"{value:,.1f} {'PASS' if value <= limit else 'MISS'}"


def print_drivers(stage: str, seen: dict[str, Any], sources: int, per_source: bool = False, goals: dict[str, float] | None = None) -> bool:
    """A stage's row. A per-source stage's requests are its largest step's; ``per_source``: a global
    step's requests divided by the sources of the pool it reads; ``goals``: this stage's own, over ``GOALS``."""
    goals = GOALS | (goals or {})
    requests = seen["requests"] / sources if per_source else seen["requests"]
    figures = {
        "driver_peak_mib": seen["peak"] / MIB, "planning_cpu_min": seen["cpu"] / 60, "largest_spec_kib": seen["spec"] / 1024,
        "event_rows": seen["rows"], "driver_requests_per_source": requests, "most_inputs": seen["inputs"],
    }  # fmt: skip
    cells = " ".join(f"{k}={verdict(v, goals[k])}" for k, v in figures.items())
    phases = " (" + ", ".join(f"{k} {v:,}" for k, v in seen.get("phases", {}).items()) + ")"
    print(f"rehearse driver {stage}: sources={sources} tasks={seen['tasks']:,}{phases} {cells}", flush=True)
    return all(v <= goals[k] for k, v in figures.items())


# --------------------------------------------------------------------------- part 2: tasks on a slow store


def write_corpus(directory: Path, files: int, file_bytes: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(5000)]
    uris = []
    for f in range(files):
        lines, held = [], 0
        while held < file_bytes:
            text = " ".join(rng.choice(words) for _ in range(rng.randint(40, 400)))
            lines.append(json.dumps({"id": f"{f}-{len(lines)}", "text": text}))
            held += len(lines[-1])
        path = directory / f"part-{f:05d}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        uris.append(f"{slow_store.PROTOCOL}://{path}")
    return uris


def counted_map(tasks: list[ShardTask], per_phase: dict[str, list[int]]) -> list[ShardResult]:
    """Each task in this process (the store's counts are its own), its requests by phase."""
    results = []
    for task in tasks:
        before = slow_store.SlowStore.total()
        results.append(_execute(task))
        per_phase.setdefault(task.fn.__name__, []).append(slow_store.SlowStore.total() - before)
    return results


class CountingRunner(ShardRunner):
    def __init__(self, per_phase: dict[str, list[int]]) -> None:
        super().__init__()
        object.__setattr__(self, "_per_phase", per_phase)

    def map(self, tasks: Any, on_done: Any = None) -> list[ShardResult]:
        return counted_map(list(tasks), self._per_phase)


