"""The fenced shell commands of the README and docs/ run as written in a fresh copy of the repository.

Every command of a fenced ``bash`` block is listed below as run here (fast), run by the system
tests, or not run with the reason (network, a long-running server, installing into the
shared virtualenv); a command the README gains must be listed, so the README cannot drift
from what is tested. The copy holds the tracked files only (what a clone has) and the
project's virtualenv.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from marin_assets_tests.test_quiet_commands import warnings_in

REPO = Path(__file__).resolve().parents[1]

FAST = {
    ".venv/bin/marin-assets sources",
    ".venv/bin/marin-assets status --recipes",
    ".venv/bin/python -m marin_assets_tests.recipes",
    "export DAGSTER_HOME=$PWD/.dagster_home && make home",
    ".venv/bin/dagster instance info",
}
SYSTEM = {
    ".venv/bin/dg check defs",
    ".venv/bin/dg list defs",
}
NOT_RUN = {
    "make demo": "the whole demo pipeline: run by the demo system tests",
    "make test": "the test suite itself",
    "make test-fast": "the test suite itself",
    ".venv/bin/marin-assets runs": "inspects the instance of a running `make dev` (its own tests are in faults/)",
    ".venv/bin/marin-assets runs --free": "repairs the instance of a running `make dev` (its own tests are in faults/)",
    ".venv/bin/marin-assets verify --sources cp/peps": "reads a built prefix's outputs (its own test is in faults/test_published.py)",
    "make install": "installs into the virtualenv (the copy shares the project's)",
    "make check": "depends on make install (same as dg check defs, run as a system test)",
    "make bench": "the benchmarks",
    "make rehearse": "a benchmark (minutes); its parts run in the normalize, runner and event-log tests",
    "make dev": "a long-running server (the browser test runs it)",
    "make dev PORT=3001": "a long-running server (the browser test runs it)",
    "export HF_TOKEN=hf_...": "real provider credentials",
    "export HF_ENDPOINT=https://huggingface.co": "the real Hub (network)",
    "export MARIN_PREFIX=gs://my-bucket/marin": "a real bucket (network)",
    "export MARIN_EMBED_MODEL=microsoft/harrier-oss-v1-0.6b": "the production model (network)",
    "export MARIN_EMBED_REVISION=f9b9dc8d367d443f2479d27aa5d8d2850c0774ee": "the production model (network)",
    "export DAGSTER_HOME=$PWD/.dagster_home": "sets up the commands after it, which are not run here",
    ".venv/bin/marin-assets materialize --select raw_files,normalized --partition coderforge": "downloads from the real Hub (test_quiet_commands fails one against the local Hub)",
    ".venv/bin/marin-assets status": "reads the instance `make demo` built (automation/test_status.py runs it on a demo instance)",
}


def readme_commands(text: str) -> list[str]:
    """Commands of the fenced bash blocks: continuation lines joined, comments dropped."""
    commands: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in re.sub(r"\\\n\s*", "", block).splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


COMMANDS = [c for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))] for c in readme_commands(page.read_text())]


def test_every_readme_command_is_run_or_says_why_not() -> None:
    unlisted = [c for c in COMMANDS if c not in FAST | SYSTEM | set(NOT_RUN)]
    assert not unlisted, f"README commands not classified in {Path(__file__).name}: {unlisted}"
    stale = (FAST | SYSTEM | set(NOT_RUN)) - set(COMMANDS)
    assert not stale, f"listed here but no longer in the README: {sorted(stale)}"


def fresh_copy(tmp_path: Path) -> Path:
    """The tracked files (what a clone has) plus a link to the project's virtualenv."""
    root = tmp_path / "clone"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        source = REPO / name
        if source.is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, root / name)
    (root / ".venv").symlink_to((REPO / ".venv").resolve() if (REPO / ".venv").exists() else Path(sys.prefix))
    return root


def run_in(root: Path, command: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_", "MARIN_")) and k not in ("HF_TOKEN", "HF_ENDPOINT")}
    env["PYTHONPATH"] = str(root)  # the copy's package, not the virtualenv's editable install
    return subprocess.run(["bash", "-c", f"set -e; {command}"], cwd=root, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.system  # end to end: each README command in a fresh shell
def test_the_fast_readme_commands_run_as_written(tmp_path: Path) -> None:
    root = fresh_copy(tmp_path)
    commands = [c for c in COMMANDS if c in FAST]
    assert commands
    # One shell, in README order, so an `export` carries to the commands after it.
    done = run_in(root, "\n".join(commands))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert warnings_in(done.stdout + done.stderr) == [], "the project's commands print no warning"
    assert "146" in done.stdout, "marin-assets sources lists the catalog"
    assert (root / ".dagster_home" / "dagster.yaml").exists(), "make home set up the instance the dagster CLI uses"


@pytest.mark.system
def test_the_dg_readme_commands_run_as_written(tmp_path: Path) -> None:
    root = fresh_copy(tmp_path)
    for command in [c for c in COMMANDS if c in SYSTEM]:
        done = run_in(root, command)
        assert done.returncode == 0, f"{command}\n" + done.stdout[-2000:] + done.stderr[-3000:]
        assert "virtual environment does not match" not in done.stdout + done.stderr, f"{command} warns about the venv it runs from"
        assert warnings_in(done.stdout + done.stderr) == [], command
