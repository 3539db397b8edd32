"""Pictures of a mixture study for the asset metadata: surrogate fit and optimized weights."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import polars as pl

from marin_assets.core.report import _figure, _matrix, render_png, topic_row_labels


def predicted_vs_actual_png(actual: np.ndarray, predicted: Mapping[str, np.ndarray], chosen: str, metric: str) -> bytes:
    """Out-of-fold prediction against the proxies' measured metric, one panel per surrogate."""
    names = list(predicted)
    fig = _figure(4.2 * len(names), 4.0)
    actual = np.asarray(actual, dtype=np.float64)
    lo, hi = float(actual.min()), float(actual.max())
    for i, name in enumerate(names, start=1):
        ax = fig.add_subplot(1, len(names), i)
        pred = np.asarray(predicted[name], dtype=np.float64)
        lo_i, hi_i = min(lo, float(pred.min())), max(hi, float(pred.max()))
        ax.plot([lo_i, hi_i], [lo_i, hi_i], color="#999999", linewidth=1)
        ax.scatter(actual, pred, s=14, color="#1f77b4" if name == chosen else "#ff7f0e")
        ax.set_xlabel(f"measured {metric}")
        ax.set_ylabel("cross-validated prediction")
        ax.set_title(f"{name}{' (used)' if name == chosen else ''}")
    return render_png(fig)


def weights_grid_png(table: pl.DataFrame, phases: list[str]) -> bytes:
    """Weights over the topics x bands grid: token-proportional, then each optimized phase."""
    first = table.filter(pl.col("phase") == phases[0])
    panels = [("token-proportional", first.select("topic", "band", "topic_label", pl.col("proportional_weight").alias("value")))]
    for phase in phases:
        panels.append((f"optimized: {phase}", table.filter(pl.col("phase") == phase).select("topic", "band", "topic_label", pl.col("weight").alias("value"))))
    matrices = [_matrix(frame, "value") for _, frame in panels]
    vmax = max(float(m.max()) for m in matrices) or 1.0
    n_topics = matrices[0].shape[0]
    fig = _figure(3.0 + 2.2 * len(panels), 1.2 + 0.26 * n_topics)
    labels = topic_row_labels(first)
    image = None
    for i, ((title, _), m) in enumerate(zip(panels, matrices), start=1):
        ax = fig.add_subplot(1, len(panels), i)
        ax.set_facecolor("#dddddd")
        image = ax.imshow(np.ma.masked_less_equal(m, 0), aspect="auto", cmap="viridis", vmin=0, vmax=vmax, interpolation="nearest")
        ax.set_xticks(range(m.shape[1]), [f"q{b}" for b in range(m.shape[1])])
        ax.set_yticks(range(n_topics), labels if i == 1 else [""] * n_topics, fontsize=7)
        ax.set_title(title, fontsize=9)
    if image is not None:
        fig.colorbar(image, ax=fig.axes, fraction=0.03, pad=0.02, label="weight (grey: 0)")
    return render_png(fig)


def proposals_png(mixtures: pl.DataFrame, groups: pl.DataFrame) -> bytes:
    """The spread of proposed weights per group (runs as dots) against the proportional prior."""
    order = groups.filter(pl.col("tokens") > 0).sort("prior", descending=True)["group"].to_list()[:60]
    index = {g: i for i, g in enumerate(order)}
    fig = _figure(9.0, 3.6)
    ax = fig.add_subplot(1, 1, 1)
    sub = mixtures.filter(pl.col("group").is_in(order))
    xs = [index[g] for g in sub["group"].to_list()]
    ax.scatter(xs, sub["weight"].to_list(), s=5, alpha=0.4, color="#1f77b4", label="proposed (runs x phases)")
    prior = groups.filter(pl.col("group").is_in(order)).select("group", "prior").rows_by_key("group", unique=True)
    ax.scatter(range(len(order)), [prior[g][0] for g in order], marker="_", s=80, color="black", label="token-proportional")
    ax.set_yscale("log")
    ax.set_xticks(range(len(order)), order, rotation=90, fontsize=6)
    ax.set_ylabel("weight")
    ax.set_title(f"Proposed weights of the {len(order)} largest groups")
    ax.legend(fontsize=7)
    return render_png(fig)
