"""Gates on a mixture fit: a study publishes an optimized mixture only when its evidence holds.

An optimizer always returns some mixture; whether it is better than token-proportional sampling
is a question of evidence. The fit of a study passes when all of these hold, and otherwise the
study publishes token-proportional weights with the reasons and what to add:

* ``finite``: every run's target is a finite number;
* ``runs``: at least ``max(min_runs, runs_per_feature x phases x groups)`` runs;
* ``noise``: the targets vary across mixtures by more than ``noise_ratio`` replicate standard
  deviations (replicates: runs of one mixture with other seeds); no replicates, no noise floor;
* ``fit``: cross-validated Spearman >= ``min_spearman`` and R^2 >= ``min_r2``;
* ``baseline``: the fit ranks held-out runs better (Spearman, by ``baseline_margin``) than the
  distance to the proportional mix alone, else the surrogate learned nothing a KL penalty
  does not already say.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from marin_assets.core.mixture.swarm import GateParams


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
    return {"noise_sd": noise, "spread_sd": spread, "replicated_mixtures": len(replicated), "mixtures": len(by_mix)}


def _reason(gate: str, why: str, add: str) -> dict[str, str]:
    return {"gate": gate, "why": why, "add": add}


def data_gates(targets: np.ndarray, run_ids: Sequence[str], mixture_ids: Sequence[str], n_features: int, params: GateParams) -> Verdict:
    """The gates that need no fit: finite targets, enough runs, targets beyond the noise."""
    y = np.asarray(targets, dtype=np.float64)
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
    elif not noise["spread_sd"] > params.noise_ratio * noise["noise_sd"]:
        reasons.append(_reason(
            "noise", f"targets vary by sd {noise['spread_sd']:.4g} across mixtures, within {params.noise_ratio:g} x the replicate noise sd {noise['noise_sd']:.4g}",
            "propose more distinct mixtures (a wider concentration), a larger proxy_budget, or a less noisy target",
        ))
    facts = {"runs": len(y), "runs_needed": need, **noise}
    return Verdict(not reasons, reasons, facts)


def fit_gates(data: Verdict, cv: Mapping[str, float], baseline: Mapping[str, float], params: GateParams) -> Verdict:
    """``data``'s verdict with the fit's cross-validated scores against the floors and the KL baseline."""
    reasons = list(data.reasons)
    rho, r2, base = cv.get("spearman", math.nan), cv.get("r2", math.nan), baseline.get("spearman", math.nan)
    if not (np.isfinite(rho) and rho >= params.min_spearman and np.isfinite(r2) and r2 >= params.min_r2):
        reasons.append(_reason("fit", f"cross-validated Spearman {rho:.3f} and R^2 {r2:.3f}; at least {params.min_spearman:g} and {params.min_r2:g} needed",
                               "more runs, replicates to average out noise, or a target the mixture moves"))
    if np.isfinite(base) and not (np.isfinite(rho) and rho > base + params.baseline_margin):
        reasons.append(_reason("baseline", f"the fit's Spearman {rho:.3f} does not beat {base:.3f} of the distance to the proportional mix alone",
                               "more runs far from the proportional mix; the KL penalty already captures what the fit found"))
    facts = {**data.facts, "cv_spearman": rho, "cv_r2": r2, "baseline_spearman": base}
    return Verdict(not reasons, reasons, facts)
