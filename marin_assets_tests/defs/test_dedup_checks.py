"""The dedup steps' removal_ratio check: it names the source over its limit and its share, and a
source whose catalog entry raises ``max_dup_removal`` passes."""

from __future__ import annotations

from pathlib import Path

from marin_assets.catalog import load_catalog
from marin_assets.defs.dedup.assets import _removal_rows, removal_check

CATALOG = """
[[source]]
name = "{name}"
family = "code"
rough_tokens_b = 1.0
input_format = "parquet"
{extra}
[source.provider]
kind = "hf"
repo_id = "org/{name}"
revision = "c156f05"
"""


def limits(tmp_path: Path, vendored_limit: str) -> dict[str, float]:
    text = CATALOG.format(name="cpython", extra="") + CATALOG.format(name="vendored", extra=vendored_limit)
    (tmp_path / "sources.toml").write_text(text)
    return {s.name: s.max_dup_removal for s in load_catalog(tmp_path / "sources.toml")}


def rows(removed_vendored: int) -> list[dict]:
    stats = {"removed_per_source": {"cpython": 10, "vendored": removed_vendored}}
    return _removal_rows(stats, {"cpython": 1_000, "vendored": 400}, {})


def test_a_source_over_the_default_limit_is_named_with_its_share_and_the_setting_that_accepts_it(tmp_path):
    check = removal_check("removal_ratio", "fuzzy_duplicates", rows(290), limits(tmp_path, ""))
    assert not check.passed
    assert "vendored would lose 290 of 400 documents (72.5%, its limit 50%)" in check.description
    assert "cpython" not in check.description
    assert "max_dup_removal" in check.description
    assert [r.data["source"] for r in check.metadata["sources_over_limit"].value.records] == ["vendored"]


def test_a_raised_limit_makes_the_check_pass_for_that_source_only(tmp_path):
    raised = limits(tmp_path, "max_dup_removal = 0.9")
    assert removal_check("removal_ratio", "fuzzy_duplicates", rows(290), raised).passed
    assert not removal_check("removal_ratio", "fuzzy_duplicates", rows(361), raised).passed  # 90.25% > 90%
    over_default = _removal_rows({"removed_per_source": {"cpython": 600, "vendored": 290}}, {"cpython": 1_000, "vendored": 400}, {})
    check = removal_check("removal_ratio", "fuzzy_duplicates", over_default, raised)
    assert not check.passed and "cpython would lose 600" in check.description and "vendored would" not in check.description
