"""Real services for the system tests: PostgreSQL on loopback, ``marin-assets dev`` on the demo.

Both are started from the tests themselves in temporary folders and stopped afterwards (only
the processes started here are stopped). When a binary is missing the test is skipped, unless
``MARIN_REQUIRE_SYSTEM_TESTS=1`` (CI) turns the skip into a failure.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def require(what: str, found: bool) -> None:
    """Skip (or fail in CI) when a system dependency is missing."""
    if found:
        return
    message = f"{what} is not installed (CI installs it: .ci/run)"
    if os.environ.get("MARIN_REQUIRE_SYSTEM_TESTS") == "1":
        pytest.fail(message)
    pytest.skip(message)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(what: str, condition: Callable[[], Any], timeout_s: float, every_s: float = 0.25, diagnose: Callable[[], str] | None = None) -> Any:
    """Poll ``condition`` until it returns something truthy; fail with ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}" + (f"\n{diagnose()}" if diagnose else ""))
        time.sleep(every_s)


# --------------------------------------------------------------------------- PostgreSQL


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


@contextlib.contextmanager
def postgres_server() -> Iterator[dict[str, Any]]:
    """A throwaway PostgreSQL cluster on 127.0.0.1 (trust auth); yields connection settings.

    As root (CI containers) the server runs as the ``postgres`` system user, which initdb
    requires; otherwise as the current user.
    """
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    require("PostgreSQL (initdb, pg_ctl)", bool(initdb and pg_ctl))
    root = tempfile.mkdtemp(prefix="marin-pg-", dir="/tmp")
    data = os.path.join(root, "data")
    as_user: list[str] = []
    if os.geteuid() == 0:
        require("the postgres system user and runuser", bool(shutil.which("runuser")) and _user_exists("postgres"))
        shutil.chown(root, "postgres", "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    port = free_port()
    settings = {"host": "127.0.0.1", "port": port, "user": "marin", "password": "marin", "db": "postgres"}
    log = os.path.join(root, "server.log")
    try:
        subprocess.run([*as_user, initdb, "-D", data, "-U", "marin", "-A", "trust", "-E", "UTF8", "--no-sync"],
                       check=True, capture_output=True, timeout=120)  # fmt: skip
        options = f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        subprocess.run([*as_user, pg_ctl, "-D", data, "-l", log, "-w", "-t", "60", "-o", options, "start"],
                       check=True, capture_output=True, timeout=90)  # fmt: skip
        yield settings
    finally:
        subprocess.run([*as_user, pg_ctl, "-D", data, "-m", "immediate", "-w", "stop"], capture_output=True, timeout=60)
        shutil.rmtree(root, ignore_errors=True)


def _user_exists(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def postgres_env(settings: dict[str, Any]) -> dict[str, str]:
    """The production template's storage variables, pointed at ``settings``."""
    return {
        "DAGSTER_PG_HOST": settings["host"],
        "DAGSTER_PG_PORT": str(settings["port"]),
        "DAGSTER_PG_USERNAME": settings["user"],
        "DAGSTER_PG_PASSWORD": settings["password"],
        "DAGSTER_PG_DB": settings["db"],
    }


# --------------------------------------------------------------------------- marin-assets dev on the demo


class DagsterDev:
    """``marin-assets dev`` (``make dev``: webserver, daemon, code server) on the demo Hub, in temporary folders."""

    def __init__(self, root: Path, hub_endpoint: str, home: Path | None = None, prefix: Path | None = None, env: dict[str, str] | None = None):
        """``home``/``prefix``: an existing instance and data root (default: new, empty ones
        under ``root``); ``env``: more variables (e.g. ``MARIN_CATALOG``)."""
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.home = home or root / "dagster_home"
        self.prefix = prefix or root / "data"
        self.home.mkdir(parents=True, exist_ok=home is not None)
        self.prefix.mkdir(parents=True, exist_ok=prefix is not None)
        shutil.copy(REPO / "dagster.yaml", self.home / "dagster.yaml")
        self.env = {
            **os.environ,
            "DAGSTER_HOME": str(self.home),
            "MARIN_PREFIX": str(self.prefix),
            "HF_ENDPOINT": hub_endpoint,
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "MARIN_AUTOMATION": "off",
            # Steps run inside the run worker: one process per run instead of one per step
            # (the definitions read it through executor_from_env; the UI and daemon paths are the same).
            "MARIN_EXECUTOR": "in_process",
            "PYTHONUNBUFFERED": "1",
        }
        self.env.pop("HF_TOKEN", None)
        self.env.pop("MARIN_CATALOG", None)
        self.env.update(env or {})
        self.log_path = root / "dagster-dev.log"
        self.process: subprocess.Popen | None = None

    def start(self, timeout_s: float = 180) -> DagsterDev:
        exe = str(Path(sys.executable).with_name("marin-assets"))  # what `make dev` runs
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [exe, "dev", "--port", str(self.port)],
            cwd=REPO, env=self.env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        wait_for("the Dagster webserver and the marin_assets code location", self._loaded, timeout_s, every_s=1.0, diagnose=self.tail)
        return self

    def stop(self) -> None:
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)  # the dev server's own process group
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        self._log.close()
        self.process = None

    def tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def _loaded(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(f"marin-assets dev exited with {self.process.returncode}:\n{self.tail()}")
        try:
            data = self.graphql("{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus "
                                "locationOrLoadError { __typename } } } } }")  # fmt: skip
        except OSError:
            return False
        entries = data["workspaceOrError"]["locationEntries"]
        return bool(entries) and all(e["loadStatus"] == "LOADED" and e["locationOrLoadError"]["__typename"] == "RepositoryLocation" for e in entries)

    def graphql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        request = urllib.request.Request(f"{self.url}/graphql", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            payload = json.loads(response.read())
        if payload.get("errors"):
            raise AssertionError(f"GraphQL errors: {payload['errors']}")
        return payload["data"]

    def runs(self, tags: dict[str, str] | None = None) -> list[dict[str, Any]]:
        """Runs (id, status, partition tag) of the instance, newest first, filtered by tags."""
        data = self.graphql(
            "query($filter: RunsFilter) { runsOrError(filter: $filter) { ... on Runs { results { runId status tags { key value } } } } }",
            {"filter": {"tags": [{"key": k, "value": v} for k, v in (tags or {}).items()]}},
        )
        return [
            {"id": r["runId"], "status": r["status"], "tags": {t["key"]: t["value"] for t in r["tags"]}}
            for r in data["runsOrError"]["results"]
        ]

    def materialized_partitions(self, asset: str) -> set[str]:
        data = self.graphql(
            "query($key: AssetKeyInput!) { assetNodeOrError(assetKey: $key) { ... on AssetNode { "
            "partitionStats { numMaterialized } assetPartitionStatuses { ... on DefaultPartitionStatuses { materializedPartitions } } } } }",
            {"key": {"path": [asset]}},
        )
        return set(data["assetNodeOrError"]["assetPartitionStatuses"]["materializedPartitions"])
