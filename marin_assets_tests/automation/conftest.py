"""``dagster dev`` on the demo, shared by the backfill and browser tests of this folder."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from marin_assets_tests.automation.system import DagsterDev


@pytest.fixture(scope="session")
def demo_dagster(tmp_path_factory) -> Iterator[DagsterDev]:
    """Webserver + daemon + code server on the packaged definitions, the demo repos served by a
    local Hub, DAGSTER_HOME and MARIN_PREFIX in a temporary folder, automation off."""
    from marin_assets.testing.hub_server import LocalHubServer
    from marin_assets.demo.run import build_demo_hub, served_note

    root = tmp_path_factory.mktemp("demo_dagster")
    with LocalHubServer(build_demo_hub(str(root / "hub")), served_note=served_note()) as hub:
        dev = DagsterDev(root, hub.endpoint)
        try:
            yield dev.start()
        finally:
            dev.stop()
