"""The dagster-ray resource behind MarinResource: which runner each setting gives (no Ray started)."""

from __future__ import annotations

import dagster as dg
from dagster_ray import LocalRay

from marin_assets.core.runner import LOCAL, TaskResources
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
    runner = MarinResource(ray_address=LOCAL, ray_retries=5, ray_max_in_flight=7, task_cpus=2, task_memory_bytes=1 << 30).runner()
    assert (runner.ray_address, runner.retries, runner.max_in_flight) == (LOCAL, 5, 7)
    assert runner.task_resources == TaskResources(cpus=2, memory_bytes=1 << 30)
    monkeypatch.setenv("MARIN_RAY_ADDRESS", "auto")
    assert MarinResource().runner().ray_address == "auto"


def test_a_step_with_a_lazy_ray_resource_starts_no_cluster(tmp_path) -> None:
    import ray

    seen = {}

    @dg.asset
    def probe(marin: MarinResource) -> None:
        seen["address"] = marin.runner().ray_address

    result = dg.materialize([probe], resources={"marin": MarinResource(prefix=str(tmp_path), ray_address=LOCAL)})
    assert result.success and seen["address"] == LOCAL
    assert not ray.is_initialized()  # connecting waits for the first shard map
