"""Gates on a mixture fit: a study publishes an optimized mixture only when its evidence holds.

An optimizer always returns some mixture; whether it is better than token-proportional sampling
is a question of evidence. The fit of a study passes when all of these hold, and otherwise the
study publishes token-proportional weights with the reasons and what to add:

* ``finite``: every run's target is a finite number;
* ``runs``: at least ``max(min_runs, runs_per_feature x phases x groups)`` runs;
* ``noise``: the targets vary across mixtures by more than ``noise_ratio`` replicate standard
  deviations (replicates: runs of one mixture with other seeds); no replicates, no noise floor,
  and replicates that agree exactly (a trainer that ignores its seed) are no noise floor either;
* ``fit``: cross-validated Spearman >= ``min_spearman`` and R^2 >= ``min_r2``;
* ``baseline``: on the same cross-validation folds, paired fold by fold, the distance to the
  proportional mix alone does not rank held-out runs better than the fit by more than
  ``baseline_margin`` (Spearman); else the surrogate learned nothing a KL penalty does not
  already say. A tie within the margin passes: the verdict never turns on a 0.001 difference;
* ``gain``: the optimized mixture's predicted gain over proportional exceeds one run's noise
  and ``min_gain``, whatever the noise estimate.

Run ids must be unique: two results for one run are an error, never averaged or overwritten.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from marin_assets.core.mixture import fit
from marin_assets.core.mixture.swarm import GateParams, StudyParams, kl_divergence
from marin_assets.core.pool.groups import MixtureError


@dataclasses.dataclass
class Verdict:
    """Whether the fit is trusted; each failed gate with why and what to add."""

    passed: bool
    reasons: list[dict[str, str]]
    facts: dict[str, Any]

    def describe(self) -> str:
        if self.passed:
            return "passed: " + ", ".join(f"{k} {_fmt(v)}" for k, v in self.facts.items() if v is not None)
        return "; ".join(f"{r['gate']}: {r['why']} ({r['add']})" for r in self.reasons)

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "reasons": self.reasons, "facts": self.facts}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Verdict:
        return cls(bool(raw["passed"]), list(raw["reasons"]), dict(raw["facts"]))


def _fmt(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def replicate_noise(targets: np.ndarray, mixture_ids: Sequence[str]) -> dict[str, Any]:
    """Pooled within-mixture standard deviation (replicates), and the standard deviation of the
    per-mixture mean targets (the spread the fit has to explain)."""
    y = np.asarray(targets, dtype=np.float64)
    by_mix: dict[str, list[float]] = {}
    for mid, value in zip(mixture_ids, y):
        by_mix.setdefault(mid, []).append(float(value))
    replicated = [np.asarray(v) for v in by_mix.values() if len(v) > 1]
    dof = sum(len(v) - 1 for v in replicated)
    noise = math.sqrt(sum(float(((v - v.mean()) ** 2).sum()) for v in replicated) / dof) if dof else None
    means = np.array([np.mean(v) for v in by_mix.values()])
    spread = float(means.std(ddof=1)) if len(means) > 1 else 0.0
    identical = bool(replicated) and all(len(set(v.tolist())) == 1 for v in replicated)
    return {"noise_sd": noise, "spread_sd": spread, "replicated_mixtures": len(replicated), "mixtures": len(by_mix), "identical_replicates": identical}


def _refuse_duplicates(run_ids: Sequence[str]) -> None:
    twice = sorted(r for r, n in Counter(run_ids).items() if n > 1)
    if twice:
        raise MixtureError(f"run ids {twice[:5]} appear more than once; each run has one result (fix the results that report them twice)")


def _reason(gate: str, why: str, add: str) -> dict[str, str]:
    return {"gate": gate, "why": why, "add": add}


def data_gates(targets: np.ndarray, run_ids: Sequence[str], mixture_ids: Sequence[str], n_features: int, params: GateParams) -> Verdict:
    """The gates that need no fit: finite targets, enough runs, targets beyond the noise."""
    y = np.asarray(targets, dtype=np.float64)
    _refuse_duplicates(run_ids)
    reasons: list[dict[str, str]] = []
    bad = [r for r, v in zip(run_ids, y) if not np.isfinite(v)]
    if bad:
        reasons.append(_reason("finite", f"{len(bad)} runs have a non-finite target ({', '.join(bad[:5])})", "fix or rerun those runs"))
    need = max(params.min_runs, math.ceil(params.runs_per_feature * n_features))
    if len(y) < need:
        reasons.append(_reason("runs", f"{len(y)} runs for {n_features} weight features; at least {need} needed", f"train {need - len(y)} more proxy runs (n_runs)"))
    finite = np.isfinite(y)
    noise = replicate_noise(y[finite], [m for m, f in zip(mixture_ids, finite) if f])
    if noise["noise_sd"] is None:
        reasons.append(_reason("noise", "no replicate runs, so the run-to-run noise is unknown", "add replicates (replicate_mixtures >= 1, replicate_seeds >= 2)"))
    elif noise["identical_replicates"]:
        reasons.append(_reason("noise", f"the replicates of {noise['replicated_mixtures']} mixtures gave identical targets (noise sd 0): the trainer ignores "
                               "its seed, so the run-to-run noise is unknown", "make the trainer use the config's seed (data order, initialization)"))
    elif not noise["spread_sd"] > params.noise_ratio * noise["noise_sd"]:
        reasons.append(_reason(
            "noise", f"targets vary by sd {noise['spread_sd']:.4g} across mixtures, within {params.noise_ratio:g} x the replicate noise sd {noise['noise_sd']:.4g}",
            "propose more distinct mixtures (a wider concentration), a larger proxy_budget, or a less noisy target",
        ))
    facts = {"runs": len(y), "runs_needed": need, **noise}
    return Verdict(not reasons, reasons, facts)


def fit_gates(data: Verdict, cv: Mapping[str, float], baseline: Mapping[str, float], params: GateParams,
              paired: Mapping[str, Any] | None = None) -> Verdict:
    """``data``'s verdict with the fit's cross-validated scores against the floors, and against
    the KL baseline fold by fold (``paired``: :func:`fit.paired_fold_difference`; without it,
    the pooled Spearmans)."""
    reasons = list(data.reasons)
    rho, r2, base = cv.get("spearman", math.nan), cv.get("r2", math.nan), baseline.get("spearman", math.nan)
    if not (np.isfinite(rho) and rho >= params.min_spearman and np.isfinite(r2) and r2 >= params.min_r2):
        reasons.append(_reason("fit", f"cross-validated Spearman {rho:.3f} and R^2 {r2:.3f}; at least {params.min_spearman:g} and {params.min_r2:g} needed",
                               "more runs, replicates to average out noise, or a target the mixture moves"))
    folds = int(paired["folds"]) if paired else 0
    ahead = float(paired["mean"]) if folds else (rho - base if np.isfinite(rho) else -math.inf)
    if np.isfinite(base) and not ahead >= -params.baseline_margin:
        where = f"over {folds} paired folds" if folds else "pooled"
        reasons.append(_reason("baseline", f"the distance to the proportional mix alone ranks held-out runs better than the fit by {-ahead:.3f} Spearman "
                               f"({where}; fit {rho:.3f}, KL-only {base:.3f}), more than the margin {params.baseline_margin:g}",
                               "more runs far from the proportional mix; the KL penalty already captures what the fit found"))
    facts = {**data.facts, "cv_spearman": rho, "cv_r2": r2, "baseline_spearman": base, "fit_minus_baseline": ahead,
             "fit_minus_baseline_interval": [paired["low"], paired["high"]] if folds else None}
    return Verdict(not reasons, reasons, facts)


@dataclasses.dataclass
class Assessment:
    """A study's fit (None when the data gates leave nothing to fit) and the verdict on it."""

    model: Any
    verdict: Verdict
    baseline: dict[str, float]


def assess(
    weights: np.ndarray, targets: np.ndarray, run_ids: Sequence[str], mixture_ids: Sequence[str], study: StudyParams,
    tokens: np.ndarray, fit_params: fit.FitParams, components: Sequence[str], component_weights: Sequence[float],
) -> Assessment:
    """Data gates, then (with finite targets for 3 or more runs) the surrogates and the KL-only
    baseline on the same folds, then the fit gates."""
    targets = np.asarray(targets, dtype=np.float64).reshape(len(run_ids), -1)
    cw = np.asarray(component_weights, dtype=np.float64)
    target = targets @ cw
    data = data_gates(target, run_ids, mixture_ids, weights.shape[1] * weights.shape[2], study.gate)
    if len(run_ids) < 3 or not np.isfinite(target).all():
        return Assessment(None, data, {})
    model = fit.fit_surrogates(weights, targets, fit_params, components, cw, fit.epoch_scale(tokens, study))
    shares = np.array([p.share for p in study.phases])
    prior = np.asarray(tokens, dtype=np.float64) / float(np.sum(tokens))
    kl = (kl_divergence(weights.reshape(-1, weights.shape[-1]), prior).reshape(weights.shape[:2]) * shares).sum(axis=1)
    baseline, baseline_oof = fit.cross_validate_baseline(kl, target, fit_params)
    paired = fit.paired_fold_difference(target, model.oof[model.chosen], baseline_oof, fit_params)
    return Assessment(model, fit_gates(data, model.cv[model.chosen], baseline, study.gate, paired), baseline)


def gain_gate(verdict: Verdict, gain: Mapping[str, float] | None, predicted_gain: float, min_gain: float = GateParams.min_gain) -> Verdict:
    """``verdict`` with the optimized mixture's predicted gain over proportional, which must
    exceed one run's replicate noise and ``min_gain``: a smaller gain could not be told apart
    from noise by validation, and is not worth claiming even when the noise reads 0. The
    bootstrap interval is reported, not gated on: refits of trees on a few hundred runs
    scatter widely, and validation measures the gain itself."""
    reasons = list(verdict.reasons)
    noise = verdict.facts.get("noise_sd") or 0.0
    if not predicted_gain > max(noise, min_gain):
        reasons.append(_reason("gain", f"the predicted gain {predicted_gain:.4g} is not above one run's noise (sd {noise:.4g}) and the smallest gain claimed ({min_gain:g})",
                               "more runs, or a larger proxy_budget; the surrogate sees no mixture clearly better than proportional"))
    interval = {"gain_low": gain["low"], "gain_high": gain["high"]} if gain else {}
    return Verdict(not reasons, reasons, {**verdict.facts, "predicted_gain": predicted_gain, **interval})


def publish(
    model: fit.FittedModel | None, verdict: Verdict, tokens: np.ndarray, study: StudyParams, seeds: np.ndarray | None = None
) -> tuple[fit.Optimized, fit.Optimized, Verdict, dict[str, float] | None]:
    """(published, candidate, verdict with the predicted gain, gain): the optimizer's candidate
    is published only when every gate passed, token-proportional sampling otherwise."""
    proportional = fit.proportional_optimized(tokens, study, model.predict if model is not None else None)
    if model is None:
        return proportional, proportional, verdict, None
    params = fit.OptimizeParams(candidates=study.search_candidates, rounds=study.search_rounds, seed=study.seed, method=study.optimizer, top_k=study.top_k)
    candidate = fit.optimize_mixture(model.predict, tokens, study, params, seeds=seeds, penalty=fit.limit_penalty(model, dict(study.target_limits)))
    gain = fit.gain_interval(model, candidate.weights, candidate.proportional)
    verdict = gain_gate(verdict, gain, candidate.proportional_predicted - candidate.predicted, study.gate.min_gain)
    return (candidate if verdict.passed else proportional), candidate, verdict, gain
