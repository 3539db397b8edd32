"""Surrogates from mixture weights to a proxy metric, and the optimized mixture they propose.

Two surrogates are fitted on the proxies' (weights, metric) pairs, with the weights of every
phase side by side as features:

* ``lightgbm``: gradient-boosted trees, as RegMix uses;
* ``loglinear``: the log-linear mixing law ``c + exp(a + t . w)``, the baseline.

When the target is a mean of component metrics (macro bits per byte over evaluation domains),
each component gets its own surrogate and their predictions are averaged. Each surrogate is
scored by k-fold cross-validation (out-of-fold Spearman, R^2 and mean absolute error of the
target); the one with the higher out-of-fold Spearman is used unless the caller names one.

The optimizer minimizes ``predicted metric + kl_weight x sum_p share_p KL(w_p || proportional)``
over the simplex of every phase, subject to the epoch cap summed over phases (feasibility is
restored by :func:`project_batch` after every proposal), by a cross-entropy search: Dirichlet
proposals around the prior, then rounds around the best so far; the mean of the final elites
is tried too (RegMix averages its top predictions). The result is rounded to the mixture block;
groups whose weight rounds to zero are reported.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import polars as pl

from marin_assets.core.mixture.swarm import StudyParams, epochs, kl_divergence, round_to_block
from marin_assets.core.pool.groups import MixtureError
from marin_assets.core.runtime import storage

SURROGATES = ("lightgbm", "loglinear")


@dataclasses.dataclass(frozen=True)
class FitParams:
    """Surrogate settings. ``surrogate``: ``auto`` (best cross-validated Spearman) or a name."""

    folds: int = 5
    seed: int = 0
    surrogate: str = "auto"
    lgbm_estimators: int = 400
    lgbm_learning_rate: float = 0.05
    lgbm_leaves: int = 4
    lgbm_min_child_samples: int = 4
    ridge_alphas: tuple[float, ...] = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)


@dataclasses.dataclass(frozen=True)
class OptimizeParams:
    """Cross-entropy search: ``candidates`` first proposals, then ``rounds`` of refinement."""

    candidates: int = 20_000
    rounds: int = 8
    elite: int = 64
    seed: int = 0


def features(weights: np.ndarray) -> np.ndarray:
    """(runs x phases x groups) weights as (runs x phases*groups) features."""
    w = np.asarray(weights, dtype=np.float64)
    return w.reshape(w.shape[0], -1)


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
        best: tuple[float, float, Any] | None = None
        for c in offsets:
            model = RidgeCV(alphas=self.params.ridge_alphas).fit(x, np.log(y - c))
            err = float(((c + np.exp(model.predict(x)) - y) ** 2).mean())
            if best is None or err < best[0]:
                best = (err, c, model)
        assert best is not None
        _, self.offset, model = best
        self.coef, self.intercept = np.asarray(model.coef_, dtype=np.float64), float(model.intercept_)
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
    return np.mean([m.predict(x) for m in models], axis=0)


def cross_validate(name: str, x: np.ndarray, targets: np.ndarray, params: FitParams) -> tuple[dict[str, float], np.ndarray]:
    """Out-of-fold scores and predictions of the target (the mean of ``targets``' columns) with
    ``k = min(folds, runs)`` folds."""
    from sklearn.model_selection import KFold  # noqa: PLC0415

    k = min(params.folds, len(targets))
    oof = np.zeros(len(targets), dtype=np.float64)
    for train, test in KFold(n_splits=k, shuffle=True, random_state=params.seed).split(x):
        oof[test] = _predict_components(_fit_components(name, x[train], targets[train], params), x[test])
    return scores(targets.mean(axis=1), oof) | {"folds": k}, oof


@dataclasses.dataclass
class FittedModel:
    """Surrogates per name, each a list of per-component models whose mean is the target."""

    chosen: str
    surrogates: dict[str, list[Any]]
    cv: dict[str, dict[str, float]]
    oof: dict[str, np.ndarray]
    components: list[str]

    def predict(self, weights: np.ndarray, name: str | None = None) -> np.ndarray:
        return _predict_components(self.surrogates[name or self.chosen], features(weights))


def fit_surrogates(weights: np.ndarray, targets: np.ndarray, params: FitParams = FitParams(), components: Sequence[str] | None = None) -> FittedModel:
    """Both surrogates cross-validated, then refitted on every run; the chosen one named.

    ``targets`` is (runs,) for one metric, or (runs x k) when the target is the mean of ``k``
    component metrics (macro bits per byte over domains): each component is fitted on its own
    and the predictions averaged, as the mixing laws fit one law per domain.
    """
    targets = np.asarray(targets, dtype=np.float64)
    targets = targets.reshape(len(targets), -1)
    if len(targets) < 3:
        raise MixtureError(f"{len(targets)} runs have results; a fit needs at least 3 (train or collect more proxies)")
    if not np.isfinite(targets).all():
        raise MixtureError("target metric values must be finite")
    x = features(weights)
    cv, oof, models = {}, {}, {}
    for name in SURROGATES:
        cv[name], oof[name] = cross_validate(name, x, targets, params)
        models[name] = _fit_components(name, x, targets, params)
    if params.surrogate == "auto":
        chosen = max(SURROGATES, key=lambda n: (np.nan_to_num(cv[n]["spearman"], nan=-2.0), -cv[n]["mae"]))
    elif params.surrogate in SURROGATES:
        chosen = params.surrogate
    else:
        raise MixtureError(f"unknown surrogate {params.surrogate!r}: use one of {SURROGATES} or 'auto'")
    names = list(components) if components is not None else [f"target{j}" for j in range(targets.shape[1])]
    return FittedModel(chosen, models, cv, oof, names)


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


def objective_fn(predict: Callable[[np.ndarray], np.ndarray], prior: np.ndarray, study: StudyParams) -> Callable[[np.ndarray], np.ndarray]:
    shares = np.array([p.share for p in study.phases])

    def objective(w: np.ndarray) -> np.ndarray:
        kl = (kl_divergence(w.reshape(-1, w.shape[-1]), prior).reshape(w.shape[0], w.shape[1]) * shares).sum(axis=1)
        return predict(w) + study.kl_weight * kl

    return objective


def optimize_mixture(
    predict: Callable[[np.ndarray], np.ndarray],
    tokens: np.ndarray,
    study: StudyParams,
    params: OptimizeParams = OptimizeParams(),
    seeds: np.ndarray | None = None,
) -> Optimized:
    """The mixture (phases x groups) minimizing predicted metric + KL penalty under the caps.

    ``predict`` maps (n x phases x groups) weights to predictions; ``seeds`` (e.g. the proxies'
    own mixtures) join the first proposals.
    """
    tokens = np.asarray(tokens, dtype=np.float64)
    prior = tokens / tokens.sum()
    n_phases = len(study.phases)
    rng = np.random.default_rng(params.seed)
    objective = objective_fn(predict, prior, study)
    proportional = project_batch(np.tile(prior, (1, n_phases, 1)), tokens, study, prior)
    lo, hi = study.concentration
    n = params.candidates
    conc = np.exp(rng.uniform(np.log(min(lo, 0.1)), np.log(max(hi, 10.0)), size=n))
    first = dirichlet_batch(rng, np.broadcast_to(prior, (n, n_phases, len(prior))), conc)
    sparse = rng.random(n) < study.sparse_share
    if sparse.any():
        keep = rng.random((int(sparse.sum()), 1, len(prior))) < rng.uniform(0.1, 0.6, size=(int(sparse.sum()), 1, 1))
        masked = first[sparse] * keep
        masked_sum = masked.sum(axis=-1, keepdims=True)
        first[sparse] = np.where(masked_sum > 0, masked / np.maximum(masked_sum, 1e-300), first[sparse])
    pool = [proportional, project_batch(first, tokens, study, prior)]
    if seeds is not None and len(seeds):
        pool.append(project_batch(np.asarray(seeds, dtype=np.float64), tokens, study, prior))
    cand = np.concatenate(pool)
    values = objective(cand)
    for _ in range(params.rounds):
        order = np.argsort(values)[: params.elite]
        elites, elite_values = cand[order], values[order]
        picks = elites[rng.integers(0, len(elites), size=n // 4)]
        kappa = rng.choice([5.0, 20.0, 100.0, 500.0], size=n // 4)
        fresh = project_batch(dirichlet_batch(rng, picks, kappa), tokens, study, prior)
        mean = project_batch(elites.mean(axis=0, keepdims=True), tokens, study, prior)
        cand = np.concatenate([elites, fresh, mean])
        values = np.concatenate([elite_values, objective(fresh), objective(mean)])
    best = cand[int(np.argmin(values))]
    blocks = round_to_block(best, tokens, study)
    rounded = blocks / study.block_size
    shares = np.array([p.share for p in study.phases])
    kl = float((kl_divergence(rounded, prior) * shares).sum())
    return Optimized(
        weights=rounded,
        block_sequences=blocks,
        unrounded=best,
        predicted=float(predict(rounded[None])[0]),
        objective=float(objective(rounded[None])[0]),
        kl=kl,
        proportional=proportional[0],
        proportional_predicted=float(predict(proportional)[0]),
        vanished=[int(g) for g in np.flatnonzero((best > 0).any(axis=0) & (blocks == 0).all(axis=0) & (tokens > 0))],
    )


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


def weights_table(groups: pl.DataFrame, opt: Optimized, study: StudyParams, active: Sequence[int]) -> pl.DataFrame:
    """One row per (phase, group) over all groups: optimized and proportional weights, change, epochs."""
    n_groups = groups.height
    full = np.zeros((len(study.phases), n_groups))
    prop = np.zeros((len(study.phases), n_groups))
    blocks = np.zeros((len(study.phases), n_groups), dtype=np.int64)
    idx = np.asarray(active, dtype=np.int64)
    full[:, idx] = opt.weights
    prop[:, idx] = opt.proportional
    blocks[:, idx] = opt.block_sequences
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
            "surrogates": {name: [m.state() for m in ms] for name, ms in model.surrogates.items()},
            **meta,
        },
    )
    return uri


def load_fit(out_dir: str, params: FitParams = FitParams()) -> tuple[FittedModel, dict[str, Any]]:
    """The surrogates saved by :func:`save_fit`, ready to predict."""
    meta = storage.read_json(storage.join(out_dir, "model.json"))
    surrogates = {name: [_SURROGATE_TYPES[name].from_state(st, params) for st in states] for name, states in meta.pop("surrogates").items()}
    return FittedModel(meta["chosen"], surrogates, meta["cv"], {}, meta["components"]), meta
