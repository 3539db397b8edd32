"""Mixture search on a synthetic ground truth: regret of the chosen mixture and the gates' calls.

The truth is known, so the loop can be scored. 200 groups (token counts log-uniform over two
decades), 4 evaluation domains, each relevant to a few groups; domain d's loss is
``base_d + scale_d x (x_d + 0.02)^-0.5`` with ``x_d = sum_g rel_dg x tokens_g x eff(e_g) / budget``:
a power law in the effective relevant tokens, where ``eff`` is the data-constrained value of
``e_g`` epochs (R* = 3: the fourth epoch of a group is worth far less than its first; the full run sees the pool once
under token-proportional sampling). The
target is the mean over domains; a proxy measures it with Gaussian noise.

Two studies per truth seed, each a swarm of proxies with replicates:

* ``signal``: noise sd 0.003 against a spread of about 0.05 across mixtures; the gates should
  publish, and the published mixture should be truly better than token-proportional;
* ``noise``: the same surface 100x flatter with noise sd 0.01: mixtures differ by less than one
  run's noise, and the gates should refuse (publish token-proportional);
* ``small groups``: the fifth of the groups with the fewest tokens is worth 6x per fresh token
  (their relevance x 6), so the optimum repeats them for several epochs; proposals drawn only
  around the token-proportional prior barely touch them. The study should publish, with a true
  regret below token-proportional's.

For the signal study it prints the true regret (true target of the chosen mixture minus the
true optimum, found by searching the truth itself) of every optimizer (``topk``: the mean of
the search's best candidates; ``regmix``: of the best simulated ones; ``trust_region``;
``argmin``), with token-proportional for scale, and holds them to goals (PASS/MISS).

Run: ``python -m bench mixture`` (``--quick``: one truth seed, fewer runs).
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time

import numpy as np

from bench.harness import absolute_goal, exit_status, pick
from marin_assets.core.mixture import fit as mf
from marin_assets.core.mixture import gates
from marin_assets.core.mixture import swarm as ms

N_GROUPS, N_DOMAINS, REPEAT_SCALE = 200, 4, 3.0
METHODS = ms.OPTIMIZERS


@dataclasses.dataclass
class Truth:
    tokens: np.ndarray
    relevance: np.ndarray  # domains x groups
    base: np.ndarray
    scale: np.ndarray
    study: ms.StudyParams

    def __call__(self, weights: np.ndarray) -> np.ndarray:
        """True target (mean over domains) of (n x phases x groups) weights."""
        w = np.asarray(weights, dtype=np.float64)
        e = np.einsum("npg,p->ng", w, self.study.phase_budgets(self.study.target_budget)) / self.tokens
        eff = _eff(e)
        x = (eff * self.tokens / self.study.target_budget) @ self.relevance.T
        return (self.base + self.scale * (x + 0.02) ** -0.5).mean(axis=1)


def _eff(e: np.ndarray) -> np.ndarray:
    """``proxy_trainer.effective_epochs`` over an array."""
    return np.where(e <= 1, e, 1 + REPEAT_SCALE * (1 - np.exp(-(np.maximum(e, 1) - 1) / REPEAT_SCALE)))


def make_truth(seed: int, n_runs: int, flat: float = 1.0, small_worth: float = 1.0) -> Truth:
    rng = np.random.default_rng(seed)
    tokens = np.floor(np.exp(rng.uniform(np.log(1e8), np.log(1e10), N_GROUPS)))
    relevance = (rng.random((N_DOMAINS, N_GROUPS)) < 0.05) * rng.uniform(1, 4, (N_DOMAINS, N_GROUPS)) + 0.05 * rng.random((N_DOMAINS, N_GROUPS))
    relevance[:, tokens <= np.quantile(tokens, 0.2)] *= small_worth  # the planted value of small groups
    study = ms.StudyParams(name=f"synthetic{seed}", target_budget=float(tokens.sum()), proxy_budget=1e8, n_runs=n_runs, seed=seed,
                           phases=(ms.TrainingPhase("main", 1.0),), kl_weight=0.0, search_candidates=pick(20_000, 8_000), search_rounds=pick(8, 4))
    return Truth(tokens, relevance, rng.uniform(0.8, 1.2, N_DOMAINS), rng.uniform(0.05, 0.1, N_DOMAINS) * flat, study)


def run_study(truth: Truth, noise: float, seed: int) -> tuple[gates.Assessment, np.ndarray]:
    """The swarm (replicates included) measured with noise, assessed; returns the observed weights too."""
    proposals = ms.propose_mixtures(truth.tokens, truth.study)
    plan = truth.study.run_plan()
    weights = np.stack([proposals[i] for _, i, _ in plan])
    measured = truth(weights) + np.random.default_rng(seed + 100).normal(0, noise, len(plan))
    found = gates.assess(weights, measured, [r for r, _, _ in plan], [f"m{i}" for _, i, _ in plan], truth.study, truth.tokens,
                         mf.FitParams(seed=seed, bootstrap=8), ["target"], [1.0])
    return found, weights


def true_optimum(truth: Truth) -> float:
    best = mf.optimize_mixture(truth, truth.tokens, truth.study, mf.OptimizeParams(candidates=pick(40_000, 10_000), rounds=pick(16, 8), method="argmin", seed=1))
    return float(min(truth(best.weights[None])[0], truth(best.unrounded[None])[0]))


def main() -> None:
    seeds = pick([0, 1, 2], [0])
    n_runs = pick(128, 96)
    regrets: dict[str, list[float]] = {m: [] for m in (*METHODS, "proportional")}
    published, refused, improved = [], [], []
    small: list[dict] = []
    for seed in seeds:
        started = time.perf_counter()
        truth = make_truth(seed, n_runs)
        found, observed = run_study(truth, 0.003, seed)
        optimum = true_optimum(truth)
        for method in METHODS:
            study = dataclasses.replace(truth.study, optimizer=method)
            _, candidate, verdict, _ = gates.publish(found.model, found.verdict, truth.tokens, study, observed)
            regrets[method].append(float(truth(candidate.weights[None])[0]) - optimum)
            if method == "topk":  # the default: what the study publishes
                published.append(verdict.passed)
                improved.append(verdict.passed and float(truth(candidate.weights[None])[0]) < float(truth(candidate.proportional[None])[0]))
        regrets["proportional"].append(float(truth(candidate.proportional[None])[0]) - optimum)
        flat = make_truth(seed, n_runs, flat=0.01)
        noisy, _ = run_study(flat, 0.01, seed)
        refused.append(not noisy.verdict.passed)
        print(f"  truth seed {seed}: signal study {'published' if published[-1] else 'refused'} (cv Spearman {found.verdict.facts.get('cv_spearman', float('nan')):.3f}, "
              f"KL-only {found.baseline.get('spearman', float('nan')):.3f}, noise sd {found.verdict.facts['noise_sd']:.4f} vs spread {found.verdict.facts['spread_sd']:.4f}); "
              f"noise study {'refused: ' + noisy.verdict.describe()[:120] if not noisy.verdict.passed else 'published'} ({time.perf_counter() - started:.0f} s)", flush=True)
        print("    true regret: " + ", ".join(f"{m} {regrets[m][-1]:.4f}" for m in (*METHODS, "proportional")), flush=True)
        small.append(small_groups_study(seed, n_runs))
    med = {m: statistics.median(v) for m, v in regrets.items()}
    print(f"  median true regret over {len(seeds)} truth(s), {n_runs} runs + replicates, {N_GROUPS} groups: "
          + ", ".join(f"{m} {med[m]:.4f} [{min(regrets[m]):.4f}..{max(regrets[m]):.4f}]" for m in regrets))
    absolute_goal("gates publish when the signal is real", f"{sum(published)} of {len(published)} signal studies", all(published))
    absolute_goal("gates refuse when mixtures differ by less than the noise", f"{sum(refused)} of {len(refused)} noise studies", all(refused))
    absolute_goal("the published top-k mixture is truly better than token-proportional", f"{sum(improved)} of {len(improved)}", all(improved))
    absolute_goal("top-k regret <= argmin regret (median)", f"{med['topk']:.4f} vs {med['argmin']:.4f}", med["topk"] <= med["argmin"])
    absolute_goal("top-k regret <= regmix regret (median): the search helps", f"{med['topk']:.4f} vs {med['regmix']:.4f}", med["topk"] <= med["regmix"])
    closed = 1 - med["topk"] / med["proportional"]
    print(f"  top-k closes {closed:.0%} of token-proportional's regret (median)")
    found = [s["published"] and s["regret"] < s["proportional_regret"] for s in small]
    absolute_goal("small groups worth 6x per fresh token are found (published, regret below proportional)", f"{sum(found)} of {len(found)}", all(found))


def small_groups_study(seed: int, n_runs: int) -> dict:
    """The planted study: the smallest fifth of the groups worth 6x per fresh token."""
    started = time.perf_counter()
    truth = make_truth(seed, n_runs, small_worth=6.0)
    found, observed = run_study(truth, 0.003, seed)
    optimum = true_optimum(truth)
    published, candidate, verdict, _ = gates.publish(found.model, found.verdict, truth.tokens, truth.study, observed)
    small = truth.tokens <= np.quantile(truth.tokens, 0.2)
    budgets = truth.study.phase_budgets(truth.study.target_budget)
    epochs = lambda w: ms.epochs(w, truth.tokens, budgets)[small]  # noqa: E731
    best = mf.optimize_mixture(truth, truth.tokens, truth.study, mf.OptimizeParams(candidates=pick(40_000, 10_000), rounds=pick(16, 8), method="argmin", seed=1))
    proposed = np.array([epochs(w).mean() for w in observed])
    out = {"published": verdict.passed, "regret": float(truth(published.weights[None])[0]) - optimum,
           "proportional_regret": float(truth(candidate.proportional[None])[0]) - optimum}
    print(f"  truth seed {seed}: small-groups study {'published' if verdict.passed else 'refused: ' + verdict.describe()[:160]}; true regret "
          f"{out['regret']:.4f} vs token-proportional {out['proportional_regret']:.4f}; mean epochs on the small groups: proposals "
          f"{np.median(proposed):.2f} (median; 90th percentile {np.percentile(proposed, 90):.2f}), published {epochs(published.weights).mean():.2f}, "
          f"true optimum {epochs(best.weights).mean():.2f} ({time.perf_counter() - started:.0f} s)", flush=True)
    return out


if __name__ == "__main__":
    sys.exit(exit_status(main()))
