"""A 429 with a one-year reset, on every request path: the wait is the project's cap, never the server's.

``huggingface_hub`` retries inside its own calls and sleeps for whatever ``Retry-After`` says;
its sleep is replaced by one that fails the test, so a request path that still retries
inside the library cannot pass by waiting.
"""

from __future__ import annotations

import dataclasses
import time
import types

import pytest
from huggingface_hub.utils import _http as hf_http

from marin_assets.core.ingest import hub
from marin_assets.core.ingest.providers import hf_bucket
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.retry import RetryPolicy
from marin_assets_tests.faults.hostile import ONE_YEAR_S, SHA
from marin_assets_tests.faults.test_paths_and_credentials import access, bucket_source

CAP_S = 900.0


@pytest.fixture
def waits(monkeypatch) -> list[float]:
    def library_sleep(seconds: float) -> None:
        raise AssertionError(f"huggingface_hub slept {seconds}s inside its own retry loop")

    clock = types.SimpleNamespace(**{n: getattr(time, n) for n in dir(time) if not n.startswith("_")})
    clock.sleep = library_sleep
    monkeypatch.setattr(hf_http, "time", clock)
    return []


def capped(waits: list[float]) -> RetryPolicy:
    return RetryPolicy(attempts=3, base_wait_s=0.0, min_wait_s=0.0, jitter_fraction=0.0, max_reset_wait_s=CAP_S, sleep=waits.append)


def _tokenizer(hub_server, waits):
    sha = hub_server.store.publish("org/tok", {"tokenizer.json": b'{"version": "1.0"}'}, commit="0a1b2c3", repo_type="model")
    path = hub.hub_file("org/tok", "tokenizer.json", sha, policy=capped(waits))
    with open(path, "rb") as handle:
        assert handle.read() == b'{"version": "1.0"}'


def _dataset(call):
    def run(hub_server, waits):
        sha = hub_server.store.publish("org/corpus", {"data/a.jsonl": b'{"text": "a"}\n'}, commit="060fca9")
        return call(sha, capped(waits))

    return run


# name -> (the paths a 429 hits, how many times, the call): the client asks a file's HEAD twice itself, without waiting
LOCAL_HUB_PATHS = {
    "repo info": ("/api/datasets/org/corpus/revision/*", 1, _dataset(lambda sha, p: hub.resolve_revision("org/corpus", "060fca9", policy=p))),
    "tree listing": ("/api/datasets/org/corpus/tree/*", 1, _dataset(lambda sha, p: hub.list_files("org/corpus", sha, policy=p))),
    "model file (tokenizer)": ("/org/tok/resolve/*", 2, _tokenizer),
}  # fmt: skip


@pytest.mark.parametrize("name", list(LOCAL_HUB_PATHS))
def test_a_one_year_429_on_a_hub_client_path_waits_the_cap(world, hub_server, waits, name):
    glob, times, call = LOCAL_HUB_PATHS[name]
    fault = hub_server.faults.add("429", glob, times=times, reset_s=ONE_YEAR_S)
    world.inject()
    call(hub_server, waits)
    assert fault.hits == times and waits == [CAP_S]


def test_a_one_year_429_on_file_bodies_waits_the_cap(world, hub_server, waits):
    sha = hub_server.store.publish("org/corpus", {"data/a.jsonl": b'{"text": "a"}\n'}, commit="060fca9")
    fault = hub_server.faults.add("429", "*/resolve/*", times=1, reset_s=ONE_YEAR_S)
    world.inject()
    dest = storage.Layout(str(world.root)).raw("org__corpus", sha)
    manifest = hub.download_snapshot("org/corpus", sha, None, None, dest, capped(waits), staging_dir=str(world.staging))
    assert fault.hits == 1 and waits == [CAP_S] and len(manifest["files"]) == 1


@pytest.mark.parametrize("where", ["/api/buckets/evil/bucket/tree", "/buckets/evil/bucket/resolve/"])
def test_a_one_year_429_on_bucket_paths_waits_the_cap(world, hostile, waits, where):
    hostile.files = {"data/part-0.jsonl": b'{"text": "fine"}\n'}
    hostile.throttled[where] = 1
    world.inject()
    manifest = hf_bucket.fetch(bucket_source(), storage.Layout(str(world.root)), access=dataclasses.replace(access(), policy=capped(waits)))
    assert hostile.throttled[where] == 0 and waits == [CAP_S]
    assert [f["path"] for f in manifest["files"]] == ["data/part-0.jsonl"]


def test_the_hostile_hub_tree_listing_429_waits_the_cap(world, hostile, waits):
    hostile.files = {"data/a.jsonl": b'{"text": "listed"}\n'}
    hostile.throttled[f"/api/datasets/evil/corpus/tree/{SHA}"] = 1
    world.inject()
    assert [f.path for f in hub.list_files("evil/corpus", SHA, policy=capped(waits))] == ["data/a.jsonl"]
    assert waits == [CAP_S]
