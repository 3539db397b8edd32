"""The built-in proxy trainer: a byte-level n-gram language model trained on a proxy's mixture.

It stands in for a small transformer where seconds per run matter (the demo and the tests):
what a proxy learns still depends on the mixture, through how much of each group it sees.

Training data follow simulated epoching: each group is cut to its ``proxy_tokens`` (documents
in id order, the last one cut by its share of tokens), and the group's counts are weighted by
the epochs the proxy spends on it (``proxy_budget x weight / proxy_tokens``, summed over
phases), which is what repeating the data that many times does to counts.

The model is an interpolated Witten-Bell n-gram over bytes (orders 0..``order``), counted with
sorted integer keys (context bytes packed into an int64 with the next byte). Evaluation text
is the held-out pool documents (id hash 0 modulo ``holdout_mod``), one domain per source;
the metrics are bits per byte per domain (``bpb/<source>``) and their mean (``macro_bpb``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import polars as pl

from marin_assets.core.mixture.swarm import ProxyTrainerParams
from marin_assets.core.runtime import storage

DOC_SEPARATOR = b"\n\n"
EVAL_FILE = "eval_texts.parquet"


def is_heldout(ids: pl.Series, holdout_mod: int) -> pl.Series:
    """Documents kept for evaluation: the first 8 hex chars of the id, modulo ``holdout_mod``, are 0."""
    return ids.str.slice(0, 8).str.to_integer(base=16, strict=False).fill_null(1) % holdout_mod == 0


def read_group_documents(files: Sequence[str]) -> pl.DataFrame:
    parts = [pl.from_arrow(storage.read_parquet(f, ["id", "text", "source", "tokens"])) for f in files]
    if not parts:
        return pl.DataFrame(schema={"id": pl.Utf8, "text": pl.Utf8, "source": pl.Utf8, "tokens": pl.Int64})
    return pl.concat(parts).with_columns(pl.col("tokens").cast(pl.Int64)).sort("id")  # type: ignore[arg-type]


def truncated_training_text(docs: pl.DataFrame, proxy_tokens: int, params: ProxyTrainerParams) -> bytes:
    """The group's training bytes: non-held-out documents in id order up to ``proxy_tokens``."""
    train = docs.filter(~is_heldout(docs["id"], params.holdout_mod))
    out: list[bytes] = []
    left = int(proxy_tokens)
    size = 0
    for text, tokens in train.select("text", "tokens").iter_rows():
        if left <= 0 or size >= params.max_train_bytes_per_group:
            break
        data = str(text).encode("utf-8")
        if tokens > left:
            data = data[: max(1, int(len(data) * left / max(tokens, 1)))]
        out.append(data)
        size += len(data)
        left -= int(tokens)
    return DOC_SEPARATOR.join(out)[: params.max_train_bytes_per_group]


def _keys(data: np.ndarray, k: int, order: int) -> np.ndarray:
    """For every position: the ``k`` preceding bytes and the byte itself packed as an int64
    (positions before the start see byte 0)."""
    padded = np.concatenate([np.zeros(order, dtype=np.int64), data.astype(np.int64)])
    n = len(data)
    key = padded[order : order + n].copy()
    for j in range(1, k + 1):
        key |= padded[order - j : order - j + n] << (8 * j)
    return key


class ByteNgram:
    """Weighted byte n-gram counts and Witten-Bell interpolated probabilities."""

    def __init__(self, order: int) -> None:
        if not 1 <= order <= 6:
            raise ValueError("order must be between 1 and 6 (context bytes packed into an int64)")
        self.order = order
        self.tables: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self.unigram = np.zeros(256, dtype=np.float64)

    def fit(self, texts: Sequence[bytes], weights: Sequence[float]) -> ByteNgram:
        arrays = [(np.frombuffer(t, dtype=np.uint8), float(w)) for t, w in zip(texts, weights) if t and w > 0]
        self.unigram = np.zeros(256, dtype=np.float64)
        for data, w in arrays:
            self.unigram += w * np.bincount(data, minlength=256)
        self.tables = []
        for k in range(1, self.order + 1):
            keys = np.concatenate([_keys(d, k, self.order) for d, _ in arrays]) if arrays else np.zeros(0, dtype=np.int64)
            wts = np.concatenate([np.full(len(d), w) for d, w in arrays]) if arrays else np.zeros(0)
            uniq, inverse = np.unique(keys, return_inverse=True)
            counts = np.bincount(inverse, weights=wts, minlength=len(uniq))
            ctx = uniq >> 8
            ctx_uniq, ctx_start = np.unique(ctx, return_index=True)
            ctx_total = np.add.reduceat(counts, ctx_start) if len(counts) else np.zeros(0)
            ctx_types = np.diff(np.append(ctx_start, len(uniq))).astype(np.float64)
            self.tables.append((uniq, counts, ctx_uniq, ctx_total, ctx_types))
        return self

    def log2_probs(self, data: bytes) -> np.ndarray:
        arr = np.frombuffer(data, dtype=np.uint8)
        total = self.unigram.sum()
        p = (self.unigram[arr] + 1.0) / (total + 256.0)
        for k, (uniq, counts, ctx_uniq, ctx_total, ctx_types) in enumerate(self.tables, start=1):
            keys = _keys(arr, k, self.order)
            pos = np.searchsorted(uniq, keys)
            hit = (pos < len(uniq)) & (uniq[np.minimum(pos, len(uniq) - 1)] == keys) if len(uniq) else np.zeros(len(keys), dtype=bool)
            c = np.where(hit, counts[np.minimum(pos, max(len(counts) - 1, 0))] if len(counts) else 0.0, 0.0)
            ctx = keys >> 8
            cpos = np.searchsorted(ctx_uniq, ctx)
            chit = (cpos < len(ctx_uniq)) & (ctx_uniq[np.minimum(cpos, len(ctx_uniq) - 1)] == ctx) if len(ctx_uniq) else np.zeros(len(ctx), dtype=bool)
            safe = np.minimum(cpos, max(len(ctx_uniq) - 1, 0))
            n = np.where(chit, ctx_total[safe] if len(ctx_total) else 0.0, 0.0)
            t = np.where(chit, ctx_types[safe] if len(ctx_types) else 0.0, 0.0)
            p = np.where(n > 0, (c + t * p) / np.maximum(n + t, 1e-300), p)
        return np.log2(p)

    def bits_per_byte(self, data: bytes) -> float:
        return float(-self.log2_probs(data).mean()) if data else float("nan")


def evaluation_texts(pool_files: Mapping[str, Sequence[str]], params: ProxyTrainerParams) -> dict[str, bytes]:
    """Held-out text per domain (source) over every group, capped per domain, in id order."""
    files = sorted({f for fs in pool_files.values() for f in fs})
    parts = [pl.from_arrow(storage.read_parquet(f, ["id", "text", "source"])) for f in files]
    if not parts:
        return {}
    docs = pl.concat(parts).sort("id")  # type: ignore[arg-type]
    held = docs.filter(is_heldout(docs["id"], params.holdout_mod))
    out: dict[str, bytes] = {}
    for (source,), frame in held.group_by("source", maintain_order=True):
        chunks: list[bytes] = []
        size = 0
        for text in frame["text"].to_list():
            data = str(text).encode("utf-8")
            chunks.append(data)
            size += len(data)
            if size >= params.max_eval_bytes_per_domain:
                break
        out[str(source)] = DOC_SEPARATOR.join(chunks)[: params.max_eval_bytes_per_domain]
    return dict(sorted(out.items()))


def write_evaluation_texts(texts: Mapping[str, bytes], out_dir: str) -> str:
    uri = storage.join(out_dir, EVAL_FILE)
    storage.write_parquet(pl.DataFrame({"domain": list(texts), "text": list(texts.values())}, schema={"domain": pl.Utf8, "text": pl.Binary}), uri)
    return uri


def read_evaluation_texts(out_dir: str) -> dict[str, bytes] | None:
    uri = storage.join(out_dir, EVAL_FILE)
    if not storage.exists(uri):
        return None
    frame = pl.from_arrow(storage.read_parquet(uri))
    return {str(d): bytes(t) for d, t in frame.iter_rows()}  # type: ignore[union-attr]


def train_proxy(config: Mapping[str, Any], eval_texts: Mapping[str, bytes], params: ProxyTrainerParams) -> dict[str, Any]:
    """Train one proxy from its trainer config (see ``mixture_swarm.build_swarm``); returns metrics.

    The result rows follow the external results schema, so both kinds of proxy are read alike.
    """
    if not eval_texts:
        raise ValueError("no held-out evaluation text: the pool has no document whose id hash is 0 modulo holdout_mod")
    budget = float(config["experiment_budget"])
    exposure: dict[str, float] = {}
    for phase in config["phases"]:
        for group, weight in phase["weights"].items():
            exposure[group] = exposure.get(group, 0.0) + float(phase["share"]) * float(weight)
    texts: list[bytes] = []
    weights: list[float] = []
    skipped: list[str] = []
    for group, share in sorted(exposure.items()):
        component = config["components"][group]
        proxy_tokens = int(component["proxy_tokens"])
        if proxy_tokens <= 0:
            skipped.append(group)
            continue
        text = truncated_training_text(read_group_documents(component["pool_files"]), proxy_tokens, params)
        if not text:
            skipped.append(group)
            continue
        texts.append(text)
        weights.append(budget * share / proxy_tokens)  # epochs of this group in the proxy
    model = ByteNgram(params.order).fit(texts, weights)
    metrics = {f"bpb/{domain}": model.bits_per_byte(text) for domain, text in eval_texts.items()}
    metrics["macro_bpb"] = float(np.mean(list(metrics.values())))
    rows = [
        {"run_id": config["run_id"], "mixture_id": config["mixture_id"], "step": 1, "tokens": budget, "metric": m, "value": float(v)}
        for m, v in sorted(metrics.items())
    ]
    return {
        "rows": rows,
        "metrics": metrics,
        "train_bytes": int(sum(len(t) for t in texts)),
        "groups_trained": len(texts),
        "groups_without_proxy_tokens": skipped,
    }
