"""Shared by the system tests of this folder: ``marin-assets dev`` on the demo Hub (backfill and
browser tests) and a demo instance built once (automation at scale, the browser's screenshots)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from marin_assets_tests.automation.system import REPO, DagsterDev


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


@pytest.fixture(scope="session")
def built_demo(tmp_path_factory) -> Path:
    """``marin-assets demo`` into a temporary DAGSTER_HOME and MARIN_PREFIX (once per session);
    ``dagster_home_as_built`` is a copy of the instance as the demo left it."""
    root = tmp_path_factory.mktemp("demo_scale")
    home = root / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    env = {**os.environ, "DAGSTER_HOME": str(home), "MARIN_PREFIX": str(root / "data"), "MARIN_DEMO_HUB": str(root / "hub")}
    for key in ("MARIN_CATALOG", "HF_TOKEN", "HF_ENDPOINT", "MARIN_AUTOMATION"):
        env.pop(key, None)
    done = subprocess.run([sys.executable, "-m", "marin_assets.cli", "demo"], cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    shutil.copytree(home, root / "dagster_home_as_built")  # for tests that need the instance as the demo left it
    return root
