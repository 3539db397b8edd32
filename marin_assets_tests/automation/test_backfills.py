"""Backfills over chosen sources against a real daemon: ``dagster job backfill`` on the
``source_chain`` job, and ``python -m marin_assets.backfill`` through the webserver's GraphQL API.

Both are launched before either is awaited (they share the daemon; waiting for one after the
other would only add the backfill daemon's 30 s loop twice).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from marin_assets_tests.automation.system import REPO, wait_for

pytestmark = pytest.mark.system  # daemon: `make test` runs it, `make test-fast` does not

TERMINAL = {"SUCCESS", "FAILURE", "CANCELED"}
MODULE = [sys.executable, "-m", "marin_assets.backfill"]


def _finished_runs(dev, tags: dict[str, str], expected: int):
    runs = dev.runs(tags)
    return runs if len(runs) == expected and all(r["status"] in TERMINAL for r in runs) else None


def test_cli_and_graphql_backfills_run_two_sources_each_to_completion(demo_dagster) -> None:
    cli_sources = ["cp/peps", "dolma_code_prose"]
    api_sources = ["cp/libretexts", "starcoder2/documentation"]
    dagster = str(Path(sys.executable).with_name("dagster"))
    api = subprocess.Popen(
        [*MODULE, "--sources", ",".join(api_sources), "--assets", "raw_files,normalized",
         "--url", demo_dagster.url, "--wait", "--poll", "1", "--timeout", "300"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    try:
        cli = subprocess.run(
            [dagster, "job", "backfill", "-m", "marin_assets.definitions", "-j", "source_chain", "--partitions", ",".join(cli_sources), "--noprompt"],
            cwd=REPO, env=demo_dagster.env, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert cli.returncode == 0, cli.stdout[-2000:] + cli.stderr[-2000:]
        backfill_id = re.search(r"Launched backfill job `(\w+)`", cli.stdout).group(1)
        runs = wait_for(
            "the daemon to run both CLI partitions", lambda: _finished_runs(demo_dagster, {"dagster/backfill": backfill_id}, 2), 300,
            every_s=2, diagnose=demo_dagster.tail,
        )  # fmt: skip
        api_out, api_err = api.communicate(timeout=360)
    finally:
        if api.poll() is None:
            api.kill()
    assert {r["tags"]["dagster/partition"]: r["status"] for r in runs} == {s: "SUCCESS" for s in cli_sources}
    for asset in ("raw_files", "normalized", "minhash_buckets", "embeddings"):
        assert set(cli_sources) <= demo_dagster.materialized_partitions(asset), asset

    assert api.returncode == 0, api_out[-2000:] + api_err[-2000:] + demo_dagster.tail()
    assert "COMPLETED_SUCCESS: 2 success" in api_out
    api_id = re.search(r"backfill (\w+):", api_out).group(1)
    assert sorted(r["tags"]["dagster/partition"] for r in demo_dagster.runs({"dagster/backfill": api_id})) == sorted(api_sources)
    for asset in ("raw_files", "normalized"):
        assert set(api_sources) <= demo_dagster.materialized_partitions(asset), asset
    assert not set(api_sources) & demo_dagster.materialized_partitions("embeddings"), "only the chosen assets ran"


def test_graphql_backfill_script_names_unknown_sources(demo_dagster) -> None:
    done = subprocess.run([*MODULE, "--sources", "no/such_source", "--url", demo_dagster.url], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 2 and "no/such_source" in done.stderr
