"""Downloading a source's files: the project's fetch (what ``raw_files`` runs) against
``huggingface_hub.snapshot_download`` used as its users use it, the same files from the same
local Hub server.

The repo is published once into a temporary ``HubRepoStore`` (incompressible files, stored
with LFS like Parquet shards on the Hub) and served by ``LocalHubServer`` on loopback from this
process. Each run is a fresh child (``bench.harness``), interleaved A B A B:

* ``snapshot_download``: ``snapshot_download(repo_id, repo_type="dataset", revision=sha,
  allow_patterns=...)`` into a fresh cache, ``HF_ENDPOINT`` pointing at the server (its default
  8 workers);
* ``marin-assets``: ``hub.download_snapshot`` with the same selection into a fresh destination
  (its 4 workers): staging, size and sha256 verification, the resumable ``_partial`` markers
  and the manifest ``raw_files`` records.

Goal: the project's fetch moves at least 0.9x the bytes per second of ``snapshot_download``.
The server shares the machine (and, under load, the cores) with both; its CPU is not counted.
"""

from __future__ import annotations

import os
import sys
import tempfile

from bench import harness

REPO = "bench/download"
FILES = harness.pick(8, 4)
FILE_MIB = harness.pick(32, 8)
ROUNDS = harness.pick(5, 2)


def snapshot_download_case(repo_id: str, revision: str, allow: list[str]) -> dict:
    from huggingface_hub import snapshot_download

    with tempfile.TemporaryDirectory(prefix="bench-hf-") as cache, harness.timed():
        path = snapshot_download(repo_id, repo_type="dataset", revision=revision, allow_patterns=allow, cache_dir=cache)
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
    return {"items": size / (1 << 20)}


def marin_case(repo_id: str, revision: str, allow: list[str]) -> dict:
    from marin_assets.core.ingest import hub

    with tempfile.TemporaryDirectory(prefix="bench-marin-") as root, harness.timed():
        manifest = hub.download_snapshot(repo_id, revision, allow=allow, exclude=None, dest_uri=os.path.join(root, "raw"), endpoint=os.environ["HF_ENDPOINT"])
        size = sum(int(f["size"]) for f in manifest["files"])
    return {"items": size / (1 << 20)}


def main() -> int:
    from marin_assets.testing.hub_server import HubRepoStore, LocalHubServer

    with tempfile.TemporaryDirectory(prefix="bench-download-") as root:
        files = {f"data/part-{i:05d}.parquet": os.urandom(FILE_MIB << 20) for i in range(FILES)}
        files["README.md"] = b"not selected\n"
        revision = HubRepoStore(os.path.join(root, "hub")).publish(REPO, files)
        allow = ["data/*.parquet"]
        with LocalHubServer(os.path.join(root, "hub")) as server:
            env = {"HF_ENDPOINT": server.endpoint, "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
                   "HF_HUB_OFFLINE": "0", "HF_TOKEN": ""}  # fmt: skip
            kwargs = {"repo_id": REPO, "revision": revision, "allow": allow}
            cases = [
                harness.Case("snapshot_download", "bench.bench_download:snapshot_download_case", kwargs, env),
                harness.Case("marin-assets", "bench.bench_download:marin_case", kwargs, env),
            ]
            result = harness.compare(f"download: {FILES} files x {FILE_MIB} MiB from the local Hub, MiB per second", cases, rounds=ROUNDS, unit="MiB")
    harness.speed_goal("marin-assets", "snapshot_download", 0.9, "raw_files' fetch >= 0.9x snapshot_download's MiB/s").check(result)
    return 0


if __name__ == "__main__":
    sys.exit(harness.exit_status(main()))
