"""Web, API, pre-staged and bucket sources through ``raw_files`` and ``normalized``.

Each registered case of ``web_fixtures`` runs the real assets on a temporary instance against
its provider files, served from a loopback server (``MARIN_WEB_MIRROR``), held by a loopback
bucket API (``HF_ENDPOINT``) or staged under ``MARIN_PREFIX``, with faults injected on the
way; the rendered text of known rows is checked exactly and dropped rows by reason. The
other tests cover what must fail, and how.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import polars as pl
import pytest

from marin_assets.catalog.sources import load_catalog
from marin_assets.core.ingest import normalize
from marin_assets.core.ingest.providers import http, prestaged
from marin_assets.core.ingest.transforms.ghalogs import sanitize_log
from marin_assets.core.ingest.transforms.web_sources import parse_annotation
from marin_assets.core.runtime import storage
from marin_assets_tests.fixtures.pipeline import catalog_with
from marin_assets_tests.recipes import FixtureCase, fixture_builders
from marin_assets_tests.recipes import web_fixtures as fx
from marin_assets_tests.recipes.hub_bucket import BucketApi, BucketFile
from marin_assets_tests.recipes.loopback import LoopbackServer, zstd

HPLT, NSF, DOCX, GHALOGS, CODE_V2, BIO = "hplt_v3", "nsf_awards", "docx-corpus/en", "ghalogs/public", "nemotron_code_v2/content", "biocorpus"
CATALOG = load_catalog()
PLACEMENTS = fx.placements()
BUCKET_ID = "timodonnell/biocorpus"

# Faults injected while a case runs (path glob, kind, times, status) and the retries they cost at least.
FAULTS = {
    HPLT: ([(f"{fx.HPLT_DIR}/10_2.jsonl.zst", "status", 2, 429), (f"{fx.HPLT_DIR}/10_2.jsonl.zst", "cut", 1, 0),
            (f"{fx.HPLT_DIR}/10_3.jsonl.zst", "corrupt", 1, 0)], 4),
    NSF: ([("/nsf-s3/awards/2019.zip", "corrupt", 1, 0), ("/nsf-api/*", "status", 1, 503)], 2),
    DOCX: ([(f"/docx/extracted/{fx.docx_id(1)}.txt", "cut", 1, 0)], 1),
    "massive_function_calling": ([(fx.MASSIVE_PATH, "cut", 1, 0)], 1),
    BIO: ([(f"/buckets/{BUCKET_ID}/resolve/data/part-000.jsonl.zst", "status", 1, 429), ("/xet-bridge/*", "corrupt", 1, 0)], 2),
}  # fmt: skip


@pytest.fixture
def web_server():
    server = LoopbackServer().start()
    yield server
    server.stop()


@pytest.fixture
def web(pipeline, web_server, monkeypatch):
    """The pipeline with every web/API origin mirrored to the loopback server, and no retry waits."""
    base = web_server.base
    mirrors = {fx.HPLT_ORIGIN: "/hplt", fx.MASSIVE_ORIGIN: "/massive", fx.NSF_API_ORIGIN: "/nsf-api",
               fx.NSF_S3_ORIGIN: "/nsf-s3", fx.DOCX_API_ORIGIN: "/docx-api", fx.DOCX_ORIGIN: "/docx"}  # fmt: skip
    monkeypatch.setenv("MARIN_WEB_MIRROR", ";".join(f"{origin}={base}{path}" for origin, path in mirrors.items()))
    monkeypatch.setenv("MARIN_RETRY_WAIT_S", "0")
    monkeypatch.setenv("HF_ENDPOINT", base)  # settings the resource reads when a step runs
    return pipeline


def case_of(name: str) -> FixtureCase:
    return fixture_builders()[name](CATALOG.by_name(name))


def place(pipeline, web_server, tmp_path: Path, name: str, case: FixtureCase, edit: dict | None = None) -> BucketApi | None:
    """Serve, stage or hold the case's files and point the pipeline at a catalog scaled to them."""
    placement = PLACEMENTS[name]
    edit = edit if edit is not None else dict(placement.edit)
    pipeline.catalog_path = str(catalog_with(tmp_path / "catalog.toml", keep=[name], edit={name: edit} if edit else None))
    if placement.where == "served":
        for path, data in case.files.items():
            web_server.put(path, data)
    elif placement.where == "staged":
        for path, data in case.files.items():
            target = Path(pipeline.prefix) / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    else:
        scratch = tmp_path / "xet"
        scratch.mkdir(exist_ok=True)
        return BucketApi(web_server, BUCKET_ID, [BucketFile(p, d) for p, d in case.files.items()], str(scratch))
    return None


def failure(result) -> str:
    assert not result.success, "the step should have failed"
    events = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    error = events[0].event_specific_data.error
    return str(error.message) + str(error.cause)


def run_logs(pipeline, result) -> str:
    return "\n".join(e.user_message or "" for e in pipeline.instance.all_logs(result.run_id))


def check_case(name: str, case: FixtureCase, frame: pl.DataFrame, manifest: dict) -> None:
    assert frame.columns[:3] == ["id", "text", "source_id"], name
    assert manifest["bad_rows"] == dict(case.bad_rows), name
    for key, value in case.counters.items():
        assert manifest["counters"][key] == value, (name, key)
    assert manifest["rows"] == case.rows == frame.height, name
    for source_id, text in case.texts.items():
        match = frame.filter(pl.col("source_id").is_null() if source_id is None else pl.col("source_id") == source_id)
        assert match["text"].to_list() == [text], (name, source_id)
    assert set(case.columns) <= set(frame.columns), (name, frame.columns)
    assert not set(case.absent_columns) & set(frame.columns), (name, frame.columns)
    if case.check is not None:
        case.check(frame)


@pytest.mark.system  # every web source through the assets; `make test` runs them
@pytest.mark.parametrize("name", sorted(PLACEMENTS), ids=lambda n: n.replace("/", "_"))
def test_fixture_through_assets(web, web_server, tmp_path, name) -> None:
    case = case_of(name)
    place(web, web_server, tmp_path, name, case)
    faults, min_retries = FAULTS.get(name, ([], 0))
    for pattern, kind, times, status in faults:
        web_server.fail(pattern, kind, times=times, status=status, headers={"Retry-After": "0"})
    result = web.materialize(["raw_files", "normalized"], partition=name)
    meta = web.metadata(result, "normalized")
    check_case(name, case, normalize.read_normalized(meta["uri"]), storage.read_manifest(meta["uri"]))
    raw = web.metadata(result, "raw_files")
    assert raw.get("retries", 0) >= min_retries, (name, raw)
    # a rerun reuses the raw copy and the normalized shards, without a request
    before = len(web_server.requests)
    again = web.materialize(["raw_files", "normalized"], partition=name)
    assert web.metadata(again, "raw_files")["reused"] and web.metadata(again, "normalized")["reused"]
    assert len(web_server.requests) == before


def test_every_web_api_staged_and_bucket_entry_has_a_fixture() -> None:
    wanted = {s.name for s in CATALOG if s.provider.kind != "hf" or s.provider.repo_type == "bucket"}
    assert wanted == set(PLACEMENTS) and wanted <= set(fixture_builders())


# --------------------------------------------------------------------------- what must fail


def test_hplt_selection_must_match_the_expected_shard_count(web, web_server, tmp_path) -> None:
    edit = {"provider": {**fx.HPLT_EDIT["provider"], "expected_shards": 5}}
    place(web, web_server, tmp_path, HPLT, case_of(HPLT), edit)
    message = failure(web.materialize(["raw_files"], partition=HPLT, raise_on_error=False))
    assert "74 (tier 5) + 3 (tier 10) = 4 shards" in message and "expected_shards is 5" in message
    assert not web_server.requests


def test_hplt_excludes_select_single_shards(web, web_server, tmp_path) -> None:
    place(web, web_server, tmp_path, HPLT, case_of(HPLT))
    web.materialize(["raw_files"], partition=HPLT)
    fetched = sorted({r.path.rsplit("/", 1)[-1] for r in web_server.requests})
    assert fetched == ["10_1.jsonl.zst", "10_2.jsonl.zst", "10_3.jsonl.zst", "5_1.jsonl.zst"]


def test_nsf_links_never_leak_and_missing_years_are_reported(web, web_server, tmp_path) -> None:
    place(web, web_server, tmp_path, NSF, case_of(NSF))
    result = web.materialize(["raw_files"], partition=NSF)
    raw = storage.read_manifest(web.metadata(result, "raw_files")["uri"])
    assert raw["missing_years"] == [2021] and raw["counters"]["awards"] == 7
    text = str(raw) + run_logs(web, result)
    assert "X-Amz-Signature" not in text and "AKIAFAKEFIXTURE" not in text


def test_nsf_expired_link_fails_at_once_without_leaking_the_signature(web, web_server, tmp_path) -> None:
    place(web, web_server, tmp_path, NSF, case_of(NSF), {"provider": {"revision": "2019-2020"}})
    web_server.fail("/nsf-s3/awards/2020.zip", "status", times=None, status=403)
    result = web.materialize(["raw_files"], partition=NSF, raise_on_error=False)
    message = failure(result)
    assert "year 2020" in message and "HTTP 403" in message and "expired" in message
    assert "X-Amz-Signature" not in message and "X-Amz-Signature" not in run_logs(web, result)
    assert web_server.count("/nsf-s3/awards/2020.zip") == 1  # never retried
    # the year that succeeded is kept: the rerun fetches only the other one
    web_server.faults.clear()
    web_server.requests.clear()
    web.materialize(["raw_files"], partition=NSF)
    assert {r.path for r in web_server.requests if r.path.startswith("/nsf-s3")} == {"/nsf-s3/awards/2020.zip"}


def test_docx_corpus_changed_manifest_is_refused(web, web_server, tmp_path) -> None:
    place(web, web_server, tmp_path, DOCX, case_of(DOCX), {})  # the packaged pin, not the fixture's manifest
    message = failure(web.materialize(["raw_files"], partition=DOCX, raise_on_error=False))
    assert "34c7a3beae63d942a8d02dd3b49d4421acc1f351be5106b42262c192fc58fea9" in message and "provider.sha256" in message
    assert web_server.count("/docx/*") == 0


def test_docx_duplicates_and_bad_manifest_lines_are_counted(web, web_server, tmp_path) -> None:
    place(web, web_server, tmp_path, DOCX, case_of(DOCX))
    result = web.materialize(["raw_files"], partition=DOCX)
    counters = storage.read_manifest(web.metadata(result, "raw_files")["uri"])["counters"]
    assert (counters["manifest_rows"], counters["duplicate_ids"], counters["invalid_manifest_lines"], counters["not_found"]) == (7, 1, 1, 1)
    assert web_server.count("/docx/extracted/*") == len(fx.DOCX_TEXTS)  # the duplicate id is fetched once


def test_ghalogs_missing_archive_says_how_to_stage(web, tmp_path) -> None:
    web.catalog_path = str(catalog_with(tmp_path / "catalog.toml", keep=[GHALOGS]))
    message = failure(web.materialize(["raw_files"], partition=GHALOGS, raise_on_error=False))
    assert "github_run_logs.zip does not exist" in message and web.prefix in message
    assert "https://zenodo.org/records/14796970/files/github_run_logs.zip" in message and "curl" in message


def test_prestaged_says_what_is_missing_or_broken(web, web_server, tmp_path) -> None:
    case = case_of(CODE_V2)
    staged = Path(web.prefix) / CATALOG.by_name(CODE_V2).provider.staged_path
    place(web, web_server, tmp_path, CODE_V2, FixtureCase(files={}, rows=0))
    message = failure(web.materialize(["raw_files"], partition=CODE_V2, raise_on_error=False))
    assert f"nothing is staged at {staged}" in message and "PRESTAGED.md" in message
    files = {Path(p).name: d for p, d in case.files.items()}
    staged.mkdir(parents=True)
    for name in ("part-00000.parquet", "part-00002.parquet"):
        (staged / name).write_bytes(files[name])
    message = failure(web.materialize(["raw_files"], partition=CODE_V2, raise_on_error=False))
    assert "holds 2 shards" in message and "expected_shards is 3" in message and "missing: part-00001.parquet" in message
    assert "'nemotron_code_v2/content' section" in message
    (staged / "part-00001.parquet").write_bytes(files["part-00001.parquet"][:-20])
    message = failure(web.materialize(["raw_files"], partition=CODE_V2, raise_on_error=False))
    assert "not complete Parquet files: part-00001.parquet" in message
    (staged / "part-00001.parquet").write_bytes(files["part-00001.parquet"])
    result = web.materialize(["raw_files", "normalized"], partition=CODE_V2)
    assert web.metadata(result, "normalized")["dagster/row_count"] == case.rows
    assert storage.read_manifest(str(staged))["counters"]["files"] == 3


def test_missing_shard_names_follow_the_numbering() -> None:
    found = ["part-00000-of-00004.parquet", "part-00003-of-00004.parquet"]
    assert prestaged.expected_names(found, 4) == [f"part-{i:05d}-of-00004.parquet" for i in range(4)]
    assert prestaged.expected_names(["shard_1.parquet", "shard_3.parquet"], 3) == ["shard_1.parquet", "shard_2.parquet", "shard_3.parquet"]
    assert prestaged.expected_names(["a.parquet", "b.parquet"], 3) is None


def test_biocorpus_changed_bucket_is_refused(web, web_server, tmp_path) -> None:
    api = place(web, web_server, tmp_path, BIO, case_of(BIO))
    assert api is not None
    late = BucketFile("data/part-002.jsonl.zst", zstd(b'{"id": "new", "text": "late"}\n'), uploaded_at="2026-08-02T09:00:00Z")
    api.add(late)
    message = failure(web.materialize(["raw_files"], partition=BIO, raise_on_error=False))
    pinned = PLACEMENTS[BIO].edit["provider"]["sha256"]
    assert pinned in message and "data/part-002.jsonl.zst" in message and "provider.sha256" in message
    assert web_server.count("/buckets/*") == 0 and web_server.count("/xet-bridge/*") == 0


# --------------------------------------------------------------------------- pure rules


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


def test_people_are_pseudonymized_but_ci_accounts_stay() -> None:
    assert sanitize_log(fx.EMAIL_LOG) == fx.EMAIL_LOG_SANITIZED
    assert sanitize_log(fx.CLEAN_LOG) == fx.CLEAN_LOG
    assert sanitize_log(r"C:\Users\mkowalski\src> mkowalski ran it") == r"C:\Users\<USER_0>\src> <USER_0> ran it"


def test_massive_annotation_parsing() -> None:
    assert parse_annotation("wake me [time : five am] on [date : friday]") == [("time", "five am"), ("date", "friday")]
    assert parse_annotation("no slots at all") == []
    for broken in ("wake me [time : five am", "wake ] me", "[ : empty slot name]", "[time five]"):
        assert parse_annotation(broken) is None, broken


def test_mirror_map_and_safe_display() -> None:
    mirrors = http.parse_mirrors("https://a.example=http://m/a; https://a.example/deep=http://m/deep\n")
    assert http.mirror_url("https://a.example/deep/x?q=1", mirrors) == "http://m/deep/x?q=1"
    assert http.mirror_url("https://a.example/y", mirrors) == "http://m/a/y"
    assert http.mirror_url("https://b.example/y", mirrors) == "https://b.example/y"
    assert http.mirror_url("https://a.example/y") == "https://a.example/y"
    assert http.display_url("https://user:pw@h.example:8443/p/f.zip?X-Amz-Signature=abc#frag") == "https://h.example:8443/p/f.zip"
    with pytest.raises(ValueError, match=http.MIRROR_ENV):
        http.parse_mirrors("no-equals-sign")


def test_gone_file_fails_at_once_and_retries_run_out(web_server) -> None:
    no_wait = http.policy_with_wait(0)
    with pytest.raises(http.ProviderGoneError, match="HTTP 404"):
        http.fetch_bytes(web_server.url("/missing.bin"), what="test", policy=no_wait)
    assert web_server.count("/missing.bin") == 1
    web_server.put("/flaky.bin", os.urandom(1000))
    web_server.fail("/flaky.bin", "status", times=None, status=503)
    with pytest.raises(http.DownloadError, match="gave up after 3 attempts"):
        http.fetch_bytes(web_server.url("/flaky.bin"), what="test", policy=http.policy_with_wait(0, http.RetryPolicy(attempts=3)))
    assert web_server.count("/flaky.bin") == 3
    body = os.urandom(5000)
    web_server.put("/pinned.bin", body)
    with pytest.raises(http.IntegrityError, match="sha256 mismatch"):
        http.fetch_bytes(web_server.url("/pinned.bin"), what="test", expected_sha256="0" * 64, policy=no_wait)
    data, fetched = http.fetch_bytes(web_server.url("/pinned.bin"), what="test", expected_size=5000, policy=no_wait)
    assert data == body and fetched.size == 5000


def test_drift_checks_of_web_and_bucket_pins(web, web_server, tmp_path) -> None:
    from marin_assets.catalog.sources import load_catalog as load
    from marin_assets.core.ingest.providers import pins

    layout = storage.Layout(web.prefix)
    access = dataclasses.replace(web.resource.provider_access(), policy=pins.QUICK)  # the settings, as the drift sensor builds them
    api = place(web, web_server, tmp_path, BIO, case_of(BIO))
    bio = load(web.catalog_path).by_name(BIO)
    assert pins.check_pin(bio, layout, access=access)[0] == pins.OK
    api.add(BucketFile("data/part-009.jsonl.zst", b"late"))
    status, detail = pins.check_pin(bio, layout, access=access)
    assert status == pins.REVISION_GONE and bio.provider.sha256 in detail
    place(web, web_server, tmp_path, DOCX, case_of(DOCX), {})  # the packaged pin, another manifest served
    assert pins.check_pin(load(web.catalog_path).by_name(DOCX), layout, access=access)[0] == pins.REVISION_GONE
    place(web, web_server, tmp_path, HPLT, case_of(HPLT))
    assert pins.check_pin(load(web.catalog_path).by_name(HPLT), layout, access=access)[0] == pins.OK
    del web_server.files[f"{fx.HPLT_DIR}/10_3.jsonl.zst"]
    assert pins.check_pin(load(web.catalog_path).by_name(HPLT), layout, access=access)[0] == pins.REVISION_GONE
    web.catalog_path = str(catalog_with(tmp_path / "catalog.toml", keep=[GHALOGS]))
    status, detail = pins.check_pin(load(web.catalog_path).by_name(GHALOGS), layout, access=access)
    assert status == pins.UNKNOWN and "not staged" in detail


def test_log_chunks_are_contiguous_and_bounded() -> None:
    import zipfile

    from marin_assets.core.ingest.providers.ghalogs import plan_chunks

    members = []
    for i, size in enumerate([40, 70, 10, 200, 5, 5, 90]):
        info = zipfile.ZipInfo(f"m{i}")
        info.file_size = size
        members.append(info)
    assert plan_chunks(members, 100) == [(0, 1), (1, 3), (3, 4), (4, 7)]
    assert plan_chunks(members, 10_000) == [(0, 7)]
