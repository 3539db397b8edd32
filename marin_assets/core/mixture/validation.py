"""Validation: the published mixture and token-proportional sampling, each trained with several
seeds, measured against what the surrogate predicted.

A prediction is not a result. ``mixture_validation`` trains (built-in trainer) or hands out
configs for (external trainer) both mixtures with ``validation_seeds`` seeds each. Each mixture
gets the mean of its seeds and a t interval; the gain (proportional minus optimized, positive is
better) gets a Welch interval whose standard deviations are never below the replicate noise the
swarm measured. The mixture is *validated* only when the gate published it and the lower end of
the gain's interval is above zero: a gain inside the run-to-run noise is not claimed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import polars as pl

from marin_assets.core.mixture.swarm import StudyParams, group_truncation, mixture_id, round_to_block, trainer_config

MIXTURES = ("optimized", "proportional")
LEVEL = 0.9
RUN_PREFIX = "v-"  # validation run ids, apart from the swarm's rNNNN


def validation_run_id(which: str, seed: int) -> str:
    return f"{RUN_PREFIX}{which}-s{seed}"


def validation_configs(
    study: StudyParams, candidate_blocks: np.ndarray, proportional: np.ndarray, groups: pl.DataFrame,
    pool_files: Mapping[str, Sequence[str]], results_uri: str,
) -> dict[str, dict[str, Any]]:
    """Trainer configs of both mixtures x ``validation_seeds`` seeds, at ``validation_budget_scale``
    x the proxy budget (simulated epoching recomputed for it). ``candidate_blocks``: the optimized
    mixture's block sequences (phases x groups, every group of ``groups``); ``proportional``: the
    token-proportional weights, rounded to the block here."""
    groups = groups.sort("group")
    names = groups["group"].to_list()
    tokens = groups["tokens"].to_numpy().astype(np.float64)
    ladder = dataclasses.replace(study, proxy_budget=study.proxy_budget * study.validation_budget_scale)
    trunc = group_truncation(groups["tokens"].to_list(), ladder)
    blocks = {"optimized": np.asarray(candidate_blocks, dtype=np.int64), "proportional": round_to_block(proportional, tokens, study)}
    out = {}
    for which in MIXTURES:
        mid = mixture_id(blocks[which])
        for seed in range(study.validation_seeds):
            rid = validation_run_id(which, seed)
            out[rid] = trainer_config(ladder, rid, mid, seed, blocks[which], names, tokens, trunc, pool_files, results_uri)
    return out


def _t(level: float, dof: int) -> float:
    from scipy.stats import t  # noqa: PLC0415

    return float(t.ppf(0.5 + level / 2, max(dof, 1)))


def measured_interval(values: Sequence[float], floor_sd: float = 0.0, level: float = LEVEL) -> dict[str, float]:
    v = np.asarray(values, dtype=np.float64)
    sd = max(float(v.std(ddof=1)) if len(v) > 1 else 0.0, floor_sd)
    half = _t(level, len(v) - 1) * sd / math.sqrt(len(v))
    return {"mean": float(v.mean()), "low": float(v.mean() - half), "high": float(v.mean() + half), "sd": sd, "seeds": len(v)}


def verdict(
    measured: Mapping[str, Sequence[float]], predicted: Mapping[str, float], published: bool, noise_sd: float | None, level: float = LEVEL,
) -> dict[str, Any]:
    """Measured against predicted for both mixtures, the measured gain with its interval, and
    whether the published mixture is validated (published, and the gain's interval above 0)."""
    floor = float(noise_sd or 0.0)
    per = {m: measured_interval(measured[m], floor, level) for m in MIXTURES}
    opt, prop = (np.asarray(measured[m], dtype=np.float64) for m in MIXTURES)
    se = math.sqrt(per["optimized"]["sd"] ** 2 / len(opt) + per["proportional"]["sd"] ** 2 / len(prop))
    gain = float(prop.mean() - opt.mean())
    half = _t(level, len(opt) + len(prop) - 2) * se
    predicted_gain = predicted["proportional"] - predicted["optimized"]
    validated = bool(published and gain - half > 0)
    if validated:
        text = f"validated: measured gain {gain:.4f} (interval {gain - half:.4f} .. {gain + half:.4f}) exceeds the noise; predicted {predicted_gain:.4f}"
    elif not published:
        text = f"not validated: the gate published token-proportional; the optimizer's candidate measured a gain of {gain:.4f} (interval {gain - half:.4f} .. {gain + half:.4f})"
    else:
        text = f"not validated: measured gain {gain:.4f} (interval {gain - half:.4f} .. {gain + half:.4f}) is within the noise or negative; predicted {predicted_gain:.4f}"
    return {
        "validated": validated, "published": published, "verdict": text, "level": level, "noise_sd": noise_sd,
        "measured": per, "predicted": dict(predicted), "measured_gain": {"mean": gain, "low": gain - half, "high": gain + half}, "predicted_gain": predicted_gain,
    }
