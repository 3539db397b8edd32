"""Shared test setup: quiet Hugging Face client, the fixture modules, and how `make test-fast`
spreads the tests over its workers."""

from __future__ import annotations

import gc
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


# The shared fixtures (local Hub, GCS emulator, `pipeline`): plugins loaded where tests run.
FIXTURE_MODULES = ("marin_assets_tests.fixtures.gcs", "marin_assets_tests.fixtures.hub", "marin_assets_tests.fixtures.pipeline")


def pytest_configure(config: pytest.Config) -> None:
    """Load the fixture modules, except in the `-n` controller of `make test-fast`: it only hands
    out tests, and importing Dagster and the definitions there cost it seconds of CPU."""
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        return
    _read_migration_scripts_once()
    for name in FIXTURE_MODULES:
        config.pluginmanager.import_plugin(name)


def _read_migration_scripts_once() -> None:
    """A temporary SQLite instance opens a database per run (each run's event log is a file of its
    own), and Dagster reads its ~100 alembic migration scripts twice for every database it opens.
    The scripts are installed files that do not change while the tests run, so each process reads
    them once; every database is still created and stamped exactly as before."""
    from alembic.script import ScriptDirectory  # noqa: PLC0415

    read = ScriptDirectory.from_config.__func__
    parsed: dict[tuple, ScriptDirectory] = {}

    def from_config(cls, config):  # noqa: ANN001, ANN202
        key = (cls, config.config_file_name, config.get_alembic_option("script_location"), tuple(config.get_version_locations_list() or ()))
        if key not in parsed:
            parsed[key] = read(cls, config)
        return parsed[key]

    ScriptDirectory.from_config = classmethod(from_config)


# Test modules whose fast tests load the bundled embedding model: `make test-fast` runs them on one
# worker (importing sentence-transformers and loading the model costs ~6 CPU-seconds per process).
# automation/test_checks.py is not one: only its system test embeds.
MODEL_MODULES = frozenset(
    {"marin_assets_tests/core/embed/test_embeddings.py", "marin_assets_tests/core/embed/test_quality.py",
     "marin_assets_tests/core/embed/test_topics.py"}
)

# Folders of long modules whose tests share nothing built once per module: each test is a unit of
# its own, so their tests spread over the workers instead of making one worker the last to finish.
SPLIT_MODULES = ("marin_assets_tests/core/dedup/",)

# Where `make test-fast` keeps each unit's seconds from its last run (pytest's cache folder), so the
# next run hands out the longest units first.
UNIT_SECONDS_KEY = "marin_assets/test-fast-unit-seconds"
# Before any run is recorded (a fresh clone, or `-p no:cacheprovider`): the longest units, in CPU
# seconds as measured once; any other unit counts 0.1 s per test, and a test of a split module
# with no recorded seconds (a new one) 3 s, so that it starts early rather than last.
FIRST_RUN_GUESS_S = {
    "model": 14.0,
    "marin_assets_tests/automation/test_checks.py": 8.0,
    "marin_assets_tests/defs/test_ingest_assets.py": 9.0,
    "marin_assets_tests/recipes/test_web_sources.py": 7.0,
    "marin_assets_tests/faults/test_runs_and_catalog.py": 6.0,
}
GUESS_S_PER_TEST = 0.1
GUESS_S_SPLIT_TEST = 3.0


def unit_of(nodeid: str) -> str:
    """The scheduling unit of a test: its module, "model" for the modules that load the model, or
    the test itself in a module under ``SPLIT_MODULES``."""
    module = nodeid.split("::", 1)[0]
    if module.startswith(SPLIT_MODULES):
        return nodeid
    return "model" if module in MODEL_MODULES else module


def _loadfile(config: pytest.Config) -> bool:
    return config.getoption("dist", None) == "loadfile" and not os.environ.get("PYTEST_XDIST_WORKER")


@pytest.hookimpl(optionalhook=True)  # an xdist hook: plain `pytest -p no:xdist` works too
def pytest_xdist_make_scheduler(config: pytest.Config, log):  # noqa: ANN201
    """``--dist loadfile`` (`make test-fast`), refined: a module's tests stay on one worker (its
    module-scoped fixtures, a Ray cluster or an encoded fixture set, are built once, not once per
    worker) unless it is under ``SPLIT_MODULES``, the modules that load the embedding model share one
    worker, and the longest units (seconds from the last run) are handed out first, so no worker
    is left with a long one at the end."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    cache = getattr(config, "cache", None)
    seconds = dict(cache.get(UNIT_SECONDS_KEY, {}) if cache is not None else {})

    def unit_seconds(unit: str, tests: int) -> float:
        if unit in seconds:
            return seconds[unit]
        if unit in FIRST_RUN_GUESS_S:
            return FIRST_RUN_GUESS_S[unit]
        return GUESS_S_SPLIT_TEST if "::" in unit else GUESS_S_PER_TEST * tests

    class ByModule(LoadScopeScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

        def _assign_work_unit(self, node) -> None:  # noqa: ANN001
            if not self.ordered:  # the queue is complete once the first unit is handed out
                self.ordered = True
                units = sorted(self.workqueue.items(), key=lambda kv: -unit_seconds(kv[0], len(kv[1])))
                self.workqueue.clear()
                self.workqueue.update(units)
            super()._assign_work_unit(node)

    return ByModule(config, log)


_frozen_for: list[str] = [""]


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before a module's first test, collect the garbage the last one left and freeze what lives on
    (imported libraries, session fixtures, caches): Python's full collections then skip that heap
    (one process running the recipes, automation and faults tests: 3.3 of its 25 CPU-s were
    collections, 1.6 with this). Frozen objects are still freed when their count drops; only a
    cycle among them that becomes garbage later stays until the process ends."""
    module = item.nodeid.split("::", 1)[0]
    if module != _frozen_for[0]:
        _frozen_for[0] = module
        gc.collect()
        gc.freeze()


_unit_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Sum each unit's seconds (setup, call, teardown) as the workers report them."""
    _unit_seconds[unit_of(report.nodeid)] = _unit_seconds.get(unit_of(report.nodeid), 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Keep this run's seconds per unit for the next `make test-fast` (units not run keep theirs)."""
    cache = getattr(session.config, "cache", None)
    if cache is None or not _loadfile(session.config) or not _unit_seconds:
        return
    seconds = dict(cache.get(UNIT_SECONDS_KEY, {}))
    seconds.update({unit: round(s, 2) for unit, s in _unit_seconds.items()})
    cache.set(UNIT_SECONDS_KEY, seconds)
