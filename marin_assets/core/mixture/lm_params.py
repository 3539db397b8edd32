"""Settings of the built-in language-model proxy (``mixture.lm_proxy``): the ladder of model
sizes and the training schedule.

Kept apart from the trainer so that a study spec can be read and checked without torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

DEVICES = ("auto", "cpu", "cuda")


@dataclasses.dataclass(frozen=True)
class ModelSize:
    """One rung of the ladder: a byte-level GPT-2 shape (``n_embd`` divisible by ``n_head``)."""

    name: str
    n_layer: int
    n_embd: int
    n_head: int


# ~0.12M, ~1.1M and ~4.1M parameters: the proxy and two validation sizes that train on a CPU. The
# proxy is small so that the runs a CPU affords give it many tokens per parameter: at 1M and 2M
# tokens (8 and 16 per parameter) up to 4 repeats cost no more than a change of seed
# (``python -m bench.bench_proxy``). Its seed noise, mostly from the initial weights
# (``init_seed``), is under a tenth of the spread across a swarm's mixtures at 2M tokens. Wider
# proxies, or more steps per token, cut the noise but lose to 4 repeats (docs/mixture.md).
LADDER = (ModelSize("proxy", 2, 64, 4), ModelSize("v1", 4, 144, 4), ModelSize("v2", 4, 288, 8))


@dataclasses.dataclass(frozen=True)
class LMProxyParams:
    """The byte-level transformer proxy. A run trains ``experiment_budget`` tokens (bytes) of its
    mixture in sequences of ``context`` bytes, ``batch_size`` per step.

    ``size``: the ladder rung swarm runs train (a config's ``size`` overrides it, as
    validation at larger sizes does); ``ladder``: the sizes by name. The learning rate warms up
    linearly over ``warmup_fraction`` of the steps, then follows a cosine to ``min_lr_ratio`` x
    ``learning_rate`` (``python -m bench proxy`` measures the recipe: repeats and seed noise).
    ``init_seed``: ``-1``, each run's initial weights drawn from its seed; ``n >= 0``, every run
    of the study starts from seed ``n``'s weights and differs by mixture and data draw only. A
    proxy's seed moves its score mostly through its start (docs/mixture.md, "Initial weights").
    ``checkpoint_every``: steps between checkpoints (model, optimizer, data position, random
    states) in the run's folder, so a killed run resumes.
    ``eval_bytes_per_domain``: evaluation text scored per domain. ``device``: ``auto`` (CUDA
    when present), ``cpu`` or ``cuda``; ``threads``: CPU threads per run (runs train side by side).
    """

    size: str = "proxy"
    ladder: tuple[ModelSize, ...] = LADDER
    context: int = 128
    batch_size: int = 16
    learning_rate: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_fraction: float = 0.05
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    init_seed: int = -1
    checkpoint_every: int = 250
    eval_bytes_per_domain: int = 131_072  # several documents of each domain: fewer decide a run's score
    device: str = "auto"
    threads: int = 1

    def model_size(self, name: str) -> ModelSize:
        for size in self.ladder:
            if size.name == name:
                return size
        raise ValueError(f"model size {name!r} is not on the ladder {[s.name for s in self.ladder]}")


def check_lm_params(params: LMProxyParams) -> str:
    """The first problem with the settings, naming the field (``lm.<field>``), or ``""``."""
    names = [s.name for s in params.ladder]
    if len(set(names)) != len(names) or not names:
        return f"lm.ladder names {names} must be distinct and non-empty"
    if params.size not in names:
        return f"lm.size {params.size!r} is not on lm.ladder {names}"
    for s in params.ladder:
        if min(s.n_layer, s.n_embd, s.n_head) < 1 or s.n_embd % s.n_head:
            return f"lm.ladder {s.name!r}: n_layer, n_embd, n_head must be positive and n_embd divisible by n_head"
    if params.context < 2 or params.batch_size < 1 or params.checkpoint_every < 1 or params.eval_bytes_per_domain < 2 or params.threads < 1:
        return "lm.context >= 2, lm.batch_size, lm.checkpoint_every, lm.threads >= 1 and lm.eval_bytes_per_domain >= 2"
    if not params.learning_rate > 0 or not 0 <= params.min_lr_ratio <= 1 or not 0 <= params.warmup_fraction < 1:
        return "lm.learning_rate must be positive, lm.min_lr_ratio within [0, 1] and lm.warmup_fraction within [0, 1)"
    if params.weight_decay < 0 or not params.grad_clip > 0:
        return "lm.weight_decay must be >= 0 and lm.grad_clip > 0"
    if params.init_seed < -1:
        return "lm.init_seed must be >= 0, or -1 for each run's own seed"
    if params.device not in DEVICES:
        return f"lm.device {params.device!r} is not one of {DEVICES}"
    return ""


def lm_params_from_mapping(raw: Mapping[str, Any]) -> LMProxyParams:
    """``lm:`` of a study spec; unknown keys are errors naming the field."""
    known = {f.name for f in dataclasses.fields(LMProxyParams)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"unknown lm keys {unknown}; the keys are {sorted(known)}")
    values = dict(raw)
    if "ladder" in values:
        fields = {f.name for f in dataclasses.fields(ModelSize)}
        rungs = []
        for rung in values["ladder"]:
            if not isinstance(rung, Mapping) or set(rung) != fields:
                raise ValueError(f"lm.ladder entry {rung!r} needs exactly the keys {sorted(fields)}")
            rungs.append(ModelSize(str(rung["name"]), int(rung["n_layer"]), int(rung["n_embd"]), int(rung["n_head"])))
        values["ladder"] = tuple(rungs)
    for f in dataclasses.fields(LMProxyParams):  # YAML reads 2e-3 as a string
        if f.name in values and isinstance(f.default, (int, float)):
            try:
                values[f.name] = type(f.default)(values[f.name])
            except (TypeError, ValueError):
                raise ValueError(f"lm.{f.name} {values[f.name]!r} must be a number") from None
    return LMProxyParams(**values)


def lm_params_to_mapping(params: LMProxyParams) -> dict[str, Any]:
    """The settings as plain values (a study spec's ``lm:``, a job config's ``lm``)."""
    return {**dataclasses.asdict(params), "ladder": [dataclasses.asdict(s) for s in params.ladder]}
