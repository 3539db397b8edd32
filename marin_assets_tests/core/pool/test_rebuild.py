"""The rebuild report flags a source that lost tokens and a dedup far above the published share."""

from __future__ import annotations

import dataclasses

from marin_assets.catalog.sources import load_catalog
from marin_assets.core.pool.rebuild import NOT_CHECKED, PUBLISHED_DEDUP_SHARE, ReportParams, SourceFigures, rebuild_report, report_lines
from marin_assets.demo.sample import DEMO_SOURCES


def _catalog() -> dict[str, float]:
    catalog = load_catalog()
    return {name: catalog.by_name(name).rough_tokens_b for name in DEMO_SOURCES}


def _built(fraction: float = 1e-6, dedup: float = 0.08) -> list[SourceFigures]:
    """Each demo source measured at ``fraction`` of its catalog tokens, ``dedup`` of them removed."""
    out = []
    for name, billions in _catalog().items():
        tokens = int(billions * 1e9 * fraction)
        removed = int(tokens * dedup / (1 - dedup))
        out.append(SourceFigures(name, documents=tokens // 500, tokens=tokens, dedup_removed_documents=removed // 500,
                                 dedup_removed_tokens_est=removed, decon_removed_documents=1))  # fmt: skip
    return out


def test_a_rebuild_like_the_published_pool_is_not_flagged() -> None:
    report = rebuild_report(_built(), _catalog(), ReportParams(scale=None))
    assert report["flagged"] == [] and not report["totals"]["flag"]
    assert abs(report["scale"] - 1e-6) < 1e-8, "a sample's scale is fitted"
    assert len(report["rows"]) == len(DEMO_SOURCES)


def test_a_source_that_lost_half_its_rows_is_flagged() -> None:
    published = {f.source: f for f in _built()}
    victim = DEMO_SOURCES[1]
    rebuilt = [dataclasses.replace(f, documents=f.documents // 2, tokens=f.tokens // 2) if f.source == victim else f for f in _built()]
    report = rebuild_report(rebuilt, _catalog(), ReportParams(scale=None), published=published)
    assert report["flagged"] == [victim]
    row = next(r for r in report["rows"] if r["source"] == victim)
    assert "x0.50 of the catalog's" in row["flags"] and "x0.50 of the last published build" in row["flags"]
    assert any(victim in line and "x0.50" in line for line in report_lines(report, "offline"))


def test_a_dedup_that_removes_thirty_percent_is_flagged() -> None:
    report = rebuild_report(_built(dedup=0.30), _catalog(), ReportParams(scale=None))
    assert sorted(report["flagged"]) == sorted(DEMO_SOURCES)
    assert report["totals"]["dedup_share_est"] > PUBLISHED_DEDUP_SHARE and "published 8.5%" in report["totals"]["flag"]


def test_at_full_scale_the_catalog_counts_are_the_reference() -> None:
    report = rebuild_report(_built(fraction=1.0), _catalog())
    assert report["scale"] == 1.0 and report["flagged"] == []
    assert rebuild_report(_built(fraction=0.5), _catalog())["flagged"] == sorted(DEMO_SOURCES), "half the corpus is flagged everywhere"


def test_ok_is_said_only_against_a_figure_the_fit_did_not_make() -> None:
    """With a fitted scale the median source reads x1.00 by construction: not "ok" without an
    earlier build; with one, or at a given scale, it is."""
    fitted = rebuild_report(_built(), _catalog(), ReportParams(scale=None))
    assert [r["flags"] for r in fitted["rows"]] == [NOT_CHECKED] * len(DEMO_SOURCES)
    assert any(r["ratio"] == 1.0 for r in fitted["rows"]), "the median source matches its own fit"
    published = {f.source: f for f in _built()}
    compared = rebuild_report(_built(), _catalog(), ReportParams(scale=None), published=published)
    assert [r["flags"] for r in compared["rows"]] == ["ok"] * len(DEMO_SOURCES)
    assert [r["flags"] for r in rebuild_report(_built(fraction=1.0), _catalog())["rows"]] == ["ok"] * len(DEMO_SOURCES)
    assert all(list(r)[0] == "flags" for r in fitted["rows"]), "the verdict is the first column"
    lines = report_lines(fitted, "offline")
    assert all(line.lstrip().startswith(("not checked", "flags", "tokens", "all ", "(", "semantic")) for line in lines), lines


def test_a_sample_total_that_matches_the_published_share_says_it_is_no_validation() -> None:
    dedup = PUBLISHED_DEDUP_SHARE
    sample = rebuild_report(_built(dedup=dedup), _catalog(), ReportParams(scale=None), catalog_size=146)
    assert abs(sample["totals"]["dedup_share_est"] - dedup) < 0.001 and not sample["totals"]["flag"]
    assert sample["totals"]["note"] == f"{len(DEMO_SOURCES)} of 146 catalog sources: the published share is the whole catalog's, so this total is not a validation of it"
    assert report_lines(sample, "offline")[-1] == f"  ({sample['totals']['note']})"
    whole = rebuild_report(_built(dedup=dedup), _catalog(), catalog_size=len(DEMO_SOURCES))
    assert whole["totals"]["note"] == ""


def test_semantic_flags_are_reported_per_source_and_eval_set() -> None:
    built = _built()
    built[0] = dataclasses.replace(built[0], semantic_flagged={"demo_qa": 3})
    report = rebuild_report(built, _catalog(), ReportParams(scale=None))
    assert report["rows"][[r["source"] for r in report["rows"]].index(built[0].source)]["semantic_flagged"] == {"demo_qa": 3}
    assert any("demo_qa 3" in line for line in report_lines(report, "tok"))
    assert SourceFigures.from_json({k: v for k, v in built[1].to_json().items() if k != "semantic_flagged"}) == built[1]
