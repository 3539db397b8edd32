"""Each field of an eval row scored as its own unit (a copy of only the answer or only the question
is found), short or shared fields never flag alone, and the default flag is either rule."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from marin_assets.core.decon.rules import (
    DeconParams,
    EvalRow,
    build_eval_index,
    contamination_shard,
    eval_ngram_frequencies,
    load_drop_set,
    load_eval_index,
    mark_documents,
    source_drop_set,
)
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.integrity import text_ids
from marin_assets_tests.core.decon.test_rules import ENZYME, LICENSED_TASK, PROJECTILE, PROJECTILE_ANSWER, filler, page

P = DeconParams()

# A code problem shaped like a public code benchmark: the prompt is the signature and docstring,
# the canonical solution the body; the prompt is most of the row, so the body alone is < 50% of it.
PROMPT = '''def rolling_median(values: list[float], window: int) -> list[float]:
    """Return the median of every window of consecutive values, in order, as a new list.

    A window that holds an even number of values takes the mean of its two middle values.
    The function raises ValueError when the window is not positive or is longer than the
    list, and never changes the list it was given.
    >>> rolling_median([1, 3, 2, 8], 2)
    [2.0, 2.5, 5.0]
    """
'''
SOLUTION = '''    if window <= 0 or window > len(values):
        raise ValueError("window must be positive and at most the length of values")
    result = []
    for start in range(len(values) - window + 1):
        chunk = sorted(values[start:start + window])
        middle = window // 2
        result.append(chunk[middle] if window % 2 else (chunk[middle - 1] + chunk[middle]) / 2)
    return result
'''
SHORT_ANSWER = "The fall takes a little over three seconds in total."  # 10 tokens: too short to stand alone
INSTRUCTION = ("Read the question below carefully and answer with the letter of the single best option, giving a "
               "short justification of your choice in one or two sentences at most.")

ROWS = [
    EvalRow("code_bench", "CB/0", f"{PROMPT}\n\n{SOLUTION}", (("prompt", PROMPT), ("canonical_solution", SOLUTION))),
    EvalRow("physics_qa", "p-1", f"{PROJECTILE}\n\n{PROJECTILE_ANSWER}",
            (("question", PROJECTILE), ("answer", PROJECTILE_ANSWER))),
    EvalRow("physics_qa", "p-2", f"{LICENSED_TASK}\n\n{SHORT_ANSWER}",
            (("question", LICENSED_TASK), ("answer", SHORT_ANSWER))),
    # two rows of one set sharing their instruction: it is a template, not a unit of either row
    EvalRow("mc_task", "m-1", f"{INSTRUCTION}\n\n{ENZYME}", (("instruction", INSTRUCTION), ("question", ENZYME))),
    EvalRow("mc_task", "m-2", f"{INSTRUCTION}\n\n{filler(40, 77)}",
            (("instruction", INSTRUCTION), ("question", filler(40, 77)))),
]


def _index(tmp_path, rows, rule="coverage"):
    out = str(tmp_path / f"index-{len(rows)}-{rule}")
    stats = build_eval_index(rows, out, P)
    return load_eval_index(out, rule), stats


def test_a_copy_of_only_the_solution_or_only_the_reflowed_prompt_is_flagged(tmp_path):
    index, stats = _index(tmp_path, ROWS)
    solution_only = page("Here is a solution that passes every test:", SOLUTION, filler(30, 1))
    words = PROMPT.split()
    prompt_reflowed = page(filler(20, 2), "\n".join(" ".join(words[k:k + 5]) for k in range(0, len(words), 5)))
    answer_only = page(filler(40, 3), "Answer: " + PROJECTILE_ANSWER)
    marks = mark_documents([solution_only, prompt_reflowed, answer_only], index, None, P, "coverage")
    assert marks.contaminated.tolist() == [True, True, True]
    assert marks.matched_rows[0][0] == "code_bench:CB/0#canonical_solution"
    assert "code_bench:CB/0#prompt" in marks.matched_rows[1]
    assert marks.matched_rows[2][0] == "physics_qa:p-1#answer"
    assert stats["coverage"]["eval_sets"]["code_bench"]["field_units"] == 2
    # the same rows without their fields: the solution alone is under half the row and under the run
    whole, _ = _index(tmp_path, [(r.eval_set, r.row_id, r.text) for r in ROWS])
    assert mark_documents([solution_only], whole, None, P, "coverage").contaminated.tolist() == [False]


def test_a_short_or_shared_field_never_flags_alone(tmp_path):
    index, stats = _index(tmp_path, ROWS)
    assert "physics_qa:p-2#answer" not in {index.row_label(r) for r in range(len(index.row_ids))}
    assert stats["coverage"]["eval_sets"]["mc_task"]["field_units"] == 2  # the questions, not the instruction
    docs = [page(filler(40, 4), SHORT_ANSWER, filler(40, 5)),  # the whole short answer, verbatim
            page(filler(40, 6), INSTRUCTION, filler(40, 7)),  # the instruction every row shares
            page(filler(40, 8), ENZYME, filler(20, 9))]  # a question of its own: a copy
    assert mark_documents(docs, index, None, P, "coverage").contaminated.tolist() == [False, False, True]


def test_fields_do_not_add_n_grams_to_the_membership_index(tmp_path):
    with_fields, stats = _index(tmp_path, ROWS)
    without, _ = _index(tmp_path, [(r.eval_set, r.row_id, r.text) for r in ROWS])
    assert with_fields.hashes.tolist() == without.hashes.tolist()
    assert len(with_fields.attribution_hashes) > len(without.attribution_hashes)
    assert stats["coverage"]["rows"] == len(ROWS) and stats["coverage"]["field_units"] == 7


def test_a_row_published_twice_keeps_its_field_units(tmp_path):
    twice = ROWS[:2] + [EvalRow("physics_qa_copy", "p-1", ROWS[1].text, ROWS[1].fields)]
    index, _ = _index(tmp_path, twice)
    answer_only = page(filler(40, 3), PROJECTILE_ANSWER)
    assert mark_documents([answer_only], index, None, P, "coverage").contaminated.tolist() == [True]


def _source(tmp_path, name, docs):
    uri = str(tmp_path / name / storage.shard_name(0, 1))
    storage.write_parquet(pa.table({"id": [f"{name}-{i:04d}" for i in range(len(docs))],
                                    "text": pa.array(docs, pa.string())}), uri)
    return [uri]


def test_whole_row_copies_repeated_in_a_source_stay_flagged_when_rows_have_fields(tmp_path):
    out = str(tmp_path / "index")
    build_eval_index(ROWS, out, P)
    params = DeconParams(index_uri=out)
    # each copy holds the question and the first 40% of the answer: a copy of the row, not of the answer
    answer = PROJECTILE_ANSWER.split()
    copies = [page(filler(30, 100 + i), PROJECTILE, " ".join(answer[:len(answer) * 2 // 5])) for i in range(20)]
    uris = _source(tmp_path, "src", copies + [filler(80, 300 + i) for i in range(100)])
    eval_ngram_frequencies(uris, str(tmp_path / "freq.parquet"), params, rule="coverage")
    source_drop_set(str(tmp_path / "freq.parquet"), str(tmp_path / "drop.parquet"), params)
    drop = load_drop_set([str(tmp_path / "drop.parquet")])
    assert len(drop) == 0  # the copies are evidence, not boilerplate, although each field is in them too
    index = load_eval_index(out, "coverage")
    assert mark_documents(copies, index, drop, P, "coverage").contaminated.all()


def test_the_default_flag_is_either_rule(tmp_path):
    out = str(tmp_path / "index")
    build_eval_index([(r.eval_set, r.row_id, r.text) for r in ROWS[1:2]], out, P)
    words = PROJECTILE_ANSWER.split()
    marin_only = page(filler(30, 1), " ".join(words[10:26]), filler(30, 2))  # a 16-token paragraph of a long row
    coverage_only = PROJECTILE.upper() + " " + PROJECTILE_ANSWER.upper()
    texts = [marin_only, coverage_only, filler(80, 3)]
    shard = str(tmp_path / "normalized" / storage.shard_name(0, 1))
    storage.write_parquet(pa.table({"id": text_ids(texts), "text": texts}), shard)
    for rule, expected in (("either", [True, True, False]), ("coverage", [False, True, False]),
                           ("marin", [True, False, False])):
        target = str(tmp_path / rule / storage.shard_name(0, 1))
        stats = contamination_shard([shard], target, DeconParams(index_uri=out, rule_name=rule))
        table = pq.read_table(target)
        assert table.column("contaminated_marin").to_pylist() == [True, False, False]
        assert table.column("contaminated_coverage").to_pylist() == [False, True, False]
        assert table.column("contaminated").to_pylist() == expected, rule
        assert stats["contaminated"] == sum(expected)
    assert DeconParams().rule_name == "either"
    assert table.column("matched_rows").to_pylist()[0] == ["physics_qa:p-1"]


def test_a_question_two_sets_share_is_a_unit_of_each(tmp_path):
    answers = [filler(30, 55), filler(30, 56)]  # the question is under half of each row and under the run
    rows = [EvalRow(name, "0", f"{ENZYME}\n\n{a}", (("question", ENZYME), ("answer", a)))
            for name, a in zip(("bio_qa", "bio_variant"), answers)]
    index, _ = _index(tmp_path, rows)
    labels = {index.row_label(r) for r in range(len(index.row_ids))}
    assert {"bio_qa:0#question", "bio_variant:0#question"} <= labels
    question_only = page(filler(40, 3), ENZYME.upper(), filler(40, 4))
    assert mark_documents([question_only], index, None, P, "coverage").contaminated.tolist() == [True]
