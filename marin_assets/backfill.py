"""Asset backfills over chosen sources through a running Dagster webserver's GraphQL API.

    marin-assets build --sources cp/peps,dolma_code_prose     # their chains and the global steps after them
    marin-assets build                                        # every catalog source
    python -m marin_assets.backfill --sources cp/peps --assets raw_files,normalized --wait

``marin-assets build`` launches each named source's complete chain (every per-source asset)
and the global steps after it (dedup, boilerplate, bands, sampling groups; the model-training
steps only with ``--models``) as ONE asset backfill, and follows it to the end: the daemon runs
one run per source, then the global steps once every chain is done, retried and resumed like
any backfill (Overview > Backfills). It exits non-zero unless every run succeeded.
``python -m marin_assets.backfill`` is the lower-level form (``--assets`` or a job's assets, no
global steps); it uses only the standard library.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from marin_assets.errors import ConfigurationError

TERMINAL = {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"}
SUCCESS = {"COMPLETED", "COMPLETED_SUCCESS"}

REPOSITORIES = """
{ repositoriesOrError { __typename
    ... on RepositoryConnection { nodes { name location { name } pipelines { name } } }
    ... on PythonError { message } } }
"""
JOB_ASSETS = """
query($selector: PipelineSelector!) { assetNodes(pipeline: $selector) { assetKey { path } isPartitioned } }
"""
LAUNCH = """
mutation($params: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PartitionKeysNotFoundError { partitionKeys message }
    ... on Error { message } } }
"""
STATUS = """
query($id: String!) { partitionBackfillOrError(backfillId: $id) { __typename
    ... on PartitionBackfill { status numPartitions runs(limit: 1000) { runId status tags { key value } } }
    ... on Error { message } } }
"""


class BackfillError(ConfigurationError, RuntimeError):
    """The webserver refused or failed the request (wrong URL, no code location, a run that failed);
    the message says why."""


def graphql(url: str, query: str, variables: dict[str, Any] | None = None, timeout_s: float = 60) -> dict[str, Any]:
    body = json.dumps({"query": query, "variables": variables or {}}).encode()
    request = urllib.request.Request(url.rstrip("/") + "/graphql", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            payload = json.loads(response.read())
    except urllib.error.URLError as err:
        raise BackfillError(f"cannot reach the Dagster webserver at {url}: {err.reason}; is `make dev` (or the deployment) running?") from None
    if payload.get("errors"):
        raise BackfillError("; ".join(e.get("message", str(e)) for e in payload["errors"]))
    return payload["data"]


def find_job(url: str, job: str) -> dict[str, str]:
    """The selector of the repository that holds ``job``."""
    data = graphql(url, REPOSITORIES)["repositoriesOrError"]
    if data["__typename"] != "RepositoryConnection":
        raise BackfillError(f"the webserver could not list code locations: {data.get('message')}")
    for repo in data["nodes"]:
        if any(p["name"] == job for p in repo["pipelines"]):
            return {"repositoryLocationName": repo["location"]["name"], "repositoryName": repo["name"], "pipelineName": job}
    raise BackfillError(f"no code location has a job named {job!r}")


def job_assets(url: str, job: str) -> list[list[str]]:
    nodes = graphql(url, JOB_ASSETS, {"selector": find_job(url, job)})["assetNodes"]
    unpartitioned = [n["assetKey"]["path"] for n in nodes if not n["isPartitioned"]]
    if unpartitioned:
        raise BackfillError(f"job {job} has unpartitioned assets ({unpartitioned}); backfill over sources needs a per-source job")
    return [n["assetKey"]["path"] for n in nodes]


def launch(url: str, sources: list[str], assets: list[list[str]], title: str | None = None, launched_by: str = "marin_assets.backfill") -> str:
    params = {
        "partitionNames": sources,
        "assetSelection": [{"path": a} for a in assets],
        "title": title or f"{len(sources)} sources: {', '.join(sources[:3])}{' ...' if len(sources) > 3 else ''}",
        "tags": [{"key": "marin/launched_by", "value": launched_by}],
    }
    result = graphql(url, LAUNCH, {"params": params})["launchPartitionBackfill"]
    if result["__typename"] == "LaunchBackfillSuccess":
        return result["backfillId"]
    if result["__typename"] == "PartitionKeysNotFoundError":
        raise BackfillError(f"not partitions of these assets: {', '.join(result['partitionKeys'])} (check the names; new catalog entries need a code-location reload)")
    raise BackfillError(f"{result['__typename']}: {result.get('message', '')}")


def status(url: str, backfill_id: str) -> dict[str, Any]:
    data = graphql(url, STATUS, {"id": backfill_id})["partitionBackfillOrError"]
    if data["__typename"] != "PartitionBackfill":
        raise BackfillError(f"backfill {backfill_id}: {data.get('message', data['__typename'])}")
    return data


def wait(url: str, backfill_id: str, timeout_s: float, every_s: float = 5.0, say=print) -> dict[str, Any]:
    """Poll until the backfill is finished; returns its last status."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while True:
        data = status(url, backfill_id)
        runs = data["runs"] or []
        counts: dict[str, int] = {}
        for run in runs:
            counts[run["status"]] = counts.get(run["status"], 0) + 1
        line = f"{data['status']}: " + (", ".join(f"{n} {s.lower()}" for s, n in sorted(counts.items())) or "no runs yet")
        if line != last:
            say(line)
            last = line
        if data["status"] in TERMINAL and not any(r["status"] in ("QUEUED", "NOT_STARTED", "STARTING", "STARTED") for r in runs):
            return data
        if time.monotonic() > deadline:
            raise BackfillError(f"backfill {backfill_id} still {data['status']} after {timeout_s:.0f}s; it keeps running, see the UI")
        time.sleep(every_s)


def follow(url: str, backfill_id: str, timeout_s: float, every_s: float) -> int:
    """Wait for the backfill to end; 0 when every run succeeded, else 1 (the failed runs named)."""
    final = wait(url, backfill_id, timeout_s, every_s)
    failed = [r for r in final["runs"] if r["status"] != "SUCCESS"]
    for run in failed:
        partition = next((t["value"] for t in run["tags"] if t["key"] == "dagster/partition"), "global step")
        print(f"  {partition}: run {run['runId']} {run['status'].lower()}", file=sys.stderr)
    return 0 if final["status"] in SUCCESS and not failed else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m marin_assets.backfill", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sources", default="", help="comma-separated source names (partition keys)")
    parser.add_argument("--sources-file", default="", help="a file with one source name per line")
    parser.add_argument("--assets", default="", help="comma-separated asset keys (default: the assets of --job)")
    parser.add_argument("--job", default="source_chain", help="partitioned job whose assets to backfill (default: source_chain)")
    parser.add_argument("--url", default="http://127.0.0.1:3000", help="the Dagster webserver (default: http://127.0.0.1:3000)")
    parser.add_argument("--title", default=None)
    parser.add_argument("--wait", action="store_true", help="poll until the backfill finishes; exit 1 unless every run succeeded")
    parser.add_argument("--timeout", type=float, default=24 * 3600, help="seconds --wait waits at most")
    parser.add_argument("--poll", type=float, default=5.0, help="seconds between polls with --wait")
    args = parser.parse_args(argv)

    sources = [s.strip() for s in args.sources.split(",") if s.strip()]
    if args.sources_file:
        with open(args.sources_file) as handle:
            sources += [line.strip() for line in handle if line.strip() and not line.startswith("#")]
    if not sources:
        parser.error("give --sources a,b or --sources-file FILE")
    try:
        assets = [a.strip().split("/") for a in args.assets.split(",") if a.strip()] or job_assets(args.url, args.job)
        backfill_id = launch(args.url, sources, assets, args.title)
        print(f"backfill {backfill_id}: {len(sources)} sources x {', '.join('/'.join(a) for a in assets)}")
        print(f"  {args.url.rstrip('/')}/runs/b/{backfill_id}")
        return follow(args.url, backfill_id, args.timeout, args.poll) if args.wait else 0
    except BackfillError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
