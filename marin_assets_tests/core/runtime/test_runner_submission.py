"""How many Ray tasks the runner keeps submitted, on a stand-in cluster whose CPUs grow from 0
(an autoscaling KubeRay starts with a CPU-less head and no workers)."""

from __future__ import annotations

import types
from pathlib import Path

from marin_assets.core.runtime import storage
from marin_assets.core.runtime.runner import ShardRunner, ShardTask, in_flight_limit


class GrowingCluster:
    """The parts of the ``ray`` module the runner calls. Each ``wait`` finishes the oldest task and
    then grows the cluster by ``step`` CPUs (the autoscaler answering the demand), up to ``most``."""

    exceptions = types.SimpleNamespace(RayTaskError=type("RayTaskError", (Exception,), {}))

    def __init__(self, step: float, most: float) -> None:
        self.step, self.most, self.cpus = step, most, 0.0
        self.tasks: dict[int, object] = {}
        self.submitted = 0
        self.seen: list[tuple[float, int, int]] = []  # at each wait: CPUs, tasks in flight, tasks submitted so far
        self.resource_reads = 0
        self.options: list[dict] = []  # per submission, what the runner asked Ray for

    def is_initialized(self) -> bool:
        return True

    def cluster_resources(self) -> dict[str, float]:
        self.resource_reads += 1
        return {"CPU": self.cpus} if self.cpus else {}  # an empty cluster reports no CPU key

    def remote(self, fn):
        cluster = self

        class Remote:
            def options(self, **options: object) -> Remote:
                cluster.options.append(options)
                return self

            def remote(self, task: ShardTask) -> int:
                cluster.submitted += 1
                cluster.tasks[cluster.submitted] = (fn, task)
                return cluster.submitted

        return Remote()

    def wait(self, refs: list[int], num_returns: int = 1) -> tuple[list[int], list[int]]:
        self.seen.append((self.cpus, len(refs), self.submitted))
        self.cpus = min(self.most, self.cpus + self.step)
        return refs[:1], refs[1:]

    def get(self, ref: int):
        fn, task = self.tasks.pop(ref)
        return fn(task)

    def cancel(self, ref: int) -> None:
        self.tasks.pop(ref, None)


def _write(inputs: list[str], output: str, params: object) -> dict:
    storage.write_bytes(output, b"x")
    return {"rows": 1}


def _tasks(tmp_path: Path, n: int) -> list[ShardTask]:
    return [ShardTask(_write, (), str(tmp_path / f"part-{i:05d}")) for i in range(n)]


def test_an_idle_cluster_gets_the_target_at_once_and_in_flight_follows_the_cluster(tmp_path: Path) -> None:
    cluster = GrowingCluster(step=4, most=64)
    runner = ShardRunner(ray_address="stub", target_in_flight=32, cluster_refresh_s=0, ray_api=cluster)
    results = runner.map(_tasks(tmp_path, 400))
    assert len(results) == 400 and not any(r.reused for r in results)
    cpus, first, _ = cluster.seen[0]
    assert cpus == 0 and first == 32  # no CPUs yet: the whole target is submitted, not 1-2 tasks
    unsubmitted = [(cpus, n) for cpus, n, submitted in cluster.seen if submitted < 400]
    assert len(unsubmitted) > 200
    for cpus, in_flight in unsubmitted:
        assert in_flight == max(32, int(2 * cpus))  # the target, then twice the cluster as it grows
    assert max(n for _, n, _ in cluster.seen) == 128  # the grown cluster (64 CPUs) is kept busy


def test_a_cap_bounds_the_target_and_the_grown_cluster(tmp_path: Path) -> None:
    cluster = GrowingCluster(step=8, most=256)
    runner = ShardRunner(ray_address="stub", target_in_flight=32, max_in_flight=100, cluster_refresh_s=0, ray_api=cluster)
    runner.map(_tasks(tmp_path, 300))
    assert cluster.seen[0][:2] == (0, 32)
    assert max(n for _, n, _ in cluster.seen) == 100


def test_the_cluster_size_is_reread_at_most_every_refresh_interval(tmp_path: Path) -> None:
    cluster = GrowingCluster(step=4, most=64)
    ShardRunner(ray_address="stub", target_in_flight=8, cluster_refresh_s=3600, ray_api=cluster).map(_tasks(tmp_path, 50))
    assert cluster.resource_reads == 1  # one read for the whole map: the size seen is 0 CPUs
    assert {n for _, n, _ in cluster.seen[:40]} == {8}


def test_finished_shards_are_found_by_one_listing_and_never_submitted(tmp_path: Path) -> None:
    tasks = _tasks(tmp_path, 20)
    ShardRunner().map(tasks[:12])
    cluster = GrowingCluster(step=1, most=4)
    results = ShardRunner(ray_address="stub", target_in_flight=4, cluster_refresh_s=0, ray_api=cluster).map(tasks)
    assert [r.reused for r in results] == [True] * 12 + [False] * 8
    assert cluster.submitted == 8


def test_in_flight_limit() -> None:
    assert in_flight_limit(256, 0, 0) == 256
    assert in_flight_limit(256, 0, 1000) == 2000
    assert in_flight_limit(256, 64, 1000) == 64
    assert in_flight_limit(0, 0, 0) == 1


def test_a_scatter_task_runs_in_a_worker_whose_allocator_returns_freed_pages_at_once(tmp_path: Path) -> None:
    """A task's own environment variables (here: a normalize scatter's) reach its worker beside
    the workers' common ones; other tasks keep the common ones only."""
    from marin_assets.core.ingest.normalize import NormalizeParams, ScatterParams  # noqa: PLC0415
    from marin_assets.core.runtime.runner import FREED_AT_ONCE_ENV, WORKER_ENV  # noqa: PLC0415

    scatter = ShardTask(_write, (), str(tmp_path / "scatter"), ScatterParams(NormalizeParams(), shards=4, source="s", fmt="jsonl"))
    cluster = GrowingCluster(step=1, most=4)
    ShardRunner(ray_address="stub", target_in_flight=2, cluster_refresh_s=0, ray_api=cluster).map([scatter, *_tasks(tmp_path, 1)])
    scatter_env, other_env = (o["runtime_env"]["env_vars"] for o in cluster.options)
    assert scatter_env == {**WORKER_ENV, **dict(FREED_AT_ONCE_ENV)} and other_env == WORKER_ENV
