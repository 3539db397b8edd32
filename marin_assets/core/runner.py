"""Map a per-shard stage function over shards: in-process, a local process pool, or Ray.

The per-shard contract (DESIGN section 1): a stage function takes its input shard URIs, the
output shard URI and its parameters, writes the output atomically and returns a dict of
counters. The runner adds resumability: after a shard succeeds its counters are stored next
to it (``_shards/<basename>.json``), and a rerun returns those counters instead of redoing
the shard.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from marin_assets.core import storage

ShardFn = Callable[..., Mapping[str, Any]]


@dataclasses.dataclass(frozen=True)
class ShardTask:
    """One unit of work: ``fn(inputs, output, params)`` producing ``output``."""

    fn: ShardFn
    inputs: tuple[str, ...]
    output: str
    params: Any = None


@dataclasses.dataclass
class ShardResult:
    output: str
    stats: dict[str, Any]
    reused: bool


def _run_one(task: ShardTask) -> ShardResult:
    marker = storage.shard_stats_uri(task.output)
    if storage.exists(marker):
        return ShardResult(task.output, storage.read_json(marker), reused=True)
    stats = dict(task.fn(list(task.inputs), task.output, task.params))
    storage.write_json(marker, stats)
    return ShardResult(task.output, stats, reused=False)


@dataclasses.dataclass(frozen=True)
class ShardRunner:
    """Runs shard tasks. ``processes=1`` runs in-process (deterministic, easy to debug).

    ``ray_address`` (the ``MARIN_RAY_ADDRESS`` setting) sends each shard to a Ray cluster as a task.
    """

    processes: int = 1
    ray_address: str | None = None

    def map(self, tasks: Sequence[ShardTask], on_done: Callable[[ShardResult], None] | None = None) -> list[ShardResult]:
        results: list[ShardResult] = []
        if self.ray_address:
            results = self._map_ray(tasks)
            for r in results:
                if on_done:
                    on_done(r)
            return results
        if self.processes <= 1 or len(tasks) <= 1:
            for task in tasks:
                result = _run_one(task)
                if on_done:
                    on_done(result)
                results.append(result)
            return results
        with ProcessPoolExecutor(max_workers=self.processes) as pool:
            for result in pool.map(_run_one, tasks):
                if on_done:
                    on_done(result)
                results.append(result)
        return results

    def _map_ray(self, tasks: Sequence[ShardTask]) -> list[ShardResult]:
        try:
            import ray  # noqa: PLC0415  (optional; only imported when configured)
        except ImportError as exc:  # pragma: no cover - depends on the deployment
            raise RuntimeError(
                "MARIN_RAY_ADDRESS is set but the 'ray' package is not installed; "
                "install it (pip install 'ray[default]') or unset MARIN_RAY_ADDRESS."
            ) from exc
        if not ray.is_initialized():
            ray.init(address=self.ray_address, ignore_reinit_error=True)
        remote = ray.remote(_run_one)
        return list(ray.get([remote.remote(t) for t in tasks]))
