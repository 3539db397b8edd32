"""Mixture studies: the study spec, simulated epoching, and the proposed swarm of proxy mixtures.

A study asks which mixture of the sampling groups a full-scale run (``target_budget`` tokens)
should use. It trains many small proxies (``proxy_budget`` tokens each) on proposed mixtures,
fits a regression from weights to an evaluation metric, and optimizes it (``mixture_fit``).

Simulated epoching: a proxy sees each group truncated to ``int(tokens x proxy_budget /
target_budget)`` tokens (and ``int(sequences x proxy_budget / target_budget)`` sequences), so it
repeats every group as many times as the full run would. A rare group can shrink to zero
sequences, which makes a real trainer fail; such groups are reported per run, never dropped.

Proposals follow RegMix: Dirichlet draws around the token-proportional prior with a random
concentration, a share of them sparse (a random subset of groups), each phase drawn on its own.
Draws around the prior rarely give a small group more than a sliver, so ``explore_share`` of
the runs are drawn around the uniform mix instead, at concentrations spread over
``EXPLORE_CONCENTRATIONS``, and sparse subsets are drawn uniformly over the groups: small groups
get several epochs in some runs, and the fit can see what they are worth. All are then made
feasible (every group within ``max_epochs`` summed over phases in the full run) and
rounded to the mixture block (``block_size`` sequences; a group whose weight gets no sequence of
the block vanishes, which is reported). Run ``r0000`` is always the token-proportional mix itself.

Everything a study writes lives under ``<root>/mixture/<study>/``: the spec (``study.yaml``),
the external trainer's results (``results/``) and one fingerprinted folder per stage.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import polars as pl

from marin_assets.core.mixture.launcher import LauncherError, check_template
from marin_assets.core.mixture.lm_params import LMProxyParams, check_lm_params, lm_params_from_mapping, lm_params_to_mapping
from marin_assets.core.pool.groups import MixtureError
from marin_assets.core.runtime import storage
from marin_assets.errors import ConfigurationError

MIXTURE_CODE_VERSION = "3"  # 2: replicate runs with seeds, epoch features, gates, top-k optimizer; 3: exploring proposals, runs as jobs, validation per size
STUDY_FILE = "study.yaml"
RESULTS_DIR = "results"
STUDY_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
TRAINERS = ("builtin", "external")
OPTIMIZERS = ("topk", "regmix", "trust_region", "argmin")
LM_TRAINER = "marin_assets.core.mixture.lm_proxy:train_run"  # the language-model proxy: what a study trains by default
NGRAM_TRAINER = "marin_assets.core.mixture.proxy_trainer:train_run"  # the fast stand-in for tests: a byte n-gram model, not a language model


class StudyError(ConfigurationError, ValueError):
    """A study spec or study input is wrong; the message names the file and the fix."""


# --------------------------------------------------------------------------- the study


@dataclasses.dataclass(frozen=True)
class TrainingPhase:
    """A phase of the training run and its share of the steps (and tokens)."""

    name: str
    share: float


@dataclasses.dataclass(frozen=True)
class ProxyTrainerParams:
    """The built-in proxy: a byte-level n-gram model (Witten-Bell interpolation) trained on the
    proxy's truncated mixture; bits per byte on held-out pool documents, one domain per source.

    ``holdout_mod``: a document whose id hash is 0 modulo this is never trained on (and is the
    evaluation text when no ``eval_set`` is named). ``eval_set``: the text the proxy is scored
    on: ``""`` (held-out pool documents, one domain per source), ``locked`` (the locked eval
    sets, one domain per set), or a JSONL/Parquet file with ``domain`` and ``text`` columns (a
    path inside the study folder, or a URI). ``repeat_scale``: R* of the data-constrained
    scaling form; e epochs of a group count as ``1 + R* (1 - exp(-(e - 1) / R*))`` epochs of
    fresh data, so each repeat is worth less than the one before. The byte caps bound what one
    run reads (the built-in trainer is for demos and tests).
    """

    order: int = 4
    holdout_mod: int = 10
    max_eval_bytes_per_domain: int = 200_000
    max_train_bytes_per_group: int = 4_000_000
    eval_set: str = ""
    repeat_scale: float = 15.4


@dataclasses.dataclass(frozen=True)
class GateParams:
    """When a fit is trusted enough to publish an optimized mixture (see ``mixture.gates``).

    ``min_spearman`` / ``min_r2``: cross-validated floors; ``min_runs`` and ``runs_per_feature``
    (runs per weight feature, phases x groups): enough runs for the features; ``noise_ratio``:
    the spread of the targets across mixtures must exceed this many replicate standard
    deviations; ``baseline_margin``: the Spearman, averaged over the same cross-validation
    folds, by which the KL-to-proportional-only baseline must beat the fit to refuse it (a tie
    within the margin is not a loss, so no verdict turns on a 0.001 difference);
    ``min_gain``: the smallest gain of the target over proportional that is ever claimed,
    predicted or measured, whatever the noise estimate (a trainer that ignores its seed
    measures a noise of 0).
    """

    min_spearman: float = 0.5
    min_r2: float = 0.1
    min_runs: int = 8
    runs_per_feature: float = 0.1
    noise_ratio: float = 2.0
    baseline_margin: float = 0.02
    min_gain: float = 0.002


@dataclasses.dataclass(frozen=True)
class StudyParams:
    """One mixture study. Defaults are the Marin hero run's: two phases (pretraining 15T,
    cooldown 3.75T tokens, so 0.8 / 0.2), an 8-epoch cap summed over phases, KL weight 0.05 to
    the token-proportional mix, mixture blocks of 49,152 sequences of 4,096 tokens.
    ``explore_share``: the share of proposals drawn around the uniform mix rather than the prior
    (small groups upweighted, within the epoch caps), for the swarm and the optimizer's simulated
    candidates alike;
    ``search_candidates`` / ``search_rounds``: the optimizer's proposals per round and rounds;
    ``optimizer``: ``topk`` (the mean of the best ``top_k`` candidates of the search), ``regmix``
    (the mean of the best ``top_k`` simulated candidates), ``trust_region`` (the best candidate
    near an observed mixture) or ``argmin`` (see ``mixture.fit``).
    ``replicate_mixtures`` x ``replicate_seeds``: the first mixtures (run ``r0000``, the
    proportional mix, first) are trained again with other seeds, which measures run-to-run
    noise; ``validation_seeds``: seeds per mixture in ``mixture_validation``, trained at
    ``validation_budget_scale`` x ``proxy_budget`` (above 1: a ladder step that checks the gain
    transfers to a larger run).
    ``target_weights``: the target as a weighted sum of metrics (empty: ``target_metric``);
    ``target_limits``: per-metric ceilings the optimized mixture's prediction must respect.
    ``validation_sizes``: the model sizes of the trainer's ladder that ``mixture_validation``
    trains both mixtures at (each with ``validation_seeds`` seeds); empty: the trainer's default
    (:meth:`sizes_to_validate`): for the language-model proxy the ladder's sizes above the proxy's,
    since a finding must transfer to larger models; for another trainer the proxy's own size.
    ``launcher``: a command template run once per run without results (external trainer), see
    ``mixture.launcher``; ``launcher_status``: a template that prints a run's JSON state, with
    which each submitted run is followed to its end (polled every ``job_poll_s`` seconds).
    ``train_run``: the built-in trainer, a ``module:function`` of the ``mixture.jobs`` interface
    (default: the language-model proxy of ``mixture.lm_proxy``, settings ``lm``; ``NGRAM_TRAINER``
    is a byte n-gram stand-in for tests), each run a Ray task on the configured cluster reserving
    ``job_cpus`` / ``job_gpus``;
    ``job_retries``: attempts after a run's first failure (built-in and followed runs alike).
    """

    name: str
    target_budget: float = 18.75e12
    proxy_budget: float = 1.0e9
    n_runs: int = 64
    seed: int = 0
    phases: tuple[TrainingPhase, ...] = (TrainingPhase("pretrain", 0.8), TrainingPhase("cooldown", 0.2))
    max_epochs: float = 8.0
    kl_weight: float = 0.05
    block_size: int = 49_152
    seq_len: int = 4_096
    sparse_share: float = 0.25
    concentration: tuple[float, float] = (0.1, 5.0)
    explore_share: float = 0.5
    trainer: str = "builtin"
    target_metric: str = "macro_bpb"
    search_candidates: int = 20_000
    search_rounds: int = 8
    optimizer: str = "topk"
    top_k: int = 64
    replicate_mixtures: int = 2
    replicate_seeds: int = 3
    validation_seeds: int = 3
    validation_budget_scale: float = 1.0
    target_weights: tuple[tuple[str, float], ...] = ()
    target_limits: tuple[tuple[str, float], ...] = ()
    validation_sizes: tuple[str, ...] = ()
    launcher: str = ""
    launcher_status: str = ""
    train_run: str = LM_TRAINER
    job_retries: int = 2
    job_poll_s: float = 30.0
    job_cpus: float = 1.0
    job_gpus: float = 0.0
    proxy: ProxyTrainerParams = ProxyTrainerParams()
    lm: LMProxyParams = LMProxyParams()
    gate: GateParams = GateParams()

    def phase_budgets(self, budget: float) -> np.ndarray:
        return np.array([budget * p.share for p in self.phases], dtype=np.float64)

    def run_plan(self) -> list[tuple[str, int, int]]:
        """(run id, mixture index, seed) of every run: ``n_runs`` mixtures with seed 0, then the
        replicates of the first ``replicate_mixtures`` with seeds 1 .. ``replicate_seeds`` - 1."""
        plan = [(run_id(i), i, 0) for i in range(self.n_runs)]
        for m in range(min(self.replicate_mixtures, self.n_runs)):
            for seed in range(1, self.replicate_seeds):
                plan.append((run_id(len(plan)), m, seed))
        return plan

    def run_ids(self) -> list[str]:
        return [r for r, _, _ in self.run_plan()]

    def uses_lm_proxy(self) -> bool:
        return self.trainer == "builtin" and self.train_run == LM_TRAINER

    def sizes_to_validate(self) -> tuple[str, ...]:
        """``validation_sizes``, else for the language-model proxy the rungs listed after ``lm.size``
        on its ladder (smallest first), else the proxy's own size (``""``)."""
        if self.validation_sizes:
            return self.validation_sizes
        if self.uses_lm_proxy():
            names = [s.name for s in self.lm.ladder]
            return tuple(names[names.index(self.lm.size) + 1 :]) or ("",)
        return ("",)

    def target(self) -> dict[str, float]:
        """The target as metric -> weight (``target_metric`` alone unless ``target_weights``)."""
        return dict(self.target_weights) or {self.target_metric: 1.0}


def run_id(index: int) -> str:
    return f"r{index:04d}"


def validate_study(params: StudyParams, where: str = "study") -> StudyParams:
    """The same params, or a :class:`StudyError` naming the field and the fix."""

    def fail(msg: str) -> None:
        raise StudyError(f"{where}: {msg}")

    if not STUDY_NAME.match(params.name):
        fail(f"name {params.name!r} must be lowercase letters, digits, '-' or '_' (at most 64)")
    if not params.target_budget > 0 or not params.proxy_budget > 0:
        fail("target_budget and proxy_budget must be positive token counts")
    if params.proxy_budget > params.target_budget:
        fail(f"proxy_budget {params.proxy_budget:g} exceeds target_budget {params.target_budget:g}; a proxy is the smaller run")
    if not 2 <= params.n_runs <= 10_000:
        fail(f"n_runs {params.n_runs} must be between 2 and 10000")
    if not 1 <= len(params.phases) <= 2:
        fail(f"{len(params.phases)} phases given; a study has one or two")
    shares = [p.share for p in params.phases]
    if any(s <= 0 for s in shares) or abs(sum(shares) - 1.0) > 1e-9:
        fail(f"phase shares {shares} must be positive and sum to 1")
    if len({p.name for p in params.phases}) != len(params.phases):
        fail("phase names must differ")
    if not params.max_epochs > 0 or params.kl_weight < 0:
        fail("max_epochs must be positive and kl_weight non-negative")
    if params.block_size < 1 or params.seq_len < 1:
        fail("block_size and seq_len must be positive")
    if not 0 <= params.sparse_share <= 1 or not 0 <= params.explore_share <= 1:
        fail("sparse_share and explore_share must be within [0, 1]")
    lo, hi = params.concentration
    if not 0 < lo <= hi:
        fail("concentration must be (low, high) with 0 < low <= high")
    if params.trainer not in TRAINERS:
        fail(f"trainer {params.trainer!r} is not one of {TRAINERS}")
    if params.search_candidates < 100 or params.search_rounds < 0:
        fail("search_candidates must be >= 100 and search_rounds >= 0")
    if params.proxy.order < 1 or params.proxy.holdout_mod < 2 or not params.proxy.repeat_scale > 0:
        fail("proxy.order must be >= 1, proxy.holdout_mod >= 2 and proxy.repeat_scale > 0")
    if check_lm_params(params.lm):
        fail(check_lm_params(params.lm))
    if params.optimizer not in OPTIMIZERS or params.top_k < 1:
        fail(f"optimizer {params.optimizer!r} must be one of {OPTIMIZERS} and top_k >= 1")
    if not 1.0 <= params.validation_budget_scale <= params.target_budget / params.proxy_budget:
        fail(f"validation_budget_scale {params.validation_budget_scale:g} must be between 1 and target_budget / proxy_budget")
    if params.replicate_mixtures < 0 or params.replicate_seeds < 1 or params.validation_seeds < 2:
        fail("replicate_mixtures must be >= 0, replicate_seeds >= 1 and validation_seeds >= 2 (noise needs two runs)")
    if params.gate.baseline_margin < 0 or not params.gate.min_gain > 0:
        fail("gate.baseline_margin must be >= 0 and gate.min_gain > 0 (the smallest gain ever claimed)")
    if any(not w > 0 for _, w in params.target_weights):
        fail(f"target_weights {dict(params.target_weights)} must be positive")
    if params.launcher:
        if params.trainer != "external":
            fail("a launcher submits runs to an external trainer; set trainer: external or remove launcher")
        try:
            check_template(params.launcher)
            if params.launcher_status:
                check_template(params.launcher_status)
        except LauncherError as exc:
            fail(str(exc))
    elif params.launcher_status:
        fail("launcher_status follows the runs a launcher submits; set launcher too, or remove launcher_status")
    if params.job_retries < 0 or not params.job_poll_s > 0 or params.job_cpus < 0 or params.job_gpus < 0:
        fail("job_retries, job_cpus and job_gpus must be >= 0 and job_poll_s > 0")
    if ":" not in params.train_run:
        fail(f"train_run {params.train_run!r} must be an importable 'module:function'")
    if len(set(params.validation_sizes)) != len(params.validation_sizes) or not all(STUDY_NAME.match(s) for s in params.validation_sizes):
        fail(f"validation_sizes {list(params.validation_sizes)} must be distinct names (lowercase letters, digits, '-' or '_')")
    off_ladder = [s for s in params.validation_sizes if params.uses_lm_proxy() and s not in {r.name for r in params.lm.ladder}]
    if off_ladder:
        fail(f"validation_sizes {off_ladder} are not on lm.ladder {[r.name for r in params.lm.ladder]}; name ladder sizes or add them to lm.ladder")
    unknown_limits = sorted(set(dict(params.target_limits)) - set(params.target()))
    if unknown_limits:
        fail(f"target_limits name metrics {unknown_limits} that are not in the target {sorted(params.target())}; add them to target_weights")
    return params


def study_from_mapping(raw: Mapping[str, Any], where: str = "study") -> StudyParams:
    """A :class:`StudyParams` from a parsed YAML/JSON mapping; unknown keys are errors."""
    known = {f.name for f in dataclasses.fields(StudyParams)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise StudyError(f"{where}: unknown keys {unknown}; the keys are {sorted(known)}")
    values = dict(raw)
    try:
        if "phases" in values:
            values["phases"] = tuple(TrainingPhase(str(p["name"]), float(p["share"])) for p in values["phases"])
        if "concentration" in values:
            values["concentration"] = tuple(float(x) for x in values["concentration"])
        if "proxy" in values:
            values["proxy"] = ProxyTrainerParams(**values["proxy"])
        if "gate" in values:
            values["gate"] = GateParams(**values["gate"])
        if "lm" in values:
            values["lm"] = lm_params_from_mapping(values["lm"])
        if "validation_sizes" in values:
            values["validation_sizes"] = tuple(str(x) for x in values["validation_sizes"])
        for key in ("target_weights", "target_limits"):
            if key in values:
                values[key] = tuple((str(m), float(v)) for m, v in dict(values[key]).items())
        for key in ("target_budget", "proxy_budget", "max_epochs", "kl_weight", "sparse_share", "explore_share", "validation_budget_scale", "job_poll_s", "job_cpus", "job_gpus"):
            if key in values:
                values[key] = float(values[key])
        for key in ("n_runs", "seed", "block_size", "seq_len", "search_candidates", "search_rounds", "top_k", "replicate_mixtures", "replicate_seeds", "validation_seeds", "job_retries"):
            if key in values:
                values[key] = int(values[key])
        params = StudyParams(**values)
    except (KeyError, TypeError, ValueError) as exc:
        raise StudyError(f"{where}: {exc}; see docs/mixture.md for the study keys") from exc
    return validate_study(params, where)


def study_to_mapping(params: StudyParams) -> dict[str, Any]:
    raw = dataclasses.asdict(params)
    raw["phases"] = [dataclasses.asdict(p) for p in params.phases]
    raw["concentration"] = list(params.concentration)
    raw["lm"] = lm_params_to_mapping(params.lm)
    raw["target_weights"] = dict(params.target_weights)
    raw["target_limits"] = dict(params.target_limits)
    raw["validation_sizes"] = list(params.validation_sizes)
    return raw


def study_dir(root: str, study: str) -> str:
    return storage.join(root, "mixture", study)


def results_dir(root: str, study: str) -> str:
    return storage.join(study_dir(root, study), RESULTS_DIR)


def load_study(root: str, study: str) -> StudyParams:
    """The spec at ``<root>/mixture/<study>/study.yaml`` (YAML or JSON), validated."""
    import yaml  # noqa: PLC0415

    uri = storage.join(study_dir(root, study), STUDY_FILE)
    if not storage.exists(uri):
        raise StudyError(f"study '{study}' has no spec at {uri}; write one (see docs/mixture.md)")
    try:
        raw = yaml.safe_load(storage.read_bytes(uri).decode("utf-8")) or {}
    except yaml.YAMLError as exc:
        raise StudyError(f"{uri}: not valid YAML ({exc})") from exc
    if not isinstance(raw, dict):
        raise StudyError(f"{uri}: the spec must be a mapping of keys to values")
    raw.setdefault("name", study)
    if raw["name"] != study:
        raise StudyError(f"{uri}: name {raw['name']!r} differs from its folder {study!r}; make them the same")
    return study_from_mapping(raw, uri)


def write_study(root: str, params: StudyParams) -> str:
    import yaml  # noqa: PLC0415

    validate_study(params)
    uri = storage.join(study_dir(root, params.name), STUDY_FILE)
    storage.write_bytes(uri, yaml.safe_dump(study_to_mapping(params), sort_keys=False).encode("utf-8"))
    return uri


def list_studies(root: str) -> list[str]:
    """Study folders under ``<root>/mixture`` that hold a spec."""
    return [
        storage.basename(u)
        for u in storage.listdir(storage.join(root, "mixture"))
        if STUDY_NAME.match(storage.basename(u)) and storage.exists(storage.join(u, STUDY_FILE))
    ]


# --------------------------------------------------------------------------- simulated epoching


def truncated_tokens(tokens: int, proxy_budget: float, target_budget: float) -> int:
    """Tokens of a group a proxy sees: ``int(tokens x proxy_budget / target_budget)``."""
    return int(tokens * proxy_budget / target_budget)


def group_truncation(tokens: Sequence[int], params: StudyParams) -> pl.DataFrame:
    """Per group: tokens, sequences, and what a proxy keeps of each (zero-sequence groups flagged)."""
    tokens = [int(t) for t in tokens]
    sequences = [t // params.seq_len for t in tokens]
    trunc_tokens = [truncated_tokens(t, params.proxy_budget, params.target_budget) for t in tokens]
    trunc_seqs = [truncated_tokens(s, params.proxy_budget, params.target_budget) for s in sequences]
    return pl.DataFrame(
        {
            "tokens": tokens,
            "sequences": sequences,
            "proxy_tokens": trunc_tokens,
            "proxy_sequences": trunc_seqs,
            "zero_sequences": [t > 0 and s == 0 for t, s in zip(tokens, trunc_seqs)],
        },
        schema={"tokens": pl.Int64, "sequences": pl.Int64, "proxy_tokens": pl.Int64, "proxy_sequences": pl.Int64, "zero_sequences": pl.Boolean},
    )


def epochs(weights: np.ndarray, tokens: np.ndarray, phase_budgets: np.ndarray) -> np.ndarray:
    """Epochs each group sees over all phases: sum_p budget_p x w_pg / tokens_g (0 for empty groups).

    ``weights`` is (phases, groups); a weighted group without tokens gets ``inf``.
    """
    weights = np.atleast_2d(np.asarray(weights, dtype=np.float64))
    tokens = np.asarray(tokens, dtype=np.float64)
    seen = (np.asarray(phase_budgets, dtype=np.float64)[:, None] * weights).sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        out = np.where(tokens > 0, seen / np.maximum(tokens, 1e-300), np.where(seen > 0, np.inf, 0.0))
    return out


# --------------------------------------------------------------------------- constraints


def epoch_caps(tokens: np.ndarray, params: StudyParams) -> np.ndarray:
    """The largest weight a group may have in every phase at once: max_epochs x tokens / budget."""
    return params.max_epochs * np.asarray(tokens, dtype=np.float64) / params.target_budget


def project_feasible(weights: np.ndarray, tokens: np.ndarray, params: StudyParams, prior: np.ndarray) -> np.ndarray:
    """Weights (phases x groups, each row on the simplex) with every group within the epoch cap
    summed over phases. Over-cap groups are scaled down in every phase and the freed mass goes
    to the others in proportion to their weights (to the prior if none is left), repeatedly.
    """
    w = np.array(np.atleast_2d(weights), dtype=np.float64)
    tokens = np.asarray(tokens, dtype=np.float64)
    budgets = params.phase_budgets(params.target_budget)
    cap = params.max_epochs
    if params.max_epochs * tokens.sum() < params.target_budget * (1 - 1e-12):
        raise MixtureError(
            f"a budget of {params.target_budget:,.0f} tokens needs more than {params.max_epochs:g} epochs of the "
            f"{tokens.sum():,.0f} pool tokens; raise max_epochs, lower target_budget, or add data"
        )
    w[:, tokens <= 0] = 0.0
    fixed = np.zeros(w.shape[1], dtype=bool)
    for _ in range(4 * w.shape[1] + 10):
        e = epochs(w, tokens, budgets)
        over = e > cap * (1 + 1e-9)
        if not over.any():
            break
        scale = np.where(over, cap / np.where(over, e, 1.0), 1.0)
        w = w * scale[None, :]
        fixed |= over
        for p in range(w.shape[0]):
            deficit = 1.0 - w[p].sum()
            free = ~fixed & (tokens > 0)
            base = np.where(free, w[p], 0.0)
            if base.sum() <= 1e-15:
                base = np.where(free, prior, 0.0)
            if base.sum() <= 0:
                raise MixtureError("every group is at its epoch cap; raise max_epochs or lower target_budget")
            w[p] += deficit * base / base.sum()
    return w / w.sum(axis=1, keepdims=True)


def round_to_block(weights: np.ndarray, tokens: np.ndarray, params: StudyParams) -> np.ndarray:
    """Integer sequences per group in each phase's mixture block (rows sum to ``block_size``).

    Largest remainder, phase by phase, never rounding a group up past its epoch cap; a weight
    under half a sequence becomes 0 (the group vanishes from the block).
    """
    w = np.atleast_2d(np.asarray(weights, dtype=np.float64))
    size = params.block_size
    budgets = params.phase_budgets(params.target_budget)
    tokens = np.asarray(tokens, dtype=np.float64)
    out = np.floor(w * size).astype(np.int64)
    for p in range(w.shape[0]):
        remainder = w[p] * size - out[p]
        missing = size - int(out[p].sum())
        order = np.argsort(-remainder, kind="stable")
        for g in order:
            if missing <= 0:
                break
            if remainder[g] <= 0 and w[p, g] <= 0:
                continue
            trial = out.astype(np.float64) / size
            trial[p, g] += 1.0 / size
            if epochs(trial, tokens, budgets)[g] <= params.max_epochs * (1 + 1e-9):
                out[p, g] += 1
                missing -= 1
        if missing > 0:  # every rounded-up candidate hit its cap: give to the most spacious groups
            room = params.max_epochs - epochs(out / size, tokens, budgets)
            for g in np.argsort(-np.where(tokens > 0, room * tokens, -np.inf)):
                if missing <= 0:
                    break
                out[p, g] += 1
                missing -= 1
    return out


def kl_divergence(weights: np.ndarray, prior: np.ndarray) -> np.ndarray:
    """KL(w || prior) in nats for each row of ``weights`` (0 log 0 = 0)."""
    w = np.atleast_2d(np.asarray(weights, dtype=np.float64))
    q = np.asarray(prior, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(w > 0, w * (np.log(np.maximum(w, 1e-300)) - np.log(np.maximum(q, 1e-300))), 0.0)
    return terms.sum(axis=-1)


# --------------------------------------------------------------------------- proposals


def proportional_prior(tokens: np.ndarray) -> np.ndarray:
    tokens = np.asarray(tokens, dtype=np.float64)
    if tokens.sum() <= 0:
        raise MixtureError("no group has tokens; build the pool and sampling_groups first")
    return tokens / tokens.sum()


def dirichlet_around(rng: np.random.Generator, prior: np.ndarray, concentration: float, subset: np.ndarray | None = None) -> np.ndarray:
    """One Dirichlet draw with mean ``prior`` (restricted to ``subset``) and total concentration
    ``concentration x groups``: small values give spiky mixtures, large ones stay near the prior."""
    mask = prior > 0 if subset is None else subset & (prior > 0)
    base = np.where(mask, prior, 0.0)
    base = base / base.sum()
    alpha = np.maximum(base * concentration * int(mask.sum()), 1e-3)
    draw = np.where(mask, rng.gamma(alpha), 0.0)
    if draw.sum() <= 0:
        return base
    return draw / draw.sum()


EXPLORE_CONCENTRATIONS = (0.3, 1.0, 3.0, 10.0)  # around the uniform mix: spiky to near-uniform


def propose_mixtures(tokens: np.ndarray, params: StudyParams) -> np.ndarray:
    """``n_runs`` mixtures, (runs x phases x groups), feasible, run 0 the token-proportional mix;
    ``explore_share`` of the others drawn around the uniform mix."""
    tokens = np.asarray(tokens, dtype=np.float64)
    prior = proportional_prior(tokens)
    uniform = np.where(prior > 0, 1.0, 0.0) / float((prior > 0).sum())
    rng = np.random.default_rng(params.seed)
    n_phases = len(params.phases)
    active = np.flatnonzero(prior > 0)
    lo, hi = params.concentration
    out = np.zeros((params.n_runs, n_phases, len(tokens)), dtype=np.float64)
    out[0] = project_feasible(np.tile(prior, (n_phases, 1)), tokens, params, prior)
    for i in range(1, params.n_runs):
        explore = rng.random() < params.explore_share
        sparse = rng.random() < params.sparse_share
        rows = []
        for _ in range(n_phases):
            if explore:
                center, concentration = uniform, float(EXPLORE_CONCENTRATIONS[rng.integers(len(EXPLORE_CONCENTRATIONS))])
            else:
                center, concentration = prior, float(np.exp(rng.uniform(np.log(lo), np.log(hi))))
            subset = None
            if sparse and len(active) > 2:
                k = int(rng.integers(max(2, len(active) // 10), max(3, len(active) // 2) + 1))
                subset = np.zeros(len(tokens), dtype=bool)
                subset[rng.choice(active, size=min(k, len(active)), replace=False)] = True  # uniformly: small groups as often as large
            rows.append(dirichlet_around(rng, center, concentration, subset))
        out[i] = project_feasible(np.array(rows), tokens, params, prior)
    return out


def mixture_id(sequences: np.ndarray) -> str:
    """``m`` + 10 hex chars of the block counts: equal mixtures share an id across studies."""
    return "m" + hashlib.sha256(np.ascontiguousarray(sequences, dtype=np.int64).tobytes()).hexdigest()[:10]


# --------------------------------------------------------------------------- the swarm


def trainer_config(
    params: StudyParams, rid: str, mid: str, seed: int, blocks: np.ndarray, names: Sequence[str], tokens: np.ndarray,
    trunc: pl.DataFrame, pool_files: Mapping[str, Sequence[str]], results_uri: str,
) -> dict[str, Any]:
    """One run's trainer config: weights and block sequences per phase, and per weighted group
    its pool files, tokens, simulated-epoching truncation and full-run epochs."""
    weights = blocks / params.block_size
    full_epochs = epochs(weights, tokens, params.phase_budgets(params.target_budget))
    used = weights.sum(axis=0) > 0
    proxy_tokens = trunc["proxy_tokens"].to_numpy()
    proxy_seqs = trunc["proxy_sequences"].to_numpy()
    return {
        "study": params.name,
        "run_id": rid,
        "mixture_id": mid,
        "seed": int(seed),
        "target_budget": params.target_budget,
        "experiment_budget": params.proxy_budget,
        "seq_len": params.seq_len,
        "block_size": params.block_size,
        "phases": [
            {
                "name": ph.name,
                "start_fraction": float(sum(q.share for q in params.phases[:p])),
                "share": ph.share,
                "weights": {names[g]: float(weights[p, g]) for g in np.flatnonzero(blocks[p] > 0)},
                "block_sequences": {names[g]: int(blocks[p, g]) for g in np.flatnonzero(blocks[p] > 0)},
            }
            for p, ph in enumerate(params.phases)
        ],
        "components": {
            names[g]: {
                "pool_files": list(pool_files.get(names[g], [])),
                "tokens": int(tokens[g]),
                "proxy_tokens": int(proxy_tokens[g]),
                "proxy_sequences": int(proxy_seqs[g]),
                "epochs_full_run": float(full_epochs[g]),
            }
            for g in np.flatnonzero(used)
        },
        "zero_sequence_groups": [names[g] for g in np.flatnonzero(used & trunc["zero_sequences"].to_numpy())],
        "results": {"write_to": results_uri, "columns": list(RESULT_COLUMNS)},
    }


@dataclasses.dataclass
class Swarm:
    groups: pl.DataFrame  # one row per group: group, topic, topic_label, band, tokens, sequences, proxy_tokens, proxy_sequences, zero_sequences, prior
    mixtures: pl.DataFrame  # one row per (run, phase, group) with weight > 0: run_id, mixture_id, phase, group, weight, block_sequences
    runs: pl.DataFrame  # one row per run: run_id, mixture_id, seed, max_epochs, zero_sequence_groups, vanished_groups, kl_to_prior
    configs: dict[str, dict[str, Any]]  # trainer config per run id
    summary: dict[str, Any]


def build_swarm(groups: pl.DataFrame, pool_files: Mapping[str, Sequence[str]], params: StudyParams, results_uri: str = "") -> Swarm:
    """The study's proposed runs from the sampling groups table (``group``, ``tokens``, labels)."""
    validate_study(params)
    groups = groups.sort("group")
    names = groups["group"].to_list()
    tokens = groups["tokens"].to_numpy().astype(np.float64)
    prior = proportional_prior(tokens)
    trunc = group_truncation(groups["tokens"].to_list(), params)
    proposals = propose_mixtures(tokens, params)
    budgets = params.phase_budgets(params.target_budget)
    phase_names = [p.name for p in params.phases]
    mix_rows: list[tuple] = []
    run_rows: list[tuple] = []
    configs: dict[str, dict[str, Any]] = {}
    zero_seq = trunc["zero_sequences"].to_numpy()
    for rid, i, seed in params.run_plan():
        blocks = round_to_block(proposals[i], tokens, params)
        weights = blocks / params.block_size
        mid = mixture_id(blocks)
        full_epochs = epochs(weights, tokens, budgets)
        used = weights.sum(axis=0) > 0
        vanished = (proposals[i] > 0) & (blocks == 0) & (tokens > 0)[None, :]
        zero_groups = [names[g] for g in np.flatnonzero(used & zero_seq)]
        for p in range(len(phase_names)):
            for g in np.flatnonzero(blocks[p] > 0):
                mix_rows.append((rid, mid, phase_names[p], names[g], float(weights[p, g]), int(blocks[p, g])))
        kl = float(np.dot(params.phase_budgets(1.0), kl_divergence(weights, prior)))
        run_rows.append((rid, mid, seed, float(full_epochs.max()), len(zero_groups), int(vanished.any(axis=0).sum()), kl))
        configs[rid] = trainer_config(params, rid, mid, seed, blocks, names, tokens, trunc, pool_files, results_uri)
    label = groups["topic_label"] if "topic_label" in groups.columns else pl.Series([""] * groups.height)
    group_table = pl.DataFrame(
        {
            "group": names,
            "topic": groups["topic"] if "topic" in groups.columns else [int(n[1:3]) for n in names],
            "topic_label": label,
            "band": groups["band"] if "band" in groups.columns else [int(n.split("q")[1]) for n in names],
            "prior": prior,
        }
    ).hstack(trunc)
    mixtures = pl.DataFrame(
        mix_rows,
        schema={"run_id": pl.Utf8, "mixture_id": pl.Utf8, "phase": pl.Utf8, "group": pl.Utf8, "weight": pl.Float64, "block_sequences": pl.Int64},
        orient="row",
    )
    runs = pl.DataFrame(
        run_rows,
        schema={"run_id": pl.Utf8, "mixture_id": pl.Utf8, "seed": pl.Int64, "max_epochs": pl.Float64, "zero_sequence_groups": pl.Int64, "vanished_groups": pl.Int64, "kl_to_prior": pl.Float64},
        orient="row",
    )
    zero_any = group_table.filter(pl.col("zero_sequences"))["group"].to_list()
    summary = {
        "runs": len(configs),
        "phases": phase_names,
        "groups_with_tokens": int((tokens > 0).sum()),
        "proxy_to_target": params.proxy_budget / params.target_budget,
        "groups_zero_sequences_in_proxy": len(zero_any),
        "zero_sequence_groups": zero_any,
        "runs_with_zero_sequence_groups": int((runs["zero_sequence_groups"] > 0).sum()),
        "runs_with_vanished_groups": int((runs["vanished_groups"] > 0).sum()),
        "max_full_run_epochs": float(runs["max_epochs"].max()),
        "distinct_mixtures": int(runs["mixture_id"].n_unique()),
        "replicate_runs": int((runs["seed"] > 0).sum()),
        "trainer": params.trainer,
    }
    return Swarm(group_table, mixtures, runs, configs, summary)


def write_swarm(swarm: Swarm, out_dir: str, pool_files: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """Parquet tables, the pool files of every group, and one JSON and one YAML trainer config
    per run under ``configs/``."""
    import yaml  # noqa: PLC0415

    written = {"pool_files": storage.join(out_dir, "pool_files.json")}
    storage.write_json(written["pool_files"], {g: list(f) for g, f in pool_files.items()})
    for name in ("groups", "mixtures", "runs"):
        uri = storage.join(out_dir, f"{name}.parquet")
        storage.write_parquet(getattr(swarm, name), uri)
        written[f"{name}_parquet"] = uri
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml's emitter where built: the same text, ~6x faster
    for rid, config in swarm.configs.items():
        storage.write_bytes(storage.join(out_dir, "configs", f"{rid}.json"), json.dumps(config, indent=2, sort_keys=True).encode())
        storage.write_bytes(storage.join(out_dir, "configs", f"{rid}.yaml"), yaml.dump(config, Dumper=dumper, sort_keys=True).encode())
    written["configs"] = storage.join(out_dir, "configs")
    return written


def read_swarm(out_dir: str) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """(groups, mixtures, runs) of a written swarm."""
    return tuple(pl.from_arrow(storage.read_parquet(storage.join(out_dir, f"{n}.parquet"))) for n in ("groups", "mixtures", "runs"))  # type: ignore[return-value]


def read_config(out_dir: str, rid: str) -> dict[str, Any]:
    uri = storage.join(out_dir, "configs", f"{rid}.json")
    if not storage.exists(uri):
        raise StudyError(f"run {rid!r} is not in the swarm at {out_dir}; its runs are the files under configs/")
    return storage.read_json(uri)


def weight_matrix(mixtures: pl.DataFrame, run_ids: Sequence[str], phases: Sequence[str], groups: Sequence[str]) -> np.ndarray:
    """(runs x phases x groups) weights from the long ``mixtures`` table."""
    r_index = {r: i for i, r in enumerate(run_ids)}
    p_index = {p: i for i, p in enumerate(phases)}
    g_index = {g: i for i, g in enumerate(groups)}
    out = np.zeros((len(run_ids), len(phases), len(groups)), dtype=np.float64)
    for rid, phase, group, weight in mixtures.select("run_id", "phase", "group", "weight").iter_rows():
        if rid in r_index:
            out[r_index[rid], p_index[phase], g_index[group]] = weight
    return out


# The external results schema (one row per run, step and metric); see mixture_results.
RESULT_COLUMNS = ("run_id", "mixture_id", "step", "tokens", "metric", "value")

