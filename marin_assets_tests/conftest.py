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


# Test modules that load the bundled embedding model: `make test-fast` runs them on one worker.
MODEL_MODULES = frozenset(
    {"marin_assets_tests/core/test_embed.py", "marin_assets_tests/core/test_quality.py", "marin_assets_tests/core/test_topics.py", "marin_assets_tests/automation/test_checks.py"}
)


def pytest_xdist_make_scheduler(config: pytest.Config, log):  # noqa: ANN201
    """``--dist loadfile`` (`make test-fast`), refined: a module's tests stay on one worker (its
    module-scoped fixtures, a Ray cluster or an encoded fixture set, are built once, not once per
    worker), and the modules that load the embedding model share one worker."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "model" if module in MODEL_MODULES else module

    return ByModule(config, log)
