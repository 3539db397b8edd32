"""Gates on a study's fit: an optimized mixture is published only on evidence; otherwise
token-proportional weights, with the reason and what to add.

The truth is the synthetic study of ``test_fit`` (4 domains, 20 groups, a power law in
the weighted relevant data); replicate runs repeat a mixture with fresh measurement noise.
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
import pytest

from marin_assets.core.mixture import fit as mf
from marin_assets.core.mixture import gates
from marin_assets.core.mixture import swarm as ms
from marin_assets_tests.core.mixture.test_fit import STUDY, TOKENS, TRUTH

FIT = mf.FitParams(seed=0, bootstrap=4, lgbm_estimators=200)
STUDY_GATED = dataclasses.replace(STUDY, replicate_mixtures=2, replicate_seeds=3, search_candidates=2_000, search_rounds=2)


def _runs(study: ms.StudyParams = STUDY_GATED):
    """(weights, run ids, mixture ids) of every planned run, replicates included."""
    proposals = ms.propose_mixtures(TOKENS, study)
    plan = study.run_plan()
    weights = np.stack([proposals[i] for _, i, _ in plan])
    return weights, [r for r, _, _ in plan], [f"m{i}" for _, i, _ in plan]


def _assess(weights, targets, run_ids, mixture_ids, study=STUDY_GATED):
    targets = np.asarray(targets, dtype=np.float64).reshape(len(run_ids), -1)
    k = targets.shape[1]
    return gates.assess(weights, targets, run_ids, mixture_ids, study, TOKENS, FIT, [f"d{j}" for j in range(k)], [1.0 / k] * k)


def _refused_publishes_proportional(found: gates.Assessment, gate: str, study=STUDY_GATED) -> str:
    published, candidate, verdict, _ = gates.publish(found.model, found.verdict, TOKENS, study)
    assert not verdict.passed
    assert gate in [r["gate"] for r in verdict.reasons]
    np.testing.assert_allclose(published.weights, mf.proportional_optimized(TOKENS, study).weights)
    return verdict.describe()


def test_real_signal_with_replicates_is_published() -> None:
    weights, runs, mixes = _runs()
    measured = TRUTH(weights).mean(axis=1) + np.random.default_rng(7).normal(0, 0.003, len(runs))
    found = _assess(weights, measured, runs, mixes)
    assert found.verdict.passed, found.verdict.describe()
    assert found.verdict.facts["cv_spearman"] > found.baseline["spearman"]
    assert 0 < found.verdict.facts["noise_sd"] < found.verdict.facts["spread_sd"] / 5  # 4 degrees of freedom: a rough estimate of 0.003
    published, candidate, verdict, gain = gates.publish(found.model, found.verdict, TOKENS, STUDY_GATED)
    assert verdict.passed and published is candidate and gain["low"] > 0
    truth = TRUTH(np.stack([published.weights, published.proportional])).mean(axis=1)
    assert truth[0] < truth[1]  # the published mixture is truly better


def test_r2_at_or_below_zero_publishes_proportional() -> None:
    """Targets that differ per mixture (beyond the replicate noise) but not through the weights."""
    weights, runs, mixes = _runs()
    per_mixture = {m: int(hashlib.sha256(m.encode()).hexdigest()[:8], 16) / 2**32 for m in set(mixes)}
    noise = np.random.default_rng(1).normal(0, 0.001, len(runs))
    targets = np.array([per_mixture[m] * 0.1 for m in mixes]) + noise
    found = _assess(weights, targets, runs, mixes)
    assert found.verdict.facts["cv_r2"] <= 0.05
    text = _refused_publishes_proportional(found, "fit")
    assert "R^2" in text and "more runs" in text


def test_nan_targets_publish_proportional_without_a_fit() -> None:
    weights, runs, mixes = _runs()
    targets = TRUTH(weights).mean(axis=1)
    targets[[3, 9]] = np.nan
    found = _assess(weights, targets, runs, mixes)
    assert found.model is None
    assert "r0003, r0009" in _refused_publishes_proportional(found, "finite")


def test_too_few_runs_publish_proportional() -> None:
    study = dataclasses.replace(STUDY_GATED, n_runs=5, replicate_mixtures=1, replicate_seeds=2)
    weights, runs, mixes = _runs(study)
    targets = TRUTH(weights).mean(axis=1) + np.random.default_rng(2).normal(0, 0.003, len(runs))
    found = _assess(weights, targets, runs, mixes, study)
    assert "6 runs for 20 weight features; at least 8 needed" in _refused_publishes_proportional(found, "runs", study)


def test_gains_inside_the_noise_publish_proportional() -> None:
    """A surface 100x flatter than the noise: mixtures differ by less than one run's noise."""
    weights, runs, mixes = _runs()
    truth = TRUTH(weights).mean(axis=1)
    targets = 3.0 + (truth - truth.mean()) / 100 + np.random.default_rng(3).normal(0, 0.01, len(runs))
    found = _assess(weights, targets, runs, mixes)
    assert "replicate noise" in _refused_publishes_proportional(found, "noise")


def test_no_replicates_means_unknown_noise() -> None:
    study = dataclasses.replace(STUDY_GATED, replicate_mixtures=0)
    weights, runs, mixes = _runs(study)
    verdict = gates.data_gates(TRUTH(weights).mean(axis=1), runs, mixes, 20, study.gate)
    assert [r["gate"] for r in verdict.reasons] == ["noise"] and "replicate_seeds" in verdict.reasons[0]["add"]


def test_replicate_noise_pools_within_mixture_spread() -> None:
    noise = gates.replicate_noise(np.array([1.0, 1.2, 2.0, 2.0, 2.2, 5.0]), ["a", "a", "b", "b", "b", "c"])
    within = (0.02 + 0.0266667) / 3  # (0.1^2 x 2) + (b's squared deviations) over 1 + 2 degrees of freedom
    assert noise["noise_sd"] == pytest.approx(np.sqrt(within), rel=1e-3)
    assert noise["replicated_mixtures"] == 2 and noise["mixtures"] == 3


def test_all_equal_targets_are_refused_by_name_not_silently() -> None:
    weights, runs, mixes = _runs()
    found = _assess(weights, np.full(len(runs), 2.5), runs, mixes)
    gates_failed = [r["gate"] for r in found.verdict.reasons]
    assert "noise" in gates_failed and "fit" in gates_failed and "Spearman nan" in found.verdict.describe()
