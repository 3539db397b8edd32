"""The dagster-ray resource behind MarinResource: which runner each setting gives (no Ray started)."""

from __future__ import annotations

import dagster as dg
from dagster_ray import LocalRay

from marin_assets.core.runtime.runner import LOCAL, TaskResources
from marin_assets.defs.ray import RayClusterAddress, ray_cluster, runner_address
from marin_assets.defs.resources import MarinResource


def test_empty_address_runs_in_process(monkeypatch) -> None:
    monkeypatch.delenv("MARIN_RAY_ADDRESS", raising=False)
    assert MarinResource().runner().ray_address is None


def test_local_and_cluster_addresses_become_dagster_ray_resources(monkeypatch) -> None:
    monkeypatch.delenv("MARIN_RAY_ADDRESS", raising=False)
    assert isinstance(ray_cluster(LOCAL), LocalRay)
    cluster = ray_cluster("ray://head.example:10001")
    assert isinstance(cluster, RayClusterAddress) and cluster.host == "head.example"
    assert runner_address(cluster) == "ray://head.example:10001"
    runner = MarinResource(ray_address=LOCAL, ray_retries=5, ray_max_in_flight=7, ray_target_in_flight=3, task_cpus=2,
                           task_memory_bytes=1 << 30).runner()
    assert (runner.ray_address, runner.retries, runner.max_in_flight, runner.target_in_flight) == (LOCAL, 5, 7, 3)
    assert runner.task_resources == TaskResources(cpus=2, memory_bytes=1 << 30)
    monkeypatch.setenv("MARIN_RAY_ADDRESS", "auto")
    monkeypatch.setenv("MARIN_RAY_TARGET_IN_FLIGHT", "2000")
    assert (MarinResource().runner().ray_address, MarinResource().runner().target_in_flight) == ("auto", 2000)


def test_a_step_with_a_lazy_ray_resource_starts_no_cluster(tmp_path) -> None:
    import ray

    seen = {}

    @dg.asset
    def probe(marin: MarinResource) -> None:
        seen["address"] = marin.runner().ray_address

    result = dg.materialize([probe], resources={"marin": MarinResource(prefix=str(tmp_path), ray_address=LOCAL)})
    assert result.success and seen["address"] == LOCAL
    assert not ray.is_initialized()  # connecting waits for the first shard map


def _count(inputs: list[str], output: str, params: dict) -> dict:
    from marin_assets.core.runtime import storage

    storage.write_bytes(output, b"x")
    return {"rows": params["rows"]}


def test_a_running_step_reports_shard_progress_as_asset_observations(tmp_path) -> None:
    """Every N finished tasks (and the last) the step logs an observation while it still runs."""
    from marin_assets.core.runtime.runner import ShardTask

    partitions = dg.StaticPartitionsDefinition(["src"])
    seen_during: list[int] = []

    @dg.asset(partitions_def=partitions)
    def sharded(context, marin: MarinResource) -> None:
        tasks = [ShardTask(_count, (), str(tmp_path / "out" / f"part-{i:05d}.bin"), {"rows": i}) for i in range(23)]

        def on_done(result) -> None:  # observations already stored while the map is running
            seen_during.append(len(context.instance.fetch_observations(dg.AssetKey("sharded"), limit=100).records))

        marin.runner().map(tasks, on_done=on_done)

    with dg.DagsterInstance.ephemeral() as instance:
        result = dg.materialize([sharded], partition_key="src", instance=instance,
                                resources={"marin": MarinResource(prefix=str(tmp_path), progress_every=10)})
        assert result.success
        observations = [e.event_specific_data.asset_observation for e in result.all_events if e.event_type_value == "ASSET_OBSERVATION"]
    finished = [o.metadata["shard_tasks_finished"].value for o in observations]
    assert finished == [10, 20, 23]
    assert all(o.metadata["shard_tasks_total"].value == 23 and o.partition == "src" and o.asset_key == dg.AssetKey("sharded") for o in observations)
    assert seen_during[10] == 1 and seen_during[20] == 2  # stored as the tasks finished, not at the end
    rates = [o.metadata["shard_tasks_per_minute"].value for o in observations]
    left = [o.metadata["minutes_left_predicted"].value for o in observations]
    assert all(r > 0 for r in rates) and left[-1] == 0 and all(m >= 0 for m in left), (rates, left)


def test_pace_is_the_rate_so_far_and_the_time_left_at_it() -> None:
    from marin_assets.defs.ray import pace

    figures = {k: v.value for k, v in pace(30, 120, 90.0).items()}
    assert figures == {"shard_tasks_per_minute": 20.0, "minutes_left_predicted": 4.5}
    assert pace(0, 120, 0.0) == {}


def test_outside_a_step_the_runner_reports_no_progress(monkeypatch) -> None:
    monkeypatch.delenv("MARIN_RAY_ADDRESS", raising=False)
    assert MarinResource().runner().progress is None


def test_a_long_map_records_a_bounded_number_of_progress_events_and_log_lines(tmp_path) -> None:
    """1,000 tasks: at most MAX_PROGRESS_EVENTS observations (evenly apart) plus the last, and at most
    MAX_LOG_LINES per-task log lines, the later ones counting the lines left out."""
    from marin_assets.core.runtime.runner import ShardTask
    from marin_assets.defs.ray import MAX_LOG_LINES, MAX_PROGRESS_EVENTS, step_log

    @dg.asset
    def wide(context, marin: MarinResource) -> None:
        tasks = [ShardTask(_count, (), str(tmp_path / "out" / f"part-{i:05d}.bin"), {"rows": i}) for i in range(1000)]
        say = step_log(context)
        marin.runner().map(tasks, on_done=lambda r: say(f"wrote {r.output}"))

    with dg.DagsterInstance.ephemeral() as instance:
        result = dg.materialize([wide], instance=instance, resources={"marin": MarinResource(prefix=str(tmp_path), progress_every=10)})
        assert result.success
        records = instance.all_logs(result.run_id)
    observations = [r.dagster_event.event_specific_data.asset_observation for r in records
                    if r.dagster_event and r.dagster_event.event_type_value == "ASSET_OBSERVATION"]
    finished = [o.metadata["shard_tasks_finished"].value for o in observations]
    assert finished[-1] == 1000 and len(finished) <= MAX_PROGRESS_EVENTS + 1
    assert finished[:3] == [25, 50, 75]  # 1,000 / 40 apart, not every 10
    lines = [r.user_message for r in records if r.user_message.startswith("wrote ")]
    assert 10 <= len(lines) <= MAX_LOG_LINES
    assert len(records) < 150  # was ~1.1 event rows per task


def test_step_log_keeps_the_first_lines_then_counts_the_rest() -> None:
    from marin_assets.defs.ray import StepLog

    logged: list[str] = []
    log = StepLog(logged.append, head=3, every_s=3600, most=5)
    for i in range(10):
        log(f"line {i}")
    assert logged == ["line 0", "line 1", "line 2"] and log.left_out == 7
    log._last = -float("inf")  # an hour later
    log("line 10")
    assert logged[-1] == "line 10 (7 lines like this one left out of the log since the last)"
