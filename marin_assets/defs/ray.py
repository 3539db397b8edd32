"""The Ray cluster that per-shard work runs on, as a ``dagster-ray`` resource.

* empty: no Ray; shards run in the step's process (the embedded default, ``make demo``);
* ``local``: ``dagster_ray.LocalRay``, a Ray started on this machine the first time a step maps
  shards (``make dev``, the tests);
* an address (``auto``, ``ray://head:10001``): an existing cluster;
* production on Kubernetes: the standing KubeRay cluster of ``deploy/ray`` by its ``ray://``
  address (a per-run ``dagster_ray.kuberay.KubeRayCluster`` is not wired yet).

The resource is created with ``connect=False``: steps that map no shards (downloads, global
decisions) never start or join Ray; the shard runner connects on first use.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import dagster as dg
from dagster_ray import Lifecycle, LocalRay, RayResource

from marin_assets.core.runtime.runner import LOCAL, ShardResult


class RayClusterAddress(RayResource):
    """An already running Ray cluster, reached at ``address`` (``auto`` inside the cluster)."""

    address: str

    @property
    def host(self) -> str:
        rest = self.address.split("://", 1)[-1]
        return rest.rsplit(":", 1)[0] if ":" in rest else rest

    @property
    def ray_address(self) -> str:  # type: ignore[override]
        return self.address

    @property
    def name(self) -> str:
        return f"Ray cluster at {self.address}"

    @property
    def created(self) -> bool:
        return True

    @property
    def ready(self) -> bool:
        return True


def ray_cluster(address: str) -> RayResource | None:
    """The dagster-ray resource for a ``MARIN_RAY_ADDRESS`` value (None: run in-process)."""
    lazy = Lifecycle(connect=False, cleanup="never")
    if not address:
        return None
    if address == LOCAL:
        return LocalRay(lifecycle=lazy)
    return RayClusterAddress(address=address, lifecycle=lazy)


def runner_address(cluster: RayResource | None) -> str | None:
    """The address the shard runner connects to (``local`` for a LocalRay)."""
    if cluster is None:
        return None
    if isinstance(cluster, LocalRay):
        return LOCAL
    try:
        return cluster.ray_address
    except (AssertionError, ValueError) as exc:  # a KubeRay cluster that was not created yet
        raise dg.Failure(f"the Ray cluster {cluster.display_name} has no address yet: {exc}") from exc


PROGRESS_EVERY = 10  # finished shard tasks between two progress observations (and the last one)
PROGRESS_SECONDS = 60.0  # ... or this long since the last one, whichever comes first
MAX_PROGRESS_EVENTS = 40  # observations per map besides its last: a 10^5-task map logs a bounded number
MAX_LOG_LINES = 40  # per-task log lines per step (the first ones, then one a minute); the rest are counted


def step_progress(every: int = PROGRESS_EVERY, seconds: float = PROGRESS_SECONDS,
                  most: int = MAX_PROGRESS_EVENTS) -> Callable[[int, int, ShardResult], None] | None:  # fmt: skip
    """Progress of the running step's shard tasks as ``AssetObservation`` events, so the UI shows
    how far a long step is while it runs.

    Every ``every`` finished tasks (more apart in a long map: at most ``most`` observations per
    map) or ``seconds`` after the last one, and always at the last task (the map's summary): tasks
    finished and total, the rate of this map so far and the time left at that rate (labelled
    predicted), shards reused, CPU seconds and the largest task peak so far. The event log
    (a database row per event) grows with the steps, not with the shards. None outside a Dagster step.
    """
    try:
        context = dg.AssetExecutionContext.get()
    except dg.DagsterInvariantViolationError:
        return None
    keys = sorted(context.selected_asset_keys, key=lambda k: k.to_user_string())
    partition = context.partition_key if context.has_partition_key else None
    every = max(1, int(every))
    seen = {"reused": 0, "cpu": 0.0, "peak": 0, "maps": 0, "emitted": 0}
    started = last = map_started = time.monotonic()

    def report(finished: int, total: int, result: ShardResult) -> None:
        nonlocal last, map_started
        seen["reused"] += int(result.reused)
        seen["cpu"] += result.cpu_seconds
        seen["peak"] = max(seen["peak"], result.peak_rss_bytes)
        now = time.monotonic()
        if finished == 1:
            seen["maps"] += 1  # normalize maps twice (read files, then write shards)
            seen["emitted"] = 0
            map_started = now
        stride = max(every, -(-total // max(1, most)))
        if finished != total and (seen["emitted"] >= most or (finished % stride and now - last < seconds)):
            return
        seen["emitted"] += 1
        last = now
        metadata = {
            "shard_tasks_finished": dg.MetadataValue.int(finished),
            "shard_tasks_total": dg.MetadataValue.int(total),
            "shard_tasks_fraction": dg.MetadataValue.float(round(finished / max(total, 1), 4)),
            **pace(finished, total, now - map_started),
            "shard_tasks_reused": dg.MetadataValue.int(seen["reused"]),
            "shard_map": dg.MetadataValue.int(seen["maps"]),
            "task_cpu_seconds": dg.MetadataValue.float(round(seen["cpu"], 3)),
            "largest_task_peak_mib": dg.MetadataValue.float(round(seen["peak"] / (1 << 20), 1)),
            "elapsed_seconds": dg.MetadataValue.float(round(now - started, 1)),
        }
        for key in keys:
            context.log_event(dg.AssetObservation(asset_key=key, partition=partition, metadata=metadata))

    return report


def pace(finished: int, total: int, seconds: float) -> dict[str, dg.MetadataValue]:
    """This map's rate so far (tasks per minute) and, at that rate, the minutes left (a prediction)."""
    if seconds <= 0 or finished <= 0:
        return {}
    per_minute = finished * 60.0 / seconds
    return {
        "shard_tasks_per_minute": dg.MetadataValue.float(round(per_minute, 2)),
        "minutes_left_predicted": dg.MetadataValue.float(round((total - finished) / per_minute, 1)),
    }


class StepLog:
    """A step's per-task log lines, bounded: the first ``head`` lines, then at most one every
    ``every_s`` seconds, at most ``most`` in all; a line logged after a gap says how many were
    left out (the progress observations carry the counts). Called like ``context.log.info``."""

    def __init__(self, log: Callable[[str], None], head: int = 10, every_s: float = 60.0, most: int = MAX_LOG_LINES) -> None:
        self._log, self._head, self._every_s, self._most = log, head, every_s, most
        self.logged = self.left_out = 0
        self._last = -float("inf")

    def __call__(self, message: str) -> None:
        now = time.monotonic()
        if self.logged >= self._most or (self.logged >= self._head and now - self._last < self._every_s):
            self.left_out += 1
            return
        if self.left_out:
            message = f"{message} ({self.left_out} lines like this one left out of the log since the last)"
            self.left_out = 0
        self._log(message)
        self.logged += 1
        self._last = now


def step_log(context: dg.AssetExecutionContext) -> StepLog:
    """The step's info log, bounded for per-task lines (see ``StepLog``)."""
    return StepLog(context.log.info)
