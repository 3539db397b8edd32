"""A study end to end with the built-in trainer: when one group matches the evaluation domain,
the study finds a mixture that gives it more weight, publishes it, and validation measures a
gain over token-proportional beyond the run-to-run noise.

Ten groups, each writing its own vocabulary; the configured eval set is fresh text in the
vocabulary of ``c00q0``, one of the smaller groups. Every proxy is a real byte n-gram trained on
its truncated, seed-ordered share of real Parquet pool files.
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
import polars as pl
import pytest

from marin_assets.core.mixture import fit as mf
from marin_assets.core.mixture import gates
from marin_assets.core.mixture import proxy_trainer as pt
from marin_assets.core.mixture import swarm as ms
from marin_assets.core.mixture import validation as mv

N_GROUPS = 10


def _vocabulary(rng: np.random.Generator) -> list[str]:
    letters = list("abcdefghijklmnopqrstuvwxyz")
    return ["".join(rng.choice(letters, size=int(rng.integers(3, 8)))) for _ in range(30)]


def _pool(tmp_path) -> tuple[pl.DataFrame, dict[str, list[str]], dict[str, bytes]]:
    rng = np.random.default_rng(0)
    files, rows, vocab0 = {}, [], None
    for g in range(N_GROUPS):
        group = f"c{g:02d}q0"
        words = _vocabulary(rng)
        vocab0 = vocab0 or words
        n_docs = 40 if g == 0 else 60 + 20 * g
        texts = [" ".join(rng.choice(words, size=40)) for _ in range(n_docs)]
        ids = [hashlib.sha256(f"{group}-{i}".encode()).hexdigest()[:32] for i in range(n_docs)]
        path = tmp_path / f"{group}.parquet"
        pl.DataFrame({"id": ids, "text": texts, "source": ["web"] * n_docs, "tokens": [40] * n_docs}).write_parquet(path)
        files[group] = [str(path)]
        rows.append((group, 40 * n_docs))
    groups = pl.DataFrame(rows, schema={"group": pl.Utf8, "tokens": pl.Int64}, orient="row").with_columns(
        pl.lit("t").alias("topic_label"), pl.col("group").str.slice(1, 2).cast(pl.Int64).alias("topic"), pl.lit(0).alias("band"))
    evals = {"target": " ".join(rng.choice(vocab0, size=600)).encode()}
    return groups, files, evals


@pytest.mark.system  # ~40 proxies trained and fitted: several seconds
def test_a_group_matching_the_eval_domain_is_found_and_validated(tmp_path) -> None:
    groups, files, evals = _pool(tmp_path)
    tokens = groups["tokens"].to_numpy().astype(np.float64)
    study = ms.StudyParams(
        name="match", target_budget=float(tokens.sum()) * 2, proxy_budget=float(tokens.sum()) * 0.2, n_runs=24, seed=0, seq_len=8,
        phases=(ms.TrainingPhase("main", 1.0),), block_size=4096, search_candidates=2_000, search_rounds=2, validation_seeds=3,
        proxy=ms.ProxyTrainerParams(order=3), train_run=ms.NGRAM_TRAINER,  # trained below with the n-gram: no ladder, validated at its own size
    )
    swarm = ms.build_swarm(groups, files, study)
    measured = {rid: pt.train_proxy(c, evals, study.proxy)["metrics"]["macro_bpb"] for rid, c in swarm.configs.items()}
    runs = swarm.runs
    names = swarm.groups["group"].to_list()
    weights = ms.weight_matrix(swarm.mixtures, runs["run_id"].to_list(), ["main"], names)
    found = gates.assess(weights, np.array([measured[r] for r in runs["run_id"]]), runs["run_id"].to_list(), runs["mixture_id"].to_list(),
                         study, tokens, mf.FitParams(seed=0, bootstrap=8), ["macro_bpb"], [1.0])
    published, candidate, verdict, gain = gates.publish(found.model, found.verdict, tokens, study, weights)
    assert verdict.passed, verdict.describe()
    assert published.weights[0, 0] > 1.5 * published.proportional[0, 0]  # the matching group gets more than its share
    configs = mv.validation_configs(study, published.block_sequences, published.proportional, swarm.groups, files, "")
    values = {rid: pt.train_proxy(c, evals, study.proxy)["metrics"]["macro_bpb"] for rid, c in configs.items()}
    result = mv.verdict({"": {m: [values[mv.validation_run_id(m, s)] for s in range(3)] for m in mv.MIXTURES}},
                        {"optimized": published.predicted, "proportional": published.proportional_predicted}, verdict.passed, verdict.facts["noise_sd"])
    assert result["validated"], result["verdict"]
    assert result["measured_gain"]["low"] > 0 and result["measured"]["optimized"]["high"] < result["measured"]["proportional"]["low"]


def _at(optimized, proportional, size=""):
    return {size: {"optimized": optimized, "proportional": proportional}}


def test_a_gain_inside_the_noise_is_not_claimed() -> None:
    predicted = {"optimized": 2.90, "proportional": 2.96}
    clear = mv.verdict(_at([2.90, 2.91, 2.89], [2.96, 2.97, 2.95]), predicted, True, 0.01)
    assert clear["validated"] and clear["measured_gain"]["low"] > 0 and not clear["worse"]
    # the same means, but the replicate noise (sd 0.05) is larger than the seeds' own spread
    noisy = mv.verdict(_at([2.90, 2.91, 2.89], [2.96, 2.97, 2.95]), predicted, True, 0.05)
    assert not noisy["validated"] and noisy["measured"]["optimized"]["sd"] == 0.05 and "within the noise" in noisy["verdict"]
    worse = mv.verdict(_at([2.99, 3.00, 2.98], [2.96, 2.97, 2.95]), predicted, True, 0.01)
    assert not worse["validated"] and worse["measured_gain"]["mean"] < 0 and worse["worse"] and worse["verdict"].startswith("measured worse")
    refused = mv.verdict(_at([2.90, 2.91, 2.89], [2.96, 2.97, 2.95]), predicted, False, 0.01)
    assert not refused["validated"] and not refused["worse"] and refused["verdict"].startswith("not validated: the gate published token-proportional")


def test_a_vanishing_gain_with_zero_noise_is_not_validated() -> None:
    """A trainer that ignores its seed: every seed equal, replicate noise 0, a true gain of 5e-6."""
    predicted = {"optimized": 2.9, "proportional": 2.9}
    tiny = mv.verdict(_at([2.899995] * 3, [2.9] * 3), predicted, True, 0.0)
    assert tiny["measured_gain"]["low"] > 0  # a zero-width interval above 0 ...
    assert not tiny["validated"] and "smallest gain claimed" in tiny["verdict"] and "ignores its seed" in tiny["verdict"]  # ... is no claim
    real = mv.verdict(_at([2.88] * 3, [2.9] * 3), predicted, True, 0.0, min_gain=0.002)
    assert real["validated"]


def test_validated_only_where_the_gain_holds_at_every_size() -> None:
    predicted = {"optimized": 2.90, "proportional": 2.96}
    both = {**_at([2.90, 2.91, 2.89], [2.96, 2.97, 2.95], "m4"), **_at([2.80, 2.81, 2.79], [2.86, 2.87, 2.85], "m16")}
    result = mv.verdict(both, predicted, True, 0.01)
    assert result["validated"] and list(result["sizes"]) == ["m4", "m16"] and "m4: 0.0600" in result["verdict"]
    lost = {**_at([2.90, 2.91, 2.89], [2.96, 2.97, 2.95], "m4"), **_at([2.86, 2.87, 2.85], [2.86, 2.87, 2.85], "m16")}
    result = mv.verdict(lost, predicted, True, 0.01)
    assert not result["validated"] and not result["worse"] and "at m16 it is within the noise" in result["verdict"]
    assert result["sizes"]["m4"]["measured_gain"]["low"] > 0 >= result["sizes"]["m16"]["measured_gain"]["low"]


def test_a_mixture_measured_worse_or_unconfirmed_leaves_consumers_on_token_proportional() -> None:
    published = {"published": "optimized", "phases": [{"weights": {"a": 0.9, "b": 0.1}}]}
    proportional = {"published": "proportional", "phases": [{"weights": {"a": 0.5, "b": 0.5}}]}
    predicted = {"optimized": 2.90, "proportional": 2.96}
    worse = mv.verdict(_at([2.99, 3.00, 2.98], [2.96, 2.97, 2.95]), predicted, True, 0.01)
    consumed = mv.consumer_mixture(published, proportional, worse)
    assert consumed["published"] == "proportional" and consumed["phases"] == proportional["phases"]
    assert "measured the optimized mixture worse" in consumed["why"] and consumed["validation"].startswith("measured worse")
    within = mv.verdict(_at([2.95, 2.97, 2.96], [2.96, 2.97, 2.95]), predicted, True, 0.01)
    unconfirmed = mv.consumer_mixture(published, proportional, within)
    assert unconfirmed["published"] == "proportional" and unconfirmed["phases"] == proportional["phases"] and "did not confirm" in unconfirmed["why"]
    better = mv.verdict(_at([2.90, 2.91, 2.89], [2.96, 2.97, 2.95]), predicted, True, 0.01)
    kept = mv.consumer_mixture(published, proportional, better)
    assert kept["published"] == "optimized" and kept["phases"] == published["phases"] and kept["why"].startswith("validated")
    pending = mv.consumer_mixture(published, proportional, None)
    assert pending["phases"] == published["phases"] and pending["validation"].startswith("not measured yet")


def test_validation_configs_seed_both_mixtures_and_climb_the_ladder() -> None:
    groups = pl.DataFrame({"group": ["c00q0", "c01q0", "c02q0"], "tokens": [40_000, 80_000, 0]})
    study = ms.StudyParams(name="l", target_budget=1e5, proxy_budget=1e4, phases=(ms.TrainingPhase("main", 1.0),), block_size=100, seq_len=10,
                           validation_seeds=2, validation_budget_scale=4.0, train_run=ms.NGRAM_TRAINER)  # no ladder: the proxy's own size
    configs = mv.validation_configs(study, np.array([[70, 30, 0]]), np.array([[1 / 3, 2 / 3, 0.0]]), groups, {"c00q0": ["a.parquet"]}, "/results")
    assert sorted(configs) == ["v-optimized-s0", "v-optimized-s1", "v-proportional-s0", "v-proportional-s1"] and configs["v-optimized-s0"]["size"] == ""
    opt, prop = configs["v-optimized-s1"], configs["v-proportional-s0"]
    assert opt["seed"] == 1 and opt["phases"][0]["block_sequences"] == {"c00q0": 70, "c01q0": 30}
    assert prop["phases"][0]["block_sequences"] == {"c00q0": 33, "c01q0": 67} and opt["mixture_id"] != prop["mixture_id"]
    assert opt["experiment_budget"] == 4e4 and opt["components"]["c00q0"]["proxy_tokens"] == 16_000  # 40,000 x 4e4 / 1e5
    with pytest.raises(ms.StudyError, match="validation_budget_scale"):
        ms.validate_study(dataclasses.replace(study, validation_budget_scale=0.5))

    laddered = mv.validation_configs(dataclasses.replace(study, validation_sizes=("m4", "m16")), np.array([[70, 30, 0]]), np.array([[1 / 3, 2 / 3, 0.0]]),
                                     groups, {"c00q0": ["a.parquet"]}, "/results")
    assert len(laddered) == 8 and laddered["v-m16-proportional-s1"]["size"] == "m16" and laddered["v-m16-proportional-s1"]["seed"] == 1
