"""Sampling groups and mixture weights over a real (small) pool; the report pictures."""

from __future__ import annotations

import base64

import numpy as np
import polars as pl
import pytest

from marin_assets.core.pool import curated as pool
from marin_assets.core.pool.groups import MixtureError, MixtureParams, cap_epochs, group_counts_from_index, group_counts_from_pool, read_sampling_groups, sampling_groups, write_sampling_groups
from marin_assets.core.runtime.runner import ShardRunner
from marin_assets.defs import report
from marin_assets_tests.core.pool.test_curated import N_TOPICS, build_pool_inputs, read_pool

LABELS = {0: "rivers, stone, harbor", 1: "music, letters", 2: "planets, theory", 3: "gardens, winter"}


@pytest.fixture(scope="module")
def built_pool(tmp_path_factory: pytest.TempPathFactory):
    b = build_pool_inputs(str(tmp_path_factory.mktemp("mix")), seed=11, rows=80)
    results = ShardRunner().map(b.tasks)
    return b, results


def test_group_counts_equal_the_rows_of_the_pool(built_pool) -> None:
    b, results = built_pool
    from_index = group_counts_from_index(pool.read_pool_index([r.output for r in results]))
    from_files = group_counts_from_pool(b.pool_dir)
    assert from_index.equals(from_files)

    result = sampling_groups(from_index, LABELS, MixtureParams(n_topics=N_TOPICS))
    rows = read_pool(b.pool_dir)
    per_group = pl.from_arrow(rows.select(["group", "tokens"])).group_by("group").agg(pl.len().alias("n"), pl.col("tokens").sum().alias("t"))
    expected = {g: (n, t) for g, n, t in per_group.iter_rows()}
    groups = result.groups
    assert groups.height == N_TOPICS * 5 and groups["group"].to_list()[0] == "c00q0"
    for g, docs, tokens in groups.select("group", "documents", "tokens").iter_rows():
        assert (docs, tokens) == expected.get(g, (0, 0))
    assert result.summary["documents"] == len(rows)
    assert result.group_sources.group_by("group").agg(pl.col("documents").sum()).sort("group").equals(
        groups.filter(pl.col("documents") > 0).select("group", "documents").sort("group")
    )
    assert set(result.group_sources["source"]) == {"alpha", "beta/sub"}
    assert groups.filter(pl.col("topic") == 2)["topic_label"].unique().to_list() == ["planets, theory"]


def test_token_proportional_weights_sum_to_one(built_pool) -> None:
    _, results = built_pool
    counts = group_counts_from_index(pool.read_pool_index([r.output for r in results]))
    groups = sampling_groups(counts, LABELS, MixtureParams(n_topics=N_TOPICS)).groups
    weights = groups["weight"].to_numpy()
    tokens = groups["tokens"].to_numpy()
    assert weights.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(weights, tokens / tokens.sum())
    assert groups["epochs"].is_nan().all()


def test_epoch_cap_holds_and_weights_renormalize(built_pool) -> None:
    _, results = built_pool
    counts = group_counts_from_index(pool.read_pool_index([r.output for r in results]))
    total = int(counts["tokens"].sum())
    budget = 3 * total
    per_group = counts.group_by("group").agg(pl.col("tokens").sum())["tokens"].to_numpy()
    uniform_epochs = budget / (len(per_group) * per_group)
    cap = max(1.05 * budget / total, float(np.quantile(uniform_epochs, 0.75)))
    assert uniform_epochs.max() > cap  # the small groups would exceed it without the cap
    params = MixtureParams(n_topics=N_TOPICS, weighting="uniform", token_budget=budget, max_epochs=cap)
    result = sampling_groups(counts, LABELS, params)
    g = result.groups
    weights, tokens, epochs = g["weight"].to_numpy(), g["tokens"].to_numpy(), g["epochs"].to_numpy()
    assert weights.sum() == pytest.approx(1.0)
    assert np.all(weights * params.token_budget <= params.max_epochs * tokens * (1 + 1e-9))
    assert epochs.max() <= params.max_epochs + 1e-9
    assert result.summary["groups_capped"] > 0
    capped = g["capped"].to_numpy()
    np.testing.assert_allclose(epochs[capped], params.max_epochs)
    free = ~capped & (tokens > 0)
    assert np.allclose(weights[free], weights[free][0])  # the uncapped groups still share equally


def test_cap_epochs_exact_case_and_infeasible_budget() -> None:
    weights, capped = cap_epochs(np.full(3, 1 / 3), np.array([100.0, 100.0, 1000.0]), token_budget=1000, max_epochs=2)
    np.testing.assert_allclose(weights, [0.2, 0.2, 0.6])
    assert capped.tolist() == [True, True, False]
    with pytest.raises(MixtureError, match="raise max_epochs"):
        cap_epochs(np.full(3, 1 / 3), np.array([100.0, 100.0, 100.0]), token_budget=1000, max_epochs=2)


def test_small_groups_can_be_left_out_and_vanishing_groups_are_reported() -> None:
    counts = pl.DataFrame(
        {"group": ["c00q0", "c00q1", "c01q0"], "source": ["a", "a", "b"], "documents": [10, 1, 5], "tokens": [10_000_000, 10, 50_000]},
        schema={"group": pl.Utf8, "source": pl.Utf8, "documents": pl.Int64, "tokens": pl.Int64},
    )
    out = sampling_groups(counts, None, MixtureParams(n_topics=2, min_tokens_per_group=100))
    weights = dict(zip(out.groups["group"], out.groups["weight"]))
    assert weights["c00q1"] == 0.0 and weights["c00q0"] > 0 and sum(weights.values()) == pytest.approx(1.0)
    assert out.groups.filter(pl.col("group") == "c01q0")["topic_label"].item() == "topic 01"
    tiny = sampling_groups(counts, None, MixtureParams(n_topics=2, block_size=10))
    assert tiny.summary["groups_vanishing_in_block"] == 2  # 10 and 50k tokens of ~10M get < half a sequence
    with pytest.raises(MixtureError, match="outside"):
        sampling_groups(counts, None, MixtureParams(n_topics=1))


def test_tables_written_as_parquet_and_csv(built_pool, tmp_path) -> None:
    _, results = built_pool
    counts = group_counts_from_index(pool.read_pool_index([r.output for r in results]))
    result = sampling_groups(counts, LABELS, MixtureParams(n_topics=N_TOPICS))
    uris = write_sampling_groups(result, str(tmp_path))
    groups, sources = read_sampling_groups(str(tmp_path))
    assert groups.equals(result.groups) and sources.equals(result.group_sources)
    csv = pl.read_csv(uris["groups_csv"])
    assert csv["group"].to_list() == result.groups["group"].to_list()
    assert csv["tokens"].to_list() == result.groups["tokens"].to_list()
    assert "topic_label" in csv.columns and "rivers, stone, harbor" in csv["topic_label"].to_list()


def test_report_pictures_carry_topic_labels(built_pool) -> None:
    _, results = built_pool
    counts = group_counts_from_index(pool.read_pool_index([r.output for r in results]))
    result = sampling_groups(counts, LABELS, MixtureParams(n_topics=N_TOPICS))
    figures = {
        "heatmap": report.token_heatmap_figure(result.groups),
        "sources": report.topic_sources_figure(result.group_sources, result.groups),
        "bands": report.band_sizes_figure(result.groups),
    }
    for name, fig in figures.items():
        ax = fig.axes[0]
        ticks = [t.get_text() for t in ax.get_yticklabels()]
        assert ticks == [f"c{t:02d} {LABELS[t]}" for t in range(N_TOPICS)], name
    heat = figures["heatmap"].axes[0].images[0].get_array()
    assert heat.shape == (N_TOPICS, 5)
    np.testing.assert_array_equal(heat.filled(0), result.groups["tokens"].to_numpy().reshape(N_TOPICS, 5))
    legend = [t.get_text() for t in figures["sources"].axes[0].get_legend().get_texts()]
    assert set(legend) == {"alpha", "beta/sub"}
    png = report.token_heatmap_png(result.groups)
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    md = report.markdown_image(png, "tokens per group")
    assert md.startswith("![tokens per group](data:image/png;base64,")
    assert base64.b64decode(md.split(",", 1)[1].rstrip(")")) == png
    assert report.topic_sources_png(result.group_sources, result.groups).startswith(b"\x89PNG")
    assert report.band_sizes_png(result.groups).startswith(b"\x89PNG")


def test_report_handles_forty_topics_with_empty_groups() -> None:
    counts = pl.DataFrame(
        {"group": ["c00q0", "c39q4"], "source": ["a", "b"], "documents": [3, 4], "tokens": [300, 4000]},
        schema={"group": pl.Utf8, "source": pl.Utf8, "documents": pl.Int64, "tokens": pl.Int64},
    )
    result = sampling_groups(counts, {t: f"label {t}" for t in range(40)})
    fig = report.token_heatmap_figure(result.groups)
    assert len(fig.axes[0].get_yticklabels()) == 40
    assert report.token_heatmap_png(result.groups).startswith(b"\x89PNG")
    assert report.human(1_234_567) == "1.2M" and report.human(999) == "999"
