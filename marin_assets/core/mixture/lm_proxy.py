"""The built-in proxy trainer: a small causal transformer language model (a byte-level GPT-2
from ``transformers``) trained on one run's mixture, scored in bits per byte.

A run trains ``experiment_budget`` tokens (bytes: the vocabulary is the 256 byte values) in
sequences of ``lm.context`` bytes. Each group contributes its simulated-epoching truncation
(``proxy_trainer.truncated_training_text``: documents in the seed's order up to its
``proxy_tokens``), cut into fixed windows of ``context`` bytes. Phase by phase, a group gets its
weight's share of the phase's sequences; it walks through its windows in an order drawn per
epoch from the seed, so a group the mixture repeats is seen again window for window, as a real
trainer would repeat it. The sequences of a phase are shuffled by the seed, and phases follow
one another. The whole plan follows from the config and the seed, so the data position of a
checkpoint is its step.

Determinism: the seed (or ``lm.init_seed``) fixes the initial weights, the seed the documents
kept and the data order, and torch runs deterministic algorithms (on CUDA where torch has them;
it warns where not). A checkpoint (weights, optimizer, schedule, step, random states) is written atomically every
``lm.checkpoint_every`` steps into the run's folder; a restarted run with the same config
resumes from it and ends with the same weights and metrics as one that was never stopped. Evaluation: bits per byte per domain (``bpb/<domain>``) and their mean
(``macro_bpb``), the same metric names as every trainer.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import math
import time
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from marin_assets.core.mixture import proxy_trainer
from marin_assets.core.mixture.lm_params import LMProxyParams, ModelSize, lm_params_from_mapping
from marin_assets.core.mixture.swarm import ProxyTrainerParams
from marin_assets.core.runtime import storage

CHECKPOINT = "checkpoint.pt"
VOCAB = 256


def choose_device(requested: str, cuda_available: bool) -> str:
    """``auto``: CUDA when present, else CPU; ``cuda`` without a GPU is an error naming the setting."""
    if requested == "auto":
        return "cuda" if cuda_available else "cpu"
    if requested == "cuda" and not cuda_available:
        raise ValueError("lm.device is 'cuda' but no CUDA device is available; set lm.device to auto or cpu")
    return requested


def build_model(size: ModelSize, context: int) -> Any:
    """A byte-level GPT-2 of the rung's shape, without dropout (a proxy's noise is its seed's)."""
    from transformers import GPT2Config, GPT2LMHeadModel  # noqa: PLC0415

    config = GPT2Config(
        vocab_size=VOCAB, n_positions=context, n_embd=size.n_embd, n_layer=size.n_layer, n_head=size.n_head,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )
    model = GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"  # the model reads its own attribute, not the config's: named, it warns of nothing
    return model


def parameter_count(size: ModelSize, context: int) -> int:
    return sum(p.numel() for p in build_model(size, context).parameters())


# --------------------------------------------------------------------------- the data plan


def _rng(seed: int, *salt: str) -> np.random.Generator:
    return np.random.default_rng([int(seed), *(zlib.crc32(s.encode()) for s in salt)])


def _largest_remainder(shares: np.ndarray, total: int) -> np.ndarray:
    raw = shares / shares.sum() * total
    counts = np.floor(raw).astype(np.int64)
    counts[np.argsort(-(raw - counts), kind="stable")[: total - int(counts.sum())]] += 1
    return counts


def windows_of(text: bytes, context: int) -> np.ndarray:
    """The text as fixed windows of ``context`` bytes (a text shorter than one window is repeated to fill it)."""
    data = np.frombuffer(text, dtype=np.uint8)
    if len(data) < context:
        data = np.resize(data, context)
    n = len(data) // context
    return data[: n * context].reshape(n, context)


def training_plan(config: Mapping[str, Any], windows: Mapping[str, int], steps: int, batch: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The groups (sorted), and per training sequence in order its group's index and window:
    ``steps x batch`` sequences.

    Phase ``p`` gets its share of the steps; within it each group gets its weight's share of the
    sequences (renormalized over ``windows``' groups, those with training text) and reads its
    windows in an order drawn per epoch; the phase's sequences are then shuffled."""
    seed = int(config.get("seed", 0))
    phases = config["phases"]
    names = sorted(windows)
    ends = np.round(np.cumsum([float(p["share"]) for p in phases]) / sum(float(p["share"]) for p in phases) * steps).astype(int)
    cursors = dict.fromkeys(names, 0)
    orders = {g: np.zeros(0, dtype=np.int64) for g in names}
    streams = {g: _rng(seed, g) for g in names}
    group_parts, window_parts = [], []
    start = 0
    for p, (phase, end) in enumerate(zip(phases, ends)):
        weighted = [g for g in names if float(phase["weights"].get(g, 0.0)) > 0]
        n = (int(end) - start) * batch
        start = int(end)
        if not weighted or n <= 0:
            continue
        counts = _largest_remainder(np.array([float(phase["weights"][g]) for g in weighted]), n)
        groups, chosen = [], []
        for g, count in zip(weighted, counts):
            missing = cursors[g] + count - len(orders[g])
            if missing > 0:  # more epochs of the group's windows, each in its own order
                epochs = -(-missing // windows[g])
                orders[g] = np.concatenate([orders[g], np.argsort(streams[g].random((epochs, windows[g])), axis=1).ravel()])
            chosen.append(orders[g][cursors[g] : cursors[g] + count])
            groups.append(np.full(count, names.index(g), dtype=np.int32))
            cursors[g] += int(count)
        shuffle = _rng(seed, "phase", str(p)).permutation(n)
        group_parts.append(np.concatenate(groups)[shuffle])
        window_parts.append(np.concatenate(chosen)[shuffle])
    if not group_parts:
        return names, np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int64)
    return names, np.concatenate(group_parts), np.concatenate(window_parts)


# --------------------------------------------------------------------------- training


def _run_fingerprint(config: Mapping[str, Any], size: ModelSize, lm: LMProxyParams, proxy: ProxyTrainerParams) -> str:
    payload = {"config": config, "size": dataclasses.asdict(size), "lm": dataclasses.asdict(lm), "proxy": dataclasses.asdict(proxy)}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def weights_digest(model: Any) -> str:
    """sha256 of the weights, tensor by tensor in state-dict order."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def _schedule(lm: LMProxyParams, steps: int) -> Callable[[int], float]:
    warmup = max(1, int(lm.warmup_fraction * steps))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return lm.min_lr_ratio + (1 - lm.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return factor


def _save_checkpoint(uri: str, state: dict[str, Any]) -> None:
    import torch  # noqa: PLC0415

    buffer = io.BytesIO()
    torch.save(state, buffer)
    storage.write_bytes(uri, buffer.getvalue())  # atomic: a kill leaves the previous checkpoint


def _load_checkpoint(uri: str, fingerprint: str) -> dict[str, Any] | None:
    import torch  # noqa: PLC0415

    if not storage.exists(uri):
        return None
    state = torch.load(io.BytesIO(storage.read_bytes(uri)), map_location="cpu", weights_only=False)
    return state if state.get("fingerprint") == fingerprint else None  # another config's checkpoint: start over


def bits_per_byte(model: Any, text: bytes, context: int, device: str, batch: int = 64) -> float:
    """Mean bits per predicted byte over the text cut into windows of ``context`` bytes."""
    import torch  # noqa: PLC0415

    data = np.frombuffer(text, dtype=np.uint8)
    starts = list(range(0, max(len(data) - 1, 0), context))
    if not starts:
        return float("nan")
    nats, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for first in range(0, len(starts), batch):
            chunk = [data[s : s + context] for s in starts[first : first + batch]]
            for length in sorted({len(c) for c in chunk}):  # the last window may be shorter
                rows = torch.tensor(np.stack([c for c in chunk if len(c) == length]).astype(np.int64), device=device)
                logits = model(input_ids=rows).logits[:, :-1].float()
                loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), rows[:, 1:].reshape(-1), reduction="sum")
                nats += float(loss)
                count += rows.shape[0] * (length - 1)
    model.train()
    return nats / max(count, 1) / math.log(2)


def _group_texts(config: Mapping[str, Any], proxy: ProxyTrainerParams, seed: int) -> tuple[dict[str, bytes], list[str]]:
    """Each weighted group's truncated training text; groups left without text are listed."""
    texts: dict[str, bytes] = {}
    skipped: list[str] = []
    for group in sorted({g for phase in config["phases"] for g, w in phase["weights"].items() if float(w) > 0}):
        component = config["components"][group]
        proxy_tokens = int(component["proxy_tokens"])
        text = proxy_trainer.truncated_training_text(component["pool_files"], proxy_tokens, proxy, seed) if proxy_tokens > 0 else b""
        if text:
            texts[group] = text
        else:
            skipped.append(group)
    return texts, skipped


def train_lm_proxy(
    config: Mapping[str, Any], eval_texts: Mapping[str, bytes], proxy: ProxyTrainerParams, lm: LMProxyParams, work_dir: str,
    size: str | None = None, progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Train one proxy from its trainer config at ladder rung ``size`` (default: the config's
    ``size``, else ``lm.size``), checkpointing into ``work_dir``; returns the metrics and
    the result rows of the external results schema. ``progress(step, steps)`` follows each step."""
    import torch  # noqa: PLC0415

    if not eval_texts:
        raise ValueError("no evaluation text: name an eval set (proxy.eval_set), or the pool needs documents whose id hash is 0 modulo holdout_mod")
    rung = lm.model_size(size or str(config.get("size") or lm.size))
    device = choose_device(lm.device, torch.cuda.is_available())
    torch.use_deterministic_algorithms(True, warn_only=device == "cuda")  # a CUDA kernel without a deterministic twin warns, not fails
    torch.set_num_threads(lm.threads)
    seed = int(config.get("seed", 0))
    texts, skipped = _group_texts(config, proxy, seed)
    if not texts:
        raise ValueError(f"run {config['run_id']}: none of its groups has training text within its proxy_tokens; raise proxy_budget")
    windows = {g: windows_of(t, lm.context) for g, t in texts.items()}
    steps = max(1, round(float(config["experiment_budget"]) / (lm.batch_size * lm.context)))
    names, plan_groups, plan_windows = training_plan(config, {g: len(w) for g, w in windows.items()}, steps, lm.batch_size)

    torch.manual_seed(seed if lm.init_seed < 0 else lm.init_seed)  # the only draw from torch's generator
    model = build_model(rung, lm.context).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lm.learning_rate, betas=(0.9, 0.95), weight_decay=lm.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _schedule(lm, steps))
    checkpoint = storage.join(work_dir, CHECKPOINT)
    fingerprint = _run_fingerprint(config, rung, lm, proxy)
    state = _load_checkpoint(checkpoint, fingerprint)
    start = 0
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["torch_rng"])
        if device == "cuda" and state.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(state["cuda_rng"])
        start = int(state["step"])
    resumed_from = start
    wall, cpu = time.perf_counter(), time.process_time()
    model.train()
    for step in range(start, steps):
        at = slice(step * lm.batch_size, (step + 1) * lm.batch_size)
        batch = torch.tensor(np.stack([windows[names[g]][w] for g, w in zip(plan_groups[at], plan_windows[at])]).astype(np.int64), device=device)
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), lm.grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if (step + 1) % lm.checkpoint_every == 0 or step + 1 == steps:
            _save_checkpoint(checkpoint, {
                "fingerprint": fingerprint, "step": step + 1, "sequences_done": (step + 1) * lm.batch_size,
                "model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "torch_rng": torch.get_rng_state(), "cuda_rng": torch.cuda.get_rng_state() if device == "cuda" else None,
            })
        if progress is not None:
            progress(step + 1, steps)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    trained_tokens = (steps - resumed_from) * lm.batch_size * lm.context
    metrics = {f"bpb/{d}": bits_per_byte(model, t[: lm.eval_bytes_per_domain], lm.context, device) for d, t in eval_texts.items()}
    metrics["macro_bpb"] = float(np.mean(list(metrics.values())))
    tokens = float(steps * lm.batch_size * lm.context)
    rows = [{"run_id": config["run_id"], "mixture_id": config["mixture_id"], "step": steps, "tokens": tokens, "metric": m, "value": float(v)}
            for m, v in sorted(metrics.items())]
    return {
        "rows": rows, "metrics": metrics, "train_bytes": int(sum(len(t) for t in texts.values())), "groups_trained": len(texts),
        "groups_without_proxy_tokens": skipped, "model_size": rung.name, "parameters": sum(p.numel() for p in model.parameters()),
        "steps": steps, "tokens": tokens, "device": device, "resumed_from_step": resumed_from, "weights_sha256": weights_digest(model),
        "train_seconds": wall, "train_cpu_seconds": cpu, "tokens_per_cpu_second": trained_tokens / cpu if cpu > 0 else None,
    }


def train_run(config: Mapping[str, Any], results_dir: str, size: str = "", seed: int = 0) -> dict[str, float]:
    """The job interface (``mixture.jobs``) over the language-model proxy: ``config`` carries
    ``proxy`` and ``lm`` (the study's settings as mappings) and ``evaluation_dir`` (the study's
    evaluation text, see ``proxy_trainer.write_evaluation_texts``). ``size``: a rung of the
    ladder (``""``: ``lm.size``). Checkpoints go to ``<results_dir>/_checkpoints/<run>-<size>-s<seed>/``
    (the results reader skips names starting with ``_``), so a retried or restarted run resumes."""
    texts = proxy_trainer.read_evaluation_texts(str(config["evaluation_dir"]))
    if texts is None:
        raise ValueError(f"no evaluation text under {config['evaluation_dir']}; materialize mixture_swarm again")
    lm = lm_params_from_mapping(config.get("lm", {}))
    rung = size or lm.size
    work = storage.join(results_dir, "_checkpoints", f"{config['run_id']}-{rung}-s{int(seed)}")
    return train_lm_proxy({**config, "seed": int(seed)}, texts, ProxyTrainerParams(**dict(config["proxy"])), lm, work, size=rung)["metrics"]
