"""The project's own commands print no warning of their own making, and a failed
materialization ends with its cause on the first line of the error."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from marin_assets.testing.hub_server import LocalHubServer

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

# A warning line: Python's warnings ("...Warning: ...") and logged warnings (" - WARNING - "),
# the daemon's too: its run-retry consumer (``run_retries`` in dagster.yaml) would warn on a fresh
# instance that it starts without a cursor, had ``marin-assets dev`` not set them first.
WARNING = re.compile(r"\w+Warning: | - WARNING - ")


def warnings_in(text: str) -> list[str]:
    return [line for line in text.splitlines() if WARNING.search(line)]


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    home = tmp_path / "dagster_home"
    home.mkdir(exist_ok=True)
    (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_", "MARIN_")) and k not in ("HF_TOKEN", "HF_ENDPOINT")}
    return {**env, "PYTHONPATH": str(REPO), "DAGSTER_HOME": str(home), "MARIN_PREFIX": str(tmp_path / "data"), **extra}


@pytest.mark.system  # a run on a real instance against the local Hub (~20 s)
def test_a_source_the_hub_lacks_fails_with_its_cause_first(tmp_path: Path) -> None:
    (tmp_path / "hub").mkdir()
    with LocalHubServer(tmp_path / "hub") as hub:
        env = env_for(tmp_path, HF_ENDPOINT=hub.endpoint, MARIN_RETRY_WAIT_S="0")
        done = subprocess.run([str(BIN / "marin-assets"), "materialize", "--select", "raw_files", "--partition", "coderforge"],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 1
    error = done.stderr[done.stderr.rindex("error: "):].splitlines()
    assert re.match(r"error: raw_files: dataset \S+ was not found at http://127\.0\.0\.1:\d+: check the repo id", error[0]), error
    assert "coderforge" in error[1] and len(error) == 2, "the cause, then the run to open; no trace after it"
    assert warnings_in(done.stdout + done.stderr) == []


@pytest.mark.system  # starts the webserver and the daemon (~40 s)
def test_make_dev_starts_without_warnings(tmp_path: Path) -> None:
    env = env_for(tmp_path, HF_ENDPOINT="http://127.0.0.1:9")  # no demo Hub: the UI only
    server = subprocess.Popen([str(BIN / "marin-assets"), "dev", "--port", "3917"], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 240
        for line in server.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if "Serving dagster-webserver" in line or time.monotonic() > deadline:
                break
        time.sleep(5)  # the daemon's first sensor ticks
    finally:
        os.killpg(server.pid, signal.SIGINT)
        rest, _ = server.communicate(timeout=60)
    output = "".join(lines) + rest
    assert "Serving dagster-webserver" in output, output[-3000:]
    assert "will not be used" not in output
    assert warnings_in(output) == [], output[-3000:]
