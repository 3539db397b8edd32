"""Web, API, pre-staged and bucket sources through ``raw_files`` and ``normalized``.

Each test runs the real assets on a temporary instance against provider files served from a
loopback server (``MARIN_WEB_MIRROR`` / ``HF_ENDPOINT``) or staged under ``MARIN_PREFIX``,
then checks the rendered text of known rows exactly and the dropped rows by reason.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import polars as pl
import pytest

from marin_assets.core import normalize, storage
from marin_assets.core.providers import http, prestaged
from marin_assets.core.transforms.ghalogs import sanitize_log
from marin_assets.core.transforms.web_sources import parse_annotation, tool_selection
from marin_assets_tests.fixtures.pipeline import catalog_with
from marin_assets_tests.recipes import web_fixtures as fx

HPLT, MASSIVE, NSF, DOCX, GHALOGS = "hplt_v3", "massive_function_calling", "nsf_awards", "docx-corpus/en", "ghalogs/public"
CODE_V2, BIO = "nemotron_code_v2/content", "biocorpus"


@pytest.fixture
def web_server():
    server = fx.LoopbackServer().start()
    yield server
    server.stop()


@pytest.fixture
def web(pipeline, web_server, monkeypatch):
    """The pipeline with every web/API origin mirrored to the loopback server, and no retry waits."""
    base = web_server.base
    mirrors = {fx.HPLT_ORIGIN: "/hplt", fx.MASSIVE_ORIGIN: "/massive", fx.NSF_API_ORIGIN: "/nsf-api",
               fx.NSF_S3_ORIGIN: "/nsf-s3", fx.DOCX_API_ORIGIN: "/docx-api", fx.DOCX_ORIGIN: "/docx"}  # fmt: skip
    monkeypatch.setenv(http.MIRROR_ENV, ";".join(f"{origin}={base}{path}" for origin, path in mirrors.items()))
    monkeypatch.setenv(http.RETRY_WAIT_ENV, "0")
    return pipeline


def use_catalog(pipeline, tmp_path: Path, name: str, **edit) -> None:
    pipeline.catalog_path = str(catalog_with(tmp_path / "catalog.toml", keep=[name], edit={name: edit} if edit else None))


def run(pipeline, name: str):
    result = pipeline.materialize(["raw_files", "normalized"], partition=name)
    meta = pipeline.metadata(result, "normalized")
    frame = normalize.read_normalized(meta["uri"])
    return result, meta, frame, storage.read_manifest(meta["uri"])


def texts(frame: pl.DataFrame) -> dict:
    return dict(zip(frame["source_id"].to_list(), frame["text"].to_list(), strict=True))


def failure(result) -> str:
    assert not result.success, "the step should have failed"
    events = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    error = events[0].event_specific_data.error
    return str(error.message) + str(error.cause)


def run_logs(pipeline, result) -> str:
    return "\n".join(e.user_message or "" for e in pipeline.instance.all_logs(result.run_id))


# --------------------------------------------------------------------------- HPLT


HPLT_EDIT = {"provider": {"allow": ["5_*.jsonl.zst", "10_*.jsonl.zst"], "exclude": ["5_[2-9]*.jsonl.zst", "5_1?*.jsonl.zst"], "expected_shards": 4}}


def test_hplt_tiers_crawl_and_register_filters_with_faults(web, web_server, tmp_path) -> None:
    for path, data in fx.hplt_files().items():
        web_server.put(path, data)
    web_server.fail(f"{fx.HPLT_DIR}/10_2.jsonl.zst", "status", times=2, status=429, headers={"Retry-After": "0"})
    web_server.fail(f"{fx.HPLT_DIR}/10_2.jsonl.zst", "cut", times=1)
    web_server.fail(f"{fx.HPLT_DIR}/10_3.jsonl.zst", "corrupt", times=1)
    use_catalog(web, tmp_path, HPLT, **HPLT_EDIT)
    result, meta, frame, manifest = run(web, HPLT)
    assert texts(frame) == fx.HPLT_KEPT
    assert manifest["bad_rows"] == fx.HPLT_DROPPED
    assert manifest["counters"]["empty_dropped"] == 1 and manifest["counters"]["whitespace_compacted"] == 1
    tiers = dict(zip(frame["source_id"].to_list(), frame["hplt_wds_tier"].to_list(), strict=True))
    assert tiers["h5-news"] == 5 and tiers["h-keep"] == 10
    assert frame.filter(pl.col("source_id") == "h-keep")["hplt_crawl_id"].item() == fx.WIDE
    raw = web.metadata(result, "raw_files")
    assert raw["files"] == 4 and raw["retries"] >= 4  # two 429s, a cut body, a corrupt body
    assert web_server.count(f"{fx.HPLT_DIR}/5_*") == 1  # the exclude globs kept only 5_1
    # a rerun reuses the raw copy and the normalized shards without a request
    before = len(web_server.requests)
    again = web.materialize(["raw_files", "normalized"], partition=HPLT)
    assert web.metadata(again, "raw_files")["reused"] and web.metadata(again, "normalized")["reused"]
    assert len(web_server.requests) == before


def test_hplt_selection_must_match_the_expected_shard_count(web, web_server, tmp_path) -> None:
    use_catalog(web, tmp_path, HPLT, provider={**HPLT_EDIT["provider"], "expected_shards": 5})
    message = failure(web.materialize(["raw_files"], partition=HPLT, raise_on_error=False))
    assert "74 (tier 5) + 3 (tier 10) = 4 shards" in message and "expected_shards is 5" in message
    assert not web_server.requests


# --------------------------------------------------------------------------- MASSIVE


def test_massive_function_calling_renders_all_partitions(web, web_server, tmp_path) -> None:
    web_server.put(fx.MASSIVE_PATH, fx.massive_tarball())
    use_catalog(web, tmp_path, MASSIVE, provider={"expected_shards": 2})
    _, meta, frame, manifest = run(web, MASSIVE)
    assert manifest["bad_rows"] == fx.MASSIVE_DROPPED
    assert meta["dagster/row_count"] == 5
    rows = {r["source_id"]: r for r in frame.iter_rows(named=True)}
    assert set(rows) == {"en-US/1/train", "en-US/2/validation", "en-US/3/test", "de-DE/1/train", "de-DE/2/test"}
    tools_line, request, call = rows["en-US/2/validation"]["text"].split("\n")
    assert request == "Request: trains from virginia to california"
    assert json.loads(call.removeprefix("tool_call: ")) == {
        "type": "function_call", "call_id": "call_en-US_2", "name": "transport_query",
        "arguments": json.dumps({"place_name": ["virginia", "california"]}),
    }  # fmt: skip
    tools = json.loads(tools_line.removeprefix("Tools: "))
    names = [t["name"] for t in tools]
    assert 21 <= len(tools) <= 60 and len(set(names)) == len(names) and "transport_query" in names
    gold = tools[names.index("transport_query")]
    assert gold["type"] == "function" and "place_name" in gold["parameters"]["properties"]
    assert gold["parameters"]["properties"]["place_name"]["type"] == "array"
    assert names == tool_selection("transport_query", "en-US/2/validation")  # seeded: the same list every run
    greet = rows["en-US/3/test"]["text"].split("\n")
    assert greet[1] == "Request: hello there" and json.loads(json.loads(greet[2].removeprefix("tool_call: "))["arguments"]) == {}
    german = rows["de-DE/1/train"]["text"].split("\n")[1]
    assert german == "Request: weck mich um fünf uhr" + " " * 128 + "bitte"
    assert json.loads(rows["de-DE/2/test"]["text"].split("\n")[2].removeprefix("tool_call: "))["arguments"] == json.dumps(
        {"place_name": ["m\ufffdnchen"]}, ensure_ascii=False
    )
    assert {r["split"] for r in rows.values()} == {"train", "validation", "test"}


def test_massive_annotation_parsing() -> None:
    assert parse_annotation("wake me [time : five am] on [date : friday]") == [("time", "five am"), ("date", "friday")]
    assert parse_annotation("no slots at all") == []
    for broken in ("wake me [time : five am", "wake ] me", "[ : empty slot name]", "[time five]"):
        assert parse_annotation(broken) is None, broken


# --------------------------------------------------------------------------- NSF awards


def serve_nsf(web_server, years=(2019, 2020)) -> None:
    web_server.put("/nsf-api/services/v2/s3/list-files", fx.nsf_listing(years))
    for year in years:
        web_server.put(f"/nsf-s3/awards/{year}.zip", fx.zip_bytes(fx.NSF_YEARS[year]))


def test_nsf_awards_title_and_abstract_per_year(web, web_server, tmp_path) -> None:
    serve_nsf(web_server)
    web_server.fail("/nsf-s3/awards/2019.zip", "corrupt", times=1)
    use_catalog(web, tmp_path, NSF, provider={"revision": "2019-2021"})
    result, meta, frame, manifest = run(web, NSF)
    assert texts(frame) == fx.NSF_KEPT
    assert manifest["bad_rows"] == fx.NSF_DROPPED
    amounts = dict(zip(frame["source_id"].to_list(), frame["awd_amount"].to_list(), strict=True))
    assert amounts["1900001"] == 249_871.0 and amounts["2000001"] is None
    assert frame.filter(pl.col("source_id") == "1900001")["div_abbr"].item() == "CCF"
    raw = storage.read_manifest(web.metadata(result, "raw_files")["uri"])
    assert raw["missing_years"] == [2021] and raw["counters"]["awards"] == 7 and raw["counters"]["retries"] >= 1
    # presigned links carry credentials: never in manifests or logs
    secret = "X-Amz-Signature"
    assert secret not in json.dumps(raw) and secret not in run_logs(web, result)
    assert "AKIAFAKEFIXTURE" not in json.dumps(raw)


def test_nsf_expired_link_fails_at_once_without_leaking_the_signature(web, web_server, tmp_path) -> None:
    serve_nsf(web_server)
    web_server.fail("/nsf-s3/awards/2020.zip", "status", times=None, status=403)
    use_catalog(web, tmp_path, NSF, provider={"revision": "2019-2020"})
    result = web.materialize(["raw_files"], partition=NSF, raise_on_error=False)
    message = failure(result)
    assert "2020" in message and "HTTP 403" in message and "expired" in message
    assert "X-Amz-Signature" not in message and "X-Amz-Signature" not in run_logs(web, result)
    assert web_server.count("/nsf-s3/awards/2020.zip") == 1  # never retried
    # the year that succeeded is kept: the rerun fetches only the other one
    web_server.faults.clear()
    web_server.requests.clear()
    web.materialize(["raw_files"], partition=NSF)
    assert {r.path for r in web_server.requests if r.path.startswith("/nsf-s3")} == {"/nsf-s3/awards/2020.zip"}


# --------------------------------------------------------------------------- docx corpus


def test_docx_corpus_manifest_pin_and_per_document_texts(web, web_server, tmp_path) -> None:
    manifest_bytes = fx.docx_manifest()
    web_server.put("/docx-api/manifest", manifest_bytes)
    for doc, text in fx.DOCX_TEXTS.items():
        if text is not None:
            web_server.put(f"/docx/extracted/{doc}.txt", text)
    use_catalog(web, tmp_path, DOCX, provider={"sha256": hashlib.sha256(manifest_bytes).hexdigest()})
    result, meta, frame, manifest = run(web, DOCX)
    assert texts(frame) == fx.DOCX_KEPT
    assert manifest["bad_rows"] == fx.DOCX_DROPPED
    row = frame.filter(pl.col("source_id") == fx.docx_id(1)).row(0, named=True)
    assert row["url"] == f"{fx.DOCX_ORIGIN}/extracted/{fx.docx_id(1)}.txt" and row["language"] == "en"
    assert row["source"] == "superdoc-dev/docx-corpus"
    counters = storage.read_manifest(web.metadata(result, "raw_files")["uri"])["counters"]
    assert (counters["manifest_rows"], counters["duplicate_ids"], counters["invalid_manifest_lines"]) == (7, 1, 1)
    assert web_server.count("/docx/extracted/*") == len(fx.DOCX_TEXTS)  # the duplicate id is fetched once


def test_docx_corpus_changed_manifest_is_refused(web, web_server, tmp_path) -> None:
    web_server.put("/docx-api/manifest", fx.docx_manifest())  # differs from the packaged pin
    use_catalog(web, tmp_path, DOCX)
    message = failure(web.materialize(["raw_files"], partition=DOCX, raise_on_error=False))
    assert "34c7a3beae63d942a8d02dd3b49d4421acc1f351be5106b42262c192fc58fea9" in message and "provider.sha256" in message
    assert web_server.count("/docx/*") == 0


# --------------------------------------------------------------------------- GitHub Actions logs


def stage_ghalogs(pipeline) -> None:
    path = Path(pipeline.prefix) / "raw/diagnostic_logs/ghalogs/zenodo-14796970/zenodo.org/records/14796970/files/github_run_logs.zip"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(fx.zip_bytes(fx.ghalogs_members()))


def test_ghalogs_sanitized_train_partition(web, tmp_path) -> None:
    stage_ghalogs(web)
    use_catalog(web, tmp_path, GHALOGS)
    _, meta, frame, manifest = run(web, GHALOGS)
    assert manifest["bad_rows"] == fx.GHALOGS_DROPPED
    assert meta["dagster/row_count"] == 4
    by_path = dict(zip(frame["archive_path"].to_list(), frame["text"].to_list(), strict=True))
    members = fx.ghalogs_members()
    train = [name for name, data in members.items() if data and fx.spec_partition(name) == "train"]
    assert by_path[train[1]] == fx.CLEAN_LOG
    assert by_path[train[2]] == fx.EMAIL_LOG_SANITIZED
    assert by_path[train[3]] == "Compiling caf\ufffd.c\nwarning: unused variable"
    assert set(frame["partition"].to_list()) == {"train"}
    assert frame.filter(pl.col("archive_path") == train[0])["source_id"].item() == hashlib.sha256(f"ghalogs:{train[0]}".encode()).hexdigest()
    everything = "\n".join(frame["text"].to_list())
    for kind, secret in fx.SECRETS.items():
        assert secret not in everything, kind
    for person in fx.PEOPLE:
        assert person not in by_path[train[0]], person
    for marker in ("<REDACTED_AWS_ACCESS_KEY>", "<REDACTED_AWS_SECRET_KEY>", "<REDACTED_GITHUB_TOKEN>", "<REDACTED_HF_TOKEN>",
                   "<REDACTED_TOKEN>", "<REDACTED_PASSWORD>", "<REDACTED_PRIVATE_KEY>", "<REDACTED_SECRET>"):  # fmt: skip
        assert marker in by_path[train[0]], marker


@pytest.mark.parametrize(
    "line, secret",
    [
        ("key=AKIAIOSFODNN7EXAMPLE done", "AKIAIOSFODNN7EXAMPLE"),
        ("AWS_SECRET_ACCESS_KEY: 'wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY'", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
        ("push with ghp_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "ghp_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"),
        ("gho_0123456789abcdefABCDEF0123456789abcd in use", "gho_0123456789abcdefABCDEF0123456789abcd"),
        ("Authorization: token abcdef0123456789abcdef", "abcdef0123456789abcdef"),
        ("auth Bearer sk-live.0123456789/abc=", "sk-live.0123456789/abc="),
        ("-----BEGIN PRIVATE KEY-----\nMIIBVgIBADANBgkqhkiG9w0BAQEFAASCAUAwggE8AgEAAkEA\n-----END PRIVATE KEY-----", "MIIBVgIBADANBgkqhkiG9w0BAQEFAASCAUAwggE8AgEAAkEA"),
        ("-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIBkg4LVWM9nuwNSk3yByxZpYRTBnVJk5\n(log truncated)", "MHcCAQEEIBkg4LVWM9nuwNSk3yByxZpYRTBnVJk5"),
        ("clone https://bob:pa55w0rd!@git.example.com/x.git", "pa55w0rd!"),
        ("redis://:s3cretredis@cache:6379/0", "s3cretredis"),
        ("HUGGING_FACE_HUB_TOKEN hf_ZyXwVuTsRqPoNmLkJiHgFeDcBa9876543210", "hf_ZyXwVuTsRqPoNmLkJiHgFeDcBa9876543210"),
        ('{"password": "letmein-42"}', "letmein-42"),
        ("api_key=ABCDEF123456 next", "ABCDEF123456"),
        ("docker login -u ci --password-stdin < x; --token=tok_987654321", "tok_987654321"),
        ("OPENAI_API_KEY sk-proj-abcdefghijklmnopqrstuvwxyz012345", "sk-proj-abcdefghijklmnopqrstuvwxyz012345"),
        ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJlc2ln", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJlc2ln"),
    ],
)
def test_no_credential_survives_sanitization(line, secret) -> None:
    assert secret not in sanitize_log(f"step 3\n{line}\nstep 4")


def test_ghalogs_missing_archive_says_how_to_stage(web, tmp_path) -> None:
    use_catalog(web, tmp_path, GHALOGS)
    message = failure(web.materialize(["raw_files"], partition=GHALOGS, raise_on_error=False))
    assert "github_run_logs.zip does not exist" in message and web.prefix in message
    assert "https://zenodo.org/records/14796970/files/github_run_logs.zip" in message and "curl" in message


# --------------------------------------------------------------------------- pre-staged


def code_shard(rows: list[dict]) -> bytes:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("sha1_git", pa.binary()), ("sha1", pa.binary()), ("content", pa.binary()), ("present", pa.bool_())])
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), buf, compression="zstd")
    return buf.getvalue()


CODE_SHARDS = {
    "part-00000.parquet": [
        {"sha1_git": bytes.fromhex("aa" * 20), "sha1": b"x", "content": b"def main():\n    return 0\n", "present": True},
        {"sha1_git": bytes.fromhex("bb" * 20), "sha1": b"y", "content": None, "present": False},
    ],
    "part-00001.parquet": [{"sha1_git": bytes.fromhex("cc" * 20), "sha1": b"z", "content": b"s = 'caf\xe9'\n", "present": True}],
    "part-00002.parquet": [{"sha1_git": bytes.fromhex("dd" * 20), "sha1": b"w", "content": b"x = 1" + b" " * 300 + b"# end", "present": True}],
}


def test_prestaged_shards_are_verified_then_normalized_in_place(web, tmp_path) -> None:
    use_catalog(web, tmp_path, CODE_V2, provider={"expected_shards": 3})
    staged = Path(web.prefix) / "raw/nemotron-code-v2-content"
    message = failure(web.materialize(["raw_files"], partition=CODE_V2, raise_on_error=False))
    assert f"nothing is staged at {staged}" in message and "PRESTAGED.md" in message
    staged.mkdir(parents=True)
    for name in ("part-00000.parquet", "part-00002.parquet"):
        (staged / name).write_bytes(code_shard(CODE_SHARDS[name]))
    message = failure(web.materialize(["raw_files"], partition=CODE_V2, raise_on_error=False))
    assert "holds 2 shards" in message and "expected_shards is 3" in message and "missing: part-00001.parquet" in message
    assert "'nemotron_code_v2/content' section" in message
    (staged / "part-00001.parquet").write_bytes(code_shard(CODE_SHARDS["part-00001.parquet"])[:-20])
    message = failure(web.materialize(["raw_files"], partition=CODE_V2, raise_on_error=False))
    assert "not complete Parquet files: part-00001.parquet" in message
    (staged / "part-00001.parquet").write_bytes(code_shard(CODE_SHARDS["part-00001.parquet"]))
    _, meta, frame, manifest = run(web, CODE_V2)
    assert texts(frame) == {"aa" * 20: "def main():\n    return 0\n", "cc" * 20: "s = 'caf\ufffd'\n", "dd" * 20: "x = 1" + " " * 128 + "# end"}
    assert frame.columns == ["id", "text", "source_id"]  # bare
    assert manifest["bad_rows"] == {"content_missing": 1, "invalid_utf8_repaired": 1}
    assert storage.read_manifest(str(staged))["counters"]["files"] == 3


def test_missing_shard_names_follow_the_numbering() -> None:
    found = ["part-00000-of-00004.parquet", "part-00003-of-00004.parquet"]
    assert prestaged.expected_names(found, 4) == [f"part-{i:05d}-of-00004.parquet" for i in range(4)]
    assert prestaged.expected_names(["shard_1.parquet", "shard_3.parquet"], 3) == ["shard_1.parquet", "shard_2.parquet", "shard_3.parquet"]
    assert prestaged.expected_names(["a.parquet", "b.parquet"], 3) is None


# --------------------------------------------------------------------------- Hub bucket


def serve_bucket(web_server, tmp_path, monkeypatch) -> fx.BucketApi:
    scratch = tmp_path / "xet"
    scratch.mkdir()
    api = fx.BucketApi(web_server, "timodonnell/biocorpus", fx.bio_files(), str(scratch), page_size=2)
    monkeypatch.setenv("HF_ENDPOINT", web_server.base)
    return api


def test_biocorpus_bucket_snapshot_verified_and_normalized(web, web_server, tmp_path, monkeypatch) -> None:
    api = serve_bucket(web_server, tmp_path, monkeypatch)
    snapshot = api.fingerprint(list(fx.BIO_ROWS))
    web_server.fail("/buckets/timodonnell/biocorpus/resolve/data/part-000.jsonl.zst", "status", times=1, status=429)
    web_server.fail("/xet-bridge/" + api.hashes["data/part-001.jsonl.zst"], "corrupt", times=1)
    use_catalog(web, tmp_path, BIO, provider={"sha256": snapshot})
    result, meta, frame, manifest = run(web, BIO)
    assert texts(frame) == fx.BIO_KEPT
    assert manifest["counters"]["empty_dropped"] == 1 and manifest["counters"]["whitespace_compacted"] == 1
    raw = storage.read_manifest(web.metadata(result, "raw_files")["uri"])
    assert [f["path"] for f in raw["files"]] == sorted(fx.BIO_ROWS)
    assert raw["snapshot_fingerprint"] == snapshot and raw["counters"]["xet_verified"] == 2
    assert raw["counters"]["retries"] >= 2  # the 429 and the corrupted body
    assert web_server.count("/api/buckets/timodonnell/biocorpus/tree/*") == 2  # two pages of listing


def test_biocorpus_changed_bucket_is_refused(web, web_server, tmp_path, monkeypatch) -> None:
    api = serve_bucket(web_server, tmp_path, monkeypatch)
    snapshot = api.fingerprint(list(fx.BIO_ROWS))
    api.add(fx.BucketFile("data/part-002.jsonl.zst", fx.zstd(b'{"id": "new", "text": "late"}\n'), uploaded_at="2026-08-02T09:00:00Z"))
    use_catalog(web, tmp_path, BIO, provider={"sha256": snapshot})
    message = failure(web.materialize(["raw_files"], partition=BIO, raise_on_error=False))
    assert snapshot in message and "data/part-002.jsonl.zst" in message and "provider.sha256" in message
    assert web_server.count("/buckets/*") == 0 and web_server.count("/xet-bridge/*") == 0


# --------------------------------------------------------------------------- HTTP rules


def test_mirror_map_and_safe_display() -> None:
    env = {http.MIRROR_ENV: "https://a.example=http://m/a; https://a.example/deep=http://m/deep\n"}
    assert http.mirror_url("https://a.example/deep/x?q=1", env) == "http://m/deep/x?q=1"
    assert http.mirror_url("https://a.example/y", env) == "http://m/a/y"
    assert http.mirror_url("https://b.example/y", env) == "https://b.example/y"
    assert http.display_url("https://user:pw@h.example:8443/p/f.zip?X-Amz-Signature=abc#frag") == "https://h.example:8443/p/f.zip"
    with pytest.raises(ValueError, match=http.MIRROR_ENV):
        http.mirror_url("https://a", {http.MIRROR_ENV: "no-equals-sign"})


def test_gone_file_fails_at_once(web_server, monkeypatch) -> None:
    monkeypatch.setenv(http.RETRY_WAIT_ENV, "0")
    with pytest.raises(http.ProviderGoneError, match="HTTP 404"):
        http.fetch_bytes(web_server.url("/missing.bin"), what="test")
    assert web_server.count("/missing.bin") == 1
    web_server.put("/flaky.bin", os.urandom(1000))
    web_server.fail("/flaky.bin", "status", times=None, status=503)
    with pytest.raises(http.DownloadError, match="gave up after 3 attempts"):
        http.fetch_bytes(web_server.url("/flaky.bin"), what="test", policy=http.policy_from_env(http.RetryPolicy(attempts=3)))
