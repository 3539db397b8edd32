"""One settings object: declared in the resources, read through ``dg.EnvVar`` when used, and
the settings table in docs/operations.md is exactly what the code declares."""

from __future__ import annotations

import ast
import dataclasses
import pathlib
import re

import dagster as dg
import pytest

from marin_assets.catalog.sources import CatalogError
from marin_assets.core.pool import tokens
from marin_assets.defs.resources import RESOURCES, CurationResource, EncoderResource, MarinResource, settings_table
from marin_assets.defs.settings import DEFS_SETTINGS, all_settings, defs_setting
from marin_assets_tests.fixtures.pipeline import catalog_with

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "marin_assets"


def readme_table() -> str:
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    return "\n".join(line for line in section.splitlines() if line.startswith("|"))


def test_readme_table_is_exactly_what_the_code_declares() -> None:
    assert readme_table() == settings_table(), "regenerate the table in docs/operations.md with `marin-assets settings`"


def test_every_marin_variable_the_package_names_is_declared() -> None:
    """A setting named anywhere in the product (messages, docs, reads) is in the table."""
    declared = {s.env for s in all_settings(RESOURCES)}
    named: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for name in re.findall(r"\bMARIN_[A-Z][A-Z0-9_]*\b", node.value):
                    named.setdefault(name, set()).add(str(path.relative_to(PACKAGE)))
    assert {n: sorted(where) for n, where in named.items() if n not in declared} == {}
    declared_by_resources = {s.env for r in RESOURCES for s in r.declared_settings()}
    assert len(declared_by_resources) == sum(len(r.declared_settings()) for r in RESOURCES), "a variable feeds two fields"


def test_unset_fields_read_their_variable_when_used_and_explicit_values_win(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("MARIN_SHARD_PROCESSES", raising=False)
    monkeypatch.delenv("MARIN_RETRY_WAIT_S", raising=False)
    marin = MarinResource()  # built before the environment changes: nothing is read at construction
    assert marin.runner().processes == 1 and marin.retry_policy().base_wait_s == 5.0
    monkeypatch.setenv("MARIN_PREFIX", str(tmp_path / "data"))
    monkeypatch.setenv("MARIN_SHARD_PROCESSES", "3")
    monkeypatch.setenv("MARIN_RETRY_WAIT_S", "0")
    monkeypatch.setenv("MARIN_WEB_MIRROR", "https://a.example=http://m/a")
    monkeypatch.setenv("MARIN_STAGING_DIR", str(tmp_path / "stage"))
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    assert marin.layout().root == str(tmp_path / "data")
    assert marin.runner().processes == 3
    access = marin.provider_access()
    assert access.policy.base_wait_s == 0 and access.policy.max_jitter_s == 0
    assert access.mirrors == (("https://a.example", "http://m/a"),)
    assert (access.staging_dir, access.hf_token) == (str(tmp_path / "stage"), "hf_secret")
    explicit = MarinResource(prefix=str(tmp_path / "other"), shard_processes=2, retry_wait_s=1.5)
    assert explicit.layout().root == str(tmp_path / "other") and explicit.runner().processes == 2
    assert explicit.retry_policy().base_wait_s == 1.5


def test_a_malformed_value_fails_naming_the_variable(monkeypatch) -> None:
    monkeypatch.setenv("MARIN_TARGET_SHARD_BYTES", "lots")
    with pytest.raises(dg.Failure, match="MARIN_TARGET_SHARD_BYTES='lots'"):
        MarinResource().shard_bytes()
    monkeypatch.setenv("MARIN_DRIFT_BATCH", "x")
    with pytest.raises(ValueError, match="MARIN_DRIFT_BATCH"):
        from marin_assets.defs.settings import defs_setting_number

        defs_setting_number("MARIN_DRIFT_BATCH", 10)
    with pytest.raises(KeyError, match="not a declared"):
        defs_setting("MARIN_UNDECLARED")
    assert {s.env for s in DEFS_SETTINGS} >= {"MARIN_EXECUTOR", "MARIN_AUTOMATION"}


def test_catalog_and_evals_settings_are_reread_on_every_use(tmp_path, monkeypatch) -> None:
    path = catalog_with(tmp_path / "catalog.toml", keep=["cp/peps"])
    monkeypatch.setenv("MARIN_CATALOG", str(path))
    marin = MarinResource()
    assert marin.catalog().names == ("cp/peps",)
    catalog_with(path, keep=["cp/peps", "agenttrove"])
    assert set(marin.catalog().names) == {"cp/peps", "agenttrove"}
    assert len(MarinResource(catalog_path="").catalog()) == 1 + 1  # empty string: still the variable
    monkeypatch.setenv("MARIN_CATALOG", str(tmp_path / "nope.toml"))
    with pytest.raises(CatalogError, match=r"nope\.toml.* \(set by MARIN_CATALOG\)"):
        marin.catalog()
    monkeypatch.delenv("MARIN_CATALOG")
    assert len(marin.catalog()) == 146


def test_encoder_and_curation_choices_follow_their_variables(monkeypatch) -> None:
    for name in ("MARIN_EMBED_MODEL", "MARIN_EMBED_REVISION", "MARIN_EMBED_DEVICE", "MARIN_TOKENIZER", "MARIN_BAND_METHOD", "MARIN_TOKEN_BUDGET"):
        monkeypatch.delenv(name, raising=False)
    encoder, curation = EncoderResource(), CurationResource()
    offline_tokenizer = curation.tokenizer_params()
    assert encoder.offline() and offline_tokenizer == tokens.offline_tokenizer_params()
    monkeypatch.setenv("MARIN_EMBED_MODEL", "org/encoder")
    monkeypatch.setenv("MARIN_EMBED_REVISION", "abc1234")
    params = encoder.params()
    assert (params.model, params.revision) == ("org/encoder", "abc1234")
    assert curation.tokenizer_params() == tokens.TokenizerParams()  # the pinned Marin tokenizer with a real encoder
    monkeypatch.setenv("MARIN_BAND_METHOD", "fixed")
    monkeypatch.setenv("MARIN_TOKEN_BUDGET", "1e9")
    assert curation.band_params().method == "fixed"
    assert curation.mixture_params().token_budget == 1e9


def test_the_fuzzy_dedup_resource_hands_core_its_rule_and_task_sizes(monkeypatch) -> None:
    """Unset, the rule and sizes are core's reference values (and the table shows them); set,
    the variables size the shuffle."""
    from marin_assets.core.dedup.decisions import FuzzyDedupParams
    from marin_assets.core.dedup.fuzzy import FuzzyScale
    from marin_assets.defs.resources import DedupResource

    for s in DedupResource.declared_settings():
        monkeypatch.delenv(s.env, raising=False)
    resource = DedupResource()
    assert resource.fuzzy_scale() == FuzzyScale() and resource.fuzzy_rule() == FuzzyDedupParams()
    reference = dataclasses.asdict(FuzzyScale()) | dataclasses.asdict(FuzzyDedupParams())
    for name, field in DedupResource.model_fields.items():
        shown = field.json_schema_extra["shown_default"].strip("`")
        assert float(shown) == reference[name], name
    monkeypatch.setenv("MARIN_FUZZY_MAX_INPUTS_PER_TASK", "256")
    monkeypatch.setenv("MARIN_FUZZY_RECORDS_PER_TASK", "1000")
    assert resource.fuzzy_scale() == dataclasses.replace(FuzzyScale(), max_inputs_per_task=256, records_per_task=1000)
