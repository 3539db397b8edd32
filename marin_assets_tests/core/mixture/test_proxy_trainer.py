"""The built-in proxy: a byte n-gram whose held-out bits per byte follow what it was trained on."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from marin_assets.core.mixture import proxy_trainer as pt
from marin_assets.core.mixture.swarm import ProxyTrainerParams

CODE = b"def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(add(i, i))\n" * 40
PROSE = b"The river runs quietly past the old mill, where the miller keeps his grain and his stories.\n" * 40


def test_ngram_bits_per_byte_follow_the_training_mixture() -> None:
    code_eval, prose_eval = CODE[:500], PROSE[:500]
    code_heavy = pt.ByteNgram(3).fit([CODE, PROSE], [10.0, 0.1])
    prose_heavy = pt.ByteNgram(3).fit([CODE, PROSE], [0.1, 10.0])
    assert code_heavy.bits_per_byte(code_eval) < prose_heavy.bits_per_byte(code_eval)
    assert prose_heavy.bits_per_byte(prose_eval) < code_heavy.bits_per_byte(prose_eval)
    assert 0 < code_heavy.bits_per_byte(code_eval) < 8
    probs = np.exp2(pt.ByteNgram(2).fit([CODE], [1.0]).log2_probs(b"xyz"))
    assert ((probs > 0) & (probs < 1)).all()  # unseen bytes keep probability


def test_untrained_model_is_about_eight_bits_per_byte() -> None:
    assert pt.ByteNgram(2).fit([], []).bits_per_byte(b"hello") == pytest.approx(8.0)


def _pool(tmp_path) -> dict[str, list[str]]:
    files = {}
    for group, source, text in (("c00q0", "code", CODE), ("c01q0", "prose", PROSE)):
        ids = [f"{i * 7919 % 4096:08x}" + "0" * 24 for i in range(40)]
        frame = pl.DataFrame({"id": ids, "text": [text[:200].decode()] * 40, "source": [source] * 40, "tokens": [50] * 40})
        path = tmp_path / f"{group}.parquet"
        frame.write_parquet(path)
        files[group] = [str(path)]
    return files


def test_train_proxy_uses_truncation_and_reports_per_domain(tmp_path) -> None:
    params = ProxyTrainerParams(order=3, holdout_mod=4)
    files = _pool(tmp_path)
    evals = pt.evaluation_texts(files, params)
    assert sorted(evals) == ["code", "prose"]
    ids = pl.Series([f"{i * 7919 % 4096:08x}" for i in range(40)])
    assert pt.is_heldout(ids, 4).sum() == sum(int(x, 16) % 4 == 0 for x in ids)
    config = {
        "run_id": "r0001", "mixture_id": "m1", "experiment_budget": 1000.0,
        "phases": [{"share": 1.0, "weights": {"c00q0": 0.9, "c01q0": 0.1}}],
        "components": {"c00q0": {"pool_files": files["c00q0"], "proxy_tokens": 120}, "c01q0": {"pool_files": files["c01q0"], "proxy_tokens": 0}},
    }
    out = pt.train_proxy(config, evals, params)
    assert out["groups_without_proxy_tokens"] == ["c01q0"]  # nothing of it survives truncation
    assert set(out["metrics"]) == {"bpb/code", "bpb/prose", "macro_bpb"}
    assert out["metrics"]["bpb/code"] < out["metrics"]["bpb/prose"]
    assert out["metrics"]["macro_bpb"] == pytest.approx((out["metrics"]["bpb/code"] + out["metrics"]["bpb/prose"]) / 2)
    assert out["rows"][0]["run_id"] == "r0001" and out["rows"][0]["mixture_id"] == "m1"
    # 120 tokens of 50-token documents: two whole documents and 40% of a third
    text = pt.truncated_training_text(files["c00q0"], 120, params)
    assert len(text) == 200 + 200 + 80 + 2 * len(pt.DOC_SEPARATOR)
    pt.write_evaluation_texts(evals, str(tmp_path / "swarm"))
    assert pt.read_evaluation_texts(str(tmp_path / "swarm")) == evals


def test_seed_changes_the_documents_a_proxy_sees(tmp_path) -> None:
    params = ProxyTrainerParams(order=3, holdout_mod=4)
    ids = [f"{i * 7919 % 4096:08x}" + "0" * 24 for i in range(40)]
    frame = pl.DataFrame({"id": ids, "text": [f"document number {i} " * 5 for i in range(40)], "source": ["s"] * 40, "tokens": [10] * 40})
    frame.write_parquet(tmp_path / "g.parquet")
    files = [str(tmp_path / "g.parquet")]
    first, again, other = (pt.truncated_training_text(files, 50, params, seed) for seed in (0, 0, 1))
    assert first == again and first != other
    assert len(first.split(pt.DOC_SEPARATOR)) == len(other.split(pt.DOC_SEPARATOR)) == 5


def test_repeated_epochs_are_worth_less_each_time() -> None:
    values = [pt.effective_epochs(e, 15.4) for e in (0.5, 1, 2, 4, 8, 64)]
    assert values[:2] == [0.5, 1.0]
    gains = np.diff(values[1:]) / np.diff([1, 2, 4, 8, 64])
    assert (gains < 1).all() and (np.diff(gains) < 0).all()  # each further epoch adds less
    assert values[-1] < 1 + 15.4  # bounded by R* + 1


def test_evaluation_reads_text_only_of_files_it_uses(tmp_path, monkeypatch) -> None:
    files = _pool(tmp_path)
    extra = tmp_path / "more_code.parquet"
    ids = [f"{i * 4:08x}" + "0" * 24 for i in range(10)]  # every id held out
    pl.DataFrame({"id": ids, "text": ["x = 1\n" * 10] * 10, "source": ["code"] * 10, "tokens": [5] * 10}).write_parquet(extra)
    files["c00q1"] = [str(extra)]
    read: list[tuple[str, tuple]] = []
    original = pt.storage.read_parquet
    monkeypatch.setattr(pt.storage, "read_parquet", lambda uri, columns=None: read.append((uri.rsplit("/", 1)[-1], tuple(columns or ()))) or original(uri, columns))
    evals = pt.evaluation_texts(files, ProxyTrainerParams(holdout_mod=4, max_eval_bytes_per_domain=300))
    assert len(evals["code"]) == 300 and evals["prose"]
    texts_read = sorted(name for name, cols in read if "text" in cols)
    assert texts_read == ["c00q0.parquet", "c01q0.parquet"]  # the code domain was full before more_code
    assert ("more_code.parquet", ("source",)) in read


def test_configured_eval_set_is_read_and_checked(tmp_path) -> None:
    good = tmp_path / "evals.jsonl"
    good.write_text('{"domain": "qa", "text": "What is a prime?"}\n{"domain": "qa", "text": "Two is prime."}\n{"domain": "code", "text": "def f(): pass"}\n')
    evals = pt.read_eval_set(str(good), ProxyTrainerParams())
    assert evals == {"code": b"def f(): pass", "qa": b"What is a prime?" + pt.DOC_SEPARATOR + b"Two is prime."}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"domain": "qa"}\n')
    with pytest.raises(ValueError, match="bad.jsonl.*rows \\[1\\] lack string 'domain' and 'text'"):
        pt.read_eval_set(str(bad), ProxyTrainerParams())
