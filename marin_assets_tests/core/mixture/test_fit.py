"""Surrogates and the constrained optimizer on a synthetic study with a known true metric.

The truth: 4 evaluation domains; domain d's loss is ``base_d + k_d x (A_d . w + 0.02)^-0.5``
(a power law in the weighted data relevant to it, A random with a few strong groups per
domain), measured with Gaussian noise (sd 0.003, against a spread of about 0.05 across runs);
the target is the macro mean.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from marin_assets.core.mixture import fit as mf
from marin_assets.core.mixture import swarm as ms

N_GROUPS, N_DOMAINS = 20, 4


def _truth(seed: int = 1):
    rng = np.random.default_rng(seed)
    relevance = rng.random((N_DOMAINS, N_GROUPS)) ** 3
    base = rng.uniform(0.8, 1.2, N_DOMAINS)
    scale = rng.uniform(0.2, 0.4, N_DOMAINS)

    def per_domain(weights: np.ndarray) -> np.ndarray:
        w = np.asarray(weights)
        effective = (w * np.array([p.share for p in STUDY.phases])[None, :, None]).sum(axis=1)
        return base + scale * (effective @ relevance.T + 0.02) ** -0.5

    return per_domain


_rng = np.random.default_rng(0)
TOKENS = np.floor(np.exp(_rng.uniform(np.log(1e8), np.log(1e10), N_GROUPS)))
# twice the pool's tokens: the proportional mix sees 2 epochs, so a group may grow at most 4x
STUDY = ms.StudyParams(name="synthetic", target_budget=float(TOKENS.sum()) * 2, proxy_budget=1e8, n_runs=64, seed=3, phases=(ms.TrainingPhase("main", 1.0),), kl_weight=0.0)
TRUTH = _truth()


@pytest.fixture(scope="module")
def fitted():
    weights = ms.propose_mixtures(TOKENS, STUDY)
    measured = TRUTH(weights) + np.random.default_rng(7).normal(0, 0.003, (len(weights), N_DOMAINS))
    return weights, mf.fit_surrogates(weights, measured, mf.FitParams(seed=0), [f"d{i}" for i in range(N_DOMAINS)])


def test_surrogate_ranks_held_out_mixtures(fitted) -> None:
    from scipy.stats import spearmanr  # noqa: PLC0415 (here, not at collection: every test worker collects this module)

    weights, model = fitted
    cv = model.cv[model.chosen]
    assert cv["spearman"] >= 0.9, model.cv
    assert cv["folds"] == 5 and cv["r2"] > 0.8
    # and on 300 mixtures it never saw
    fresh = ms.propose_mixtures(TOKENS, dataclasses.replace(STUDY, seed=99, n_runs=300))
    assert spearmanr(TRUTH(fresh).mean(axis=1), model.predict(fresh)).statistic >= 0.9
    assert set(model.cv) == {"lightgbm", "loglinear"} and all(np.isfinite(model.cv[n]["mae"]) for n in model.cv)


def test_optimized_mixture_is_near_the_best_of_10000_random_feasible_ones(fitted) -> None:
    weights, model = fitted
    opt = mf.optimize_mixture(lambda w: model.predict(w), TOKENS, STUDY, mf.OptimizeParams(seed=0), seeds=weights)
    prior = TOKENS / TOKENS.sum()
    rng = np.random.default_rng(11)
    uniform = np.full((10_000, 1, N_GROUPS), 1.0 / N_GROUPS)
    random = mf.project_batch(mf.dirichlet_batch(rng, uniform, rng.uniform(0.05, 2.0, 10_000)), TOKENS, STUDY, prior)
    for w in random[:200]:
        assert mf.constraint_report(w, TOKENS, STUDY)["within_epoch_cap"]
    best_random = float(TRUTH(random).mean(axis=1).min())
    achieved = float(TRUTH(opt.weights[None]).mean(axis=1)[0])
    assert achieved <= best_random * 1.02, (achieved, best_random)
    assert achieved < float(TRUTH(opt.proportional[None]).mean(axis=1)[0])  # better than token-proportional
    checks = mf.constraint_report(opt.weights, TOKENS, STUDY)
    assert checks["within_epoch_cap"] and checks["rows_sum_to_one"] and checks["block_multiples"] and checks["non_negative"]
    assert opt.block_sequences.sum() == STUDY.block_size


def test_two_phases_keep_the_summed_cap_and_kl_pulls_toward_proportional(fitted) -> None:
    _, model = fitted
    two = dataclasses.replace(STUDY, phases=(ms.TrainingPhase("pretrain", 0.8), ms.TrainingPhase("cooldown", 0.2)), max_epochs=3.0)
    predict = lambda w: model.predict(w.mean(axis=1, keepdims=True))  # noqa: E731 -- the phases' plain mean as the one-phase mix
    free = mf.optimize_mixture(predict, TOKENS, dataclasses.replace(two, kl_weight=0.0), mf.OptimizeParams(candidates=4000, rounds=4))
    pulled = mf.optimize_mixture(predict, TOKENS, dataclasses.replace(two, kl_weight=1.0), mf.OptimizeParams(candidates=4000, rounds=4))
    for opt in (free, pulled):
        assert opt.weights.shape == (2, N_GROUPS)
        checks = mf.constraint_report(opt.weights, TOKENS, two)
        assert checks["within_epoch_cap"] and checks["max_epochs_seen"] <= 3.0 + 1e-9
        assert checks["rows_sum_to_one"] and checks["block_multiples"]
        assert opt.weights.min() == 0 or opt.weights[opt.weights > 0].min() >= 1 / two.block_size
    assert pulled.kl < free.kl
    assert pulled.predicted >= free.predicted - 1e-9  # the pull costs predicted metric, never gains it


def test_saved_surrogates_predict_the_same(fitted, tmp_path) -> None:
    weights, model = fitted
    mf.save_fit(model, str(tmp_path), {"groups": []})
    loaded, meta = mf.load_fit(str(tmp_path))
    assert loaded.chosen == model.chosen and meta["groups"] == []
    for name in mf.SURROGATES:
        np.testing.assert_allclose(loaded.predict(weights[:10], name), model.predict(weights[:10], name), rtol=1e-9)


def test_too_few_runs_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="at least 3"):
        mf.fit_surrogates(np.ones((2, 1, 3)) / 3, np.array([1.0, 2.0]))


def test_weighted_target_with_a_limit_keeps_the_limited_metric_down(fitted) -> None:
    """Target 3 x d0 + d1 + d2 + d3, with the domain the free optimum neglects most held 0.01
    below what the free optimum gives it: the limit is met and costs some of the target."""
    weights, fitted_model = fitted
    cw = [3.0, 1.0, 1.0, 1.0]
    model = dataclasses.replace(fitted_model, component_weights=np.array(cw))  # one surrogate per domain: only the combination changes
    np.testing.assert_allclose(model.predict(weights[:5]), model.predict_components(weights[:5]) @ np.array(cw))
    params = mf.OptimizeParams(candidates=4000, rounds=4)
    free = mf.optimize_mixture(model.predict, TOKENS, STUDY, params)
    free_parts = model.predict_components(free.weights[None])[0] - model.predict_components(free.proportional[None])[0]
    j = 1 + int(np.argmax(free_parts[1:]))
    limit = float(model.predict_components(free.weights[None])[0, j]) - 0.01
    bounded = mf.optimize_mixture(model.predict, TOKENS, STUDY, params, penalty=mf.limit_penalty(model, {f"d{j}": limit}))
    assert model.predict_components(bounded.weights[None])[0, j] <= limit + 1e-3
    assert free.predicted < bounded.predicted < free.proportional_predicted  # the limit costs target, which still improves
