"""raw_files and normalized on a real temporary instance, against fixture repos on the local Hub.

The sources are real catalog entries at their real pins; the local Hub serves small files in
each provider's own format.
"""

from __future__ import annotations

import gzip
import io
import json
import os

import polars as pl
import zstandard

from marin_assets.core.ingest import normalize
from marin_assets.core.runtime import storage
from marin_assets_tests.fixtures.pipeline import catalog_with

PEPS = "cp/peps"  # Dolma-style gzipped JSON lines
DOCS = "starcoder2/documentation"  # parquet, text in `content`
PROSE = "dolma_code_prose"  # zstd JSON lines under a nested folder


def _jsonl(rows):
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def _parquet(rows):
    buf = io.BytesIO()
    pl.DataFrame(rows).write_parquet(buf)
    return buf.getvalue()


PEP_ROWS = [{"id": f"pep-{i}", "text": f"PEP {i}: a proposal about feature number {i}.", "added": "2024"} for i in range(6)]
DOC_ROWS = [{"id": f"d{i}", "content": f"Documentation page {i}\n\nUsage notes.", "path": f"doc/{i}.md"} for i in range(4)]
PROSE_ROWS = [{"id": f"p{i}", "text": f"def f{i}():\n    return {i}  # code and prose"} for i in range(5)]


def publish(hub_store, pins: dict[str, str]) -> None:
    """Publish the three fixture repos at the catalog's pins."""
    from marin_assets.catalog.sources import load_catalog

    catalog = load_catalog()
    files = {
        PEPS: {"peps/part-0.json.gz": gzip.compress(_jsonl(PEP_ROWS)), "README.md": b"# fixture"},
        DOCS: {"documentation/train-0.parquet": _parquet(DOC_ROWS), "kaggle/train-0.parquet": _parquet(DOC_ROWS[:1])},
        PROSE: {"dolma_code_prose/a/0.jsonl.zst": zstandard.ZstdCompressor().compress(_jsonl(PROSE_ROWS))},
    }
    for name, content in files.items():
        hub_store.publish(catalog.by_name(name).provider.repo_id, content, commit=pins.get(name, catalog.by_name(name).provider.revision))


def test_three_formats_through_raw_files_and_normalized(pipeline, hub_store) -> None:
    publish(hub_store, {})
    expected = {PEPS: [r["text"] for r in PEP_ROWS], DOCS: [r["content"] for r in DOC_ROWS], PROSE: [r["text"] for r in PROSE_ROWS]}
    for name, texts in expected.items():
        result = pipeline.materialize(["raw_files", "normalized"], partition=name)
        meta = pipeline.metadata(result, "normalized")
        assert meta["dagster/row_count"] == len(texts)
        assert meta["reused"] is False
        frame = normalize.read_normalized(meta["uri"])
        assert sorted(frame["text"].to_list()) == sorted(texts)
        assert frame.columns[:3] == ["id", "text", "source_id"]
        raw = pipeline.metadata(result, "raw_files")
        assert len(raw["revision"]) == 40 and raw["revision"].startswith(raw["pin"])
    # starcoder2/documentation normalizes only its own subset of the repo
    docs = pipeline.metadata(pipeline.materialize(["normalized"], partition=DOCS), "normalized")
    assert normalize.read_normalized(docs["uri"])["path"].to_list() == sorted(
        [r["path"] for r in DOC_ROWS], key=lambda p: normalize.text_ids([f"Documentation page {p[4]}\n\nUsage notes."])[0]
    )


def test_rerun_reuses_without_download_or_rewrite(pipeline, hub_store, hub_server) -> None:
    publish(hub_store, {})
    first = pipeline.metadata(pipeline.materialize(["raw_files", "normalized"], partition=PEPS), "normalized")
    shard = storage.list_shards(first["uri"])[0]
    mtime = os.stat(shard).st_mtime_ns
    hub_server.clear_requests()
    again = pipeline.materialize(["raw_files", "normalized"], partition=PEPS)
    assert pipeline.metadata(again, "raw_files")["reused"] is True
    assert pipeline.metadata(again, "normalized")["reused"] is True
    assert pipeline.metadata(again, "normalized")["fingerprint"] == first["fingerprint"]
    assert hub_server.count() == 0
    assert os.stat(shard).st_mtime_ns == mtime


def test_changed_pin_gives_new_fingerprints(pipeline, hub_store, tmp_path) -> None:
    publish(hub_store, {})
    before = pipeline.materialize(["raw_files", "normalized"], partition=PEPS)
    from marin_assets.catalog.sources import load_catalog

    repo = load_catalog().by_name(PEPS).provider.repo_id
    rows = PEP_ROWS + [{"id": "pep-new", "text": "A new proposal arrived in the next revision.", "added": "2025"}]
    new_sha = hub_store.publish(repo, {"peps/part-0.json.gz": gzip.compress(_jsonl(rows))}, commit="abcdef1")
    pipeline.catalog_path = str(catalog_with(tmp_path / "edited.toml", edit={PEPS: {"provider": {"revision": "abcdef1"}}}))
    after = pipeline.materialize(["raw_files", "normalized"], partition=PEPS)
    assert pipeline.metadata(after, "raw_files")["revision"] == new_sha
    assert pipeline.metadata(after, "raw_files")["fingerprint"] != pipeline.metadata(before, "raw_files")["fingerprint"]
    assert pipeline.metadata(after, "normalized")["fingerprint"] != pipeline.metadata(before, "normalized")["fingerprint"]
    assert pipeline.metadata(after, "normalized")["dagster/row_count"] == len(rows)


def _failure_message(result) -> str:
    failures = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert failures, "the step should have failed"
    return str(failures[0].event_specific_data.error.message) + str(failures[0].event_specific_data.error.cause)


def test_gated_repo_fails_at_once_with_the_fix(pipeline, hub_store, hub_server) -> None:
    publish(hub_store, {})
    from marin_assets.catalog.sources import load_catalog

    hub_store.set_gated(load_catalog().by_name(DOCS).provider.repo_id, True)
    result = pipeline.materialize(["raw_files"], partition=DOCS, raise_on_error=False)
    assert not result.success
    message = _failure_message(result)
    assert "HF_TOKEN" in message and "accept" in message.lower()
    assert hub_server.count(status=403) + hub_server.count(status=401) == 1  # no retries


def test_rate_limit_storm_and_cut_connection_then_success(pipeline, hub_store, hub_server) -> None:
    publish(hub_store, {})
    hub_server.faults.add("429", "*/resolve/*/peps/part-0.json.gz", times=3, reset_s=0)
    hub_server.faults.add("cut", "*/resolve/*/peps/part-0.json.gz", times=1, methods=["GET"])
    result = pipeline.materialize(["raw_files", "normalized"], partition=PEPS)
    assert pipeline.metadata(result, "raw_files")["retries"] >= 4
    assert pipeline.metadata(result, "normalized")["dagster/row_count"] == len(PEP_ROWS)


def test_corrupted_file_is_detected(pipeline, hub_store, hub_server) -> None:
    publish(hub_store, {})
    hub_server.faults.add("corrupt", "*/resolve/*/documentation/train-0.parquet", times=None, methods=["GET"])
    result = pipeline.materialize(["raw_files"], partition=DOCS, raise_on_error=False)
    assert not result.success
    message = _failure_message(result)
    assert "documentation/train-0.parquet" in message
    assert "hash" in message.lower() or "sha256" in message.lower() or "integrity" in message.lower()


def test_killed_download_resumes_without_refetching(pipeline, hub_store, hub_server) -> None:
    from marin_assets.catalog.sources import load_catalog

    repo = load_catalog().by_name(PROSE).provider.repo_id
    pin = load_catalog().by_name(PROSE).provider.revision
    files = {f"dolma_code_prose/a/{i}.jsonl.zst": zstandard.ZstdCompressor().compress(_jsonl(PROSE_ROWS[i : i + 1])) for i in range(5)}
    hub_store.publish(repo, files, commit=pin)
    hub_server.faults.add("cut", "*/resolve/*/dolma_code_prose/a/4.jsonl.zst", times=None, methods=["GET"])
    failed = pipeline.materialize(["raw_files"], partition=PROSE, raise_on_error=False)
    assert not failed.success
    hub_server.faults.clear()
    hub_server.clear_requests()
    result = pipeline.materialize(["raw_files", "normalized"], partition=PROSE)
    fetched = {r.path.rsplit("/", 1)[-1] for r in hub_server.requests if r.method == "GET" and "/resolve/" in r.path}
    assert fetched == {"4.jsonl.zst"}
    assert pipeline.metadata(result, "normalized")["dagster/row_count"] == len(PROSE_ROWS)


def test_storage_on_gcs_emulator(pipeline, hub_store, gcs_prefix) -> None:
    publish(hub_store, {})
    pipeline.prefix = gcs_prefix
    meta = pipeline.metadata(pipeline.materialize(["raw_files", "normalized"], partition=PEPS), "normalized")
    assert meta["uri"].startswith("gs://")
    assert storage.is_complete(meta["uri"])
    assert normalize.read_normalized(meta["uri"]).height == len(PEP_ROWS)


def test_recipe_not_implemented_is_named(pipeline, tmp_path) -> None:
    pipeline.catalog_path = str(catalog_with(tmp_path / "c.toml", keep=[PEPS], edit={PEPS: {"transform": "no_such_transform"}}))
    result = pipeline.materialize(["normalized"], partition=PEPS, raise_on_error=False)
    message = _failure_message(result)
    # refused when the catalog loads (before anything is downloaded), naming the entry and the transform
    assert "catalog entry is invalid" in message and "no_such_transform" in message and PEPS in message

