"""The built-in proxy trainer: a byte-level n-gram language model trained on a proxy's mixture.

It stands in for a small transformer where seconds per run matter (the demo and the tests):
what a proxy learns still depends on the mixture, through how much of each group it sees.
:func:`train_run` is its entry of the job interface (``mixture.jobs``); it has no size ladder.

Training data follow simulated epoching: each group is cut to its ``proxy_tokens`` (documents
in an order set by the run's seed, id order for seed 0, the last one cut by its share of
tokens), and the group's counts are weighted by the epochs the proxy spends on it
(``proxy_budget x weight / proxy_tokens``, summed over phases), discounted as repeated data is
in data-constrained scaling: e epochs count as ``1 + R* (1 - exp(-(e - 1) / R*))`` fresh ones.
Only the columns and files a run needs are read: ids and token counts of its groups' files,
then the text of the chosen documents' files.

The model is an interpolated Witten-Bell n-gram over bytes (orders 0..``order``), counted with
sorted integer keys (context bytes packed into an int64 with the next byte). Evaluation text
is eval-like text when the study names one (the locked eval sets, or a file of ``domain`` and
``text``), else the held-out pool documents (id hash 0 modulo ``holdout_mod``), one domain per
source; the metrics are bits per byte per domain (``bpb/<domain>``) and their mean (``macro_bpb``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
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


def effective_epochs(epochs: float, repeat_scale: float) -> float:
    """Fresh-data epochs that ``epochs`` passes are worth (data-constrained scaling, R* = ``repeat_scale``)."""
    if epochs <= 1.0:
        return float(epochs)
    return float(1.0 + repeat_scale * (1.0 - np.exp(-(epochs - 1.0) / repeat_scale)))


def _order_key(doc_id: str, seed: int) -> str:
    return doc_id if seed == 0 else hashlib.sha256(f"{seed}:{doc_id}".encode()).hexdigest()


def truncated_training_text(files: Sequence[str], proxy_tokens: int, params: ProxyTrainerParams, seed: int = 0) -> bytes:
    """The group's training bytes: non-held-out documents in the seed's order up to
    ``proxy_tokens``. Ids and token counts are read first; text only from files that hold a
    chosen document."""
    index = []
    for f, uri in enumerate(files):
        frame = pl.from_arrow(storage.read_parquet(uri, ["id", "tokens"])).with_row_index("row")  # type: ignore[union-attr]
        frame = frame.filter(~is_heldout(frame["id"], params.holdout_mod))
        index += [(_order_key(str(i), seed), f, int(r), int(t)) for r, i, t in frame.select("row", "id", "tokens").iter_rows()]
    chosen: list[tuple[int, int, int, int]] = []  # (file, row, tokens to keep, tokens)
    left = int(proxy_tokens)
    for _, f, row, tokens in sorted(index):
        if left <= 0 or int(proxy_tokens) - left >= params.max_train_bytes_per_group:  # a token is at least a byte
            break
        chosen.append((f, row, min(tokens, left), tokens))
        left -= tokens
    texts: dict[tuple[int, int], str] = {}
    for f in sorted({c[0] for c in chosen}):
        column = storage.read_parquet(files[f], ["text"]).column("text")
        texts |= {(f, c[1]): str(column[c[1]].as_py()) for c in chosen if c[0] == f}
    out: list[bytes] = []
    size = 0
    for f, row, keep, tokens in chosen:
        data = texts[(f, row)].encode("utf-8")
        if keep < tokens:
            data = data[: max(1, int(len(data) * keep / max(tokens, 1)))]
        out.append(data)
        size += len(data)
        if size >= params.max_train_bytes_per_group:
            break
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


def capped_texts(pairs: Iterable[tuple[str, str]], cap: int) -> dict[str, bytes]:
    """(domain, text) pairs as one text per domain, documents joined, at most ``cap`` bytes each."""
    chunks: dict[str, list[bytes]] = {}
    sizes: dict[str, int] = {}
    for domain, text in pairs:
        if sizes.get(domain, 0) >= cap:
            continue
        data = str(text).encode("utf-8")
        chunks.setdefault(domain, []).append(data)
        sizes[domain] = sizes.get(domain, 0) + len(data) + len(DOC_SEPARATOR)
    return {d: DOC_SEPARATOR.join(c)[:cap] for d, c in sorted(chunks.items())}


def evaluation_texts(pool_files: Mapping[str, Sequence[str]], params: ProxyTrainerParams) -> dict[str, bytes]:
    """Held-out pool text per domain (source), capped per domain. A file's ``source`` column is
    read first and the file skipped once its domain is full; ids next; text only for files that
    hold held-out documents."""
    cap = params.max_eval_bytes_per_domain
    sizes: dict[str, int] = {}
    pairs: list[tuple[str, str]] = []
    for uri in sorted({f for fs in pool_files.values() for f in fs}):
        sources = storage.read_parquet(uri, ["source"]).column("source").to_pylist()
        if not sources or all(sizes.get(str(x), 0) >= cap for x in set(sources)):
            continue
        ids = pl.from_arrow(storage.read_parquet(uri, ["id"]))["id"]  # type: ignore[index]
        held = np.flatnonzero(is_heldout(ids, params.holdout_mod).to_numpy())
        if not len(held):
            continue
        column = storage.read_parquet(uri, ["text"]).column("text")
        for row in sorted(held, key=lambda r: ids[int(r)]):
            domain = str(sources[row])
            if sizes.get(domain, 0) < cap:
                text = str(column[int(row)].as_py())
                pairs.append((domain, text))
                sizes[domain] = sizes.get(domain, 0) + len(text.encode("utf-8")) + len(DOC_SEPARATOR)
    return capped_texts(pairs, cap)


def read_eval_set(uri: str, params: ProxyTrainerParams) -> dict[str, bytes]:
    """A configured evaluation set: JSON Lines or Parquet rows with ``domain`` and ``text``."""
    where = f"{uri} (proxy.eval_set)"
    if not storage.exists(uri):
        raise ValueError(f"{where} does not exist; write JSONL or Parquet rows with 'domain' and 'text' there, or clear proxy.eval_set")
    if uri.endswith(".parquet"):
        frame = pl.from_arrow(storage.read_parquet(uri))
        rows = frame.to_dicts()  # type: ignore[union-attr]
    elif uri.endswith(".jsonl"):
        try:
            rows = [json.loads(line) for line in storage.read_bytes(uri).decode("utf-8").splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: line is not JSON ({exc}); write one object with 'domain' and 'text' per line") from exc
    else:
        raise ValueError(f"{where}: an eval set is a .jsonl or .parquet file")
    bad = [i for i, r in enumerate(rows, start=1) if not (isinstance(r, dict) and isinstance(r.get("domain"), str) and isinstance(r.get("text"), str))]
    if bad or not rows:
        raise ValueError(f"{where}: rows {bad[:5] or 'none'} lack string 'domain' and 'text'; every row needs both")
    return capped_texts(((r["domain"], r["text"]) for r in rows), params.max_eval_bytes_per_domain)


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
        raise ValueError("no evaluation text: name an eval set (proxy.eval_set), or the pool needs documents whose id hash is 0 modulo holdout_mod")
    budget = float(config["experiment_budget"])
    seed = int(config.get("seed", 0))
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
        text = truncated_training_text(component["pool_files"], proxy_tokens, params, seed)
        if not text:
            skipped.append(group)
            continue
        texts.append(text)
        weights.append(effective_epochs(budget * share / proxy_tokens, params.repeat_scale))  # this group's epochs in the proxy, discounted
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


def train_run(config: Mapping[str, Any], results_dir: str, size: str = "", seed: int = 0) -> dict[str, float]:
    """The job interface over the n-gram proxy: ``config`` carries ``proxy`` (the study's
    ``ProxyTrainerParams`` as a mapping) and ``evaluation_dir`` (a folder holding the study's
    evaluation text, see :func:`write_evaluation_texts`). An n-gram model has no sizes: ``size``
    is accepted and ignored; results are written by the caller (``results_dir`` unused)."""
    del results_dir, size
    texts = read_evaluation_texts(str(config["evaluation_dir"]))
    if texts is None:
        raise ValueError(f"no evaluation text under {config['evaluation_dir']}; materialize mixture_swarm again")
    return train_proxy({**config, "seed": int(seed)}, texts, ProxyTrainerParams(**dict(config["proxy"])))["metrics"]
