"""Validation: the published mixture and token-proportional sampling, each trained with several
seeds at each size of the trainer's ladder, measured against what the surrogate predicted.

A prediction is not a result, and a proxy's finding may not hold for a larger model.
``mixture_validation`` trains (built-in trainer) or hands out configs for (external trainer) both
mixtures with ``validation_seeds`` seeds at every size of ``StudyParams.sizes_to_validate`` (the
language-model proxy's larger ladder sizes unless ``validation_sizes`` names others). At each
size each mixture gets the mean of its seeds and a t interval; the gain (proportional minus
optimized, positive is better) gets a Welch interval whose standard deviations are never below
the replicate noise the swarm measured. The mixture is *validated* only when the gate published
it and, at every size, the gain's interval lies above zero and the gain reaches
``gate.min_gain`` (a noise estimate of 0, from a trainer that ignores its seed, never makes a
vanishing gain a claim). When the interval lies entirely below zero at some size,
validation measured the mixture *worse*. Either way, a mixture validation did not confirm is not
what consumers train on: they get token-proportional weights instead (:func:`consumer_mixture`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import polars as pl

from marin_assets.core.mixture import fit
from marin_assets.core.mixture.swarm import GateParams, StudyParams, group_truncation, mixture_id, round_to_block, study_dir, trainer_config
from marin_assets.core.runtime import storage

MIXTURES = ("optimized", "proportional")
LEVEL = 0.9
RUN_PREFIX = "v-"  # validation run ids, apart from the swarm's rNNNN


def validation_run_id(which: str, seed: int, size: str = "") -> str:
    return f"{RUN_PREFIX}{size + '-' if size else ''}{which}-s{seed}"


def validation_plan(study: StudyParams) -> list[tuple[str, str, str, int]]:
    """(run id, size, mixture, seed) of every validation run: sizes x mixtures x seeds."""
    return [(validation_run_id(which, seed, size), size, which, seed)
            for size in study.sizes_to_validate() for which in MIXTURES for seed in range(study.validation_seeds)]


def validation_configs(
    study: StudyParams, candidate_blocks: np.ndarray, proportional: np.ndarray, groups: pl.DataFrame,
    pool_files: Mapping[str, Sequence[str]], results_uri: str,
) -> dict[str, dict[str, Any]]:
    """Trainer configs of every run of :func:`validation_plan` (each names its ladder ``size``),
    at ``validation_budget_scale`` x the proxy budget (simulated epoching recomputed for it).
    ``candidate_blocks``: the optimized
    mixture's block sequences (phases x groups, every group of ``groups``); ``proportional``: the
    token-proportional weights, rounded to the block here."""
    groups = groups.sort("group")
    names = groups["group"].to_list()
    tokens = groups["tokens"].to_numpy().astype(np.float64)
    ladder = dataclasses.replace(study, proxy_budget=study.proxy_budget * study.validation_budget_scale)
    trunc = group_truncation(groups["tokens"].to_list(), ladder)
    blocks = {"optimized": np.asarray(candidate_blocks, dtype=np.int64), "proportional": round_to_block(proportional, tokens, study)}
    out = {}
    for rid, size, which, seed in validation_plan(study):
        config = trainer_config(ladder, rid, mixture_id(blocks[which]), seed, blocks[which], names, tokens, trunc, pool_files, results_uri)
        out[rid] = {**config, "size": size}
    return out


def _t(level: float, dof: int) -> float:
    from scipy.stats import t  # noqa: PLC0415

    return float(t.ppf(0.5 + level / 2, max(dof, 1)))


def measured_interval(values: Sequence[float], floor_sd: float = 0.0, level: float = LEVEL) -> dict[str, float]:
    v = np.asarray(values, dtype=np.float64)
    sd = max(float(v.std(ddof=1)) if len(v) > 1 else 0.0, floor_sd)
    half = _t(level, len(v) - 1) * sd / math.sqrt(len(v))
    return {"mean": float(v.mean()), "low": float(v.mean() - half), "high": float(v.mean() + half), "sd": sd, "seeds": len(v)}


def gain_at(measured: Mapping[str, Sequence[float]], floor_sd: float, level: float = LEVEL) -> dict[str, Any]:
    """One size: each mixture's interval, and the gain's Welch interval (sds floored at ``floor_sd``)."""
    per = {m: measured_interval(measured[m], floor_sd, level) for m in MIXTURES}
    opt, prop = (np.asarray(measured[m], dtype=np.float64) for m in MIXTURES)
    se = math.sqrt(per["optimized"]["sd"] ** 2 / len(opt) + per["proportional"]["sd"] ** 2 / len(prop))
    gain = float(prop.mean() - opt.mean())
    half = _t(level, len(opt) + len(prop) - 2) * se
    identical = all(len(set(measured[m])) == 1 for m in MIXTURES)
    return {"measured": per, "measured_gain": {"mean": gain, "low": gain - half, "high": gain + half}, "identical_seeds": identical}


def _interval(g: Mapping[str, float]) -> str:
    return f"{g['mean']:.4f} (interval {g['low']:.4f} .. {g['high']:.4f})"


def verdict(
    measured: Mapping[str, Mapping[str, Sequence[float]]], predicted: Mapping[str, float], published: bool, noise_sd: float | None,
    min_gain: float = GateParams.min_gain, level: float = LEVEL,
) -> dict[str, Any]:
    """Measured against predicted for both mixtures at every size (``measured``: size -> mixture
    -> the seeds' targets; size ``""`` is the proxy's own), the gain with its interval per size,
    whether the published mixture is validated, and whether it was measured worse."""
    floor = float(noise_sd or 0.0)
    sizes = {size: gain_at(m, floor, level) for size, m in measured.items()}
    name = lambda size: size or "the proxy size"  # noqa: E731
    gains = {size: at["measured_gain"] for size, at in sizes.items()}
    short = [size for size, g in gains.items() if not (g["low"] > 0 and g["mean"] >= min_gain)]
    worse = [size for size, g in gains.items() if g["high"] < 0]
    per_size = _interval(gains[""]) if list(gains) == [""] else "; ".join(f"{name(size)}: {_interval(g)}" for size, g in gains.items())
    identical = [name(size) for size, at in sizes.items() if at["identical_seeds"]]
    predicted_gain = predicted["proportional"] - predicted["optimized"]
    validated = bool(published and not short)
    if not published:
        text = f"not validated: the gate published token-proportional; the optimizer's candidate measured a gain of {per_size}"
    elif worse:
        text = (f"measured worse: the optimized mixture's gain lies entirely below 0 at {', '.join(name(s) for s in worse)} ({per_size}); "
                "token-proportional is published instead")
    elif validated:
        text = f"validated at {', '.join(name(s) for s in gains)}: measured gain {per_size}, above 0 and at least {min_gain:g}; predicted {predicted_gain:.4f}"
    else:
        text = (f"not validated: measured gain {per_size}; at {', '.join(name(s) for s in short)} it is within the noise, negative or "
                f"below the smallest gain claimed ({min_gain:g}); predicted {predicted_gain:.4f}")
    if identical:
        text += f"; the seeds gave identical results at {', '.join(identical)} (the trainer ignores its seed: its noise is unknown)"
    last = sizes[list(sizes)[-1]]
    return {
        "validated": validated, "published": published, "worse": bool(published and worse), "verdict": text, "level": level, "noise_sd": noise_sd,
        "min_gain": min_gain, "sizes": sizes, "measured": last["measured"], "measured_gain": last["measured_gain"], "predicted": dict(predicted),
        "predicted_gain": predicted_gain,
    }


def consumer_mixture(published: Mapping[str, Any], proportional: Mapping[str, Any], result: Mapping[str, Any] | None) -> dict[str, Any]:
    """The trainer-ready mixture consumers should train on, saying which it is and why:
    ``published`` (what the gates published) until validation has measured it, then only if
    validation confirmed it; ``proportional`` once validation measured it worse or found no
    clear gain (a proxy's finding that did not transfer is not shipped; the candidate stays in
    ``weights.parquet``). ``result``: the validation verdict (None: not measured yet)."""
    if result is None:
        return {**published, "validation": "not measured yet: mixture_validation has not run for these weights",
                "why": f"{published.get('published', 'optimized')} as the gates decided; not yet validated"}
    if published.get("published") != "optimized":
        return {**published, "validation": result["verdict"], "why": "the gates refused the optimized mixture"}
    if result.get("validated"):
        return {**published, "validation": result["verdict"], "why": "validated: the optimized mixture measured better at every validated size"}
    why = ("validation measured the optimized mixture worse than token-proportional" if result.get("worse")
           else "validation did not confirm the optimized mixture's gain at every validated size")
    return {**proportional, "published": "proportional", "validation": result["verdict"], "why": f"{why}, so token-proportional is published"}


CONSUMER_FILE = "mixture.json"


def consumer_uri(root: str, study: str) -> str:
    """Where a training run reads the study's mixture: ``<root>/mixture/<study>/mixture.json``."""
    return storage.join(study_dir(root, study), CONSUMER_FILE)


def write_consumer_mixture(root: str, study: str, mixture: Mapping[str, Any]) -> str:
    uri = consumer_uri(root, study)
    storage.write_json(uri, dict(mixture))
    return uri


def proportional_mixture(table: pl.DataFrame, study: StudyParams, pool_files: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """The trainer-ready token-proportional mixture (rounded to the block as validation trained
    it) from a study's ``weights.parquet`` table."""
    phases = [table.filter(pl.col("phase") == p.name).sort("group") for p in study.phases]
    tokens = phases[0]["tokens"].to_numpy().astype(np.float64)
    blocks = round_to_block(np.stack([t["proportional_weight"].to_numpy() for t in phases]), tokens, study)
    swapped = pl.concat([t.with_columns(pl.Series("weight", blocks[i] / study.block_size), pl.Series("block_sequences", blocks[i]),
                                        pl.col("proportional_epochs").alias("epochs")) for i, t in enumerate(phases)])
    return fit.trainer_mixture(swapped, dict(pool_files), study, {"published": "proportional"})
