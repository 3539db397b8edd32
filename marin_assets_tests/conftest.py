"""Shared test setup: quiet Hugging Face client, the fixture modules, and how `make test-fast`
spreads the tests over its workers."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # One worker per core: a second math thread per worker only spins against the other worker
    # (torch's encode costs twice the CPU time with 2 threads on a loaded 2-core machine).
    for _threads in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_threads, "1")

from marin_assets_tests.fixtures.gcs import gcs_emulator, gcs_prefix  # noqa: E402,F401
from marin_assets_tests.fixtures.hub import hub_server, hub_store  # noqa: E402,F401
from marin_assets_tests.fixtures.pipeline import pipeline  # noqa: E402,F401


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``--dist loadgroup`` (`make test-fast`) a module's tests stay on one worker, so a
    module-scoped fixture (a Ray cluster, an encoded fixture set) is built once, not once per
    worker; tests marked ``xdist_group("model")`` across modules share one worker's loaded
    embedding model."""
    for item in items:
        if not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
