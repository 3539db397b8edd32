"""The benchmark harness: runs interleave, memory is the child's own, goals say PASS or MISS."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from bench import harness


def allocate(mib: int, log: str, label: str) -> dict:
    """A case: ``mib`` MiB touched inside the measured part; appends ``label`` to ``log``."""
    with open(log, "a") as handle:
        handle.write(label + "\n")
    with harness.timed():
        block = bytearray(mib << 20)
        block[:: 4096] = b"x" * len(block[:: 4096])
    return {"items": 10}


@pytest.mark.system
def test_runs_interleave_and_peak_memory_is_the_childs_own(tmp_path, capsys) -> None:
    ballast = bytearray(300 << 20)  # the parent's memory must not count in the children's
    ballast[::4096] = b"x" * len(ballast[::4096])
    log = str(tmp_path / "order.log")
    cases = [
        harness.Case("small", "marin_assets_tests.test_bench_harness:allocate", {"mib": 16, "log": log, "label": "A"}),
        harness.Case("large", "marin_assets_tests.test_bench_harness:allocate", {"mib": 96, "log": log, "label": "B"}),
    ]
    result = harness.compare("harness self-test", cases, rounds=2, unit="things")
    assert open(log).read().split() == ["A", "B", "A", "B"]
    for label, mib in (("small", 16), ("large", 96)):
        runs = result[label].runs
        assert len(runs) == 2 and all(r["peak_from_region"] for r in runs)
        growth = [(r["peak_kib"] - r["base_kib"]) / 1024 for r in runs]
        assert all(mib * 0.9 <= g <= mib + 40 for g in growth), (label, growth)
        assert result[label].peak_mib() < 250, "the child's peak includes the parent's 300 MiB"
    assert harness.growth_goal("small", "large", 1.0).check(result) is False
    assert harness.growth_goal("small", "large", 100.0).check(result) is True
    out = capsys.readouterr().out
    assert "2 round(s) interleaved" in out and "-> MISS" in out and "-> PASS" in out
    del ballast


def test_speed_goal_uses_the_median_of_paired_rounds() -> None:
    def measured(label: str, seconds: list[float]) -> harness.Measured:
        return harness.Measured(harness.Case(label, "m:f"), [{"items": 100, "seconds": s, "cpu_s": s, "peak_kib": 1, "base_kib": 0} for s in seconds])

    # Round 2 was slow for both (load on the machine): the paired ratio stays 2x in every round.
    result = harness.Result("t", {"peer": measured("peer", [2.0, 8.0, 2.2]), "ours": measured("ours", [1.0, 4.0, 1.1])}, "docs")
    assert result.speedup("ours", "peer") == pytest.approx((2.0, 2.0, 2.0))
    assert harness.speed_goal("ours", "peer", 1.9).check(result)
    assert not harness.speed_goal("ours", "peer", 2.1, basis="cpu").check(result)
    # CPU time per item: "ours" costs half of "peer" per item, so peer is 2x ours.
    assert harness.cost_growth_goal("ours", "peer", 2.0, "peer within 2x of ours").check(result)
    assert not harness.cost_growth_goal("ours", "peer", 1.5).check(result)


def test_a_failing_case_names_itself() -> None:
    with pytest.raises(RuntimeError, match="'broken'.*exit"):
        harness.run_child(harness.Case("broken", "marin_assets_tests.test_bench_harness:no_such_function"))


def test_every_stage_is_mapped_to_the_bench_that_holds_it_to_a_goal() -> None:
    import pathlib

    from bench import bench_stages
    from marin_assets.core import specs

    assert set(bench_stages.STAGES) == {s.name for s in specs.ALL}
    assert [s.name for s in specs.ALL if not s.bench] == [], "give each stage's spec the bench that holds it (bench=Bench(...))"
    benches = {p.stem.removeprefix("bench_") for p in (pathlib.Path(bench_stages.__file__).parent).glob("bench_*.py")}
    for stage, (bench, how) in bench_stages.STAGES.items():
        assert bench in benches or (bench == "" and how.startswith("NO ROW")), f"{stage}: bench_{bench} does not exist"


def test_every_stage_held_by_bench_stages_has_a_row_that_runs() -> None:
    from bench import bench_stages

    held = {stage for stage, (bench, _) in bench_stages.STAGES.items() if bench == "stages"}
    assert set(bench_stages.ROWS) == held, "map each stage bench_stages holds to its row in ROWS"
    for row in set(bench_stages.ROWS.values()):
        assert callable(getattr(bench_stages, f"{row}_rows", None)), f"row {row!r} has no {row}_rows function"


# --------------------------------------------------------------------------- exit status


def test_every_bench_exits_with_its_goals_verdict() -> None:
    """Each bench ends through ``exit_status``: a missed goal exits 1, not 0."""
    benches = sorted(pathlib.Path(harness.__file__).parent.glob("bench_*.py"))
    assert benches
    for bench in benches:
        tail = bench.read_text().rsplit('if __name__ == "__main__":', 1)[-1]
        assert "exit_status(main())" in tail, f"{bench.name} does not exit with its goals' verdict"


def test_a_missed_goal_sets_the_exit_status(monkeypatch) -> None:
    monkeypatch.setattr(harness, "MISSED", [])
    assert harness.absolute_goal("rows per second >= 1", "2", True) and harness.exit_status(None) == 0
    monkeypatch.setenv("BENCH_MISS", "per second")
    assert not harness.absolute_goal("rows per second >= 1", "2", True)
    assert harness.exit_status(None) == 1 and harness.exit_status(3) == 3


@pytest.mark.system  # a whole (quick) bench in a child process, ~40 s
def test_a_bench_with_one_goal_forced_to_miss_exits_non_zero(tmp_path) -> None:
    root = pathlib.Path(harness.__file__).parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "BENCH_QUICK": "1", "BENCH_MISS": "argmin regret"}
    done = subprocess.run([sys.executable, "-m", "bench", "--only", "mixture"], cwd=root, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert "MISS  mixture    top-k regret <= argmin regret" in done.stdout, done.stdout[-3000:]
    assert done.returncode == 1 and "failed to run" not in done.stdout


def test_rehearse_exits_non_zero_when_one_goal_misses(monkeypatch) -> None:
    from bench import rehearse

    def drivers(*_args) -> dict:
        return {}

    for name in ("rehearse_normalize", "rehearse_per_shard", "rehearse_quality_bands", "rehearse_compaction", "event_log_before_after"):
        monkeypatch.setattr(rehearse, name, lambda *_a, **_k: {"levels": {}})
    monkeypatch.setattr(rehearse, "pool_sources", lambda: [rehearse.SourceSize("probe", 1)])
    monkeypatch.setattr(rehearse, "print_drivers", lambda *_a, **_k: True)
    monkeypatch.setattr(rehearse, "normalize_at", lambda *_a: None)
    monkeypatch.setattr(rehearse.rehearse_global, "rehearse_global_stages", drivers)
    monkeypatch.setattr(rehearse.rehearse_global, "measure_fit", lambda *_a: True)
    monkeypatch.setattr(rehearse.rehearse_tasks, "every_stage", lambda: True)
    monkeypatch.setattr(rehearse, "print_normalize_tasks", lambda *_a: True)
    assert rehearse.main() == 0
    monkeypatch.setattr(rehearse.rehearse_tasks, "every_stage", lambda: False)  # one goal missed
    assert rehearse.main() == 1


def test_a_proportions_interval_holds_it_and_narrows_with_more_items() -> None:
    """51 of 60 and 510 of 600 are the same rate; the larger sample pins it closer, the interval
    of k of n mirrors that of n - k, and 0 of n still leaves room above 0."""
    small, large = harness.proportion_interval(51, 60), harness.proportion_interval(510, 600)
    assert small[0] < large[0] < 0.85 < large[1] < small[1]
    low, high = harness.proportion_interval(9, 60)
    assert (low, high) == pytest.approx((1 - small[1], 1 - small[0]))
    assert harness.proportion_interval(0, 1229)[0] == 0.0 < harness.proportion_interval(0, 1229)[1] < 0.005
    assert harness.proportion_interval(0, 10, level=0.99)[1] > harness.proportion_interval(0, 10)[1]
