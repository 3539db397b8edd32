"""Storage on a local directory and on the GCS emulator, through the same functions."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from marin_assets.core import specs
from marin_assets.core.runtime import storage
from marin_assets.errors import CorruptOutput


@pytest.fixture(params=["local", "gcs"])
def root(request: pytest.FixtureRequest, tmp_path) -> str:
    if request.param == "local":
        return str(tmp_path / "data")
    return request.getfixturevalue("gcs_prefix")


def test_parquet_roundtrip_and_shard_listing(root: str) -> None:
    out = storage.join(root, "normalized", "cp/pubmed", "abc")
    for i in (1, 0):
        storage.write_parquet(pa.table({"id": [f"{i}"], "x": [i]}), storage.join(out, storage.shard_name(i, 2)))
    storage.write_json(storage.join(out, "notes.json"), {"ignored": True})
    shards = storage.list_shards(out)
    assert [storage.basename(s) for s in shards] == ["part-00000-of-00002.parquet", "part-00001-of-00002.parquet"]
    assert storage.read_parquet(shards[1]).column("x").to_pylist() == [1]


def test_manifest_marks_completion(root: str) -> None:
    out = storage.join(root, "global", "exact_duplicates", "f00")
    storage.write_bytes(storage.join(out, "data.bin"), b"payload")
    assert not storage.is_complete(out)
    storage.write_manifest(out, {"rows": 3})
    assert storage.is_complete(out)
    assert storage.read_manifest(out) == {"rows": 3}


def test_failed_write_leaves_nothing_that_looks_complete(root: str) -> None:
    target = storage.join(root, "x", "part-00000-of-00001.parquet")
    with pytest.raises(RuntimeError):
        with storage.open_atomic(target) as handle:
            handle.write(b"half a file")
            raise RuntimeError("killed")
    assert not storage.exists(target)
    assert [u for u in storage.listdir(storage.join(root, "x"))] == []


def test_fingerprint_changes_with_params_code_and_inputs() -> None:
    base = storage.fingerprint("normalized", {"a": 1}, "1", ["raw1"])
    assert base == storage.fingerprint("normalized", {"a": 1}, "1", ["raw1"])
    assert len(base) == 16
    assert base != storage.fingerprint("normalized", {"a": 2}, "1", ["raw1"])
    assert base != storage.fingerprint("normalized", {"a": 1}, "2", ["raw1"])
    assert base != storage.fingerprint("normalized", {"a": 1}, "1", ["raw2"])
    assert base != storage.fingerprint("minhash", {"a": 1}, "1", ["raw1"])


def test_layout_is_rooted_and_prefix_resolution(monkeypatch, tmp_path) -> None:
    assert storage.resolve_prefix("gs://bucket/prefix/") == "gs://bucket/prefix"
    monkeypatch.setenv("MARIN_PREFIX", "gs://elsewhere")  # core reads no environment
    monkeypatch.chdir(tmp_path)
    assert storage.resolve_prefix() == str(tmp_path / ".marin_data")
    layout = storage.Layout(storage.resolve_prefix(str(tmp_path / "rel")))
    assert specs.NORMALIZED.output_uri(layout, "cp/pubmed", "fp") == f"{tmp_path}/rel/normalized/cp/pubmed/fp"
    assert specs.MINHASH_BUCKETS.output_uri(layout, "s", "fp").endswith("/attributes/minhash_buckets/s/fp")
    assert specs.TOPIC_MODEL.output_uri(layout, None, "fp") == f"{tmp_path}/rel/global/topic_model/fp"
    assert specs.POOL.data_uri(layout, "cp/peps", "fp") == f"{tmp_path}/rel/pool/cp/peps/fp"


def test_an_object_store_write_is_spooled_on_local_disk_and_appears_whole(gcs_prefix: str) -> None:
    """A writer of a large object (a 256 MiB shard or flush) does not hold its bytes in memory."""
    target = storage.join(gcs_prefix, "x", "flush-00000.arrow")
    payload = os.urandom(3 << 20)
    with storage.open_atomic(target) as handle:
        handle.write(payload)
        handle.flush()
        assert os.path.getsize(handle.name) == len(payload)  # on local disk
        assert not storage.exists(target)  # nothing visible before the block closes
    assert storage.read_bytes(target) == payload
    assert not os.path.exists(handle.name)  # the spool is gone


@pytest.mark.parametrize("where", ["slow", "gcs"])
def test_reads_of_a_whole_object_columns_or_rows_cost_the_same_requests_at_any_size(where: str, tmp_path, request: pytest.FixtureRequest) -> None:
    """A dedup task's reads of a Parquet file from an object store: the whole object is one GET,
    some columns two (the footer, then their chunks), its row count one, and a block file's
    merge input one streamed GET, whether the file holds a few rows or many row groups of MiB;
    each gives what the plain reader gives (on the latency store the requests are counted, on
    the GCS emulator the same reads run against Cloud Storage's API)."""
    from bench import slow_store

    root = slow_store.uri(str(tmp_path / "store")) if where == "slow" else request.getfixturevalue("gcs_prefix")
    counts = {}
    for rows in (10, 200_000):
        table = pa.table({"id": [f"{i:032x}" for i in range(rows)], "text": [f"text {i} " * 20 for i in range(rows)], "n": list(range(rows))})
        uri = storage.join(root, f"t{rows}.parquet")
        storage.write_parquet(table, uri, row_group_size=20_000)
        before = slow_store.SlowStore.total()
        assert storage.read_parquet_object(uri).equals(table)
        assert storage.read_parquet_columns(uri, ["id", "n"]).equals(table.select(["id", "n"]))
        assert storage.read_parquet_columns(uri, ["text"]).equals(table.select(["text"]))
        assert storage.parquet_num_rows(uri) == rows
        with storage.open_stream(uri) as stream:
            assert stream.read() == storage.read_bytes(uri)
        counts[rows] = slow_store.SlowStore.total() - before - (1 if where == "slow" else 0)  # read_bytes: one more
    if where == "slow":
        assert counts[10] == counts[200_000] == 1 + 2 + 2 + 1 + 1, counts
    storage.write_bytes(storage.join(root, "bad.parquet"), b"not parquet at all")
    with pytest.raises(CorruptOutput, match="is no Parquet file"):
        storage.parquet_num_rows(storage.join(root, "bad.parquet"))


@pytest.mark.system
def test_a_merge_can_hold_more_streams_open_than_a_connection_pool_allows(gcs_prefix: str) -> None:
    """A merge task opens one stream per input (up to 1,024) and reads them in turn: each stream
    holds its own connection, so opening the 101st does not wait for one of the first 100 to
    finish (a shared pool of 100 connections would wait forever: a connection is busy until its
    body, larger than the client's read buffer, is read), and every stream reads its object whole."""
    import threading

    size = 512 << 10
    uris = [storage.join(gcs_prefix, "many", f"o{k:03d}.bin") for k in range(110)]
    storage.concurrently(lambda k: storage.write_bytes(uris[k], bytes([65 + k % 26]) * (size + k)), list(range(len(uris))))
    streams: list = []
    opening = threading.Thread(target=lambda: streams.extend(storage.open_stream(u, 1 << 16) for u in uris), daemon=True)
    opening.start()
    opening.join(timeout=60)
    assert not opening.is_alive() and len(streams) == len(uris), f"{len(streams)} of {len(uris)} streams opened"
    try:
        got = [b"".join(iter(lambda s=s: s.read(size // 4), b"")) for s in streams]
    finally:
        for stream in streams:
            stream.close()
    assert got == [bytes([65 + k % 26]) * (size + k) for k in range(len(uris))]
    with pytest.raises(FileNotFoundError, match="o999"):
        storage.open_stream(storage.join(gcs_prefix, "many", "o999.bin"))


def test_a_stream_whose_connection_breaks_resumes_where_it_stopped(gcs_prefix: str) -> None:
    """A merge reads an input for as long as it runs: where the connection breaks mid-body, the
    stream asks for the rest (a ranged GET from the byte reached) and the reader gets every byte
    once, in order."""
    import fsspec.asyn

    body = bytes(range(65, 91)) * (80 << 10)  # ~2 MiB, larger than the client's read buffer
    uri = storage.join(gcs_prefix, "long.bin")
    storage.write_bytes(uri, body)
    stream = storage.open_stream(uri, 1 << 16)
    try:
        head = stream.read(300 << 10)
        raw = stream.raw
        fs = raw._fs

        async def drop() -> None:
            raw._response.connection.transport.abort()

        fsspec.asyn.sync(fs.loop, drop)
        rest = stream.read()
    finally:
        stream.close()
    assert head + rest == body
