"""The download client against the local Hub: retries, verification, auth, resume, reuse."""

from __future__ import annotations

import hashlib
import json
import uuid

import pytest

from marin_assets.core.ingest import hub
from marin_assets.core.runtime import stages, storage

REPO = "org/corpus"
FILES = {
    "README.md": b"# corpus\n",
    "data/train-0.parquet": bytes(range(256)) * 1200,  # LFS (sha256-verified), ~300 KB
    "data/train-1.parquet": b"\x01\x02" * 5000,
    "data/sub/extra.parquet": b"nested" * 100,
    "data/notes.jsonl": b'{"text": "plain git file"}\n' * 50,  # not LFS: git sha1-verified
}
PARQUETS = ["data/train-0.parquet", "data/train-1.parquet"]


def tiny_policy(waits: list[float], **overrides) -> hub.RetryPolicy:
    """Real backoff arithmetic with tiny numbers; waits are recorded instead of slept."""
    defaults = dict(
        attempts=5, base_wait_s=0.001, min_wait_s=0.001, max_wait_s=0.01, jitter_fraction=0.0,
        rate_limit_margin_s=0.5, sleep=waits.append,
    )  # fmt: skip
    return hub.RetryPolicy(**(defaults | overrides))


@pytest.fixture
def sha(hub_server):
    return hub_server.store.publish(REPO, FILES, commit="060fca9")


@pytest.fixture
def waits() -> list[float]:
    return []


def download(dest, waits, revision="060fca9", allow=("data/*.parquet",), exclude=None, **kwargs):
    policy = kwargs.pop("policy", None) or tiny_policy(waits)
    kwargs.setdefault("workers", 1)
    # the stage runner records the copy (manifest last, markers dropped), as raw_files does
    return stages.commit_copy(
        str(dest), lambda: hub.download_snapshot(REPO, revision, list(allow) if allow else None, exclude, str(dest), policy, **kwargs)
    )


def file_gets(server, path: str = "*") -> int:
    return server.count("GET", f"/datasets/{REPO}/resolve/*/{path}")


def test_retry_policy_defaults_follow_the_reference_schedule():
    policy = hub.RetryPolicy()
    for retry, base in [(0, 5.0), (1, 10.0), (3, 40.0), (6, 320.0)]:
        wait = policy.wait_s(retry)
        assert base <= wait <= base + min(0.25 * base, 30.0)
    assert policy.wait_s(40) == 900.0  # capped at 15 minutes, jitter included
    assert policy.wait_s(0, rate_limit_reset_s=120) >= 130.0  # reset + 10 s margin
    assert policy.attempts == 20


def test_short_pin_resolves_and_unknown_pin_is_gone(hub_server, sha, waits):
    assert hub.resolve_revision(REPO, "060fca9", "dataset", policy=tiny_policy(waits)) == sha
    with pytest.raises(hub.RevisionGoneError, match="update the pin"):
        hub.resolve_revision(REPO, "0123abc", policy=tiny_policy(waits))
    with pytest.raises(hub.RepoNotFoundError):
        hub.resolve_revision("org/absent", "main", policy=tiny_policy(waits))
    assert waits == []  # none of these is worth a retry


def test_list_files_applies_globs_relative_to_the_repo_root(hub_server, sha):
    listed = hub.list_files(REPO, sha, allow=["data/*.parquet"])
    assert [f.path for f in listed] == PARQUETS
    lfs = listed[0]
    assert lfs.sha256 == hashlib.sha256(FILES[lfs.path]).hexdigest() and lfs.etag == lfs.sha256
    assert [f.path for f in hub.list_files(REPO, sha, allow="data/**/*.parquet")] == [
        "data/sub/extra.parquet", *PARQUETS
    ]
    assert [f.path for f in hub.list_files(REPO, sha, exclude=["data/*.parquet", "data/sub/"])] == [
        "README.md", "data/notes.jsonl"
    ]
    (notes,) = hub.list_files(REPO, sha, subdir="data", allow="**/*.jsonl")
    assert notes.sha256 is None and len(notes.etag) == 40 and notes.size == len(FILES["data/notes.jsonl"])


def test_download_verifies_and_writes_the_manifest_last(hub_server, sha, waits, tmp_path):
    dest = tmp_path / "raw"
    lines: list[str] = []
    manifest = download(dest, waits, allow=None, on_progress=lines.append)
    for path, data in FILES.items():
        assert (dest / path).read_bytes() == data
    stored = json.loads((dest / "_manifest.json").read_text())
    assert stored | {"reused": False} == manifest and manifest["resolved_revision"] == sha and manifest["requested_revision"] == "060fca9"
    assert {f["path"]: f["sha256"] for f in manifest["files"]} == {
        p: hashlib.sha256(d).hexdigest() for p, d in FILES.items()
    }
    assert manifest["counters"] | {"bytes_fetched": 0} == {
        "files": 5, "bytes": sum(map(len, FILES.values())), "fetched": 5, "reused": 0, "retries": 0, "bytes_fetched": 0
    }
    assert len(lines) == 5 and "5/5 files" in lines[-1]
    assert not (dest / hub.PARTIAL_DIR).exists()


def test_rate_limit_storm_waits_for_the_reset_then_succeeds(hub_server, sha, waits, tmp_path):
    hub_server.faults.add("429", "*/train-1.parquet", times=3, reset_s=7)
    manifest = download(tmp_path / "raw", waits)
    assert file_gets(hub_server, "data/train-1.parquet") == 4
    assert waits == [7.5, 7.5, 7.5]  # the server's reset + margin, above the tiny backoff
    assert manifest["counters"]["retries"] == 3
    assert (tmp_path / "raw/data/train-1.parquet").read_bytes() == FILES["data/train-1.parquet"]


def test_rate_limited_metadata_call_is_retried(hub_server, sha, waits):
    hub_server.faults.add("429", "/api/datasets/*/revision/*", times=2, reset_s=1)
    assert hub.resolve_revision(REPO, "060fca9", policy=tiny_policy(waits)) == sha
    assert waits == [1.5, 1.5]


def test_server_error_then_success(hub_server, sha, waits, tmp_path):
    hub_server.faults.add("500", "*/train-0.parquet", times=1)
    hub_server.faults.add("503", "*/train-1.parquet", times=2)
    manifest = download(tmp_path / "raw", waits)
    assert manifest["counters"]["retries"] == 3 and len(waits) == 3
    assert all(w <= 0.01 for w in waits)  # plain backoff, capped by the policy


def test_cut_connection_resumes_with_a_range_request(hub_server, sha, waits, tmp_path):
    hub_server.faults.add("cut", "*/train-0.parquet", times=1)
    download(tmp_path / "raw", waits)
    size = len(FILES["data/train-0.parquet"])
    gets = [r for r in hub_server.requests if r.path.endswith("train-0.parquet")]
    assert [(r.range is None, r.fault) for r in gets] == [(True, "cut"), (False, None)]
    resumed_at = int(gets[1].range.removeprefix("bytes=").removesuffix("-"))
    assert 0 < resumed_at <= size // 2  # only the missing tail was fetched again
    assert (tmp_path / "raw/data/train-0.parquet").read_bytes() == FILES["data/train-0.parquet"]


@pytest.mark.parametrize("path", ["data/train-0.parquet", "data/notes.jsonl"])  # sha256 and git-sha1 checks
def test_corrupt_body_is_refetched_once(hub_server, sha, waits, tmp_path, path):
    hub_server.faults.add("corrupt", f"*/{path}", times=1)
    manifest = download(tmp_path / "raw", waits, allow=[path])
    assert (tmp_path / "raw" / path).read_bytes() == FILES[path]
    assert manifest["counters"]["retries"] == 1 and file_gets(hub_server, path) == 2


def test_persistently_corrupt_file_raises_integrity_error(hub_server, sha, waits, tmp_path):
    hub_server.faults.add("corrupt", "*/train-1.parquet", times=None)
    with pytest.raises(hub.IntegrityError, match="train-1.parquet"):
        download(tmp_path / "raw", waits, policy=tiny_policy(waits, integrity_attempts=3))
    assert file_gets(hub_server, "data/train-1.parquet") == 3
    assert not (tmp_path / "raw/data/train-1.parquet").exists()
    assert not storage.is_complete(str(tmp_path / "raw"))


def test_gated_repo_without_token_fails_at_once_with_the_fix(hub_server, sha, waits, tmp_path):
    hub_server.store.set_gated(REPO, True, allowed_tokens=["hf_allowed_secret"])
    with pytest.raises(hub.HubAuthError) as err:
        download(tmp_path / "raw", waits)
    message = str(err.value)
    assert f"accept them at {hub_server.endpoint}/datasets/{REPO}" in message and "set HF_TOKEN" in message
    assert file_gets(hub_server) == 1 and waits == []


def test_refused_token_fails_at_once_and_is_never_echoed(hub_server, sha, waits, tmp_path):
    hub_server.store.set_gated(REPO, True, allowed_tokens=["hf_allowed_secret"])
    with pytest.raises(hub.HubAuthError) as err:
        download(tmp_path / "raw", waits, token="hf_refused_secret")
    assert "was refused" in str(err.value) and "hf_refused_secret" not in str(err.value)
    assert file_gets(hub_server, "*") == 1 and waits == []
    download(tmp_path / "raw", waits, token="hf_allowed_secret")
    assert "hf_allowed_secret" not in (tmp_path / "raw/_manifest.json").read_text()


def test_removed_revision_is_reported_without_retries(hub_server, sha, waits, tmp_path):
    hub_server.store.publish(REPO, {"README.md": b"history rewritten"})
    hub_server.store.remove_revision(REPO, sha)
    with pytest.raises(hub.RevisionGoneError, match="no longer serves revision '060fca9'"):
        download(tmp_path / "raw", waits)
    assert hub_server.count() == 1 and waits == []


def test_second_call_is_a_no_op(hub_server, sha, waits, tmp_path):
    first = download(tmp_path / "raw", waits, revision=sha)
    hub_server.clear_requests()
    again = download(tmp_path / "raw", waits, revision=sha)
    assert hub_server.count() == 0
    assert again["reused"] is True and again["counters"]["fetched"] == 0 and again["files"] == first["files"]
    via_branch = download(tmp_path / "raw", waits, revision="main")
    assert via_branch["reused"] is True and file_gets(hub_server) == 0  # only the branch was resolved


def test_interrupted_run_resumes_without_refetching_finished_files(hub_server, sha, waits, tmp_path):
    dest = tmp_path / "raw"
    hub_server.faults.add("500", "*/train-1.parquet", times=None)  # dies for good mid-run
    with pytest.raises(hub.DownloadError, match="train-1.parquet") as err:
        download(dest, waits, allow=None, policy=tiny_policy(waits, attempts=2), workers=3)
    assert "1 of 5 files failed" in str(err.value)
    assert not storage.is_complete(str(dest)) and (dest / "data/train-0.parquet").exists()
    hub_server.faults.clear()
    hub_server.clear_requests()
    manifest = download(dest, waits, allow=None)
    assert file_gets(hub_server) == 1 and file_gets(hub_server, "data/train-1.parquet") == 1
    assert manifest["counters"]["reused"] == 4 and manifest["counters"]["fetched"] == 1
    assert not (dest / hub.PARTIAL_DIR).exists()


def test_downloads_to_an_fsspec_uri(hub_server, sha, waits):
    dest = f"memory://hub-test-{uuid.uuid4().hex}/raw"
    manifest = download(dest, waits)
    for path in PARQUETS:
        assert storage.read_bytes(storage.join(dest, path)) == FILES[path]
    assert storage.read_manifest(dest) | {"reused": False} == manifest
    hub_server.clear_requests()
    assert download(dest, waits)["reused"] is True and hub_server.count() == 0


def test_empty_selection_is_an_error(hub_server, sha, waits, tmp_path):
    with pytest.raises(hub.DownloadError, match="no file matches"):
        download(tmp_path / "raw", waits, allow=["nothing/*.parquet"])


def test_select_paths_uses_folder_aware_globs():
    paths = ["a.parquet", "data/x.parquet", "data/deep/y.parquet", "meta/licenses.parquet"]
    assert hub.select_paths(paths, "data/*.parquet") == ["data/x.parquet"]
    assert hub.select_paths(paths, "**/*.parquet", exclude="meta/") == ["a.parquet", "data/x.parquet", "data/deep/y.parquet"]
    assert hub.select_paths(paths, ["data/**"], exclude=["**/y.parquet"]) == ["data/x.parquet"]
