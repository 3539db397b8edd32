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
from marin_assets.core.pool.groups import MixtureError
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


def _data_verdict() -> gates.Verdict:
    return gates.Verdict(True, [], {"noise_sd": 0.003, "spread_sd": 0.05})


def test_the_kl_baseline_gate_does_not_flip_on_a_tie() -> None:
    """Fold by fold the baseline ties the fit (0.895 vs 0.896): within the margin, either way round."""
    params = ms.GateParams()
    cv = {"spearman": 0.895, "r2": 0.6}
    for ahead in (-0.001, 0.0, 0.001):
        paired = {"folds": 5, "mean": ahead, "low": ahead - 0.03, "high": ahead + 0.03}
        assert gates.fit_gates(_data_verdict(), cv, {"spearman": 0.895 - ahead}, params, paired).passed
    behind = {"folds": 5, "mean": -0.08, "low": -0.12, "high": -0.04}
    refused = gates.fit_gates(_data_verdict(), cv, {"spearman": 0.975}, params, behind)
    assert not refused.passed and "better than the fit by 0.080 Spearman (over 5 paired folds" in refused.describe() and "margin 0.02" in refused.describe()


def test_paired_folds_compare_the_same_held_out_runs() -> None:
    rng = np.random.default_rng(0)
    target = rng.normal(size=60)
    good, bad = target + rng.normal(0, 0.1, 60), rng.normal(size=60)
    paired = mf.paired_fold_difference(target, good, bad, FIT)
    assert paired["folds"] == 5 and paired["low"] > 0.5
    assert mf.paired_fold_difference(target[:8], good[:8], bad[:8], FIT)["folds"] == 0  # folds of 1-2 runs rank nothing


def test_replicates_that_agree_exactly_are_no_noise_floor() -> None:
    """A trainer that ignores its seed: replicates equal, noise sd 0 is refused, never trusted."""
    weights, runs, mixes = _runs()
    targets = TRUTH(weights).mean(axis=1)  # no noise at all: every replicate equals its mixture
    verdict = gates.data_gates(targets, runs, mixes, 20, STUDY_GATED.gate)
    assert [r["gate"] for r in verdict.reasons] == ["noise"] and "ignores its seed" in verdict.reasons[0]["why"]


def test_a_gain_below_the_minimum_is_refused_whatever_the_noise() -> None:
    zero_noise = gates.Verdict(True, [], {"noise_sd": 0.0})
    assert not gates.gain_gate(zero_noise, None, 5e-6, min_gain=0.002).passed
    assert gates.gain_gate(zero_noise, None, 0.01, min_gain=0.002).passed
    noisy = gates.Verdict(True, [], {"noise_sd": 0.02})
    assert not gates.gain_gate(noisy, None, 0.01, min_gain=0.002).passed  # the noise still rules where it is larger


def test_duplicate_run_ids_are_refused_by_the_fit() -> None:
    weights, runs, mixes = _runs()
    runs = [*runs[:-1], runs[0]]
    with pytest.raises(MixtureError, match=r"run ids \['r0000'\] appear more than once"):
        _assess(weights, TRUTH(weights).mean(axis=1), runs, mixes)


def test_the_printed_gain_is_the_fit_s_difference_with_an_interval_of_it() -> None:
    weights, runs, mixes = _runs()
    measured = TRUTH(weights).mean(axis=1) + np.random.default_rng(7).normal(0, 0.003, len(runs))
    found = _assess(weights, measured, runs, mixes)
    _, candidate, verdict, gain = gates.publish(found.model, found.verdict, TOKENS, STUDY_GATED)
    assert gain["point"] == pytest.approx(candidate.proportional_predicted - candidate.predicted)
    assert verdict.facts["predicted_gain"] == pytest.approx(gain["point"]) and "mean" not in gain
