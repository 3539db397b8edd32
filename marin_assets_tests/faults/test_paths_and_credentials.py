"""Items 1-3: provider paths stay inside their destination, tokens stay on their host, names stay under the prefix."""

from __future__ import annotations

import dataclasses

import pytest

from marin_assets.catalog.sources import CatalogError, Provider, Source, parse_catalog
from marin_assets.core.ingest import hub
from marin_assets.core.ingest.providers import ProviderAccess, hf_bucket, http, prestaged
from marin_assets import errors
from marin_assets.core.runtime import storage, trust
from marin_assets.core.runtime.retry import RetryPolicy
from marin_assets.core.specs import NORMALIZED
from marin_assets.defs.resources import MarinResource
from marin_assets_tests.faults.conftest import TOKEN
from marin_assets_tests.faults.hostile import SHA

ESCAPE = "../../../../outside/X"
FAST = RetryPolicy(attempts=3, base_wait_s=0, min_wait_s=0, max_jitter_s=0, rate_limit_margin_s=0, sleep=lambda s: None)


def access() -> ProviderAccess:
    """How the pipeline reaches providers, built by the settings from what the fixtures set
    (``HF_ENDPOINT``, ``HF_TOKEN``, ``MARIN_STAGING_DIR``), with waits of zero."""
    return dataclasses.replace(MarinResource().provider_access(), policy=FAST)


def bucket_source(repo_id: str = "evil/bucket") -> Source:
    provider = Provider(kind="hf", repo_id=repo_id, revision="2026-01-01", repo_type="bucket", share_key="bucket")
    return Source(name="evilbucket", family="evil", rough_tokens_b=1.0, license="", notes="", gated=False, fuzzy_exempt=False,
                  input_format="jsonl", text_field="text", id_field="id", transform=None, bare=False, exact_dedup=True,
                  provider=provider)  # fmt: skip


# --------------------------------------------------------------------------- item 1: traversal from listings


@pytest.mark.parametrize("entry", [ESCAPE, "/etc/evil", "data/../../../../../outside/Y", "data\\..\\..\\x"])
def test_hub_tree_listing_cannot_write_outside_the_destination(world, hostile, entry):
    hostile.files = {"data/ok.jsonl": b'{"text": "fine"}\n', entry: b"attacker bytes"}
    world.inject()
    dest = storage.Layout(str(world.root)).raw("evil__corpus", SHA)
    with pytest.raises(trust.UnsafePathError, match=r"entry .*refusing") as caught:
        hub.download_snapshot("evil/corpus", SHA, None, None, dest, FAST, staging_dir=str(world.staging))
    assert repr(entry) in str(caught.value)
    assert isinstance(caught.value, errors.IntegrityFailure)
    assert not (world.path / "outside").exists()


def test_hub_bucket_listing_cannot_write_outside_the_destination(world, hostile):
    hostile.files = {"data/part-0.jsonl": b'{"text": "fine"}\n', ESCAPE: b"attacker bytes"}
    world.inject()
    with pytest.raises(trust.UnsafePathError, match="outside/X"):
        hf_bucket.fetch(bucket_source(), storage.Layout(str(world.root)), access=access())
    assert not (world.path / "outside").exists()


def test_raw_manifest_entries_are_checked_too(world):
    from marin_assets.catalog.sources import load_catalog
    from marin_assets.core.ingest import raw as ingest

    source = load_catalog().by_name("cp/peps")
    world.inject()
    raw = {"uri": str(world.root / "raw" / "x"), "files": [{"path": "peps/../../../../../../outside/p.json.gz"}]}
    with pytest.raises(trust.UnsafePathError):
        ingest.source_inputs(source, raw)


# --------------------------------------------------------------------------- item 2: credentials stay home


def test_bucket_pagination_link_to_another_host_gets_no_token(world, hostile, elsewhere):
    hostile.files = {"data/part-0.jsonl": b'{"text": "fine"}\n'}
    hostile.bucket_next = f"{elsewhere.base}/api/buckets/evil/bucket/tree?cursor=2"
    world.inject()
    listed = hf_bucket.list_bucket(bucket_source(), access=access(), counters=http.FetchCounters())
    assert [f["path"] for f in listed] == ["data/part-0.jsonl"]
    assert len(elsewhere.seen) == 1, "the link was followed"
    assert elsewhere.credentials_seen() == []
    assert any(s.authorization == f"Bearer {TOKEN}" for s in hostile.seen), "the token still goes to its own host"


def test_bucket_file_redirect_to_another_host_gets_no_token(world, hostile, elsewhere):
    body = b'{"text": "redirected"}\n'
    hostile.files = {"data/part-0.jsonl": body}
    elsewhere.files["/bridge/part-0"] = body
    hostile.redirect["data/part-0.jsonl"] = f"{elsewhere.base}/bridge/part-0"
    world.inject()
    manifest = hf_bucket.fetch(bucket_source(), storage.Layout(str(world.root)), access=access())
    assert storage.read_bytes(storage.join(manifest["uri"], "data/part-0.jsonl")) == body
    assert elsewhere.credentials_seen() == [] and len(elsewhere.seen) == 1


def test_hub_file_redirect_to_another_host_gets_no_token(world, hostile, elsewhere):
    body = b'{"text": "redirected"}\n'
    hostile.files = {"data/a.jsonl": body}
    elsewhere.files["/cdn/a"] = body
    hostile.redirect["data/a.jsonl"] = f"{elsewhere.base}/cdn/a"
    world.inject()
    dest = storage.Layout(str(world.root)).raw("evil__corpus", SHA)
    manifest = hub.download_snapshot("evil/corpus", SHA, None, None, dest, FAST, staging_dir=str(world.staging))
    assert [f["path"] for f in manifest["files"]] == ["data/a.jsonl"]
    assert elsewhere.credentials_seen() == [] and len(elsewhere.seen) == 1


def test_same_origin_means_scheme_host_and_port():
    home = "https://huggingface.co"
    assert trust.same_origin("https://huggingface.co:443/api/x", home)
    assert not trust.same_origin("http://huggingface.co/api/x", home)
    assert not trust.same_origin("https://huggingface.co:8443/api/x", home)
    assert not trust.same_origin("https://huggingface.co.evil.example/api", home)
    headers = {"Authorization": "Bearer t", "User-Agent": "x"}
    assert trust.credentials_for("https://evil.example/x", home, headers) == {"User-Agent": "x"}


# --------------------------------------------------------------------------- item 3: names under the prefix

ENTRY = """
[[source]]
name = "{name}"
family = "evil"
rough_tokens_b = 1.0
input_format = "jsonl"
[source.provider]
kind = "hf"
repo_id = "evil/corpus"
revision = "0123456"
"""


@pytest.mark.parametrize("name", ["../../outside", "cp/../../x", "/abs", "a/./b", "x?y", "a#b", "a*b", "a%2e", "a\\b", "a//b", "-x"])
def test_catalog_names_that_leave_the_prefix_are_refused(world, name):
    import tomllib

    world.inject()
    with pytest.raises(CatalogError, match="field 'name'") as caught:
        parse_catalog(tomllib.loads(ENTRY.format(name=name.replace("\\", "\\\\"))), known_transforms=())
    assert isinstance(caught.value, errors.ConfigurationError)


def test_every_layout_path_is_checked_under_the_prefix(world):
    layout = storage.Layout(str(world.root))
    world.inject(3)
    for make in (lambda: NORMALIZED.output_uri(layout, "../../../escape", "fp"), lambda: layout.raw("../../k", "rev"),
                 lambda: layout.staged("../../../../outside")):  # fmt: skip
        with pytest.raises(trust.OutsidePrefixError, match="not under the data root"):
            make()
    assert NORMALIZED.output_uri(layout, "cp/peps", "fp").startswith(str(world.root))


def test_hub_tree_pagination_link_to_another_host_gets_no_token(world, hostile, elsewhere):
    hostile.files = {"data/a.jsonl": b'{"text": "listed"}\n'}
    hostile.tree_next = f"{elsewhere.base}/api/datasets/evil/corpus/tree/{SHA}?cursor=2"
    world.inject()
    files = hub.list_files("evil/corpus", SHA, policy=FAST)
    assert [f.path for f in files] == ["data/a.jsonl"]
    assert elsewhere.credentials_seen() == []


# --------------------------------------------------------------------------- links out of a local folder


def staged_source(staged_path: str, shards: int) -> Source:
    provider = Provider(kind="prestaged", staged_path=staged_path, expected_shards=shards, allow=("**/*.parquet",))
    return dataclasses.replace(bucket_source(), name="evilstaged", input_format="parquet", provider=provider)


def parquet_file(path) -> None:
    import polars as pl

    path.parent.mkdir(parents=True, exist_ok=True)
    pl.DataFrame({"id": ["x"], "text": ["from outside the prefix"]}).write_parquet(path)


@pytest.mark.parametrize("linked", ["file", "folder"])
def test_a_staged_shard_linked_from_outside_the_folder_is_refused(world, linked):
    layout = storage.Layout(str(world.root))
    staged = world.root / "staged" / "evil"
    parquet_file(staged / "part-00000.parquet")
    outside = world.scratch / "elsewhere"
    parquet_file(outside / "part-00001.parquet")
    link = staged / "part-00001.parquet" if linked == "file" else staged / "more"
    link.symlink_to(outside / "part-00001.parquet" if linked == "file" else outside)
    world.inject()
    with pytest.raises(trust.UnsafePathError) as caught:
        prestaged.verify(staged_source("staged/evil", 2), layout)
    message = str(caught.value)
    assert f"'{link}' is a link to '{outside}" in message and "outside" in message and "evilstaged" in message
    assert isinstance(caught.value, errors.IntegrityFailure)


def test_a_raw_file_linked_from_outside_its_copy_is_not_read(world):
    from marin_assets.core.ingest import raw as ingest

    copy = world.root / "raw" / "evil"
    parquet_file(copy / "data" / "a.parquet")
    parquet_file(world.scratch / "secret.parquet")
    (copy / "data" / "b.parquet").symlink_to(world.scratch / "secret.parquet")
    manifest = {"uri": str(copy), "files": [{"path": "data/a.parquet"}, {"path": "data/b.parquet"}]}
    world.inject()
    with pytest.raises(trust.UnsafePathError, match=r"b\.parquet' is a link to '.*secret\.parquet'"):
        ingest.source_inputs(staged_source("raw/evil", 2), manifest)
    (copy / "data" / "b.parquet").unlink()
    (copy / "data" / "b.parquet").symlink_to(copy / "data" / "a.parquet")  # a link that stays inside is read
    assert ingest.source_inputs(staged_source("raw/evil", 2), manifest) == [str(copy / "data" / n) for n in ("a.parquet", "b.parquet")]
