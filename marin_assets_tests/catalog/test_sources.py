"""The source catalog: it matches the reference table, validates strictly and is re-read on every load."""

from __future__ import annotations

import csv
import json
import math
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from marin_assets.catalog import sources as sources_module
from marin_assets.catalog import (
    CatalogError,
    default_catalog_path,
    format_sources_table,
    load_catalog,
)
from marin_assets.core.ingest.formats import CATALOG_FORMATS

REFERENCE = Path(__file__).with_name("reference_sources.tsv")
PACKAGED = Path(sources_module.__file__).with_name("sources.toml")


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


@pytest.fixture(scope="module")
def reference() -> dict[str, dict[str, str]]:
    with REFERENCE.open(newline="") as handle:
        return {row["name"]: row for row in csv.DictReader(handle, delimiter="\t")}


# ----------------------------------------------------------------------------- the packaged catalog


def test_catalog_has_the_reference_entries_in_name_order(catalog, reference):
    assert len(catalog) == 146
    assert set(catalog.names) == set(reference)
    assert list(catalog.names) == sorted(reference)
    assert [s.name for s in catalog] == list(catalog.names)


def test_pins_and_token_counts_match_the_reference(catalog, reference):
    for name, row in reference.items():
        source = catalog.by_name(name)
        provider = source.provider
        assert provider.kind == row["provider_kind"], name
        assert math.isclose(source.rough_tokens_b, float(row["rough_token_count_b"]), rel_tol=0, abs_tol=1e-9), name
        if provider.kind == "hf":
            hub_id = ("buckets/" if provider.repo_type == "bucket" else "") + provider.repo_id
            assert hub_id == row["hf_repo_id"], name
            assert provider.revision == row["revision"], name
        else:
            assert not row["hf_repo_id"] and not provider.repo_id, name


def test_totals(catalog):
    assert round(catalog.total_tokens_b, 2) == 24478.21
    assert catalog.by_name("ghalogs/public").rough_tokens_b == 150.0
    by_kind: dict[str, float] = {}
    for source in catalog:
        by_kind[source.provider.kind] = by_kind.get(source.provider.kind, 0.0) + source.rough_tokens_b
    assert {k: round(v, 2) for k, v in by_kind.items()} == {
        "hf": 23067.49, "prestaged": 634.96, "web": 774.09, "api": 1.67,
    }


def test_names_are_valid_dagster_partition_keys(catalog):
    from dagster import StaticPartitionsDefinition

    partitions = StaticPartitionsDefinition(list(catalog.names))
    assert partitions.get_partition_keys() == list(catalog.names)


def test_nemotron_library_families_share_one_download_each(catalog):
    nemotron = [s for s in catalog if s.family == "nemotron_v2"]
    assert len(nemotron) == 52
    by_key: dict[str, set[tuple[str, str]]] = {}
    for source in nemotron:
        by_key.setdefault(source.provider.share_key, set()).add((source.provider.repo_id, source.provider.revision))
    # One share key per library family, and each key is exactly one repo@revision.
    assert len(by_key) == 10
    assert all(len(pins) == 1 for pins in by_key.values())
    sizes = {key: len(group) for key, group in catalog.share_groups().items() if key in by_key}
    assert sizes == {
        "nemotron_cc_v2": 6, "nemotron_cc_v2_1": 9, "nemotron_cc_code_v1": 1, "nemotron_cc_math_v1": 2,
        "nemotron_pretraining_code_v2": 5, "nemotron_pretraining_sft_v1": 3,
        "nemotron_pretraining_specialized_v1": 6, "nemotron_pretraining_specialized_v1_1": 5,
        "nemotron_pretraining_specialized_v1_2": 4, "nemotron_pretraining_legal_v1": 11,
    }
    # A shared download fetches the same files for every member; the subset is chosen by subdir.
    for key in by_key:
        group = catalog.share_groups()[key]
        assert len({(s.provider.allow, s.provider.exclude, s.provider.staged_path) for s in group}) == 1
        assert len({s.provider.subdir for s in group}) == len(group)
    assert all(s.gated for s in nemotron)


def test_only_the_documented_families_share_downloads(catalog):
    shared = {key for key, group in catalog.share_groups().items() if len(group) > 1}
    families = {s.family for key in shared for s in catalog.share_groups()[key]}
    assert families == {"nemotron_v2", "safety_pretraining"}
    # Same repo, separate downloads: each of these keeps its own share key.
    for name in ("finepdfs/deu_Latn", "starcoder2/ir_cpp", "biocollection/free_text_stream", "davinci-dev/env-native"):
        assert catalog.by_name(name).provider.share_key == name


def test_fuzzy_exemptions(catalog):
    exempt = {s.name for s in catalog if s.fuzzy_exempt}
    assert len(exempt) == 16
    assert {
        "biocorpus", "biocollection/free_text_stream", "biocollection/instruction_stream",
        "massive_function_calling", "swe-rebench-contree",
    } <= exempt
    assert all(catalog.by_name(n).family == "nemotron_v2" for n in exempt - {
        "biocorpus", "biocollection/free_text_stream", "biocollection/instruction_stream",
        "massive_function_calling", "swe-rebench-contree",
    })


def test_prestaged_code_content_is_bare_without_exact_dedup(catalog):
    for name, shards in (("nemotron_code_v1/content", 514), ("nemotron_code_v2/content", 133)):
        source = catalog.by_name(name)
        assert (source.bare, source.exact_dedup, source.text_field, source.id_field) == (True, False, "content", "sha1_git")
        assert source.provider.expected_shards == shards
    focus = catalog.by_name("common-crawl-focus-2026-22")
    assert focus.exact_dedup and focus.provider.expected_shards == 4573 and focus.id_field == "source_id"
    assert catalog.by_name("dolma4pdfs").bare


def test_schema_details_from_the_reference(catalog):
    assert catalog.by_name("biocorpus").provider.repo_type == "bucket"
    assert catalog.by_name("finetranslations").id_field is None
    assert catalog.by_name("cp/biodiversity").transform == "biodiversity_pages"
    assert catalog.by_name("cp/pubmed").transform is None
    code_v2 = [s for s in catalog if s.name.startswith("nemotron_code_v2/synthetic_")]
    assert len(code_v2) == 5 and all(s.text_field == "content" for s in code_v2)
    assert catalog.by_name("swe-rebench-contree").provider.exclude == ("metadata/licenses.parquet",)
    for source in catalog:
        if source.provider.kind == "hf" and source.provider.repo_type == "dataset":
            assert len(source.provider.revision) in (7, 40)


def test_families_group_all_sources(catalog):
    families = catalog.families()
    assert list(families) == sorted(families)
    assert sum(len(group) for group in families.values()) == len(catalog)
    assert len(families["common_pile"]) == 26 and len(families["finepdfs"]) == 19


def test_format_sources_table(catalog):
    table = format_sources_table(catalog).splitlines()
    assert len(table) == 1 + 146 + 1
    pubmed = next(line for line in table if line.startswith("cp/pubmed "))
    assert "hf" in pubmed and "common-pile/pubmed_filtered@c156f05" in pubmed and "38.080" in pubmed
    assert "146 sources" in table[-1] and "24,478.21" in table[-1]


def test_recipe_fingerprint_tracks_only_build_inputs(catalog):
    source = catalog.by_name("coderforge")
    recipe = source.recipe_fingerprint()
    json.dumps(recipe)  # plain data
    assert recipe["provider"]["revision"] == "060fca9"
    assert recipe["transform"] == "coderforge_trajectory"
    assert recipe == load_catalog().by_name("coderforge").recipe_fingerprint()
    flat = json.dumps(recipe)
    for descriptive in (str(source.rough_tokens_b), source.notes):
        assert descriptive not in flat


# ----------------------------------------------------------------------------- loading and validation

MINIMAL = """
[[source]]
name = "cp/pubmed"
family = "common_pile"
rough_tokens_b = 38.08
input_format = "json.gz"
[source.provider]
kind = "hf"
repo_id = "common-pile/pubmed_filtered"
revision = "c156f05"
"""


def _write(tmp_path: Path, text: str, name: str = "catalog.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_minimal_entry_gets_documented_defaults(tmp_path):
    source = load_catalog(_write(tmp_path, MINIMAL)).by_name("cp/pubmed")
    assert (source.text_field, source.id_field, source.transform) == ("text", "id", None)
    assert source.exact_dedup and not source.bare and not source.gated and not source.fuzzy_exempt
    assert source.provider.repo_type == "dataset"
    assert source.provider.share_key == "cp/pubmed"
    assert source.max_dup_removal == 0.5


def test_a_source_may_raise_its_removal_limit_without_changing_its_recipe(tmp_path):
    plain = load_catalog(_write(tmp_path, MINIMAL)).by_name("cp/pubmed")
    raised = load_catalog(_write(tmp_path, MINIMAL.replace('family = "common_pile"', 'family = "common_pile"\nmax_dup_removal = 0.9'))).by_name("cp/pubmed")
    assert raised.max_dup_removal == 0.9
    assert raised.recipe_fingerprint() == plain.recipe_fingerprint()  # a check's limit rebuilds nothing


def test_another_catalog_file_is_reread_on_every_call_and_the_environment_is_ignored(tmp_path, monkeypatch):
    path = _write(tmp_path, MINIMAL)
    assert load_catalog(path).names == ("cp/pubmed",)
    path.write_text(MINIMAL.replace("c156f05", "1234567"))
    edited = load_catalog(path).by_name("cp/pubmed")
    assert edited.provider.revision == "1234567"
    # The catalog layer reads no environment: MARIN_CATALOG is a setting of the Dagster resource.
    monkeypatch.setenv("MARIN_CATALOG", str(path))
    assert len(load_catalog()) == len(load_catalog(PACKAGED)) == 146


def test_missing_catalog_file_is_named(tmp_path):
    with pytest.raises(CatalogError, match=re.escape(str(tmp_path / "nope.toml"))):
        load_catalog(tmp_path / "nope.toml")


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('revision = "c156f05"\n', "", "catalog entry 'cp/pubmed': field 'provider.revision' is required for kind 'hf'"),
        ('revision = "c156f05"', 'revision = "main"', "catalog entry 'cp/pubmed': field 'provider.revision' must be"),
        ('revision = "c156f05"', 'revision = "c156f0"', "catalog entry 'cp/pubmed': field 'provider.revision' must be"),
        ('repo_id = "common-pile/pubmed_filtered"\n', "", "catalog entry 'cp/pubmed': field 'provider.repo_id' is required"),
        ("rough_tokens_b = 38.08", "rough_tokens_b = 0", "catalog entry 'cp/pubmed': field 'rough_tokens_b' must be a positive number"),
        ("rough_tokens_b = 38.08", "rough_tokens_b = -1.5", "catalog entry 'cp/pubmed': field 'rough_tokens_b'"),
        ("rough_tokens_b = 38.08", 'rough_tokens_b = "38"', "catalog entry 'cp/pubmed': field 'rough_tokens_b'"),
        ('input_format = "json.gz"', 'input_format = "csv"', "catalog entry 'cp/pubmed': field 'input_format' has unknown format 'csv'"),
        ('kind = "hf"', 'kind = "ftp"', "catalog entry 'cp/pubmed': field 'provider.kind' must be one of"),
        ('kind = "hf"', 'kind = "hf"\nrevison = "x"', "catalog entry 'cp/pubmed': field 'provider.revison' is unknown"),
        ('family = "common_pile"', 'family = "common_pile"\ngated = "yes"', "catalog entry 'cp/pubmed': field 'gated' must be true or false"),
        ('family = "common_pile"', 'family = "common_pile"\ntransform = "Page Stitch"', "catalog entry 'cp/pubmed': field 'transform' must be a snake_case"),
        ('kind = "hf"', 'kind = "hf"\nrepo_type = "bucket"', "catalog entry 'cp/pubmed': field 'provider.revision' must be a snapshot date"),
        ('kind = "hf"', 'kind = "hf"\nstaged_path = "../elsewhere"', "catalog entry 'cp/pubmed': field 'provider.staged_path' must be a relative path"),
        ('kind = "hf"', 'kind = "hf"\nsha256 = "abc"', "catalog entry 'cp/pubmed': field 'provider.sha256' must be 64"),
        ('family = "common_pile"', 'family = "common_pile"\nmax_dup_removal = 1.5', "catalog entry 'cp/pubmed': field 'max_dup_removal' must be a share"),
        ('family = "common_pile"', 'family = "common_pile"\nmax_dup_removal = "90%"', "catalog entry 'cp/pubmed': field 'max_dup_removal' must be a share"),
    ],
)
def test_validation_errors_name_entry_and_field(tmp_path, old, new, message):
    assert old in MINIMAL
    path = _write(tmp_path, MINIMAL.replace(old, new, 1))
    with pytest.raises(CatalogError) as caught:
        load_catalog(path, known_formats=CATALOG_FORMATS)
    text = str(caught.value)
    assert text.startswith(message), text
    assert str(path) in text
    assert caught.value.entry == "cp/pubmed"


def test_formats_and_transforms_are_checked_against_what_the_caller_hands_in(tmp_path):
    path = _write(tmp_path, MINIMAL.replace('family = "common_pile"', 'family = "common_pile"\ntransform = "page_stitch"', 1))
    assert load_catalog(path).by_name("cp/pubmed").transform == "page_stitch"  # nothing handed in: not checked
    with pytest.raises(CatalogError, match=r"field 'transform' names no known family transform 'page_stitch' \(known: a, b\)"):
        load_catalog(path, known_transforms=("b", "a"))
    with pytest.raises(CatalogError, match=r"field 'input_format' has unknown format 'json.gz' \(known: parquet\)"):
        load_catalog(path, known_formats=("parquet",))


@pytest.mark.parametrize("bad", ["cp/pub...med", "cp|pubmed", "cp,pubmed", "cp[0]", "cp]", "cp\tpubmed", "cp pubmed", ""])
def test_names_unusable_as_partition_keys_are_rejected(tmp_path, bad):
    text = MINIMAL.replace('name = "cp/pubmed"', f"name = {json.dumps(bad)}")
    with pytest.raises(CatalogError, match=r"field 'name'"):
        load_catalog(_write(tmp_path, text))


def test_duplicate_names_are_rejected(tmp_path):
    with pytest.raises(CatalogError, match=r"catalog entry 'cp/pubmed': field 'name' is duplicated"):
        load_catalog(_write(tmp_path, MINIMAL + MINIMAL))


def test_bucket_revision_is_a_date(tmp_path):
    text = MINIMAL.replace('kind = "hf"', 'kind = "hf"\nrepo_type = "bucket"').replace("c156f05", "2026-07-30")
    assert load_catalog(_write(tmp_path, text)).by_name("cp/pubmed").provider.pin == (
        "buckets/common-pile/pubmed_filtered@2026-07-30"
    )


PRESTAGED = """
[[source]]
name = "nemotron_code_v2/content"
family = "nemotron_code_v2_content"
rough_tokens_b = 120.25
input_format = "parquet"
text_field = "content"
[source.provider]
kind = "prestaged"
staged_path = "raw/nemotron-code-v2-content"
expected_shards = 133
"""

WEB = """
[[source]]
name = "massive_function_calling"
family = "massive"
rough_tokens_b = 11.39
input_format = "tar.gz"
[source.provider]
kind = "web"
url = "https://example.invalid/massive.tar.gz"
"""


@pytest.mark.parametrize(
    ("text", "old", "new", "field"),
    [
        (PRESTAGED, "expected_shards = 133\n", "", "provider.expected_shards"),
        (PRESTAGED, "expected_shards = 133", "expected_shards = 0", "provider.expected_shards"),
        (PRESTAGED, 'staged_path = "raw/nemotron-code-v2-content"\n', "", "provider.staged_path"),
        (WEB, 'url = "https://example.invalid/massive.tar.gz"\n', "", "provider.url"),
        (WEB, 'kind = "web"', 'kind = "web"\nrepo_type = "dataset"', "provider.repo_type"),
    ],
)
def test_required_fields_per_kind(tmp_path, text, old, new, field):
    assert load_catalog(_write(tmp_path, text, "ok.toml")).names
    with pytest.raises(CatalogError) as caught:
        load_catalog(_write(tmp_path, text.replace(old, new)))
    assert caught.value.field == field
    assert f"field {field!r}" in str(caught.value)


def test_invalid_toml_names_the_file(tmp_path):
    path = _write(tmp_path, "[[source]\nname = ")
    with pytest.raises(CatalogError, match="not valid TOML") as caught:
        load_catalog(path)
    assert str(path) in str(caught.value)


def test_recipe_changes_with_the_pin_but_not_with_descriptions(tmp_path):
    base = load_catalog(_write(tmp_path, MINIMAL, "a.toml")).by_name("cp/pubmed")
    repinned = load_catalog(_write(tmp_path, MINIMAL.replace("c156f05", "abcdef0"), "b.toml")).by_name("cp/pubmed")
    described = load_catalog(
        _write(tmp_path, MINIMAL.replace("38.08", "40.0").replace('family = "common_pile"',
               'family = "common_pile"\nnotes = "edited"\nlicense = "ODC-BY"'), "c.toml")
    ).by_name("cp/pubmed")
    retransformed = load_catalog(
        _write(tmp_path, MINIMAL.replace('family = "common_pile"', 'family = "common_pile"\nbare = true'), "d.toml")
    ).by_name("cp/pubmed")
    assert base.recipe_fingerprint() != repinned.recipe_fingerprint()
    assert base.recipe_fingerprint() == described.recipe_fingerprint()
    assert base.recipe_fingerprint() != retransformed.recipe_fingerprint()


def test_packaged_file_is_plain_tomllib_data():
    with default_catalog_path().open("rb") as handle:
        raw = tomllib.load(handle)
    assert set(raw) == {"source"} and len(raw["source"]) == 146


def test_catalog_layer_does_not_import_dagster():
    code = "import sys, marin_assets.catalog as c; c.load_catalog(); print('dagster' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
