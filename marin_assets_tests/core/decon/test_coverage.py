"""The coverage rule: normalization, copies wherever they sit, whole short rows, runs, and drop
sets that drop boilerplate but not repeated copies."""

from __future__ import annotations

import pyarrow as pa
import pytest

from marin_assets.core.decon.rules import (
    DeconParams,
    build_eval_index,
    eval_ngram_frequencies,
    load_drop_set,
    load_eval_index,
    mark_documents,
    normalize_text,
    source_drop_set,
)
from marin_assets.core.decon.text_normalize import normalize_batch
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.kernels import string_buffers
from marin_assets_tests.core.decon.test_rules import (
    CAPITAL,
    EVAL_ROWS,
    LICENCE,
    LICENSED_TASK,
    PROJECTILE,
    filler,
    page,
)

P = DeconParams()


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("eval_index"))
    build_eval_index(EVAL_ROWS, out, P)
    return out


@pytest.fixture(scope="module")
def indexes(index_dir):
    return {rule: load_eval_index(index_dir, rule) for rule in ("coverage", "marin")}


def flags(indexes, texts, drop=None, rule="coverage"):
    return mark_documents(texts, indexes[rule], drop, P, rule).contaminated.tolist()


def test_normalization_folds_width_case_format_punctuation_quotes_and_line_numbers():
    assert normalize_text("ＡＢＣ Straße").split() == ["abc", "strasse"]
    assert normalize_text("zero\u200bwidth so\u00adft").split() == ["zerowidth", "soft"]
    assert normalize_text("Hello, world! (yes) “quoted” a—b").split() == ["hello", "world", "yes", "quoted", "a", "b"]
    assert normalize_text("> > 12. first line\n> 13 second line").split() == ["first", "line", "second", "line"]
    assert normalize_text("in 1998 there were 12 people, 3.2 s later 7b").split() == ["in", "there", "were", "people",
                                                                                     "s", "later", "7b"]


def _variants(row: str) -> dict[str, str]:
    words = row.split()
    lines = [" ".join(words[k:k + 8]) for k in range(0, len(words), 8)]
    full = {c: chr(ord(c) + 0xFEE0) for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"}
    return {
        "inline": f"{filler(40, 1)} {row} {filler(40, 2)}",
        "reflowed": filler(20, 3) + "\n" + "\n".join(lines),
        "upper": page(filler(20, 4), row.upper()),
        "full_width": "".join(full.get(c, c) for c in row),
        "zero_width": " ".join(w[:1] + "\u200b" + w[1:] for w in words),
        "quoted": "\n".join("> " + x for x in lines),
        "line_numbers": "\n".join(f"{k + 1:>3}  {x}" for k, x in enumerate(lines)),
        "commas": " ".join(w + "," for w in words),
        "one_in_26": " ".join("zz" + w if k % 26 == 25 else w for k, w in enumerate(words)),
    }


def test_coverage_catches_every_reformatted_copy_that_the_paragraph_rule_misses(indexes):
    variants = _variants(EVAL_ROWS[0][2])
    coverage = flags(indexes, list(variants.values()))
    marin = flags(indexes, list(variants.values()), rule="marin")
    assert all(coverage), dict(zip(variants, coverage))
    missed = {kind for kind, flagged in zip(variants, marin) if not flagged}
    assert {"upper", "full_width", "zero_width", "quoted", "one_in_26"} <= missed


def test_a_short_row_matches_whole_anywhere_but_not_in_part(indexes):
    assert flags(indexes, [f"{filler(50, 5)} so, {CAPITAL.upper()} they asked. {filler(30, 6)}"]) == [True]
    assert flags(indexes, [f"{filler(50, 5)} what is the capital of {filler(30, 6)}"]) == [False]


def test_a_long_verbatim_run_is_enough_even_for_a_small_share_of_a_long_row(tmp_path):
    long_row = " ".join(filler(400, 9).split())
    build_eval_index([("long", "0", long_row)], str(tmp_path), P)
    index = load_eval_index(str(tmp_path), "coverage")
    chunk = " ".join(long_row.split()[100:160])  # 60 tokens: 48 consecutive 13-grams, 12% of the row
    short_chunk = " ".join(long_row.split()[100:140])  # 40 tokens: below run_tokens (50)
    marks = mark_documents([f"{filler(30, 1)} {chunk} {filler(30, 2)}", f"{filler(30, 1)} {short_chunk}"],
                           index, None, P, "coverage")
    assert marks.contaminated.tolist() == [True, False]
    assert 0.1 < marks.max_overlap[0] < 0.2


def test_near_misses_on_the_same_topic_are_clean(indexes):
    words = PROJECTILE.split()
    shuffled = words[::2] + words[1::2]
    assert flags(indexes, [" ".join(shuffled), " ".join(words[:10]) + " " + filler(60, 7)]) == [False, False]


def _source(tmp_path, name, docs):
    uri = str(tmp_path / name / storage.shard_name(0, 1))
    storage.write_parquet(pa.table({"id": [f"{name}-{i}" for i in range(len(docs))], "text": docs}), uri)
    return [uri]


def test_repeated_copies_of_one_row_stay_flagged_while_boilerplate_is_dropped(tmp_path, index_dir, indexes):
    params = DeconParams(index_uri=index_dir)
    copies = [page(filler(30, 100 + i), EVAL_ROWS[0][2]) for i in range(20)]  # whole rows
    licences = [page(filler(40, 200 + i), LICENCE) for i in range(40)]
    clean = [filler(80, 300 + i) for i in range(100)]
    uris = _source(tmp_path, "src", copies + licences + clean)
    drops = {}
    for rule in ("coverage", "marin"):
        freq = str(tmp_path / f"{rule}.parquet")
        eval_ngram_frequencies(uris, freq, params, rule=rule)
        source_drop_set(freq, str(tmp_path / f"{rule}_drop.parquet"), params)
        drops[rule] = load_drop_set([str(tmp_path / f"{rule}_drop.parquet")])
    coverage = mark_documents(copies + licences, indexes["coverage"], drops["coverage"], P, "coverage").contaminated
    marin = mark_documents(copies + licences, indexes["marin"], drops["marin"], P, "marin").contaminated
    assert coverage[:20].all()  # every one of the 20 copies
    assert not coverage[20:].any()  # licence-only documents: boilerplate, dropped
    assert not marin[:20].any()  # Marin's drop set counts the copies themselves and hides them
    # the row next to the licence is still caught by its own text
    assert flags(indexes, [page(LICENCE, LICENSED_TASK)], drops["coverage"]) == [True]


def test_normalizing_a_batch_equals_normalizing_each_document():
    # digits ending one document and starting the next are two tokens, not one run
    texts = ["see e1", "1 2 rows", "abc12", "34 def", "x 7", "8", "", "ＡＢ 9", "10 ok"]
    data, offsets, _ = string_buffers(pa.array(texts, pa.large_string()))
    out, out_offsets = normalize_batch(data, offsets)
    got = [out[out_offsets[i]:out_offsets[i + 1]].tobytes().decode() for i in range(len(texts))]
    assert got == [normalize_text(t) for t in texts]
    assert got[3].split() == ["def"] and got[1].split() == ["rows"]
