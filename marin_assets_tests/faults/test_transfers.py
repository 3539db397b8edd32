"""Item 9 and the faults that already passed: rate limits, cut and oversized bodies, staging, resume."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from marin_assets.core.ingest import hub, normalize
from marin_assets.core.ingest.providers import http
from marin_assets import errors
from marin_assets.core.runtime import stages, storage, trust
from marin_assets.core.runtime.retry import RetryPolicy
from marin_assets.core.specs import NORMALIZED
from marin_assets_tests.faults.hostile import SHA

REPO = "org/corpus"
ROWS = 60
FILES = {f"data/part-{i}.jsonl": "".join(f'{{"id": "{i}-{j}", "text": "document {i}-{j}"}}\n' for j in range(ROWS)).encode()
         for i in range(3)}  # fmt: skip


def policy(waits: list[float], **kw) -> RetryPolicy:
    base = dict(attempts=6, base_wait_s=0.0, min_wait_s=0.0, max_wait_s=900.0, jitter_fraction=0.0, rate_limit_margin_s=10.0,
                sleep=waits.append)  # fmt: skip
    return RetryPolicy(**(base | kw))


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.fixture
def repo(world, hub_server):
    sha = hub_server.store.publish(REPO, FILES, commit="060fca9")
    return sha


def download(world, waits, **kw):
    dest = storage.Layout(str(world.root)).raw("org__corpus", "060fca9")
    fetch = lambda: hub.download_snapshot(REPO, "060fca9", None, None, dest, kw.pop("policy", None) or policy(waits),  # noqa: E731
                                          workers=1, staging_dir=str(world.staging), **kw)  # fmt: skip
    return stages.commit_copy(dest, fetch)  # the runner writes the manifest last, as raw_files does


def normalize_copy(world, manifest) -> dict:
    uris = [storage.join(storage.Layout(str(world.root)).raw("org__corpus", "060fca9"), f["path"]) for f in manifest["files"]]
    out = NORMALIZED.output_uri(storage.Layout(str(world.root)), "corpus", "fp")
    result = normalize.normalize_source("corpus", uris, out, normalize.NormalizeParams())
    storage.write_manifest(out, result)  # what the stage runner does with the body
    world.rows(ROWS * len(FILES), result["rows"], result["counters"]["empty_dropped"] + result["counters"]["duplicates"])
    return result


# --------------------------------------------------------------------------- item 9


def test_a_one_year_rate_limit_reset_waits_at_most_the_cap(world, repo, hub_server):
    waits: list[float] = []
    hub_server.faults.add("429", "*/resolve/*/data/part-1.jsonl", times=2, reset_s=365 * 24 * 3600)
    world.inject(2)
    manifest = download(world, waits)
    assert waits and max(waits) <= 15 * 60, waits
    assert len(manifest["files"]) == 3
    normalize_copy(world, manifest)


def test_a_reset_shorter_than_the_cap_is_honoured(world, repo, hub_server):
    waits: list[float] = []
    hub_server.faults.add("429", "*/resolve/*/data/part-1.jsonl", times=1, reset_s=30)
    world.inject()
    download(world, waits)
    assert waits == [40.0]  # the reset plus the margin


def test_a_hub_body_longer_than_listed_is_cut_off_at_once(world, hostile):
    hostile.files = {"data/a.jsonl": b"x" * (20 << 20)}
    hostile.listed_size["data/a.jsonl"] = 1000
    counters = hub.Counters()
    world.inject()
    with pytest.raises(errors.IntegrityFailure, match="exceeds the listed size"):
        hub.download_snapshot("evil/corpus", SHA, None, None, str(world.root / "raw" / "evil"),
                              RetryPolicy(attempts=5, base_wait_s=0, min_wait_s=0, sleep=lambda s: None), staging_dir=str(world.staging))  # fmt: skip
    remote = hub.RemoteFile("data/a.jsonl", 1000, None, "x")
    with pytest.raises(hub.DownloadError, match="exceeds the listed size"):
        hub._fetch_file("evil/corpus", "dataset", SHA, remote, str(world.staging / "probe"), counters=counters,  # noqa: SLF001
                        policy=RetryPolicy(attempts=1, sleep=lambda s: None), endpoint=hostile.base, token=None)  # fmt: skip
    os.remove(world.staging / "probe")
    assert counters.bytes_fetched <= 1000, "not one byte past the listed size is kept"


def test_a_plain_http_body_longer_than_promised_is_cut_off(world, hostile):
    hostile.files = {"data/b.bin": b"y" * (20 << 20)}
    counters = http.FetchCounters()
    world.inject()
    with open(world.staging / "b", "w+b") as out, pytest.raises(http.IntegrityError, match="exceeds its promised size"):
        http.fetch_into(f"{hostile.base}/datasets/evil/corpus/resolve/{SHA}/data/b.bin", out, what="probe", expected_size=500,
                        policy=RetryPolicy(attempts=3, base_wait_s=0, min_wait_s=0, sleep=lambda s: None), counters=counters, mirror=False)  # fmt: skip
    os.remove(world.staging / "b")
    assert counters.bytes_fetched <= 3 * (1 << 20), counters


def test_hub_downloads_stage_under_the_staging_dir_and_sweep_killed_runs(world, repo):
    stale = world.staging / f"marin-hf-p{dead_pid()}-abc"
    stale.mkdir()
    (stale / "000001.part").write_bytes(b"half a file")
    live = world.staging / f"marin-hf-p{os.getpid()}-live"
    live.mkdir()
    seen: list[str] = []
    world.inject()
    download(world, [], on_progress=lambda line: seen.extend(os.listdir(world.staging)))
    assert not stale.exists(), "a killed run's partial download is removed by the next run"
    assert live.exists(), "a live run's staging is left alone"
    assert any(name.startswith(f"marin-hf-p{os.getpid()}-") and name != live.name for name in seen), seen
    live.rmdir()


def test_no_tmp_file_of_a_killed_writer_is_left_in_a_finished_output(world, repo):
    manifest = download(world, [])
    out = NORMALIZED.output_uri(storage.Layout(str(world.root)), "corpus", "fp")
    os.makedirs(out, exist_ok=True)
    leftover = os.path.join(out, f"part-00000-of-00001.parquet.tmp-p{dead_pid()}-0123456789ab")
    legacy = os.path.join(out, "part-00000-of-00001.parquet.tmp-0123456789ab")
    for path in (leftover, legacy):
        with open(path, "wb") as handle:
            handle.write(b"PAR1 half written")
    world.inject()
    normalize_copy(world, manifest)
    names = [n for _, _, files in os.walk(out) for n in files]
    assert not [n for n in names if ".tmp-" in n], names


# --------------------------------------------------------------------------- faults that already passed


@pytest.mark.parametrize(("kind", "times"), [("429", 4), ("503", 3), ("500", 2), ("502", 1), ("504", 1), ("408", 1), ("cut", 2), ("corrupt", 1)])
def test_transient_faults_are_retried_and_no_row_is_lost(world, repo, hub_server, kind, times):
    hub_server.faults.add(kind, "*/resolve/*/data/part-2.jsonl", times=times, reset_s=1, methods=["GET"])
    world.inject(times)
    manifest = download(world, [])
    assert manifest["counters"]["retries"] >= times
    normalize_copy(world, manifest)


def test_withdrawn_revision_and_gated_repo_fail_at_once(world, repo, hub_server):
    hub_server.store.publish(REPO, {"data/new.jsonl": b'{"text": "history rewritten"}\n'}, commit="abcdef1")
    hub_server.store.remove_revision(REPO, "060fca9")
    world.inject()
    with pytest.raises(hub.RevisionGoneError, match="no longer serves revision") as gone:
        download(world, [])
    assert isinstance(gone.value, errors.ProviderRefused)
    other = hub_server.store.publish("org/gated", {"a.jsonl": b'{"text": "x"}\n'}, commit="1234567")
    hub_server.store.set_gated("org/gated", True)
    world.inject()
    with pytest.raises(hub.HubAuthError, match="accept them"):
        hub.download_snapshot("org/gated", other, None, None, str(world.root / "raw" / "gated"), policy([]), staging_dir=str(world.staging))
    assert hub_server.count(status=401) + hub_server.count(status=403) == 1


def test_kill_9_mid_download_resumes_without_refetching_finished_files(world, repo, hub_server, tmp_path):
    """A real child process is killed while it downloads; the rerun fetches only what was left."""
    dest = storage.Layout(str(world.root)).raw("org__corpus", "060fca9")
    script = (  # the copy is killed before the runner records it complete
        "import os, signal, sys\n"
        "from marin_assets.core.ingest import hub\n"
        "def progress(line):\n"
        "    if '2/3 files' in line: os.kill(os.getpid(), signal.SIGKILL)\n"
        f"hub.download_snapshot({REPO!r}, '060fca9', None, None, {dest!r}, on_progress=progress, workers=1, staging_dir={str(world.staging)!r})\n"
    )
    env = dict(os.environ, HF_ENDPOINT=hub_server.endpoint, PYTHONPATH=os.getcwd())
    child = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, timeout=120)
    assert child.returncode == -9, child.stderr.decode()[-2000:]
    world.inject()
    assert storage.read_manifest(dest) is None
    hub_server.clear_requests()
    manifest = download(world, [])
    assert manifest["counters"]["reused"] == 2 and manifest["counters"]["fetched"] == 1
    assert hub_server.count("GET", f"/datasets/{REPO}/resolve/*") == 1
    normalize_copy(world, manifest)


def test_no_token_appears_in_logs_errors_or_stored_files(world, repo, hub_server, caplog, monkeypatch):
    from marin_assets_tests.faults.conftest import TOKEN

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    hub_server.faults.add("503", "*/resolve/*/data/part-0.jsonl", times=2, methods=["GET"])
    world.inject(2)
    with caplog.at_level("DEBUG"):
        download(world, [])
    assert TOKEN not in caplog.text
    for folder, _dirs, names in os.walk(world.root):
        for name in names:
            with open(os.path.join(folder, name), "rb") as handle:
                assert TOKEN.encode() not in handle.read(), name
    assert trust.same_origin(hub_server.endpoint, hub_server.endpoint)


@pytest.mark.system
def test_kill_9_mid_normalize_resumes_to_identical_output(world):
    """A child normalizing five files is killed after its first file; the rerun equals a clean run."""
    raw = world.root / "raw" / "many"
    raw.mkdir(parents=True)
    uris = []
    for i in range(5):
        path = raw / f"part-{i}.jsonl"
        path.write_bytes("".join(f'{{"id": "{i}-{j}", "text": "file {i} line {j} with some words"}}\n' for j in range(400)).encode())
        uris.append(str(path))
    layout = storage.Layout(str(world.root))
    resumed, clean = NORMALIZED.output_uri(layout, "many", "resumed"), NORMALIZED.output_uri(layout, "many", "clean")
    params = "normalize.NormalizeParams(target_shard_bytes=8000)"
    script = (
        "import os, signal\n"
        "from marin_assets.core.ingest import normalize\n"
        "def progress(line):\n"
        "    if ' read ' in line: os.kill(os.getpid(), signal.SIGKILL)\n"
        f"normalize.normalize_source('many', {uris!r}, {resumed!r}, {params}, progress=progress)\n"
    )
    child = subprocess.run([sys.executable, "-c", script], env=dict(os.environ, PYTHONPATH=os.getcwd()), capture_output=True, timeout=300)
    assert child.returncode == -9, child.stderr.decode()[-2000:]
    world.inject()
    assert storage.read_manifest(resumed) is None
    after = normalize.normalize_source("many", uris, resumed, normalize.NormalizeParams(target_shard_bytes=8000))
    fresh = normalize.normalize_source("many", uris, clean, normalize.NormalizeParams(target_shard_bytes=8000))
    assert after["resumed_tasks"] >= 1
    assert after["shards"] == fresh["shards"] and len(fresh["shards"]) > 1
    for name in fresh["shards"]:
        assert storage.read_parquet(storage.join(resumed, name)).equals(storage.read_parquet(storage.join(clean, name)))
    world.rows(2000, after["rows"], after["counters"]["empty_dropped"] + after["counters"]["duplicates"])
    names = [n for _, _, files in os.walk(resumed) for n in files]
    assert not [n for n in names if ".tmp-" in n]


def test_two_concurrent_downloads_of_one_snapshot_agree(world, repo):
    import concurrent.futures

    world.inject()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first, second = pool.map(lambda _: download(world, []), range(2))
    assert [f["sha256"] for f in first["files"]] == [f["sha256"] for f in second["files"]]
    normalize_copy(world, storage.read_manifest(storage.Layout(str(world.root)).raw("org__corpus", "060fca9")))


def test_raw_files_stages_hub_downloads_under_marin_staging_dir(world, pipeline, hub_store):
    """On a real instance: raw_files uses MARIN_STAGING_DIR (a killed run's leftover there is swept)."""
    import gzip
    from pathlib import Path

    from marin_assets.catalog.sources import load_catalog

    world.root = Path(pipeline.prefix)
    peps = load_catalog().by_name("cp/peps")
    body = gzip.compress("".join(f'{{"id": "{i}", "text": "proposal {i}"}}\n' for i in range(12)).encode())
    hub_store.publish(peps.provider.repo_id, {"peps/part-0.json.gz": body}, commit=peps.provider.revision)
    stale = world.staging / f"marin-hf-p{dead_pid()}-x"
    stale.mkdir()
    (stale / "000000.part").write_bytes(b"partial")
    world.inject()
    result = pipeline.materialize(["raw_files", "normalized"], partition="cp/peps")
    assert not stale.exists()
    world.rows(12, pipeline.metadata(result, "normalized")["dagster/row_count"], 0)
