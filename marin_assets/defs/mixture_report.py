"""Pictures of a mixture study for the asset metadata: surrogate fit and optimized weights."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import polars as pl

from marin_assets.defs.report import _figure, _matrix, render_png, topic_row_labels


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
    """Weights over the topics x bands grid: token-proportional, each optimized phase, and each
    phase's change against token-proportional (red: more, blue: less)."""
    first = table.filter(pl.col("phase") == phases[0])
    weight_panels = [("token-proportional", _matrix(first, "proportional_weight"))]
    change_panels = []
    for phase in phases:
        frame = table.filter(pl.col("phase") == phase)
        weight_panels.append((f"optimized: {phase}", _matrix(frame, "weight")))
        change_panels.append((f"change: {phase}", _matrix(frame, "change")))
    vmax = max(float(m.max()) for _, m in weight_panels) or 1.0
    cmax = max(float(np.abs(m).max()) for _, m in change_panels) or 1.0
    n_topics = weight_panels[0][1].shape[0]
    n_panels = len(weight_panels) + len(change_panels)
    fig = _figure(3.0 + 2.6 * n_panels, 1.2 + 0.26 * n_topics)
    fig.subplots_adjust(wspace=0.6)
    labels = topic_row_labels(first)
    weight_axes, change_axes = [], []
    weight_image = change_image = None
    for i, (title, m) in enumerate(weight_panels + change_panels, start=1):
        ax = fig.add_subplot(1, n_panels, i)
        ax.set_facecolor("#dddddd")
        if i <= len(weight_panels):
            weight_image = ax.imshow(np.ma.masked_less_equal(m, 0), aspect="auto", cmap="viridis", vmin=0, vmax=vmax, interpolation="nearest")
            weight_axes.append(ax)
        else:
            change_image = ax.imshow(m, aspect="auto", cmap="RdBu_r", vmin=-cmax, vmax=cmax, interpolation="nearest")
            change_axes.append(ax)
        ax.set_xticks(range(m.shape[1]), [f"q{b}" for b in range(m.shape[1])])
        ax.set_yticks(range(n_topics), labels if i == 1 else [""] * n_topics, fontsize=7)
        ax.set_title(title, fontsize=9)
    if weight_image is not None:
        fig.colorbar(weight_image, ax=weight_axes, fraction=0.03, pad=0.02, label="weight (grey: 0)")
    if change_image is not None:
        fig.colorbar(change_image, ax=change_axes, fraction=0.05, pad=0.02, label="optimized - proportional")
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
