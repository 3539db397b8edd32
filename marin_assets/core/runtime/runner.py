"""Map a per-shard stage function over shards: in-process, a local process pool, or Ray.

The per-shard contract: a stage function takes its input shard URIs, the
output shard URI and its parameters, writes the output atomically and returns a dict of
counters. The runner adds resumability: after a shard succeeds its counters are stored next
to it (``_shards/<basename>.json``), and a rerun returns those counters instead of redoing
the shard.

On Ray each shard is one task that carries its resources (CPUs, memory, GPUs). The runner keeps
``target_in_flight`` tasks submitted whatever the cluster's size now, so an autoscaling cluster
that starts with no workers sees the demand and grows; once the cluster has more than half as
many CPUs, twice its CPUs (re-read as it grows); never more than ``max_in_flight`` (a corpus of
10^5 shards never floods the scheduler). A failed task is retried ``retries`` times when a retry
can help (a lost worker, a worker killed for memory, a dropped connection or timed-out I/O:
``TRANSIENT_ERRORS``), never for a deterministic error (bad input, a bug), which would only fail again,
and ``on_done`` sees every task as soon as it finishes, not when the whole map ends.

The runner never starts or owns a cluster by itself unless asked to (``ray_address="local"``):
the orchestrator connects to one (a local Ray, an address, KubeRay) and hands over its address.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import gc
import json
import math
import resource
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pyarrow as pa

from marin_assets.core.runtime import storage
from marin_assets.errors import ConfigurationError

ShardFn = Callable[..., Mapping[str, Any]]

LOCAL = "local"  # ray_address that starts (or reuses) a Ray instance on this machine
# Errors raised inside a task that may pass on a retry; lost workers and out-of-memory kills are
# retried by Ray whatever the error list says (they raise nothing inside the task).
# A Ray worker runs task after task (never recycled by default): it hands freed memory back
# between them, so one large task's heap is not counted again in every later task's peak. Arrow
# allocates from the C library (its default pool keeps freed pages for reuse) and the C library
# keeps at most 2 arenas (its default is 8 per core, each holding freed pages of its own).
WORKER_ENV = {"ARROW_DEFAULT_MEMORY_POOL": "system", "MALLOC_ARENA_MAX": "2"}
# For tasks that read a large file batch after batch (``TaskResources.env_vars``): polars'
# allocator returns freed pages at once. By default it keeps them ~10 s, and such a task held
# ~100 MiB more than one reading a single batch; set for every task, it cost dedup ~13% CPU.
FREED_AT_ONCE_ENV = (("_RJEM_MALLOC_CONF", "dirty_decay_ms:0,muzzy_decay_ms:0"),)
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError)


class ShardFailed(ConfigurationError, RuntimeError):
    """A shard task's worker was lost for good (after its retries): most often the task outgrew the
    memory its worker had, so the fix is in the task sizes; the message names shard, inputs and error."""


@dataclasses.dataclass(frozen=True)
class TaskResources:
    """What one shard task reserves on a Ray cluster (logical resources used for scheduling).

    ``memory_bytes`` is the task's budget: the stage parameters bound the task's peak memory
    (shard size, batch sizes), so this is what lets Ray pack tasks on a node without running
    it out of memory. 0 reserves nothing.
    """

    cpus: float = 1.0
    memory_bytes: int = 0
    gpus: float = 0.0
    env_vars: tuple[tuple[str, str], ...] = ()  # set in the task's worker (Ray keeps workers per environment)

    def ray_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"num_cpus": self.cpus}
        if self.memory_bytes:
            options["memory"] = int(self.memory_bytes)
        if self.gpus:
            options["num_gpus"] = self.gpus
        return options


@dataclasses.dataclass(frozen=True)
class ShardTask:
    """One unit of work: ``fn(inputs, output, params)`` producing ``output``.

    ``resources`` overrides what the runner reserves for this task; when it is ``None`` the
    parameters may say what they need (``params.task_resources(default) -> TaskResources``,
    e.g. an embedding on a GPU), else the runner's default applies.
    """

    fn: ShardFn
    inputs: tuple[str, ...]
    output: str
    params: Any = None
    resources: TaskResources | None = None


@dataclasses.dataclass
class ShardResult:
    output: str
    stats: dict[str, Any]
    reused: bool
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    peak_rss_bytes: int = 0  # the task's peak resident size (VmHWM since it started; 0: reused or unknown)


def peak_rss_bytes() -> int:
    """This process's peak resident set (VmHWM), in bytes; 0 where /proc is not available."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def reset_peak_rss() -> bool:
    """Restart this process's VmHWM from its current size, so a reused worker reports each task's own peak."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def release_free_memory() -> None:
    """Hand the memory a finished task freed back to the system (Python's cycles collected,
    Arrow's pool and the C heap trimmed), so a long-lived worker starts its next task at about
    its own size instead of carrying earlier tasks' freed pages, which count in its resident set."""
    gc.collect()
    pa.default_memory_pool().release_unused()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _libc() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


_LIBC = _libc()


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _reused(task: ShardTask) -> ShardResult | None:
    marker = storage.shard_stats_uri(task.output)
    if storage.exists(marker):
        return ShardResult(task.output, storage.read_json(marker), reused=True)
    return None


def finished_before(tasks: Sequence[ShardTask]) -> list[ShardResult | None]:
    """Each task's stored result where it finished in an earlier run (None: still to do).

    One listing per folder of completion records (the tasks of a map share one or a few), then
    the records found read in one batched call (concurrent requests on an object store), not an
    existence check per task: a map of 10^5 shards costs ~10^2 listing pages, not 10^5 requests.
    """
    markers = [storage.shard_stats_uri(t.output) for t in tasks]
    by_folder: dict[str, list[int]] = {}
    for i, marker in enumerate(markers):
        by_folder.setdefault(marker.rsplit("/", 1)[0], []).append(i)
    results: list[ShardResult | None] = [None] * len(tasks)
    for folder, members in by_folder.items():
        present = {storage.basename(u) for u in storage.listdir(folder)}
        found = [i for i in members if storage.basename(markers[i]) in present]
        if not found:
            continue
        fs, _ = storage.filesystem(markers[found[0]])
        paths = [storage.filesystem(markers[i])[1] for i in found]
        blobs = {fs._strip_protocol(k): v for k, v in fs.cat(paths, on_error="raise").items()}
        for i, path in zip(found, paths):
            results[i] = ShardResult(tasks[i].output, json.loads(blobs[fs._strip_protocol(path)]), reused=True)
    return results


def _execute(task: ShardTask) -> ShardResult:
    started, cpu = time.perf_counter(), _cpu_seconds()
    stats = dict(task.fn(list(task.inputs), task.output, task.params))
    storage.write_json(storage.shard_stats_uri(task.output), stats)
    return ShardResult(
        task.output,
        stats,
        reused=False,
        seconds=time.perf_counter() - started,
        cpu_seconds=_cpu_seconds() - cpu,
        peak_rss_bytes=peak_rss_bytes(),
    )


def _run_one(task: ShardTask) -> ShardResult:
    """A task, unless its output was finished meanwhile (a retried or duplicated task is idempotent)."""
    return _reused(task) or _execute(task)


def _run_in_worker(task: ShardTask) -> ShardResult:
    """A task in a worker process of its own (Ray, process pool): its peak counts from its start.

    Never used in-process: resetting the driver's peak would hide it from whoever measures it.
    """
    reset_peak_rss()
    try:
        return _run_one(task)
    finally:
        release_free_memory()


def describe_task(task: ShardTask, limit: int = 5) -> str:
    """``shard <output> (inputs: a, b, ... and N more)`` for error messages."""
    shown = ", ".join(task.inputs[:limit])
    more = f" and {len(task.inputs) - limit} more" if len(task.inputs) > limit else ""
    return f"shard {task.output} (inputs: {shown or 'none'}{more})"


def _with_shard_note(exc: BaseException, task: ShardTask, attempts: int) -> BaseException:
    exc.add_note(f"while running {describe_task(task)} [{getattr(task.fn, '__name__', task.fn)}, {attempts} attempt(s)]")
    return exc


def in_flight_limit(target: int, cap: int, cluster_cpus: float) -> int:
    """Submitted-but-unfinished tasks to keep: ``target`` at least (an idle autoscaling cluster has
    no CPUs yet, and grows only for demand it sees), twice the cluster's CPUs once that is more
    (every CPU busy with a task queued behind it), at most ``cap`` (0: no cap)."""
    wanted = max(1, target, int(2 * cluster_cpus))
    return min(wanted, cap) if cap > 0 else wanted


def _counting(
    on_done: Callable[[ShardResult], None] | None, progress: Callable[[int, int, ShardResult], None], total: int
) -> Callable[[ShardResult], None]:
    finished = 0

    def done(result: ShardResult) -> None:
        nonlocal finished
        finished += 1
        if on_done is not None:
            on_done(result)
        progress(finished, total, result)

    return done


def connect_ray(address: str, local_cpus: int = 0) -> Any:
    """The ``ray`` module, connected: ``"local"`` starts (or reuses) a Ray on this machine
    (``local_cpus`` CPUs, 0: all), any other address is passed to ``ray.init``; a process
    already connected keeps its connection."""
    try:
        import ray  # noqa: PLC0415  (optional; only imported when configured)
    except ImportError as exc:  # pragma: no cover - depends on the deployment
        raise RuntimeError(
            f"work is configured to run on Ray ({address!r}) but the 'ray' package is not "
            "installed; install it (pip install 'ray[default]') or leave the Ray address empty"
        ) from exc
    if not ray.is_initialized():
        if address == LOCAL:
            options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
            if local_cpus:
                options["num_cpus"] = local_cpus
            ray.init(**options)
        else:
            ray.init(address=address, log_to_driver=False)
    return ray


@dataclasses.dataclass(frozen=True)
class ShardRunner:
    """Runs shard tasks. ``processes=1`` runs in-process (deterministic, easy to debug).

    ``ray_address`` sends each shard to Ray as a task: ``"local"`` starts (or reuses) a Ray
    instance on this machine, any other value is passed to ``ray.init`` (``"auto"``,
    ``"ray://head:10001"``); a process already connected to Ray keeps its connection.
    ``target_in_flight`` tasks are kept submitted from the start (an autoscaler sizes the cluster
    from the demand it sees), or twice the cluster's CPUs once that is more (re-read every
    ``cluster_refresh_s`` seconds while a map runs); ``max_in_flight`` caps both (0: no cap);
    ``retries`` is how often one failed task is run again; ``task_resources`` is the default
    reservation of a task; ``local_cpus`` sizes a Ray started with ``"local"`` (0: all);
    ``worker_max_tasks`` recycles worker processes (1: a fresh process per task, so memory a
    library keeps after a task never adds up; also what the scale benchmark measures).
    """

    processes: int = 1
    ray_address: str | None = None
    max_in_flight: int = 0
    target_in_flight: int = 256
    cluster_refresh_s: float = 10.0
    retries: int = 2
    task_resources: TaskResources = TaskResources()
    local_cpus: int = 0
    worker_max_tasks: int = 0  # Ray: recycle a worker process after this many tasks (0: never)
    # Ray runtime environment of the tasks (e.g. {"env_vars": {...}}); Ray shares a worker process only
    # between tasks with the same one, so a distinct value keeps one stage's workers to itself.
    runtime_env: Mapping[str, Any] | None = dataclasses.field(default=None, compare=False)
    # Called after every finished task of a map with (finished, total, result): how the
    # orchestrator shows progress while a step runs (core never knows who listens).
    progress: Callable[[int, int, ShardResult], None] | None = dataclasses.field(default=None, compare=False)
    # The module that talks to Ray (None: ``ray`` itself); a stand-in drives a cluster of any size in tests.
    ray_api: Any = dataclasses.field(default=None, compare=False, repr=False)

    def task_runtime_env(self, task_env: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
        """``runtime_env`` with :data:`WORKER_ENV` and a task's own variables under its
        ``env_vars`` (the step's own values win)."""
        env = dict(self.runtime_env or {})
        env["env_vars"] = {**WORKER_ENV, **dict(task_env), **dict(env.get("env_vars") or {})}
        return env

    def resources_for(self, task: ShardTask) -> TaskResources:
        if task.resources is not None:
            return task.resources
        wanted = getattr(task.params, "task_resources", None)
        return wanted(self.task_resources) if callable(wanted) else self.task_resources

    def map(self, tasks: Sequence[ShardTask], on_done: Callable[[ShardResult], None] | None = None) -> list[ShardResult]:
        """Run every task (finished shards are reused); results in task order.

        ``on_done`` is called once per task as soon as it finishes (in completion order), then
        ``progress`` with the count finished so far.
        """
        if self.progress is not None:
            on_done = _counting(on_done, self.progress, len(tasks))
        earlier = finished_before(tasks)  # finished shards are not even submitted
        if self.ray_address:
            return self._map_ray(tasks, earlier, on_done)
        results: list[ShardResult] = []
        todo = [t for t, done in zip(tasks, earlier) if done is None]
        pool = ProcessPoolExecutor(max_workers=self.processes) if self.processes > 1 and todo else None
        # with a pool, even a lone task runs in a worker: its peak is its own
        futures = iter([pool.submit(_run_in_worker, t) for t in todo] if pool else [])
        try:
            for task, done in zip(tasks, earlier):
                if done is None:
                    try:
                        done = next(futures).result() if pool else _execute(task)
                    except Exception as exc:
                        raise _with_shard_note(exc, task, 1) from None
                if on_done:
                    on_done(done)
                results.append(done)
        finally:
            if pool:
                pool.shutdown(cancel_futures=True)
        return results

    # ------------------------------------------------------------------ Ray

    def _connect(self) -> Any:
        if self.ray_api is not None:
            return self.ray_api
        return connect_ray(self.ray_address or "", self.local_cpus)

    def in_flight_limit(self, cluster_cpus: float) -> int:
        """Tasks to keep submitted on a cluster with ``cluster_cpus`` CPUs now."""
        return in_flight_limit(self.target_in_flight, self.max_in_flight, cluster_cpus)

    def _map_ray(self, tasks: Sequence[ShardTask], earlier: list[ShardResult | None],
                 on_done: Callable[[ShardResult], None] | None) -> list[ShardResult]:  # fmt: skip
        ray = self._connect()
        RayTaskError = ray.exceptions.RayTaskError  # noqa: N806

        results = list(earlier)
        todo: list[int] = []
        for i, done in enumerate(earlier):
            if done is None:
                todo.append(i)
            elif on_done:
                on_done(done)
        remote = ray.remote(max_calls=self.worker_max_tasks)(_run_in_worker) if self.worker_max_tasks else ray.remote(_run_in_worker)
        cluster = _ClusterSize(ray, self.cluster_refresh_s)
        pending: dict[Any, int] = {}
        queue = iter(todo)
        exhausted = False
        try:
            while True:
                limit = self.in_flight_limit(cluster.cpus())
                while not exhausted and len(pending) < limit:
                    i = next(queue, None)
                    if i is None:
                        exhausted = True
                        break
                    resources = self.resources_for(tasks[i])
                    options = resources.ray_options()
                    options["runtime_env"] = self.task_runtime_env(resources.env_vars)
                    ref = remote.options(max_retries=self.retries, retry_exceptions=list(TRANSIENT_ERRORS), **options).remote(tasks[i])
                    pending[ref] = i
                if not pending:
                    break
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    i = pending.pop(ref)
                    try:
                        result = ray.get(ref)
                    except RayTaskError as exc:
                        cause = exc.cause if isinstance(exc.cause, BaseException) else exc
                        attempts = self.retries + 1 if isinstance(cause, TRANSIENT_ERRORS) else 1
                        raise _with_shard_note(cause, tasks[i], attempts) from None
                    except Exception as exc:  # a lost worker or node, after its retries
                        raise ShardFailed(
                            f"{describe_task(tasks[i])} failed after {self.retries + 1} attempt(s): "
                            f"{type(exc).__name__}: {exc}; if workers were killed for memory, raise "
                            "MARIN_TASK_MEMORY_BYTES or lower the shard target, then rerun (finished shards are kept)"
                        ) from exc
                    results[i] = result
                    if on_done:
                        on_done(result)
        finally:
            for ref in pending:  # a failed map stops the rest; finished shards stay for the rerun
                ray.cancel(ref)
        return [r for r in results if r is not None]


class _ClusterSize:
    """The cluster's CPUs, re-read at most every ``refresh_s`` seconds (an autoscaler adds and
    removes nodes while a map runs; one request per finished task would be a request per shard)."""

    def __init__(self, ray: Any, refresh_s: float) -> None:
        self._ray, self._refresh_s = ray, refresh_s
        self._value, self._read_at = 0.0, -math.inf

    def cpus(self) -> float:
        now = time.monotonic()
        if now - self._read_at >= self._refresh_s:
            self._value, self._read_at = float(self._ray.cluster_resources().get("CPU", 0.0)), now
        return self._value


def combined_by_tasks(parts: Sequence[str], work_uri: str, fn: ShardFn, params: Any, runner: ShardRunner, width: int) -> list[str]:
    """``parts`` combined ``width`` at a time, in order, by tasks ``fn(parts, output, params)``:
    a step that reads the partial results of a map reads ``len(parts) / width`` files instead of
    one per task (a second level of the same tree; ``width`` parts or fewer are returned as they are)."""
    if len(parts) <= width:
        return list(parts)
    suffix = "." + parts[0].rsplit(".", 1)[-1]  # the parts' format, kept
    tasks = [
        ShardTask(fn, tuple(parts[i : i + width]), storage.join(work_uri, f"combined-{i // width:06d}{suffix}"), params)
        for i in range(0, len(parts), width)
    ]
    return [r.output for r in runner.map(tasks)]
