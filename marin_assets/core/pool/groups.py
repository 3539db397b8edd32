"""Sampling groups: documents and tokens of the 200 groups (and of each source within them), and
default mixture weights.

Weights are token-proportional by default (every token of the pool is equally likely to be
sampled) or uniform over the non-empty groups; groups under ``min_tokens_per_group`` get weight 0.
Given a token budget, an epoch cap bounds how often any group is repeated: a group's weight may
not exceed ``max_epochs x its tokens / budget``; the excess is handed to the uncapped groups in
proportion to their weights, until no group is over (water-filling). With token-proportional
weights every group sees the same number of epochs (budget / pool tokens), so the cap either
holds for all or cannot be met; it matters for uniform or hand-made weights (:func:`cap_epochs`).

The tables carry the topic labels so they can be read without the topic model; they are written
as Parquet and CSV.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from marin_assets.core.embed.quality import all_groups, parse_group
from marin_assets.core.runtime import storage
from marin_assets.errors import ConfigurationError

GROUPS_FILE = "groups"
GROUP_SOURCES_FILE = "group_sources"

_COUNT_SCHEMA = {"group": pl.Utf8, "source": pl.Utf8, "documents": pl.Int64, "tokens": pl.Int64}


class MixtureError(ConfigurationError, ValueError):
    """The requested mixture cannot be built; the message says which limit to change."""


@dataclasses.dataclass(frozen=True)
class MixtureParams:
    """Default mixture weights over the sampling groups.

    ``weighting``: ``"tokens"`` (proportional) or ``"uniform"``. ``token_budget``: the training
    tokens the mixture is for (``None``: no epoch cap); ``max_epochs``: the cap (8, the value
    used for full-scale Marin training runs). ``block_size``: sequences per mixture block; a
    group whose weight x block size rounds to 0 gets no sequence at all, which the summary
    reports.
    """

    n_topics: int = 40
    n_bands: int = 5
    weighting: str = "tokens"
    min_tokens_per_group: int = 0
    token_budget: float | None = None
    max_epochs: float = 8.0
    block_size: int = 49_152


# --------------------------------------------------------------------------- counts


def group_counts_from_index(index: pa.Table | pl.DataFrame) -> pl.DataFrame:
    """Documents and tokens per (group, source) from pool shard indexes (Arrow or polars)."""
    columns = ["group", "source", "documents", "tokens"]
    frame = index.select(columns) if isinstance(index, pl.DataFrame) else pl.from_arrow(index.select(columns))
    return _aggregate(frame)  # type: ignore[arg-type]


def group_counts_from_pool(pool_dir: str, groups: Iterable[str] | None = None) -> pl.DataFrame:
    """Documents and tokens per (group, source) read from the group files themselves."""
    rows: list[pl.DataFrame] = []
    names = list(groups) if groups is not None else [storage.basename(u) for u in storage.listdir(pool_dir)]
    for group in names:
        try:
            parse_group(group)
        except ValueError:
            continue
        for uri in _parquet_files(storage.join(pool_dir, group)):
            table = pl.from_arrow(storage.read_parquet(uri, columns=["source", "tokens"]))
            rows.append(
                table.group_by("source").agg(pl.len().cast(pl.Int64).alias("documents"), pl.col("tokens").cast(pl.Int64).sum().alias("tokens")).with_columns(pl.lit(group).alias("group"))  # type: ignore[union-attr]
            )
    if not rows:
        return pl.DataFrame(schema=_COUNT_SCHEMA)
    return _aggregate(pl.concat(rows).select(list(_COUNT_SCHEMA)))


def _parquet_files(dir_uri: str) -> list[str]:
    return [u for u in storage.listdir(dir_uri) if u.endswith(".parquet")]


def _aggregate(frame: pl.DataFrame) -> pl.DataFrame:
    return (  # one lazy query: the optimizer fuses the cast into the aggregation
        frame.lazy()
        .cast(_COUNT_SCHEMA)  # type: ignore[arg-type]
        .group_by("group", "source")
        .agg(pl.col("documents").sum(), pl.col("tokens").sum())
        .sort("group", "source")
        .collect()
    )


# --------------------------------------------------------------------------- weights


def cap_epochs(weights: np.ndarray, tokens: np.ndarray, token_budget: float, max_epochs: float) -> tuple[np.ndarray, np.ndarray]:
    """Weights (summing to 1) with ``weight x budget <= max_epochs x tokens`` for every group.

    Groups over their cap are fixed at it and the rest of the mass is shared by the others in
    proportion to their weights, repeatedly. Returns the weights and a mask of capped groups.
    Raises :class:`MixtureError` when the pool cannot supply the budget within the cap.
    """
    base = np.asarray(weights, dtype=np.float64)
    tokens = np.asarray(tokens, dtype=np.float64)
    caps = max_epochs * tokens / float(token_budget)
    available = float(caps[base > 0].sum())
    if available < 1.0 - 1e-12:
        raise MixtureError(
            f"a budget of {token_budget:,.0f} tokens needs {token_budget / max(max_epochs, 1e-12):,.0f} tokens at "
            f"{max_epochs:g} epochs, but the weighted groups hold {float(tokens[base > 0].sum()):,.0f}; "
            "raise max_epochs, lower the token budget, or add data"
        )
    capped = np.zeros(len(base), dtype=bool)
    out = np.zeros(len(base), dtype=np.float64)
    while True:
        free = ~capped & (base > 0)
        remaining = 1.0 - float(caps[capped].sum())
        out[capped] = caps[capped]
        out[free] = base[free] / base[free].sum() * remaining
        over = free & (out > caps * (1 + 1e-12))
        if not over.any():
            break
        capped |= over
    out[~capped & ~(base > 0)] = 0.0
    return out / out.sum(), capped


def mixture_weights(tokens: np.ndarray, params: MixtureParams) -> tuple[np.ndarray, np.ndarray]:
    """Default weights of groups with ``tokens``, then the epoch cap when a budget is given."""
    tokens = np.asarray(tokens, dtype=np.float64)
    eligible = (tokens > 0) & (tokens >= params.min_tokens_per_group)
    if params.weighting == "tokens":
        base = np.where(eligible, tokens, 0.0)
    elif params.weighting == "uniform":
        base = eligible.astype(np.float64)
    else:
        raise MixtureError(f"unknown weighting {params.weighting!r}: use 'tokens' or 'uniform'")
    if base.sum() <= 0:
        raise MixtureError("no group has tokens (after min_tokens_per_group); build the pool first")
    weights = base / base.sum()
    if params.token_budget is None:
        return weights, np.zeros(len(weights), dtype=bool)
    return cap_epochs(weights, tokens, params.token_budget, params.max_epochs)


# --------------------------------------------------------------------------- tables


@dataclasses.dataclass
class SamplingGroups:
    groups: pl.DataFrame  # one row per group: group, topic, topic_label, band, documents, tokens, sources, weight, epochs
    group_sources: pl.DataFrame  # one row per (group, source): documents, tokens, token_share
    summary: dict[str, Any]


def sampling_groups(counts: pl.DataFrame, topic_labels: Mapping[int, str] | None = None, params: MixtureParams = MixtureParams()) -> SamplingGroups:
    """All ``n_topics x n_bands`` groups (empty ones included) with counts, labels and weights."""
    names = all_groups(params.n_topics, params.n_bands)
    unknown = sorted(set(counts["group"].to_list()) - set(names))
    if unknown:
        raise MixtureError(f"pool groups {unknown[:5]} are outside {params.n_topics} topics x {params.n_bands} bands; set MixtureParams to the topic model's shape")
    labels = {int(k): str(v) for k, v in (topic_labels or {}).items()}
    skeleton = pl.DataFrame(
        {
            "group": names,
            "topic": [parse_group(g)[0] for g in names],
            "band": [parse_group(g)[1] for g in names],
        },
        schema={"group": pl.Utf8, "topic": pl.Int16, "band": pl.Int8},
    ).with_columns(pl.col("topic").map_elements(lambda t: labels.get(int(t), f"topic {int(t):02d}"), return_dtype=pl.Utf8).alias("topic_label"))
    per_group = counts.group_by("group").agg(
        pl.col("documents").sum(), pl.col("tokens").sum(), pl.col("source").n_unique().cast(pl.Int64).alias("sources")
    )
    groups = skeleton.join(per_group, on="group", how="left").with_columns(
        pl.col("documents").fill_null(0), pl.col("tokens").fill_null(0), pl.col("sources").fill_null(0)
    ).sort("group")
    tokens = groups["tokens"].to_numpy().astype(np.float64)
    weights, capped = mixture_weights(tokens, params)
    epochs = (
        np.where(tokens > 0, weights * float(params.token_budget) / np.maximum(tokens, 1.0), 0.0)
        if params.token_budget is not None
        else np.full(len(tokens), np.nan)
    )
    groups = groups.with_columns(
        pl.Series("weight", weights, dtype=pl.Float64),
        pl.Series("epochs", epochs, dtype=pl.Float64),
        pl.Series("capped", capped, dtype=pl.Boolean),
    ).select("group", "topic", "topic_label", "band", "documents", "tokens", "sources", "weight", "epochs", "capped")
    group_sources = (
        counts.join(groups.select("group", "topic", "topic_label", "band", pl.col("tokens").alias("group_tokens")), on="group", how="left")
        .with_columns((pl.col("tokens") / pl.col("group_tokens").cast(pl.Float64)).fill_nan(0.0).alias("token_share"))
        .select("group", "topic", "topic_label", "band", "source", "documents", "tokens", "token_share")
        .sort("group", "source")
    )
    vanishing = int(((weights > 0) & (weights * params.block_size < 0.5)).sum())
    summary = {
        "groups": len(names),
        "groups_with_documents": int((groups["documents"] > 0).sum()),
        "groups_weighted": int((weights > 0).sum()),
        "documents": int(groups["documents"].sum()),
        "tokens": int(groups["tokens"].sum()),
        "sources": int(counts["source"].n_unique()) if counts.height else 0,
        "weighting": params.weighting,
        "token_budget": params.token_budget,
        "max_epochs": params.max_epochs if params.token_budget is not None else None,
        "groups_capped": int(capped.sum()),
        "max_group_epochs": float(np.nanmax(epochs)) if params.token_budget is not None and len(epochs) else None,
        "groups_vanishing_in_block": vanishing,
        "block_size": params.block_size,
    }
    return SamplingGroups(groups, group_sources, summary)


def write_sampling_groups(result: SamplingGroups, out_dir: str) -> dict[str, str]:
    """``groups`` and ``group_sources`` as Parquet and CSV under ``out_dir``; returns their URIs."""
    written: dict[str, str] = {}
    for name, frame in ((GROUPS_FILE, result.groups), (GROUP_SOURCES_FILE, result.group_sources)):
        parquet_uri = storage.join(out_dir, f"{name}.parquet")
        csv_uri = storage.join(out_dir, f"{name}.csv")
        storage.write_parquet(frame.to_arrow(), parquet_uri)
        storage.write_bytes(csv_uri, frame.write_csv().encode("utf-8"))
        written[f"{name}_parquet"] = parquet_uri
        written[f"{name}_csv"] = csv_uri
    return written


def read_sampling_groups(out_dir: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    groups = pl.from_arrow(storage.read_parquet(storage.join(out_dir, f"{GROUPS_FILE}.parquet")))
    sources = pl.from_arrow(storage.read_parquet(storage.join(out_dir, f"{GROUP_SOURCES_FILE}.parquet")))
    return groups, sources  # type: ignore[return-value]
