"""Pictures of the sampling groups for the asset metadata: PNG bytes and Markdown data URIs.

* a topics x bands heat map of tokens;
* the composition of each topic by source (token shares, stacked bars);
* the size of each band within each topic (documents, stacked bars).

Topic labels name the rows of every picture. Figures are drawn with matplotlib's Agg canvas on
``Figure`` objects (no pyplot, no global state), imported inside the functions so that importing
this module stays cheap.
"""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np
import polars as pl

DPI = 72
MAX_LABEL_CHARS = 38


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure  # noqa: PLC0415

    return Figure(figsize=(width, height), dpi=DPI)


def render_png(figure: Any) -> bytes:
    """The figure as PNG bytes (Agg canvas)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415

    FigureCanvasAgg(figure)
    buf = io.BytesIO()
    figure.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    return buf.getvalue()


def markdown_image(png: bytes, alt: str) -> str:
    """``![alt](data:image/png;base64,...)``: a picture that Markdown metadata shows inline."""
    return f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode('ascii')})"


def human(n: float) -> str:
    """1234567 -> '1.2M'."""
    n = float(n)
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f}{unit}"
    return f"{n:.0f}"


def topic_row_labels(groups: pl.DataFrame) -> list[str]:
    """``c07 cooking, recipe, oven`` for each topic, in topic order."""
    per_topic = groups.select("topic", "topic_label").unique("topic").sort("topic")
    out = []
    for topic, label in per_topic.iter_rows():
        text = f"c{int(topic):02d} {label}"
        out.append(text if len(text) <= MAX_LABEL_CHARS else text[: MAX_LABEL_CHARS - 1] + "…")
    return out


def _matrix(groups: pl.DataFrame, value: str) -> np.ndarray:
    n_topics = int(groups["topic"].max()) + 1
    n_bands = int(groups["band"].max()) + 1
    out = np.zeros((n_topics, n_bands), dtype=np.float64)
    for topic, band, v in groups.select("topic", "band", value).iter_rows():
        out[int(topic), int(band)] = float(v)
    return out


# --------------------------------------------------------------------------- heat map


def token_heatmap_figure(groups: pl.DataFrame) -> Any:
    """Tokens per group (log colour scale; empty groups grey), one row per topic."""
    from matplotlib.colors import LogNorm  # noqa: PLC0415

    tokens = _matrix(groups, "tokens")
    n_topics, n_bands = tokens.shape
    fig = _figure(7.5, 1.2 + 0.26 * n_topics)
    ax = fig.add_subplot(1, 1, 1)
    masked = np.ma.masked_less_equal(tokens, 0)
    positive = tokens[tokens > 0]
    norm = LogNorm(vmin=float(positive.min()), vmax=float(max(positive.max(), positive.min() * 1.0001))) if positive.size else None
    ax.set_facecolor("#dddddd")
    image = ax.imshow(masked, aspect="auto", cmap="viridis", norm=norm, interpolation="nearest")
    for t in range(n_topics):
        for b in range(n_bands):
            if tokens[t, b] > 0:
                bright = norm is not None and norm(tokens[t, b]) > 0.6
                ax.text(b, t, human(tokens[t, b]), ha="center", va="center", fontsize=7, color="black" if bright else "white")
    ax.set_xticks(range(n_bands), [f"q{b}" for b in range(n_bands)])
    ax.set_yticks(range(n_topics), topic_row_labels(groups), fontsize=7)
    ax.set_xlabel("quality band (q0 lowest)")
    ax.set_title(f"Tokens per sampling group (total {human(tokens.sum())})")
    if positive.size:
        fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02, label="tokens")
    return fig


def token_heatmap_png(groups: pl.DataFrame) -> bytes:
    return render_png(token_heatmap_figure(groups))


# --------------------------------------------------------------------------- topic composition


def topic_sources_figure(group_sources: pl.DataFrame, groups: pl.DataFrame, top_sources: int = 12) -> Any:
    """Share of each topic's tokens by source: the largest sources by name, the rest as 'other'."""
    from matplotlib import colormaps  # noqa: PLC0415

    labels = topic_row_labels(groups)
    n_topics = len(labels)
    per = group_sources.group_by("topic", "source").agg(pl.col("tokens").sum())
    ranking = per.group_by("source").agg(pl.col("tokens").sum()).sort(["tokens", "source"], descending=[True, False])
    named = ranking["source"].head(top_sources).to_list()
    shares = np.zeros((n_topics, len(named) + 1), dtype=np.float64)
    for topic, source, tokens in per.iter_rows():
        column = named.index(source) if source in named else len(named)
        shares[int(topic), column] += float(tokens)
    totals = shares.sum(axis=1, keepdims=True)
    shares = np.divide(shares, totals, out=np.zeros_like(shares), where=totals > 0)
    names = named + (["other"] if shares[:, -1].any() else [])
    fig = _figure(9.5, 1.2 + 0.26 * n_topics)
    ax = fig.add_subplot(1, 1, 1)
    cmap = colormaps["tab20"]
    left = np.zeros(n_topics)
    for i, name in enumerate(names):
        ax.barh(range(n_topics), shares[:, i], left=left, color="#999999" if name == "other" else cmap(i % 20), label=name, height=0.8)
        left += shares[:, i]
    ax.set_yticks(range(n_topics), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of the topic's tokens")
    ax.set_title("Composition of each topic by source")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    return fig


def topic_sources_png(group_sources: pl.DataFrame, groups: pl.DataFrame, top_sources: int = 12) -> bytes:
    return render_png(topic_sources_figure(group_sources, groups, top_sources))


# --------------------------------------------------------------------------- band sizes


def band_sizes_figure(groups: pl.DataFrame) -> Any:
    """Documents in each band of each topic (stacked, q0 on the left)."""
    from matplotlib import colormaps  # noqa: PLC0415

    documents = _matrix(groups, "documents")
    n_topics, n_bands = documents.shape
    fig = _figure(8.5, 1.2 + 0.26 * n_topics)
    ax = fig.add_subplot(1, 1, 1)
    cmap = colormaps["viridis"]
    left = np.zeros(n_topics)
    for b in range(n_bands):
        ax.barh(range(n_topics), documents[:, b], left=left, color=cmap(b / max(n_bands - 1, 1)), label=f"q{b}", height=0.8)
        left += documents[:, b]
    ax.set_yticks(range(n_topics), topic_row_labels(groups), fontsize=7)
    ax.invert_yaxis()
    from matplotlib.ticker import FuncFormatter  # noqa: PLC0415

    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _pos: human(value)))
    ax.set_xlabel("documents")
    ax.set_title("Band sizes per topic")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False, title="band")
    return fig


def band_sizes_png(groups: pl.DataFrame) -> bytes:
    return render_png(band_sizes_figure(groups))


def rebuild_figure(rows: list[dict[str, Any]], scale: float, fitted: bool = False) -> Any:
    """Measured against expected tokens per source (log scale); flagged sources in red."""
    fig = _figure(8, 0.35 * max(4, len(rows)) + 1.2)
    ax = fig.add_subplot(1, 1, 1)
    names = [r["source"] for r in rows]
    y = np.arange(len(rows))
    measured = [max(1, r["tokens"]) for r in rows]
    expected = [max(1, r["expected_tokens"]) for r in rows]
    ax.barh(y - 0.2, measured, height=0.4, color=["#c0392b" if r["flagged"] else "#2e86c1" for r in rows], label="measured")
    ax.barh(y + 0.2, expected, height=0.4, color="#aab7b8", label=f"catalog x {scale:.3g}")
    ax.set_xscale("log")
    ax.set_yticks(y, [n[:MAX_LABEL_CHARS] for n in names])
    ax.invert_yaxis()
    ax.set_xlabel("tokens (red: flagged)")
    ax.set_title(f"Rebuild: tokens measured per source vs the catalog x {scale:.3g}" + (" (scale fitted to these sources)" if fitted else ""))
    ax.legend(loc="lower right")
    return fig


def rebuild_png(rows: list[dict[str, Any]], scale: float, fitted: bool = False) -> bytes:
    return render_png(rebuild_figure(rows, scale, fitted))
