"""Embeddings: micro-batching, int8 storage and its fidelity, order, resumability (real offline model)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from marin_assets.core.embed import embeddings as embed
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.integrity import text_ids
from marin_assets.core.runtime.runner import ShardRunner, ShardTask

TEXTS = [
    "The defendant appealed, arguing that the trial court misread the statute of limitations.",
    "Whisk the eggs with sugar until pale, then fold in the flour and bake for twenty minutes.",
    "def parse(line):\n    key, _, value = line.partition('=')\n    return key.strip(), value.strip()",
    "The striker scored twice in the second half and the home side won the league title.",
    "Every bounded monotone sequence of real numbers converges; the proof uses the supremum.",
    "Patients with type 2 diabetes were randomized to metformin or placebo for 24 weeks.",
    "Short.",
    "A much longer paragraph about the history of the railway in the valley, which opened in 1862 "
    "and carried coal, timber and passengers until the line closed a century later, leaving the "
    "stations to be converted into houses, a museum and, in one case, a small brewery.",
]


def _ids(n: int, salt: str = "") -> list[str]:
    return [hashlib.md5(f"{salt}:{i}".encode()).hexdigest() for i in range(n)]


def _write_normalized(uri: str, texts: list[str | None], salt: str = "") -> list[str]:
    """A normalized shard: each id the hash of its text (made up only where there is none)."""
    ids = [text_ids([t])[0] if t is not None else made_up for t, made_up in zip(texts, _ids(len(texts), salt))]
    storage.write_parquet(pa.table({"id": ids, "text": pa.array(texts, pa.string()), "source_id": ids}), uri)
    return ids


@pytest.fixture(scope="module")
def params() -> embed.EmbedParams:
    """The bundled offline model, loaded once for the module (cached per process)."""
    p = embed.EmbedParams(encoder=embed.offline_encoder_params())
    embed.load_encoder(p.encoder)
    return p


def test_micro_batches_are_length_sorted_and_bounded_by_padded_tokens():
    lengths = [5, 300, 17, 256, 256, 1, 90, 90, 90, 40] * 7
    batches = embed.plan_micro_batches(lengths, max_batch_tokens=600, max_batch_size=4)
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(len(lengths)))
    longest = [max(lengths[i] for i in b) for b in batches]
    assert longest == sorted(longest, reverse=True)
    for b, top in zip(batches, longest):
        assert len(b) <= 4
        assert len(b) * top <= 600 or len(b) == 1
    # a sequence longer than the token budget still gets a batch of its own
    assert [len(b) for b in embed.plan_micro_batches([1000, 3], 500, 8)] == [1, 1]


def test_long_sequences_get_batches_bounded_by_attention_cells():
    """sequences x longest^2 (the padding mask grows with the square of the length) stays in budget."""
    lengths = [8192, 8000, 4096, 4000, 512, 512, 512, 100] * 4
    cells = 16_384 * embed.ATTENTION_CELLS_PER_BATCH_TOKEN
    batches = embed.plan_micro_batches(lengths, 16_384, 32, cells)
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(lengths)))
    for b in batches:
        top = max(lengths[i] for i in b)
        assert len(b) * top * top <= cells or len(b) == 1
        assert len(b) * top <= 16_384 or len(b) == 1
    assert all(len(b) == 1 for b in batches if max(lengths[i] for i in b) >= 4000)
    # 32 x 512 still fits one batch: short texts batch exactly as without the cell bound
    assert [len(b) for b in embed.plan_micro_batches([512] * 64, 16_384, 32, cells)] == [32, 32]


def test_micro_batched_encoding_equals_plain_encoding_for_short_documents(params):
    """Windows, token budget and the cell bound change how texts are grouped, never their vectors."""
    encoder = embed.load_encoder(params.encoder)
    texts = [t + f" {i}" * (i % 7) for i, t in enumerate(TEXTS * 4)]
    plain = encoder.encode(texts, batch_size=32, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
    tight = embed.offline_encoder_params(max_batch_tokens=48, max_batch_size=5)
    got, counters = embed.encode_texts(texts, tight)
    assert counters["micro_batches"] >= len(texts) // 5 and counters["windows"] > 1
    np.testing.assert_allclose(got, plain, atol=2e-6)


def test_int8_quantization_formula_and_clipping():
    x = np.array([[0.6, -0.8, 0.0, 0.0]], dtype=np.float32)  # unit norm, two coordinates beyond +-0.3
    y = np.array([[0.1, -0.2, 0.15, np.sqrt(1 - 0.01 - 0.04 - 0.0225)]], dtype=np.float32)
    codes = embed.quantize_int8(np.vstack([x, y]), 0.3)
    assert codes.dtype == np.int8
    assert codes[0].tolist() == [127, -127, 0, 0]
    assert codes[1, :3].tolist() == [round(0.1 / 0.3 * 127), round(-0.2 / 0.3 * 127), round(0.15 / 0.3 * 127)]
    back = embed.dequantize_int8(codes[1:], 0.3)
    assert np.allclose(back[0, :3], y[0, :3], atol=0.3 / 127 / 2 + 1e-6)


def test_embed_shard_keeps_order_and_matches_plain_encode(tmp_path, params):
    src, out = str(tmp_path / "n" / "part-00000-of-00001.parquet"), str(tmp_path / "e" / "part-00000-of-00001.parquet")
    texts = TEXTS + [None]
    ids = _write_normalized(src, texts)
    stats = embed.embed_shard([src], out, params)

    table = storage.read_parquet(out)
    assert table.column("id").to_pylist() == ids
    assert table.schema.field("embedding").type == pa.list_(pa.int8(), 384)
    assert stats["rows"] == len(texts) and stats["null_texts"] == 1 and stats["dim"] == 384
    assert stats["padded_tokens"] >= stats["tokens"] > 0

    got_ids, vectors = embed.load_embeddings([out])
    assert got_ids == ids and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    # the same vectors as a plain, prompt-free sentence-transformers encode, row for row
    plain = embed.load_encoder(params.encoder).encode([t or "" for t in texts], normalize_embeddings=True)
    cosines = np.sum(vectors * plain, axis=1)
    assert cosines[:-1].min() > 0.9995, cosines
    assert cosines[-1] > 0.99  # the empty text's vector has a coordinate beyond the int8 range


def test_int8_fidelity_against_float32(tmp_path, params):
    src, out = str(tmp_path / "n.parquet"), str(tmp_path / "e.parquet")
    _write_normalized(src, TEXTS * 3)
    stats = embed.embed_shard([src], out, params)
    assert stats["fidelity_mean_cosine"] >= 0.999
    assert 0.99 < stats["fidelity_min_cosine"] <= stats["fidelity_mean_cosine"]
    # the reported fidelity is the real one: recompute it from what was stored
    reference, _ = embed.encode_texts(TEXTS * 3, params.encoder)
    _, stored = embed.load_embeddings([out])
    assert np.isclose(np.sum(reference * stored, axis=1).mean(), stats["fidelity_mean_cosine"], atol=1e-4)


def test_float16_storage_option(tmp_path, params):
    src = str(tmp_path / "n.parquet")
    _write_normalized(src, TEXTS)
    half = embed.EmbedParams(encoder=params.encoder, storage="float16")
    stats = embed.embed_shard([src], str(tmp_path / "h.parquet"), half)
    embed.embed_shard([src], str(tmp_path / "q.parquet"), params)
    stored_type = storage.read_parquet(str(tmp_path / "h.parquet")).schema.field("embedding").type
    assert stored_type == pa.list_(pa.float16(), 384)
    assert stats["fidelity_mean_cosine"] > 0.99999
    _, h = embed.load_embeddings([str(tmp_path / "h.parquet")])
    _, q = embed.load_embeddings([str(tmp_path / "q.parquet")])
    assert np.sum(h * q, axis=1).min() > 0.998
    with pytest.raises(ValueError, match="int8"):
        embed.embed_shard([src], str(tmp_path / "x.parquet"), embed.EmbedParams(encoder=params.encoder, storage="bf8"))


def test_character_cap_applies_before_tokenization(params):
    capped = embed.offline_encoder_params(max_chars=30)
    long_text = TEXTS[5] + " " + TEXTS[1]
    vectors, _ = embed.encode_texts([long_text, long_text[:30]], capped)
    uncapped, _ = embed.encode_texts([long_text], params.encoder)
    assert np.dot(vectors[0], vectors[1]) > 0.9999
    assert np.dot(vectors[0], uncapped[0]) < 0.99


def test_small_token_budget_gives_the_same_vectors(params):
    tight = embed.offline_encoder_params(max_batch_tokens=64, max_batch_size=3)
    a, counters = embed.encode_texts(TEXTS, tight)
    b, _ = embed.encode_texts(TEXTS, params.encoder)
    assert counters["micro_batches"] >= len(TEXTS) // 3
    assert np.sum(a * b, axis=1).min() > 0.9999


def test_killed_run_resumes_without_reencoding_finished_shards(tmp_path, params, monkeypatch):
    shards = []
    for i in range(2):
        name = storage.shard_name(i, 2)
        src = str(tmp_path / "normalized" / name)
        _write_normalized(src, TEXTS[i * 4 : i * 4 + 4], salt=str(i))
        shards.append((src, str(tmp_path / "embeddings" / name)))

    calls = []
    real_encode = embed.encode_texts

    def counting_encode(texts, encoder_params):
        calls.append(len(texts))
        return real_encode(texts, encoder_params)

    monkeypatch.setattr(embed, "encode_texts", counting_encode)

    def dies_on_second_shard(inputs, output, p):
        if output.endswith(storage.shard_name(1, 2)):
            raise RuntimeError("worker killed")
        return embed.embed_shard(inputs, output, p)

    runner = ShardRunner(processes=1)
    with pytest.raises(RuntimeError, match="worker killed"):
        runner.map([ShardTask(dies_on_second_shard, (s,), o, params) for s, o in shards])
    assert calls == [4] and storage.exists(shards[0][1]) and not storage.exists(shards[1][1])
    first_mtime = os.path.getmtime(shards[0][1])

    results = runner.map([ShardTask(embed.embed_shard, (s,), o, params) for s, o in shards])
    assert [r.reused for r in results] == [True, False]
    assert calls == [4, 4]  # only the unfinished shard was encoded again
    assert os.path.getmtime(shards[0][1]) == first_mtime
    assert all(r.stats["rows"] == 4 for r in results)


def test_embedding_is_deterministic(tmp_path, params):
    src = str(tmp_path / "n.parquet")
    _write_normalized(src, TEXTS)
    embed.embed_shard([src], str(tmp_path / "a.parquet"), params)
    embed.embed_shard([src], str(tmp_path / "b.parquet"), params)
    a = storage.read_parquet(str(tmp_path / "a.parquet")).column("embedding")
    b = storage.read_parquet(str(tmp_path / "b.parquet")).column("embedding")
    assert a.equals(b)


def test_defaults_pin_the_production_model_and_import_stays_light():
    default = embed.EncoderParams()
    assert default.model == "microsoft/harrier-oss-v1-0.6b"
    assert default.revision == "f9b9dc8d367d443f2479d27aa5d8d2850c0774ee"
    assert (default.max_chars, default.max_tokens) == (100_000, 8_192)
    code = (
        "import sys, marin_assets.core.embed.embeddings, marin_assets.core.embed.topics; "
        "print('torch' in sys.modules, 'sentence_transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]
