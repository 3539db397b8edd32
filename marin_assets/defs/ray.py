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

import dagster as dg
from dagster_ray import Lifecycle, LocalRay, RayResource

from marin_assets.core.runner import LOCAL


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
