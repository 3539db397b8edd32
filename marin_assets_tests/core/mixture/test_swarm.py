"""Mixture studies: simulated-epoching truncation, epochs, proposals, block rounding, study specs."""

from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl
import pytest

from marin_assets.core.mixture import swarm as ms
from marin_assets.core.mixture.lm_params import LMProxyParams
from marin_assets.core.pool.groups import MixtureError

HERO = ms.StudyParams(name="hero", target_budget=18.75e12, proxy_budget=1e9)


def test_truncation_matches_the_formula_on_hand_computed_cases() -> None:
    # int(tokens x proxy / target): 1e6 x 1e9 / 18.75e12 = 53.33; 1e10 x 1e9 / 18.75e12 = 533,333.3
    assert ms.truncated_tokens(1_000_000, 1e9, 18.75e12) == 53
    assert ms.truncated_tokens(10_000_000_000, 1e9, 18.75e12) == 533_333
    assert ms.truncated_tokens(0, 1e9, 18.75e12) == 0
    assert ms.truncated_tokens(75, 1, 4) == 18  # 18.75 rounds down
    table = ms.group_truncation([10_000_000_000, 1_000_000, 0, 4096 * 18_750], HERO)
    # sequences of 4,096 tokens: 2,441,406 -> int(2,441,406 x 1e9 / 18.75e12) = 130
    assert table["sequences"].to_list() == [2_441_406, 244, 0, 18_750]
    assert table["proxy_tokens"].to_list() == [533_333, 53, 0, 4096]
    assert table["proxy_sequences"].to_list() == [130, 0, 0, 1]
    # a group with tokens but no sequence left in the proxy is reported; an empty group is not
    assert table["zero_sequences"].to_list() == [False, True, False, False]


def test_epochs_sum_over_phases() -> None:
    budgets = HERO.phase_budgets(HERO.target_budget)  # 15T and 3.75T
    assert budgets.tolist() == [15e12, 3.75e12]
    weights = np.array([[0.1, 0.9, 0.0], [0.4, 0.6, 0.0]])
    tokens = np.array([1e12, 9e12, 0.0])
    # 15e12 x 0.1 / 1e12 + 3.75e12 x 0.4 / 1e12 = 1.5 + 1.5
    assert ms.epochs(weights, tokens, budgets) == pytest.approx([3.0, 1.75, 0.0])
    assert np.isinf(ms.epochs(np.array([[0.0, 0.0, 1.0]]), tokens, budgets[:1])[2])  # weight on an empty group


def _pool(n: int = 30, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    tokens = np.exp(rng.uniform(np.log(1e6), np.log(1e10), n))
    tokens[[3, 7]] = 0
    return np.floor(tokens)


def test_proposals_are_feasible_and_start_with_the_proportional_mix() -> None:
    tokens = _pool()
    study = ms.StudyParams(name="s", target_budget=float(tokens.sum()) * 3, proxy_budget=1e8, n_runs=40, seed=5)
    props = ms.propose_mixtures(tokens, study)
    assert props.shape == (40, 2, 30)
    np.testing.assert_allclose(props.sum(axis=2), 1.0, atol=1e-9)
    assert (props >= 0).all() and (props[:, :, [3, 7]] == 0).all()
    e = np.array([ms.epochs(p, tokens, study.phase_budgets(study.target_budget)) for p in props])
    assert e.max() <= study.max_epochs * (1 + 1e-6)
    np.testing.assert_allclose(props[0, 0], tokens / tokens.sum(), rtol=1e-9)
    # some proposals are sparse (a random subset of groups), and they differ from each other
    assert ((props[1:] > 0).sum(axis=2) < 28).any()
    assert len({p.tobytes() for p in props}) == 40
    # same seed, same swarm
    np.testing.assert_array_equal(props, ms.propose_mixtures(tokens, study))


def test_projection_respects_the_cap_summed_over_phases() -> None:
    tokens = np.array([1e9, 1e9, 1e11, 1e11])
    study = ms.StudyParams(name="s", target_budget=1e11, proxy_budget=1e8, max_epochs=4)
    w = np.array([[0.7, 0.1, 0.1, 0.1], [0.1, 0.7, 0.1, 0.1]])
    out = ms.project_feasible(w, tokens, study, tokens / tokens.sum())
    e = ms.epochs(out, tokens, study.phase_budgets(study.target_budget))
    assert e.max() <= 4 * (1 + 1e-9)
    assert e[0] == pytest.approx(4) and e[1] == pytest.approx(4)
    np.testing.assert_allclose(out.sum(axis=1), 1.0)
    with pytest.raises(MixtureError, match="raise max_epochs"):
        ms.project_feasible(w, tokens, dataclasses.replace(study, target_budget=1e13), tokens / tokens.sum())


def test_block_rounding_keeps_sums_caps_and_reports_vanishing_weights() -> None:
    tokens = np.array([1e12, 1e12, 5e4, 1e12])
    study = ms.StudyParams(name="s", target_budget=1e12, proxy_budget=1e9, phases=(ms.TrainingPhase("main", 1.0),), block_size=1000)
    w = np.array([[0.4996, 0.3, 0.0004, 0.2]])  # 0.0004 x 1000 = 0.4 sequences
    blocks = ms.round_to_block(w, tokens, study)
    assert blocks.sum() == 1000 and blocks[0, 2] == 0
    tiny_cap = dataclasses.replace(study, max_epochs=8)
    w2 = np.array([[0.5, 0.1, 0.0004, 0.3996]])  # group 2 may hold at most 8 x 5e4 / 1e12 = 4e-7
    blocks2 = ms.round_to_block(w2, tokens, tiny_cap)
    assert blocks2[0, 2] == 0 and blocks2.sum() == 1000


def test_swarm_reports_zero_sequence_groups_and_writes_trainer_configs(tmp_path) -> None:
    names = [f"c{t:02d}q{b}" for t in range(4) for b in range(5)]
    tokens = [0 if i == 5 else (2_000 if i in (1, 2) else 4_000_000 + 1000 * i) for i in range(20)]
    groups = pl.DataFrame({"group": names, "topic": [int(n[1:3]) for n in names], "topic_label": ["t"] * 20, "band": [int(n[-1]) for n in names], "tokens": tokens})
    study = ms.StudyParams(name="tiny", target_budget=2e8, proxy_budget=1e6, n_runs=6, seq_len=100, seed=1)
    files = {n: [f"/pool/{n}/a.parquet"] for n in names}
    swarm = ms.build_swarm(groups, files, study, "/results")
    # 2,000 tokens = 20 sequences -> int(20 x 1e6 / 2e8) = 0: c00q1 and c00q2 are reported
    assert swarm.summary["zero_sequence_groups"] == ["c00q1", "c00q2"]
    assert swarm.groups.filter(pl.col("group") == "c00q1")["proxy_tokens"].item() == 10
    config = swarm.configs["r0000"]
    assert set(config["zero_sequence_groups"]) == {"c00q1", "c00q2"}  # the proportional run uses every group
    assert config["components"]["c00q1"]["pool_files"] == ["/pool/c00q1/a.parquet"]
    assert "c01q0" not in config["components"]  # the empty group gets no weight
    for rid, cfg in swarm.configs.items():
        for phase in cfg["phases"]:
            assert sum(phase["block_sequences"].values()) == study.block_size
            assert sum(phase["weights"].values()) == pytest.approx(1.0)
        assert cfg["mixture_id"] == swarm.runs.filter(pl.col("run_id") == rid)["mixture_id"].item()
    written = ms.write_swarm(swarm, str(tmp_path), files)
    assert (tmp_path / "configs" / "r0003.yaml").exists()
    assert ms.read_config(str(tmp_path), "r0003")["run_id"] == "r0003"
    g, mixtures, runs = ms.read_swarm(str(tmp_path))
    w = ms.weight_matrix(mixtures, ["r0000", "r0001"], ["pretrain", "cooldown"], names)
    np.testing.assert_allclose(w.sum(axis=2), 1.0)
    # 6 mixtures, then the first 2 again with seeds 1 and 2: the replicates that measure noise
    assert written["configs"].endswith("configs") and runs.height == 10
    replicates = runs.filter(pl.col("seed") > 0)
    assert replicates["run_id"].to_list() == ["r0006", "r0007", "r0008", "r0009"] and replicates["seed"].to_list() == [1, 2, 1, 2]
    assert replicates["mixture_id"].to_list() == [runs["mixture_id"][0]] * 2 + [runs["mixture_id"][1]] * 2
    assert swarm.configs["r0007"]["seed"] == 2 and swarm.configs["r0007"]["phases"] == swarm.configs["r0000"]["phases"]


def test_study_specs_are_validated_with_the_file_named(tmp_path) -> None:
    root = str(tmp_path)
    uri = ms.write_study(root, ms.StudyParams(name="alpha", n_runs=10, phases=(ms.TrainingPhase("main", 1.0),)))
    loaded = ms.load_study(root, "alpha")
    assert loaded.n_runs == 10 and loaded.phases == (ms.TrainingPhase("main", 1.0),)
    assert ms.list_studies(root) == ["alpha"]
    (tmp_path / "mixture" / "beta").mkdir()
    (tmp_path / "mixture" / "beta" / "study.yaml").write_text("phases: [{name: a, share: 0.7}, {name: b, share: 0.2}]\n")
    with pytest.raises(ms.StudyError, match=r"beta/study.yaml: phase shares \[0.7, 0.2\] must be positive and sum to 1"):
        ms.load_study(root, "beta")
    (tmp_path / "mixture" / "beta" / "study.yaml").write_text("n_runs: 5\nepochs_cap: 4\n")
    with pytest.raises(ms.StudyError, match=r"unknown keys \['epochs_cap'\]"):
        ms.load_study(root, "beta")
    with pytest.raises(ms.StudyError, match="has no spec"):
        ms.load_study(root, "gamma")
    assert uri.endswith("mixture/alpha/study.yaml")


def test_a_share_of_proposals_explores_small_groups_within_the_caps() -> None:
    """Token counts over two decades: drawn only around the prior, the smallest fifth of the groups
    rarely gets more than a sliver; drawn around the uniform mix too, many runs repeat them."""
    tokens = np.floor(np.exp(np.random.default_rng(0).uniform(np.log(1e8), np.log(1e10), 200)))
    study = ms.StudyParams(name="explore", target_budget=float(tokens.sum()), proxy_budget=1e8, n_runs=128, phases=(ms.TrainingPhase("main", 1.0),))
    small = tokens <= np.quantile(tokens, 0.2)
    budgets = study.phase_budgets(study.target_budget)

    def epochs_on_small(params: ms.StudyParams) -> np.ndarray:
        return np.array([ms.epochs(w, tokens, budgets)[small].mean() for w in ms.propose_mixtures(tokens, params)])

    prior_only = epochs_on_small(dataclasses.replace(study, explore_share=0.0))
    exploring = epochs_on_small(study)
    assert (exploring > 2.0).mean() > 0.3 and (prior_only > 2.0).mean() < 0.05
    assert max(ms.epochs(w, tokens, budgets).max() for w in ms.propose_mixtures(tokens, study)) <= study.max_epochs * (1 + 1e-9)


def test_job_and_ladder_settings_are_read_and_checked() -> None:
    params = ms.study_from_mapping({"name": "s", "validation_sizes": ["m4", "m16"], "job_retries": "3", "job_gpus": 1, "trainer": "external",
                                    "launcher": "submit {config}", "launcher_status": "state {run_id}"})
    assert params.validation_sizes == ("m4", "m16") and params.job_retries == 3 and params.job_gpus == 1.0
    assert ms.study_from_mapping(ms.study_to_mapping(params), "again") == params
    with pytest.raises(ms.StudyError, match="launcher_status follows the runs a launcher submits"):
        ms.validate_study(ms.StudyParams(name="s", launcher_status="state {run_id}"))
    with pytest.raises(ms.StudyError, match="validation_sizes"):
        ms.validate_study(ms.StudyParams(name="s", validation_sizes=("m4", "m4")))
    with pytest.raises(ms.StudyError, match="train_run"):
        ms.validate_study(ms.StudyParams(name="s", train_run="no_colon"))


def test_the_lm_proxy_validates_at_the_ladder_s_larger_sizes_by_default() -> None:
    assert ms.StudyParams(name="s").sizes_to_validate() == ("v1", "v2")  # the default ladder: proxy, v1, v2
    assert ms.StudyParams(name="s", lm=LMProxyParams(size="v1")).sizes_to_validate() == ("v2",)
    assert ms.StudyParams(name="s", train_run=ms.NGRAM_TRAINER).sizes_to_validate() == ("",)  # no ladder: the proxy's own size
    assert ms.StudyParams(name="s", trainer="external").sizes_to_validate() == ("",)
    with pytest.raises(ms.StudyError, match=r"validation_sizes \['m4'\] are not on lm.ladder"):
        ms.validate_study(ms.StudyParams(name="s", validation_sizes=("m4",)))
