"""Surrogates from mixture weights to a proxy metric, and the optimized mixture they propose.

Two surrogates are fitted on the proxies' (weights, metric) pairs. The features are the weights
of every phase side by side and each group's ``log(1 + epochs)`` in the full run, so a fit can
learn that repeating a group is worth less than its first pass:

* ``lightgbm``: gradient-boosted trees, as RegMix uses;
* ``loglinear``: the log-linear mixing law ``c + exp(a + t . w)``, the baseline.

When the target combines component metrics (macro bits per byte over evaluation domains, or a
weighted sum of metrics), each component gets its own surrogate and their predictions are
combined with the same weights. Each surrogate is scored by k-fold cross-validation
(out-of-fold Spearman, R^2 and mean absolute error of the target); the one with the higher
out-of-fold Spearman is used unless the caller names one. The same folds score a baseline that
knows only each run's KL divergence to the proportional mix (the gates compare the two), and
``bootstrap`` refits of the chosen surrogate on resampled runs give the predictions' spread.

The optimizer minimizes ``predicted metric + kl_weight x sum_p share_p KL(w_p || proportional)``
over the simplex of every phase, subject to the epoch cap summed over phases (feasibility is
restored by :func:`project_batch` after every proposal). Simulated Dirichlet candidates around
the prior start a cross-entropy search (rounds of proposals around the best so far). ``topk``
(the default): the mean of the ``top_k`` best candidates of the search's last round, which
averages out the surrogate's error where a single argmin exploits it; ``regmix``: the mean of
the ``top_k`` best simulated candidates, no search (RegMix as published); ``trust_region``: the
search's best within the typical distance between observed mixtures of one of them;
``argmin``: the search's best. ``bench/bench_mixture.py`` scores them against a known truth.
The result is rounded to the mixture block; groups rounded to zero are reported.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import polars as pl

from marin_assets.core.mixture.swarm import (
    OPTIMIZERS,
    StudyParams,
    epochs,
    kl_divergence,
    round_to_block,
)
from marin_assets.core.pool.groups import MixtureError
from marin_assets.core.runtime import storage

SURROGATES = ("lightgbm", "loglinear")
MIN_FOLD_RUNS = 5  # held-out runs a fold needs before its own Spearman is compared


@dataclasses.dataclass(frozen=True)
class FitParams:
    """Surrogate settings. ``surrogate``: ``auto`` (best cross-validated Spearman) or a name;
    ``bootstrap``: refits of the chosen surrogate on resampled runs (the prediction's spread)."""

    folds: int = 5
    seed: int = 0
    surrogate: str = "auto"
    lgbm_estimators: int = 400
    lgbm_learning_rate: float = 0.05
    lgbm_leaves: int = 4
    lgbm_min_child_samples: int = 4
    ridge_alphas: tuple[float, ...] = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)
    bootstrap: int = 16


@dataclasses.dataclass(frozen=True)
class OptimizeParams:
    """``candidates`` simulated proposals; ``method`` (one of ``OPTIMIZERS``);
    the cross-entropy search's ``rounds`` and ``elite``; ``trust_radius`` in total variation
    (0: the median distance from an observed mixture to its nearest neighbour)."""

    candidates: int = 20_000
    rounds: int = 8
    elite: int = 64
    seed: int = 0
    method: str = "topk"
    top_k: int = 64
    trust_radius: float = 0.0


def features(weights: np.ndarray, epoch_scale: np.ndarray | None = None) -> np.ndarray:
    """(runs x phases x groups) weights as (runs x phases*groups) features, followed by each
    group's ``log(1 + epochs)`` in the full run when ``epoch_scale`` (phases x groups: phase
    budget / group tokens) is given."""
    w = np.asarray(weights, dtype=np.float64)
    flat = w.reshape(w.shape[0], -1)
    if epoch_scale is None:
        return flat
    return np.hstack([flat, np.log1p(np.einsum("npg,pg->ng", w, np.asarray(epoch_scale, dtype=np.float64)))])


def epoch_scale(tokens: np.ndarray, study: StudyParams) -> np.ndarray:
    """Phase budget / group tokens: full-run epochs per unit of weight (0 for empty groups)."""
    tokens = np.asarray(tokens, dtype=np.float64)
    per_token = np.where(tokens > 0, 1.0 / np.maximum(tokens, 1e-300), 0.0)
    return study.phase_budgets(study.target_budget)[:, None] * per_token[None, :]


# --------------------------------------------------------------------------- surrogates


class LightGBMSurrogate:
    name = "lightgbm"

    def __init__(self, params: FitParams) -> None:
        self.params = params
        self.model: Any = None

    def fit(self, x: np.ndarray, y: np.ndarray) -> LightGBMSurrogate:
        import lightgbm  # noqa: PLC0415

        p = self.params
        self.model = lightgbm.LGBMRegressor(
            n_estimators=p.lgbm_estimators,
            learning_rate=p.lgbm_learning_rate,
            num_leaves=p.lgbm_leaves,
            min_child_samples=max(1, min(p.lgbm_min_child_samples, len(y) // 4)),
            min_data_in_bin=1,
            reg_lambda=1e-3,
            random_state=p.seed,
            deterministic=True,
            force_row_wise=True,
            n_jobs=1,
            verbose=-1,
        ).fit(x, y)
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(self.model.predict(x), dtype=np.float64)

    def state(self) -> dict[str, Any]:
        booster = self.model.booster_ if hasattr(self.model, "booster_") else self.model
        return {"model": booster.model_to_string()}

    @classmethod
    def from_state(cls, state: dict[str, Any], params: FitParams) -> LightGBMSurrogate:
        import lightgbm  # noqa: PLC0415

        out = cls(params)
        out.model = lightgbm.Booster(model_str=state["model"])
        return out


class LogLinearSurrogate:
    """``metric = c + exp(a + t . w)``: the log-linear mixing law. The offset ``c`` is chosen on a
    grid below the smallest observed value; ``a`` and ``t`` by ridge regression on ``log(metric - c)``.
    """

    name = "loglinear"

    def __init__(self, params: FitParams) -> None:
        self.params = params
        self.offset = 0.0
        self.coef = np.zeros(0)
        self.intercept = 0.0

    def fit(self, x: np.ndarray, y: np.ndarray) -> LogLinearSurrogate:
        from sklearn.linear_model import RidgeCV  # noqa: PLC0415

        y = np.asarray(y, dtype=np.float64)
        low, span = float(y.min()), float(np.ptp(y)) or max(abs(float(y.min())), 1.0) * 1e-3
        offsets = [low - span * d for d in (1e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0, 10.0)]
        if low > 0:
            offsets += [low * f for f in (0.0, 0.5, 0.8, 0.9, 0.95, 0.98, 0.99) if low * f < low - 1e-12]
        offsets_arr = np.array(offsets)
        # every offset is one target column of one ridge fit: the features' decomposition is shared
        model = RidgeCV(alphas=self.params.ridge_alphas, alpha_per_target=True).fit(x, np.log(y[:, None] - offsets_arr[None, :]))
        err = ((offsets_arr[None, :] + np.exp(model.predict(x)) - y[:, None]) ** 2).mean(axis=0)
        best = int(np.argmin(err))
        self.offset = float(offsets_arr[best])
        self.coef, self.intercept = np.asarray(model.coef_[best], dtype=np.float64), float(np.atleast_1d(model.intercept_)[best])
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        return self.offset + np.exp(np.clip(np.asarray(x, dtype=np.float64) @ self.coef + self.intercept, -700, 700))

    def state(self) -> dict[str, Any]:
        return {"offset": self.offset, "intercept": self.intercept, "coef": self.coef.tolist()}

    @classmethod
    def from_state(cls, state: dict[str, Any], params: FitParams) -> LogLinearSurrogate:
        out = cls(params)
        out.offset, out.intercept, out.coef = float(state["offset"]), float(state["intercept"]), np.asarray(state["coef"], dtype=np.float64)
        return out


_SURROGATE_TYPES = {"lightgbm": LightGBMSurrogate, "loglinear": LogLinearSurrogate}


def make_surrogate(name: str, params: FitParams) -> LightGBMSurrogate | LogLinearSurrogate:
    if name not in _SURROGATE_TYPES:
        raise MixtureError(f"unknown surrogate {name!r}: use one of {SURROGATES} or 'auto'")
    return _SURROGATE_TYPES[name](params)


def scores(actual: np.ndarray, predicted: np.ndarray) -> dict[str, float]:
    """Spearman, R^2 and mean absolute error of predictions."""
    from scipy.stats import spearmanr  # noqa: PLC0415

    actual = np.asarray(actual, dtype=np.float64)
    predicted = np.asarray(predicted, dtype=np.float64)
    ss_tot = float(((actual - actual.mean()) ** 2).sum())
    rho = spearmanr(actual, predicted).statistic if np.ptp(predicted) > 0 and np.ptp(actual) > 0 else float("nan")
    return {
        "spearman": float(rho),
        "r2": float(1.0 - ((actual - predicted) ** 2).sum() / ss_tot) if ss_tot > 0 else float("nan"),
        "mae": float(np.abs(actual - predicted).mean()),
    }


def _fit_components(name: str, x: np.ndarray, targets: np.ndarray, params: FitParams) -> list[Any]:
    return [make_surrogate(name, params).fit(x, targets[:, j]) for j in range(targets.shape[1])]


def _predict_components(models: Sequence[Any], x: np.ndarray) -> np.ndarray:
    """(n x components) predictions."""
    return np.stack([m.predict(x) for m in models], axis=1)


def _folds(n: int, params: FitParams) -> list[tuple[np.ndarray, np.ndarray]]:
    from sklearn.model_selection import KFold  # noqa: PLC0415

    return list(KFold(n_splits=min(params.folds, n), shuffle=True, random_state=params.seed).split(np.zeros(n)))


def cross_validate(name: str, x: np.ndarray, targets: np.ndarray, params: FitParams, weights: np.ndarray | None = None) -> tuple[dict[str, float], np.ndarray]:
    """Out-of-fold scores and predictions of the target (``targets`` @ ``weights``, default the
    mean of the columns) with ``k = min(folds, runs)`` folds."""
    cw = _component_weights(targets, weights)
    folds = _folds(len(targets), params)
    oof = np.zeros(len(targets), dtype=np.float64)
    for train, test in folds:
        oof[test] = _predict_components(_fit_components(name, x[train], targets[train], params), x[test]) @ cw
    return scores(targets @ cw, oof) | {"folds": len(folds)}, oof


def cross_validate_baseline(kl: np.ndarray, target: np.ndarray, params: FitParams) -> tuple[dict[str, float], np.ndarray]:
    """The same folds for a ridge fit on the KL divergence to the proportional mix alone (and
    its square root): what a study knows without a surrogate."""
    from sklearn.linear_model import RidgeCV  # noqa: PLC0415

    x = np.column_stack([kl, np.sqrt(np.maximum(kl, 0.0))])
    oof = np.zeros(len(target), dtype=np.float64)
    for train, test in _folds(len(target), params):
        oof[test] = RidgeCV(alphas=params.ridge_alphas).fit(x[train], target[train]).predict(x[test])
    return scores(target, oof), oof


def paired_fold_difference(target: np.ndarray, oof: np.ndarray, baseline_oof: np.ndarray, params: FitParams) -> dict[str, Any]:
    """Fold by fold, the fit's held-out Spearman minus the baseline's on the same runs: their
    mean and its 90% t interval. Folds of fewer than ``MIN_FOLD_RUNS`` runs, or where either
    ranking is undefined, are left out (a ranking of two runs is +-1: no evidence)."""
    from scipy.stats import t  # noqa: PLC0415

    diffs = []
    for _, test in _folds(len(target), params):
        if len(test) < MIN_FOLD_RUNS:
            continue
        a, b = scores(target[test], oof[test])["spearman"], scores(target[test], baseline_oof[test])["spearman"]
        if np.isfinite(a) and np.isfinite(b):
            diffs.append(float(a - b))
    if not diffs:
        return {"folds": 0, "differences": [], "mean": float("nan"), "low": float("nan"), "high": float("nan")}
    d = np.asarray(diffs)
    half = float(t.ppf(0.95, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else float("inf")
    return {"folds": len(d), "differences": diffs, "mean": float(d.mean()), "low": float(d.mean() - half), "high": float(d.mean() + half)}


def _component_weights(targets: np.ndarray, weights: np.ndarray | Sequence[float] | None) -> np.ndarray:
    k = targets.shape[1]
    return np.full(k, 1.0 / k) if weights is None else np.asarray(weights, dtype=np.float64)


@dataclasses.dataclass
class FittedModel:
    """Surrogates per name, each a list of per-component models combined with
    ``component_weights``; ``bootstrap`` refits of the chosen one on resampled runs."""

    chosen: str
    surrogates: dict[str, list[Any]]
    cv: dict[str, dict[str, float]]
    oof: dict[str, np.ndarray]
    components: list[str]
    component_weights: np.ndarray
    epoch_scale: np.ndarray | None = None
    bootstrap: list[list[Any]] = dataclasses.field(default_factory=list)

    def features(self, weights: np.ndarray) -> np.ndarray:
        return features(weights, self.epoch_scale)

    def predict_components(self, weights: np.ndarray, name: str | None = None) -> np.ndarray:
        return _predict_components(self.surrogates[name or self.chosen], self.features(weights))

    def predict(self, weights: np.ndarray, name: str | None = None) -> np.ndarray:
        return self.predict_components(weights, name) @ self.component_weights

    def predict_bootstrap(self, weights: np.ndarray) -> np.ndarray:
        """(bootstrap x n) predictions of the target; empty without bootstrap refits."""
        x = self.features(weights)
        return np.array([_predict_components(ms, x) @ self.component_weights for ms in self.bootstrap]).reshape(len(self.bootstrap), len(x))


def fit_surrogates(
    weights: np.ndarray,
    targets: np.ndarray,
    params: FitParams = FitParams(),
    components: Sequence[str] | None = None,
    component_weights: Sequence[float] | None = None,
    epoch_scale: np.ndarray | None = None,
) -> FittedModel:
    """Both surrogates cross-validated, then refitted on every run; the chosen one named and
    refitted ``params.bootstrap`` times on runs drawn with replacement.

    ``targets`` is (runs,) for one metric, or (runs x k) when the target combines ``k``
    component metrics (by ``component_weights``, default their mean): each component is fitted
    on its own, as the mixing laws fit one law per domain.
    """
    targets = np.asarray(targets, dtype=np.float64)
    targets = targets.reshape(len(targets), -1)
    if len(targets) < 3:
        raise MixtureError(f"{len(targets)} runs have results; a fit needs at least 3 (train or collect more proxies)")
    if not np.isfinite(targets).all():
        raise MixtureError("target metric values must be finite")
    cw = _component_weights(targets, component_weights)
    x = features(weights, epoch_scale)
    cv, oof, models = {}, {}, {}
    for name in SURROGATES:
        cv[name], oof[name] = cross_validate(name, x, targets, params, cw)
        models[name] = _fit_components(name, x, targets, params)
    if params.surrogate == "auto":
        chosen = max(SURROGATES, key=lambda n: (np.nan_to_num(cv[n]["spearman"], nan=-2.0), -cv[n]["mae"]))
    elif params.surrogate in SURROGATES:
        chosen = params.surrogate
    else:
        raise MixtureError(f"unknown surrogate {params.surrogate!r}: use one of {SURROGATES} or 'auto'")
    rng = np.random.default_rng(params.seed)
    boot = [_fit_components(chosen, x[idx], targets[idx], params) for idx in (rng.integers(0, len(x), len(x)) for _ in range(params.bootstrap))]
    names = list(components) if components is not None else [f"target{j}" for j in range(targets.shape[1])]
    return FittedModel(chosen, models, cv, oof, names, cw, None if epoch_scale is None else np.asarray(epoch_scale, dtype=np.float64), boot)


# --------------------------------------------------------------------------- constraints, batched


def project_batch(weights: np.ndarray, tokens: np.ndarray, study: StudyParams, prior: np.ndarray) -> np.ndarray:
    """Like ``mixture_swarm.project_feasible`` over a batch (n x phases x groups)."""
    w = np.array(weights, dtype=np.float64)
    tokens = np.asarray(tokens, dtype=np.float64)
    budgets = study.phase_budgets(study.target_budget)
    if study.max_epochs * tokens.sum() < study.target_budget * (1 - 1e-12):
        raise MixtureError(f"target_budget {study.target_budget:,.0f} needs more than {study.max_epochs:g} epochs of the pool; raise max_epochs or lower the budget")
    w[..., tokens <= 0] = 0.0
    fixed = np.zeros((w.shape[0], w.shape[2]), dtype=bool)
    safe_tokens = np.maximum(tokens, 1e-300)
    for _ in range(4 * w.shape[2] + 10):
        e = np.einsum("npg,p->ng", w, budgets) / safe_tokens
        over = e > study.max_epochs * (1 + 1e-9)
        if not over.any():
            break
        w = w * np.where(over, study.max_epochs / np.where(over, e, 1.0), 1.0)[:, None, :]
        fixed |= over
        free = (~fixed & (tokens > 0)[None, :])[:, None, :]
        base = np.where(free, w, 0.0)
        empty = base.sum(axis=-1, keepdims=True) <= 1e-15
        base = np.where(empty, np.where(free, prior[None, None, :], 0.0), base)
        deficit = 1.0 - w.sum(axis=-1, keepdims=True)
        w = w + deficit * base / np.maximum(base.sum(axis=-1, keepdims=True), 1e-300)
    return w / w.sum(axis=-1, keepdims=True)


def dirichlet_batch(rng: np.random.Generator, means: np.ndarray, concentration: np.ndarray) -> np.ndarray:
    """Dirichlet draws (n x phases x groups) with the given means and total concentrations."""
    g = means.shape[-1]
    alpha = np.maximum(means * concentration[:, None, None] * g, 1e-3) * (means > 0)
    draw = np.where(alpha > 0, rng.gamma(np.maximum(alpha, 1e-300)), 0.0)
    total = draw.sum(axis=-1, keepdims=True)
    return np.where(total > 0, draw / np.maximum(total, 1e-300), means)


# --------------------------------------------------------------------------- optimization


@dataclasses.dataclass
class Optimized:
    weights: np.ndarray  # phases x groups, rounded to the block
    block_sequences: np.ndarray  # phases x groups
    unrounded: np.ndarray
    predicted: float
    objective: float
    kl: float
    proportional: np.ndarray
    proportional_predicted: float
    vanished: list[int]  # group indexes with weight before rounding but none after


def objective_fn(
    predict: Callable[[np.ndarray], np.ndarray], prior: np.ndarray, study: StudyParams, penalty: Callable[[np.ndarray], np.ndarray] | None = None
) -> Callable[[np.ndarray], np.ndarray]:
    shares = np.array([p.share for p in study.phases])

    def objective(w: np.ndarray) -> np.ndarray:
        kl = (kl_divergence(w.reshape(-1, w.shape[-1]), prior).reshape(w.shape[0], w.shape[1]) * shares).sum(axis=1)
        return predict(w) + study.kl_weight * kl + (penalty(w) if penalty is not None else 0.0)

    return objective


def distance_to_nearest(cand: np.ndarray, observed: np.ndarray, shares: np.ndarray, chunk: int = 256) -> np.ndarray:
    """Each candidate's total-variation distance (share-weighted over phases) to the nearest observed mixture."""
    out = np.empty(len(cand))
    for i in range(0, len(cand), chunk):
        d = 0.5 * np.abs(cand[i : i + chunk, None] - observed[None]).sum(axis=-1)  # (c, m, phases)
        out[i : i + chunk] = (d @ shares).min(axis=1)
    return out


def _simulated(rng: np.random.Generator, prior: np.ndarray, study: StudyParams, n: int) -> np.ndarray:
    """``n`` Dirichlet proposals around the prior (RegMix's simulation) or, ``explore_share`` of
    them, around the uniform mix; a share of them sparse."""
    n_phases = len(study.phases)
    lo, hi = study.concentration
    conc = np.exp(rng.uniform(np.log(min(lo, 0.1)), np.log(max(hi, 10.0)), size=n))
    uniform = np.where(prior > 0, 1.0, 0.0) / float((prior > 0).sum())
    centers = np.where((rng.random(n) < study.explore_share)[:, None], uniform[None, :], prior[None, :])  # as the swarm explores
    first = dirichlet_batch(rng, np.broadcast_to(centers[:, None, :], (n, n_phases, len(prior))), conc)
    sparse = rng.random(n) < study.sparse_share
    if sparse.any():
        keep = rng.random((int(sparse.sum()), 1, len(prior))) < rng.uniform(0.1, 0.6, size=(int(sparse.sum()), 1, 1))
        masked = first[sparse] * keep
        masked_sum = masked.sum(axis=-1, keepdims=True)
        first[sparse] = np.where(masked_sum > 0, masked / np.maximum(masked_sum, 1e-300), first[sparse])
    return first


def _cross_entropy(rng: np.random.Generator, cand: np.ndarray, values: np.ndarray, objective: Callable[[np.ndarray], np.ndarray],
                   project: Callable[[np.ndarray], np.ndarray], params: OptimizeParams) -> tuple[np.ndarray, np.ndarray]:
    """Rounds of proposals around the elites; the last round's candidates and their values."""
    n = max(params.candidates // 4, 1)
    for _ in range(params.rounds):
        order = np.argsort(values)[: params.elite]
        elites, elite_values = cand[order], values[order]
        picks = elites[rng.integers(0, len(elites), size=n)]
        fresh = project(dirichlet_batch(rng, picks, rng.choice([5.0, 20.0, 100.0, 500.0], size=n)))
        mean = project(elites.mean(axis=0, keepdims=True))
        cand = np.concatenate([elites, fresh, mean])
        values = np.concatenate([elite_values, objective(fresh), objective(mean)])
    return cand, values


def optimize_mixture(
    predict: Callable[[np.ndarray], np.ndarray],
    tokens: np.ndarray,
    study: StudyParams,
    params: OptimizeParams = OptimizeParams(),
    seeds: np.ndarray | None = None,
    penalty: Callable[[np.ndarray], np.ndarray] | None = None,
) -> Optimized:
    """The mixture (phases x groups) minimizing predicted metric + KL penalty (+ ``penalty``)
    under the caps, by ``params.method``.

    ``predict`` maps (n x phases x groups) weights to predictions; ``seeds`` (the proxies' own
    mixtures) join the candidates and are the observed mixtures of the trust region.
    """
    tokens = np.asarray(tokens, dtype=np.float64)
    prior = tokens / tokens.sum()
    rng = np.random.default_rng(params.seed)
    shares = np.array([p.share for p in study.phases])
    project = lambda w: project_batch(w, tokens, study, prior)  # noqa: E731
    base_objective = objective_fn(predict, prior, study, penalty)
    proportional = project(np.tile(prior, (1, len(study.phases), 1)))
    observed = project(np.asarray(seeds, dtype=np.float64)) if seeds is not None and len(seeds) else proportional
    pool = [proportional, project(_simulated(rng, prior, study, params.candidates)), observed]
    objective = base_objective
    if params.method == "trust_region":
        radius = params.trust_radius or _typical_spacing(observed, shares)
        picks = observed[rng.integers(0, len(observed), size=params.candidates // 2)]
        pool.append(project(dirichlet_batch(rng, picks, rng.choice([20.0, 100.0, 500.0], size=len(picks)))))

        def objective(w: np.ndarray) -> np.ndarray:
            return np.where(distance_to_nearest(w, observed, shares) <= radius, base_objective(w), np.inf)
    elif params.method not in OPTIMIZERS:
        raise MixtureError(f"unknown optimizer {params.method!r}: use one of {OPTIMIZERS}")
    cand = np.concatenate(pool)
    values = objective(cand)
    if params.method != "regmix":
        cand, values = _cross_entropy(rng, cand, values, objective, project, params)
    if params.method in ("regmix", "topk"):
        best = project(cand[np.argsort(values)[: params.top_k]].mean(axis=0, keepdims=True))[0]
    else:
        best = cand[int(np.argmin(values))]
    blocks = round_to_block(best, tokens, study)
    rounded = blocks / study.block_size
    return Optimized(
        weights=rounded,
        block_sequences=blocks,
        unrounded=best,
        predicted=float(predict(rounded[None])[0]),
        objective=float(base_objective(rounded[None])[0]),
        kl=float((kl_divergence(rounded, prior) * shares).sum()),
        proportional=proportional[0],
        proportional_predicted=float(predict(proportional)[0]),
        vanished=[int(g) for g in np.flatnonzero((best > 0).any(axis=0) & (blocks == 0).all(axis=0) & (tokens > 0))],
    )


def proportional_optimized(tokens: np.ndarray, study: StudyParams, predict: Callable[[np.ndarray], np.ndarray] | None = None) -> Optimized:
    """Token-proportional sampling (feasible, rounded to the block) in the optimizer's result
    shape: what a study publishes when its gates refuse the optimized mixture."""
    tokens = np.asarray(tokens, dtype=np.float64)
    prior = tokens / tokens.sum()
    proportional = project_batch(np.tile(prior, (1, len(study.phases), 1)), tokens, study, prior)[0]
    blocks = round_to_block(proportional, tokens, study)
    rounded = blocks / study.block_size
    shares = np.array([p.share for p in study.phases])
    predicted = float(predict(rounded[None])[0]) if predict is not None else float("nan")
    return Optimized(
        weights=rounded, block_sequences=blocks, unrounded=proportional, predicted=predicted, objective=predicted,
        kl=float((kl_divergence(rounded, prior) * shares).sum()), proportional=proportional,
        proportional_predicted=float(predict(proportional[None])[0]) if predict is not None else float("nan"),
        vanished=[int(g) for g in np.flatnonzero((proportional > 0).any(axis=0) & (blocks == 0).all(axis=0) & (tokens > 0))],
    )


def _typical_spacing(observed: np.ndarray, shares: np.ndarray) -> float:
    """Median distance from an observed mixture to its nearest other one (the trust radius)."""
    if len(observed) < 2:
        return 0.0
    d = 0.5 * np.abs(observed[:, None] - observed[None]).sum(axis=-1) @ shares
    np.fill_diagonal(d, np.inf)
    return float(np.median(d.min(axis=1)))


def gain_interval(model: FittedModel, optimized: np.ndarray, proportional: np.ndarray, level: float = 0.9) -> dict[str, float] | None:
    """Predicted gain (proportional minus optimized target; positive is better): ``point``, the
    difference under the fit itself, and the central ``level`` interval of the same difference
    under the bootstrap refits (their mean is kept apart, never shown as the point). None
    without refits."""
    if not model.bootstrap:
        return None
    both = np.stack([np.asarray(proportional), np.asarray(optimized)])
    point = model.predict(both)
    pred = model.predict_bootstrap(both)
    gains = pred[:, 0] - pred[:, 1]
    tail = (1 - level) / 2 * 100
    return {"point": float(point[0] - point[1]), "bootstrap_mean": float(gains.mean()), "low": float(np.percentile(gains, tail)),
            "high": float(np.percentile(gains, 100 - tail)), "level": level, "refits": len(gains)}


def limit_penalty(model: FittedModel, limits: dict[str, float], scale: float = 1e3) -> Callable[[np.ndarray], np.ndarray] | None:
    """A steep penalty on predicted metrics above their limits (metrics among the components)."""
    index = [(model.components.index(m), v) for m, v in limits.items()]
    if not index:
        return None

    def penalty(w: np.ndarray) -> np.ndarray:
        comp = model.predict_components(w)
        return scale * sum(np.maximum(comp[:, j] - v, 0.0) for j, v in index)

    return penalty


def constraint_report(weights: np.ndarray, tokens: np.ndarray, study: StudyParams) -> dict[str, Any]:
    """Whether a mixture meets every constraint: simplex rows, epoch cap, block multiples."""
    w = np.atleast_2d(weights)
    e = epochs(w, tokens, study.phase_budgets(study.target_budget))
    block = w * study.block_size
    return {
        "rows_sum_to_one": bool(np.allclose(w.sum(axis=1), 1.0, atol=1e-9)),
        "non_negative": bool((w >= 0).all()),
        "max_epochs_seen": float(e.max()),
        "within_epoch_cap": bool((e <= study.max_epochs * (1 + 1e-9)).all()),
        "block_multiples": bool(np.allclose(block, np.round(block), atol=1e-6)),
        "smallest_positive_weight": float(w[w > 0].min()) if (w > 0).any() else 0.0,
        "no_empty_group_weighted": bool((w[:, np.asarray(tokens) <= 0] == 0).all()),
    }


# --------------------------------------------------------------------------- tables


def weights_table(groups: pl.DataFrame, opt: Optimized, study: StudyParams, active: Sequence[int], candidate: Optimized | None = None) -> pl.DataFrame:
    """One row per (phase, group) over all groups: published and proportional weights, change,
    epochs, and the optimizer's candidate (the published mixture unless the gates refused it)."""
    n_groups = groups.height
    full = np.zeros((len(study.phases), n_groups))
    prop = np.zeros((len(study.phases), n_groups))
    blocks = np.zeros((len(study.phases), n_groups), dtype=np.int64)
    cand = np.zeros((len(study.phases), n_groups), dtype=np.int64)
    idx = np.asarray(active, dtype=np.int64)
    full[:, idx] = opt.weights
    prop[:, idx] = opt.proportional
    blocks[:, idx] = opt.block_sequences
    cand[:, idx] = (candidate or opt).block_sequences
    tokens = groups["tokens"].to_numpy().astype(np.float64)
    budgets = study.phase_budgets(study.target_budget)
    e_opt = epochs(full, tokens, budgets)
    e_prop = epochs(prop, tokens, budgets)
    frames = []
    for p, phase in enumerate(study.phases):
        frames.append(
            groups.select("group", "topic", "topic_label", "band", "tokens").with_columns(
                pl.lit(phase.name).alias("phase"),
                pl.lit(phase.share).alias("phase_share"),
                pl.Series("weight", full[p]),
                pl.Series("block_sequences", blocks[p]),
                pl.Series("candidate_block_sequences", cand[p]),
                pl.Series("proportional_weight", prop[p]),
                pl.Series("change", full[p] - prop[p]),
                pl.Series("epochs", e_opt),
                pl.Series("proportional_epochs", e_prop),
            )
        )
    return pl.concat(frames)


def trainer_mixture(table: pl.DataFrame, pool_files: dict[str, list[str]], study: StudyParams, extra: dict[str, Any]) -> dict[str, Any]:
    """The trainer-ready mixture: per phase, weights keyed by group; per group, its pool files."""
    phases = []
    start = 0.0
    for phase in study.phases:
        rows = table.filter((pl.col("phase") == phase.name) & (pl.col("weight") > 0))
        phases.append(
            {
                "name": phase.name,
                "start_fraction": start,
                "share": phase.share,
                "weights": {g: float(w) for g, w in rows.select("group", "weight").iter_rows()},
                "block_sequences": {g: int(b) for g, b in rows.select("group", "block_sequences").iter_rows()},
            }
        )
        start += phase.share
    used = sorted(set(table.filter(pl.col("weight") > 0)["group"].to_list()))
    per_group = table.unique("group").select("group", "tokens", "epochs").rows_by_key("group", named=True, unique=True)
    return {
        "study": study.name,
        "target_budget": study.target_budget,
        "block_size": study.block_size,
        "seq_len": study.seq_len,
        "max_epochs": study.max_epochs,
        "phases": phases,
        "components": {g: {"pool_files": list(pool_files.get(g, [])), "tokens": int(per_group[g]["tokens"]), "epochs": float(per_group[g]["epochs"])} for g in used},
        **extra,
    }


def save_fit(model: FittedModel, out_dir: str, meta: dict[str, Any]) -> str:
    """Every surrogate's state and the cross-validation scores in ``model.json``."""
    uri = storage.join(out_dir, "model.json")
    storage.write_json(
        uri,
        {
            "chosen": model.chosen,
            "cv": model.cv,
            "components": model.components,
            "component_weights": model.component_weights.tolist(),
            "epoch_scale": None if model.epoch_scale is None else model.epoch_scale.tolist(),
            "surrogates": {name: [m.state() for m in ms] for name, ms in model.surrogates.items()},
            "bootstrap": [[m.state() for m in ms] for ms in model.bootstrap],
            **meta,
        },
    )
    return uri


def load_fit(out_dir: str, params: FitParams = FitParams()) -> tuple[FittedModel, dict[str, Any]]:
    """The surrogates saved by :func:`save_fit`, ready to predict."""
    meta = storage.read_json(storage.join(out_dir, "model.json"))
    surrogates = {name: [_SURROGATE_TYPES[name].from_state(st, params) for st in states] for name, states in meta.pop("surrogates").items()}
    boot = [[_SURROGATE_TYPES[meta["chosen"]].from_state(st, params) for st in states] for states in meta.pop("bootstrap", [])]
    scale = meta.get("epoch_scale")
    return FittedModel(meta["chosen"], surrogates, meta["cv"], {}, meta["components"], np.asarray(meta["component_weights"]),
                       None if scale is None else np.asarray(scale), boot), meta
