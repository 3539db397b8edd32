"""The local Hub, driven by the real ``huggingface_hub`` client over loopback."""

from __future__ import annotations

import hashlib

import pytest
from huggingface_hub import HfApi, HfFileSystem, get_hf_file_metadata, hf_hub_download, hf_hub_url
from huggingface_hub.errors import (
    GatedRepoError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import parse_ratelimit_headers

from marin_assets.core.ingest.hub import httpx
from marin_assets.testing.hub_server import HubStoreError, git_blob_sha1

REPO = "org/corpus"
PARQUET = bytes(range(256)) * 40  # LFS by suffix
README = b"# corpus\n"
NESTED = b'{"text": "hello"}\n' * 7


@pytest.fixture
def repo(hub_server):
    """One repo with an LFS file, a plain file and a nested file, pinned at a short sha."""
    sha = hub_server.store.publish(
        REPO, {"README.md": README, "data/train-0.parquet": PARQUET, "data/sub/extra.jsonl": NESTED}, commit="060fca9"
    )
    return sha


def api(server) -> HfApi:
    return HfApi(endpoint=server.endpoint, token=False)


def test_short_pin_resolves_to_full_sha_and_branch_moves(hub_server, repo):
    assert repo.startswith("060fca9") and len(repo) == 40
    assert api(hub_server).dataset_info(REPO, revision="060fca9").sha == repo
    newer = hub_server.store.publish(REPO, {"README.md": b"v2"}, keep_existing=True)
    assert api(hub_server).dataset_info(REPO).sha == newer
    assert api(hub_server).dataset_info(REPO, revision="main").sha == newer
    # the old commit is still served by sha, with its own files
    old_files = api(hub_server).list_repo_files(REPO, repo_type="dataset", revision=repo[:7])
    assert old_files == ["README.md", "data/sub/extra.jsonl", "data/train-0.parquet"]


def test_repo_info_reports_sizes_and_lfs_hashes(hub_server, repo):
    info = api(hub_server).dataset_info(REPO, revision=repo, files_metadata=True)
    by_name = {s.rfilename: s for s in info.siblings}
    assert by_name["data/train-0.parquet"].lfs.sha256 == hashlib.sha256(PARQUET).hexdigest()
    assert by_name["data/train-0.parquet"].size == len(PARQUET)
    assert by_name["README.md"].lfs is None
    assert by_name["README.md"].blob_id == git_blob_sha1(README)


def test_tree_listing_paginates_through_link_header(hub_server, repo):
    hub_server.page_size = 2
    entries = list(api(hub_server).list_repo_tree(REPO, repo_type="dataset", recursive=True, revision="060fca9"))
    assert [(e.path, type(e).__name__) for e in entries] == [
        ("README.md", "RepoFile"),
        ("data", "RepoFolder"),
        ("data/sub", "RepoFolder"),
        ("data/sub/extra.jsonl", "RepoFile"),
        ("data/train-0.parquet", "RepoFile"),
    ]
    assert hub_server.count("GET", "/api/datasets/org/corpus/tree/*") == 3  # 5 entries, 2 per page
    top = list(api(hub_server).list_repo_tree(REPO, repo_type="dataset", path_in_repo="data", revision=repo))
    assert sorted(e.path for e in top) == ["data/sub", "data/train-0.parquet"]


def test_paths_info_returns_existing_paths_only(hub_server, repo):
    infos = api(hub_server).get_paths_info(REPO, ["data", "README.md", "missing.txt"], repo_type="dataset")
    assert sorted((i.path, type(i).__name__) for i in infos) == [("README.md", "RepoFile"), ("data", "RepoFolder")]


def test_resolve_headers_carry_commit_etag_and_linked_size(hub_server, repo):
    meta = get_hf_file_metadata(hf_hub_url(REPO, "data/train-0.parquet", repo_type="dataset", revision="060fca9"))
    assert meta.commit_hash == repo
    assert meta.etag == hashlib.sha256(PARQUET).hexdigest()
    assert meta.size == len(PARQUET)
    assert meta.xet_file_data is None  # never announced as Xet: plain HTTP downloads
    plain = get_hf_file_metadata(hf_hub_url(REPO, "README.md", repo_type="dataset", revision="main"))
    assert plain.etag == git_blob_sha1(README)


def test_hf_hub_download_and_byte_ranges(hub_server, repo, tmp_path):
    path = hf_hub_download(REPO, "data/train-0.parquet", repo_type="dataset", revision="060fca9", cache_dir=tmp_path / "c")
    assert open(path, "rb").read() == PARQUET
    url = hub_server.file_url(REPO, repo, "data/train-0.parquet")
    with httpx.Client() as client:
        part = client.get(url, headers={"Range": "bytes=10-19"})
        assert part.status_code == 206 and part.content == PARQUET[10:20]
        assert part.headers["Content-Range"] == f"bytes 10-19/{len(PARQUET)}"
        tail = client.get(url, headers={"Range": "bytes=-5"})
        assert tail.content == PARQUET[-5:]
        assert client.get(url, headers={"Range": f"bytes={len(PARQUET)}-"}).status_code == 416


def test_hf_filesystem_find_glob_info_and_open(hub_server, repo):
    fs = HfFileSystem(endpoint=hub_server.endpoint, token=False, skip_instance_cache=True)
    root = f"datasets/{REPO}@060fca9"
    assert fs.find(root) == [f"{root}/README.md", f"{root}/data/sub/extra.jsonl", f"{root}/data/train-0.parquet"]
    assert fs.glob(f"{root}/data/*.parquet") == [f"{root}/data/train-0.parquet"]
    assert fs.glob(f"{root}/data/**/*.jsonl") == [f"{root}/data/sub/extra.jsonl"]
    assert fs.info(f"{root}/data/train-0.parquet")["size"] == len(PARQUET)
    with fs.open(f"{root}/data/sub/extra.jsonl", "rb", block_size=8) as handle:
        handle.seek(3)
        assert handle.read(10) == NESTED[3:13]


def test_errors_are_shaped_like_the_hub(hub_server, repo):
    with pytest.raises(RepositoryNotFoundError):
        api(hub_server).dataset_info("org/missing")
    with pytest.raises(RevisionNotFoundError):
        api(hub_server).dataset_info(REPO, revision="deadbee")
    with pytest.raises(RemoteEntryNotFoundError):
        get_hf_file_metadata(hf_hub_url(REPO, "nope.txt", repo_type="dataset"))


def test_removed_revision_is_no_longer_served(hub_server, repo):
    with pytest.raises(HubStoreError, match="move the branch"):
        hub_server.store.remove_revision(REPO, repo)  # main still points at it
    hub_server.store.publish(REPO, {"README.md": b"squashed"})
    hub_server.store.remove_revision(REPO, "060fca9")
    with pytest.raises(RevisionNotFoundError):
        api(hub_server).dataset_info(REPO, revision="060fca9")
    with pytest.raises(RevisionNotFoundError):
        get_hf_file_metadata(hf_hub_url(REPO, "README.md", repo_type="dataset", revision=repo))


def test_gated_repo_needs_an_allowed_token(hub_server, repo):
    hub_server.store.set_gated(REPO, True, allowed_tokens=["hf_allowed"])
    url = hf_hub_url(REPO, "README.md", repo_type="dataset")
    with pytest.raises(GatedRepoError) as no_token:
        get_hf_file_metadata(url, token=False)
    assert no_token.value.response.status_code == 401
    with pytest.raises(GatedRepoError) as wrong:
        get_hf_file_metadata(url, token="hf_other")
    assert wrong.value.response.status_code == 403
    assert get_hf_file_metadata(url, token="hf_allowed").commit_hash == repo
    assert api(hub_server).dataset_info(REPO).gated  # metadata stays public, as on the Hub


def test_whoami_needs_a_token(hub_server):
    assert HfApi(endpoint=hub_server.endpoint, token="hf_x").whoami()["name"] == "local-user"


def test_rate_limit_fault_sends_reset_headers_then_clears(hub_server, repo):
    fault = hub_server.faults.add("429", "*/resolve/*", times=2, reset_s=7)
    url = hub_server.file_url(REPO, repo, "README.md")
    with httpx.Client() as client:
        first = client.get(url)
        assert first.status_code == 429 and first.headers["Retry-After"] == "7"
        assert parse_ratelimit_headers(first.headers).reset_in_seconds == 7
        assert client.get(url).status_code == 429
        assert client.get(url).content == README
    assert fault.hits == 2 and not fault.active
    assert hub_server.count("GET", "*/README.md", status=429) == 2


def test_cut_and_corrupt_faults_break_the_body(hub_server, repo):
    url = hub_server.file_url(REPO, repo, "data/train-0.parquet")
    hub_server.faults.add("corrupt", "*train-0.parquet")
    hub_server.faults.add("cut", "*train-0.parquet")
    with httpx.Client() as client:
        corrupted = client.get(url).content
        assert len(corrupted) == len(PARQUET) and corrupted != PARQUET
        with pytest.raises(httpx.RemoteProtocolError):
            client.get(url)
        assert client.get(url).content == PARQUET


def test_store_pins_and_deletes(hub_store):
    sha = hub_store.publish("a/b", {"x.txt": b"1"}, commit="abc1234", branch=None)
    assert sha.startswith("abc1234") and hub_store.branches("a/b") == {}
    with pytest.raises(HubStoreError):
        hub_store.publish("a/b", {"x.txt": b"2"}, commit=sha)
    assert hub_store.resolve("a/b", "abc1234") == sha
    hub_store.delete_repo("a/b")
    assert not hub_store.exists("a/b")


def test_serve_hub_command_serves_a_repo_store(tmp_path):
    """``marin-assets serve-hub ROOT`` serves what ``HubRepoStore`` wrote, at the endpoint it prints,
    and stops on SIGTERM."""
    import subprocess
    import sys

    from marin_assets.testing.hub_server import HubRepoStore

    sha = HubRepoStore(tmp_path / "hub").publish(REPO, {"README.md": README}, commit="060fca9")
    command = [sys.executable, "-m", "marin_assets.cli", "serve-hub", str(tmp_path / "hub"), "--port", "0"]
    import signal

    def ignore_term() -> None:  # as under a parent that ignores SIGTERM: the child inherits it
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, preexec_fn=ignore_term) as server:
        try:
            assert server.stdout.readline().startswith("local hub: 1 dataset repos")
            endpoint = server.stdout.readline().strip().removeprefix("HF_ENDPOINT=")
            assert HfApi(endpoint=endpoint, token=False).dataset_info(REPO, revision="060fca9").sha == sha
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                raise AssertionError("serve-hub did not stop on SIGTERM") from None
