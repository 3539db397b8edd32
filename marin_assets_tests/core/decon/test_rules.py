"""13-gram decontamination: features, the eval index, drop sets and the marking rule."""

from __future__ import annotations

import io
import json
import random
import re
import zipfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from marin_assets.catalog.evals import load_evals
from marin_assets.core.decon import rules as decon
from marin_assets.core.decon.eval_sources import read_eval_rows, registry_rows
from marin_assets.core.decon.rules import (
    DeconParams,
    EvalIndexError,
    build_eval_index,
    contamination_shard,
    eval_ngram_frequencies,
    feature_hash,
    global_drop_set,
    load_drop_set,
    load_eval_index,
    mark_documents,
    source_drop_set,
    summarize_contamination,
    text_features,
)
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.integrity import text_ids

P = DeconParams()

# Eval rows written for these tests.
PROJECTILE = (
    "A stone is dropped from rest off a bridge and a splash is heard 3.2 seconds later. Taking the speed of "
    "sound in air as 340 metres per second and g as 9.8 metres per second squared, estimate the height of the "
    "bridge above the water and explain why the naive estimate that ignores the travel time of sound is too large."
)
PROJECTILE_ANSWER = (
    "Let t be the fall time, so the height is 4.9 t squared and the sound takes that height divided by 340 "
    "seconds to return. Solving 4.9 t squared over 340 plus t equals 3.2 gives t near 3.06 seconds and a height "
    "of roughly 46 metres; ignoring the sound delay would give about 50 metres."
)
ENZYME = (
    "Which class of enzymes joins Okazaki fragments on the lagging strand by forming a phosphodiester bond "
    "between the 3 prime hydroxyl of one fragment and the 5 prime phosphate of the next one?"
)
CAPITAL = "What is the capital of Australia?"
THIRTEEN = "Name the only planet in our solar system that rotates on its side"  # exactly 13 tokens
LICENCE = (
    "Permission is granted to use, copy, modify and share this program for any purpose, provided that this "
    "notice appears in every copy and that the authors are credited in the accompanying documentation."
)
LICENSED_TASK = (
    "Implement a function that merges two sorted linked lists into one sorted list in place, reusing the "
    "existing nodes and returning the new head, without allocating any additional list nodes at all."
)
EVAL_ROWS = [
    ("physics_demo", "p-17", PROJECTILE + "\n\n" + PROJECTILE_ANSWER),
    ("bio_demo", "b-3", ENZYME + "\n\nDNA ligase."),
    ("geo_demo", "g-1", CAPITAL),
    ("geo_demo", "g-2", THIRTEEN),
    ("code_demo", "c-9", LICENCE + "\n\n" + LICENSED_TASK),
]

_VOCAB = [
    "river", "market", "quietly", "engine", "yellow", "garden", "because", "seven", "window", "carried", "a",
    "the", "of", "and", "to", "later", "morning", "bridge", "music", "under", "several", "fields", "paper",
    "light", "winter", "stone", "across", "people", "small", "returned", "without", "every", "history",
]


def filler(n_tokens: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(_VOCAB) for _ in range(n_tokens)) + "."


def page(*paragraphs: str) -> str:
    return "\n\n".join(paragraphs)


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("eval_index"))
    build_eval_index(EVAL_ROWS, out, P, expected={"physics_demo": 1, "geo_demo": 2})
    return out


@pytest.fixture(scope="module")
def index(index_dir):
    return load_eval_index(index_dir)


def mark_one(index, text, drop=None):
    marks = mark_documents([text], index, drop, P)
    return bool(marks.contaminated[0]), float(marks.max_overlap[0]), marks.matched_rows[0], marks.matched_evals[0]


# ----------------------------------------------------------------------------- features


def _reference_features(text: str, short_paragraphs: bool) -> set[int]:
    """The feature rule written plainly over Python strings."""
    paragraphs = [p.split() for p in re.split(r"\n\s*\n", text)]
    paragraphs = [p for p in paragraphs if p]
    if not paragraphs:
        return set()
    whole = max(len(p) for p in paragraphs) < 13
    if whole:
        paragraphs = [[t for p in paragraphs for t in p]]
    out = set()
    for tokens in paragraphs:
        if len(tokens) >= 13:
            for i in range(len(tokens) - 12):
                gram = tokens[i:i + 13]
                if any(c.isalpha() for t in gram for c in t):
                    out.add(feature_hash(gram))
        elif 3 <= len(tokens) <= 12 and (short_paragraphs or whole) and any(c.isalpha() for t in tokens for c in t):
            out.add(feature_hash(tokens))
    return out


def test_vectorized_features_equal_the_plain_rule_on_unicode_text():
    rng = random.Random(7)
    pieces = ["alpha", "Beta", "γάμμα", "42", "—", "x1", "!!", "naïve", "東京", "1,000", "🙂", "٣"]
    pieces.append("\x07bell")  # a control character is not whitespace
    gaps = [" ", " ", " ", "\n", "\n\n", " \n \n", "\t", "\r\n\r\n", "\u00a0", "\u3000", "\u2028", "\x1c"]
    texts = []
    for _ in range(150):
        parts = []
        for _ in range(rng.randint(0, 45)):
            parts += [rng.choice(pieces), rng.choice(gaps)]
        texts.append("".join(parts))
    texts += ["", "   \n\n ", "a b c", "1 2 3 4", ENZYME, PROJECTILE + "\n\n" + CAPITAL]
    for short in (True, False):
        got = text_features(texts, DeconParams(batch_bytes=200), short_paragraphs=short)
        for text, features in zip(texts, got):
            assert set(features.tolist()) == _reference_features(text, short), repr(text)


def test_whitespace_and_single_line_breaks_do_not_change_features():
    reflowed = ENZYME.replace(" ", "  ").replace("strand by", "strand\nby").replace("of one", "of\u00a0one")
    a, b = text_features([ENZYME, reflowed])
    assert len(a) == len(ENZYME.split()) - 12
    assert np.array_equal(a, b)


def test_ngrams_without_letters_and_tiny_records_give_no_feature():
    numbers = " ".join(str(i) for i in range(40))
    assert [len(f) for f in text_features([numbers, "yes no", "1 2 3", "one 2 3"])] == [0, 0, 0, 1]


# ----------------------------------------------------------------------------- the index


def test_index_membership_is_exact(index):
    doc_features = np.concatenate(text_features([PROJECTILE, ENZYME, filler(200, 1)]))
    assert np.array_equal(index.contains(doc_features), np.isin(doc_features, index.hashes))
    random_hashes = np.random.default_rng(0).integers(0, 2**63, 200_000, dtype=np.int64).astype(np.uint64)
    assert not index.contains(random_hashes).any()


def test_index_bitmaps_hold_exactly_the_slots_of_its_hashes():
    from marin_assets.core.decon.index import EvalIndex

    hashes = np.unique(np.random.default_rng(1).integers(0, 2**64 - 1, 50_000, dtype=np.uint64))
    empty = np.zeros(0, np.uint64)
    index = EvalIndex(hashes, empty, empty, np.zeros(0, np.int32), [], [], [], {})
    bits = 64 - index.shift
    for bitmap, shift in zip(index.bitmaps, (64 - bits, 64 - 2 * bits)):
        slots = (hashes >> np.uint64(shift)) & np.uint64((1 << bits) - 1)
        expected = np.zeros(1 << bits, dtype=bool)
        expected[slots.astype(np.int64)] = True
        assert np.array_equal(np.unpackbits(bitmap, bitorder="little").astype(bool), expected)


def test_build_refuses_missing_mandatory_set_and_writes_nothing(tmp_path):
    out = str(tmp_path / "idx")
    with pytest.raises(EvalIndexError) as err:
        build_eval_index(EVAL_ROWS, out, P, expected={"physics_demo": 1, "hle": 2500})
    assert "'hle'" in str(err.value) and "missing" in str(err.value) and "2500" in str(err.value)
    assert not storage.exists(storage.join(out, "index.json"))


def test_build_refuses_wrong_row_count(tmp_path):
    with pytest.raises(EvalIndexError, match=r"'geo_demo' has 2 rows, expected 3"):
        build_eval_index(EVAL_ROWS, str(tmp_path / "idx"), P, expected={"geo_demo": 3})


def test_build_refuses_a_mandatory_set_without_matchable_features(tmp_path):
    rows = EVAL_ROWS + [("tiny", "0", "42"), ("tiny", "1", "yes")]
    with pytest.raises(EvalIndexError, match=r"'tiny' yields no matchable feature"):
        build_eval_index(rows, str(tmp_path / "idx"), P, expected={"tiny": 2})


def test_build_stats_and_record_features(index_dir, index):
    meta = json.loads(open(f"{index_dir}/index.json").read())
    assert meta["eval_sets"]["geo_demo"] == {"rows": 2, "features": 2, "featureless_rows": 0, "field_units": 0,
                                            "mandatory": True}
    assert meta["eval_sets"]["bio_demo"]["mandatory"] is False
    # the short record and the 13-token record are complete records on their own
    assert set(index.record_hashes.tolist()) == {feature_hash(CAPITAL.split()), feature_hash(THIRTEEN.split())}


# ----------------------------------------------------------------------------- acceptance: the marking rule


def test_verbatim_copy_is_flagged_and_attributed(index):
    contaminated, overlap, rows, evals = mark_one(index, page(filler(40, 2), PROJECTILE, PROJECTILE_ANSWER))
    assert contaminated and overlap == 1.0
    assert rows[0] == "physics_demo:p-17" and evals == ["physics_demo"]


def test_copy_with_changed_whitespace_and_line_breaks_is_flagged(index):
    words = ENZYME.split()
    messy = "  ".join(words[:10]) + "\n" + "\t".join(words[10:20]) + " \r\n " + "\u00a0".join(words[20:])
    contaminated, overlap, rows, _ = mark_one(index, page(filler(30, 3), messy))
    assert contaminated and overlap == 1.0 and rows == ["bio_demo:b-3"]


def test_question_embedded_in_a_longer_page(index):
    as_paragraph = page(filler(80, 4), filler(60, 5), ENZYME, filler(90, 6))
    assert mark_one(index, as_paragraph)[0]
    # inline in a long paragraph the question's n-grams are a minority of that paragraph: below 0.5
    inline = filler(60, 7) + " " + ENZYME + " " + filler(60, 8)
    contaminated, overlap, rows, _ = mark_one(index, inline)
    n_eval = len(ENZYME.split()) - 12
    assert not contaminated and overlap == pytest.approx(n_eval / (len(inline.split()) - 12))
    assert rows == ["bio_demo:b-3"]  # partial matches are still reported as evidence


def test_answer_split_across_paragraphs(index):
    words = PROJECTILE_ANSWER.split()
    halves = page(" ".join(words[:25]), " ".join(words[25:]))  # both halves >= 13 tokens
    assert mark_one(index, page(filler(50, 9), halves))[0]
    # cut into paragraphs shorter than 13 tokens, inside a page with long paragraphs: no 13-gram survives
    lines = page(*(" ".join(words[i:i + 8]) for i in range(0, len(words), 8)))
    contaminated, overlap, _, _ = mark_one(index, page(filler(50, 10), lines))
    assert not contaminated and overlap == 0.0


def test_near_misses(index):
    words = (PROJECTILE + " " + PROJECTILE_ANSWER).split()
    every_tenth = [f"w{i}" if i % 10 == 9 else w for i, w in enumerate(words)]
    contaminated, overlap, _, _ = mark_one(index, " ".join(every_tenth))
    assert not contaminated and overlap == 0.0
    every_fortieth = [f"w{i}" if i % 40 == 39 else w for i, w in enumerate(words)]
    windows = len(words) - 12
    seam = len(PROJECTILE.split())  # the eval row has question and answer as two paragraphs
    clean = sum(all(j % 40 != 39 for j in range(k, k + 13)) and not k < seam <= k + 12 for k in range(windows))
    contaminated, overlap, _, _ = mark_one(index, " ".join(every_fortieth))
    assert contaminated and overlap == pytest.approx(clean / windows, rel=1e-6)


def test_short_record_matches_alone_only_as_a_whole_paragraph(index):
    contaminated, overlap, rows, _ = mark_one(index, page(filler(40, 11), CAPITAL, filler(40, 12)))
    assert contaminated and overlap == 1.0 and rows == ["geo_demo:g-1"]
    assert not mark_one(index, page(filler(40, 11), "Quiz: " + CAPITAL + " Answer below."))[0]


def test_one_matched_feature_is_not_enough_unless_it_is_a_whole_record(index):
    one_gram = " ".join(PROJECTILE.split()[5:18])  # 13 tokens out of a long eval row
    contaminated, overlap, _, _ = mark_one(index, page(filler(40, 13), one_gram))
    assert overlap == 1.0 and not contaminated
    assert mark_one(index, page(filler(40, 14), THIRTEEN))[0]  # the 13-token row is a complete record


def test_clean_documents_are_not_flagged(index):
    marks = mark_documents([filler(300, s) for s in range(20)] + ["", None], index, None, P)
    assert not marks.contaminated.any() and not marks.max_overlap.any()
    assert marks.counters["null_text"] == 1


# ----------------------------------------------------------------------------- drop sets


def _write_source(tmp_path, name: str, texts: list[str], shards: int = 2) -> list[str]:
    uris = []
    per = (len(texts) + shards - 1) // shards
    for s in range(shards):
        chunk = texts[s * per:(s + 1) * per]
        uri = str(tmp_path / name / storage.shard_name(s, shards))
        storage.write_parquet(pa.table({"id": [f"{name}-{s}-{i}" for i in range(len(chunk))], "text": chunk}), uri)
        uris.append(uri)
    return uris


def test_source_drop_set_removes_boilerplate_but_keeps_real_copies(tmp_path, index_dir, index):
    params = DeconParams(index_uri=index_dir)
    docs = [page(filler(60, 100 + i), LICENCE) for i in range(40)] + [page(filler(60, 200), ENZYME)]
    uris = _write_source(tmp_path, "src", docs)
    stats = eval_ngram_frequencies(uris, str(tmp_path / "freq.parquet"), params)
    assert stats["head_documents"] == 41
    drop_stats = source_drop_set(str(tmp_path / "freq.parquet"), str(tmp_path / "drop.parquet"), params)
    drop = load_drop_set([str(tmp_path / "drop.parquet")])
    assert drop_stats["dropped_ngrams"] == len(LICENCE.split()) - 12 == len(drop)

    licence_page = page(filler(50, 300), LICENCE)
    assert mark_one(index, licence_page)[0]  # without the drop set the licence looks like an eval copy
    contaminated, overlap, rows, _ = mark_one(index, licence_page, drop)
    assert not contaminated and overlap == 0.0 and rows == []
    # the task next to the licence in the same eval row is still caught
    contaminated, _, rows, _ = mark_one(index, page(LICENCE, LICENSED_TASK), drop)
    assert contaminated and rows == ["code_demo:c-9"]
    # the one document quoting the enzyme question stays below max(5, 0.5%): nothing of it is dropped
    assert not np.isin(np.concatenate(text_features([ENZYME])), drop).any()


def test_global_drop_set_needs_enough_documents_in_enough_sources(tmp_path, index_dir):
    params = DeconParams(index_uri=index_dir)
    phrase_a, phrase_b = PROJECTILE, ENZYME
    freq = []
    for s, (with_a, with_b) in enumerate([(20, 30), (20, 30), (20, 0)]):
        docs = [page(filler(30, 1000 * s + i), phrase_a) for i in range(with_a)]
        docs += [page(filler(30, 1000 * s + 500 + i), phrase_b) for i in range(with_b)]
        uris = _write_source(tmp_path, f"s{s}", docs, shards=1)
        out = str(tmp_path / f"freq{s}.parquet")
        eval_ngram_frequencies(uris, out, params)
        freq.append(out)
    global_drop_set(freq, str(tmp_path / "global.parquet"), params)
    drop = load_drop_set([str(tmp_path / "global.parquet")])
    a, b = text_features([phrase_a, phrase_b])
    assert np.isin(a, drop).all()  # 60 documents over 3 sources
    assert not np.isin(b, drop).any()  # 60 documents but only 2 sources


# ----------------------------------------------------------------------------- the per-shard function


def test_contamination_shard_is_co_partitioned_with_evidence(tmp_path, index_dir, index):
    texts = [filler(100, 1), page(filler(20, 2), PROJECTILE, PROJECTILE_ANSWER), None,
             page(filler(30, 3), CAPITAL), filler(100, 4)]
    ids = [text_ids([t])[0] if t is not None else f"{i:032x}" for i, t in enumerate(texts)]
    shard = str(tmp_path / "normalized" / storage.shard_name(0, 1))
    storage.write_parquet(pa.table({"id": ids, "text": pa.array(texts, pa.string()), "source_id": ids}), shard)
    out = str(tmp_path / "contamination" / storage.shard_name(0, 1))
    stats = contamination_shard([shard], out, DeconParams(index_uri=index_dir))

    table = pq.read_table(out)
    assert table.column_names == ["id", "contaminated", "max_overlap", "matched_evals", "matched_rows",
                                  "contaminated_marin", "contaminated_coverage"]
    assert table.schema.field("max_overlap").type == pa.float32()
    assert table.schema.field("matched_rows").type == pa.list_(pa.string())
    assert table.column("id").to_pylist() == ids
    assert table.column("contaminated").to_pylist() == [False, True, False, True, False]
    assert table.column("contaminated_marin").to_pylist() == [False, True, False, True, False]
    assert stats["flagged_marin"] == stats["flagged_coverage"] == 2 and stats["flagged_only_coverage"] == 0
    assert table.column("matched_evals").to_pylist()[1] == ["physics_demo"]
    assert table.column("matched_rows").to_pylist()[3] == ["geo_demo:g-1"]
    assert stats["documents"] == 5 and stats["contaminated"] == 2 and stats["null_text"] == 1
    assert stats["flagged_by_eval"] == {"geo_demo": 1, "physics_demo": 1}
    by_id = {s["id"]: s for s in stats["flagged_sample"]}
    assert set(by_id) == {ids[1], ids[3]}
    assert PROJECTILE[:40] in by_id[ids[1]]["excerpt"] and by_id[ids[1]]["eval_excerpts"][0].startswith(PROJECTILE[:40])
    json.dumps(stats)  # the runner stores counters as JSON

    summary = summarize_contamination([stats, {**stats, "flagged_sample": []}], sample_size=1)
    assert summary["documents"] == 10 and summary["contamination_rate"] == pytest.approx(0.4)
    assert summary["flagged_by_eval"] == {"geo_demo": 2, "physics_demo": 2}
    assert [s["key"] for s in summary["flagged_sample"]] == [min(s["key"] for s in stats["flagged_sample"])]


# ----------------------------------------------------------------------------- reading eval rows


def _registry(tmp_path, body: str):
    path = tmp_path / "evals.toml"
    path.write_text("version = 1\n" + body)
    return load_evals(path)


def test_demo_registry_file_builds_an_index(tmp_path):
    demo = storage.join(str(decon.__file__).rsplit("/core/", 1)[0], "demo", "evals_demo.jsonl")
    (tmp_path / "evals.toml").write_text(f"""version = 1
[[eval]]
name = "demo_qa"
group = "local"
mandatory = true
rows = 8
fields = ["question", "answer"]
id_field = "id"
provider = {{ kind = "local", path = "{demo}" }}
""")
    registry = load_evals(tmp_path / "evals.toml")
    rows = list(registry_rows(registry, fetch=lambda s: [s.provider.path]))
    assert len(rows) == 8 and rows[0][:2] == ("demo_qa", "demo-0001")
    stats = build_eval_index(rows, str(tmp_path / "idx"), P, registry.expected_rows())
    assert stats["eval_sets"]["demo_qa"]["featureless_rows"] == 0


def test_parquet_rows_nested_fields_explode_and_passages(tmp_path):
    registry = _registry(tmp_path, """
[[eval]]
name = "mc"
mandatory = false
fields = ["question", "choices.text"]
passage_fields = ["passage"]
provider = { kind = "huggingface", repo = "org/mc", split = "test", revision = "main" }
[[eval]]
name = "steps"
mandatory = false
fields = ["step_description_prompt", "problem_description_main"]
id_field = "problem_id"
explode = "sub_steps"
provider = { kind = "huggingface", repo = "org/steps", split = "test", revision = "main" }
""")
    mc = str(tmp_path / "test-00000.parquet")
    pq.write_table(pa.table({
        "question": ["Which gas do plants take in?"],
        "choices": [{"text": ["Oxygen", "Carbon dioxide"], "label": ["A", "B"]}],
        "answer": [1],
        "passage": ["A long shared passage that must not be indexed."],
    }), mc)
    [(name, row_id, text, fields)] = list(read_eval_rows(registry.get("mc"), [mc, str(tmp_path / "README.md")]))
    assert (name, row_id) == ("mc", "0")
    assert text.split("\n\n") == ["Which gas do plants take in?", "Oxygen", "Carbon dioxide"]
    assert fields == (("question", "Which gas do plants take in?"), ("choices.text", "Oxygen\n\nCarbon dioxide"))

    steps = str(tmp_path / "steps.jsonl")
    with open(steps, "w") as handle:
        handle.write(json.dumps({"problem_id": "7", "problem_description_main": "Simulate a pendulum.",
                                 "sub_steps": [{"step_description_prompt": "Write the force."},
                                               {"step_description_prompt": "Integrate it."}]}) + "\n")
    rows = list(read_eval_rows(registry.get("steps"), [steps]))
    assert [r[1] for r in rows] == ["7.0", "7.1"]
    assert rows[1].text == "Integrate it.\n\nSimulate a pendulum."
    assert dict(rows[1].fields) == {"step_description_prompt": "Integrate it.",
                                    "problem_description_main": "Simulate a pendulum."}


def test_missing_field_error_names_set_field_file_and_columns(tmp_path):
    registry = _registry(tmp_path, """
[[eval]]
name = "gpqa_like"
mandatory = false
fields = ["Question", "Correct Answer"]
provider = { kind = "huggingface", repo = "org/gpqa", split = "train", revision = "main" }
""")
    path = tmp_path / "gpqa.csv"
    path.write_text('Question,Right Answer\n"Line one\nline two",42\n')
    with pytest.raises(EvalIndexError) as err:
        list(read_eval_rows(registry.get("gpqa_like"), [str(path)]))
    message = str(err.value)
    assert "'gpqa_like'" in message and "'Correct Answer'" in message and "gpqa.csv" in message
    assert "Right Answer" in message


def test_web_zip_of_task_directories_with_hash_check(tmp_path):
    registry = _registry(tmp_path, """
[[eval]]
name = "tasks"
mandatory = true
rows = 2
fields = ["instruction.md", "solution/solve.sh"]
provider = { kind = "web", url = "https://example.org/tasks.zip", format = "zip", row_dirs = "*/*" }
""")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as archive:
        archive.writestr("bench-2.1/alpha/instruction.md", "Compress the log files older than a week.")
        archive.writestr("bench-2.1/alpha/solution/solve.sh", "find /var/log -mtime +7 -exec gzip {} +")
        archive.writestr("bench-2.1/beta/instruction.md", "Count the unique IP addresses in access.log.")
        archive.writestr("bench-2.1/.github/workflow.yml", "on: push")
    path = tmp_path / "tasks.zip"
    path.write_bytes(buf.getvalue())
    eval_set = registry.get("tasks")
    import hashlib

    good = hashlib.sha256(buf.getvalue()).hexdigest()
    rows = list(read_eval_rows(eval_set, [str(path)], sha256=good))
    assert [(r[1], r[2].count("\n\n")) for r in rows] == [("alpha", 1), ("beta", 0)]
    with pytest.raises(EvalIndexError, match=r"'tasks'.*sha256"):
        list(read_eval_rows(eval_set, [str(path)], sha256="0" * 64))


def test_registry_rows_skips_best_effort_failures_but_not_mandatory(tmp_path):
    registry = _registry(tmp_path, """
[[eval]]
name = "must"
mandatory = true
rows = 1
fields = ["q"]
provider = { kind = "local", path = "must.jsonl" }
[[eval]]
name = "nice"
mandatory = false
fields = ["q"]
provider = { kind = "huggingface", repo = "org/nice", split = "test", revision = "main" }
""")
    (tmp_path / "must.jsonl").write_text(json.dumps({"q": ENZYME}) + "\n")
    skipped = []

    def fetch(eval_set):
        if eval_set.name == "nice":
            raise ConnectionError("hub unreachable")
        return [eval_set.provider.path]

    rows = list(registry_rows(registry, fetch, on_skip=lambda s, e: skipped.append((s.name, str(e)))))
    assert [r[0] for r in rows] == ["must"] and skipped == [("nice", "hub unreachable")]
    with pytest.raises(EvalIndexError, match="mandatory eval set 'must'"):
        list(registry_rows(registry, lambda s: (_ for _ in ()).throw(ConnectionError("down"))))


def test_every_string_field_but_the_passages(tmp_path):
    rows = [{"id": "r0", "passage": "A long shared passage that must not be indexed at all.", "question": "Who?",
             "answers": ["the first answer", "the second"], "label": 1}]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    registry = _registry(tmp_path, f"""[[eval]]
name = "lmh_task"
group = "lm-eval"
mandatory = false
fields = ["*"]
passage_fields = ["passage", "context"]
provider = {{ kind = "local", path = "{path}" }}
""")
    [(name, row_id, text, fields)] = list(read_eval_rows(registry.get("lmh_task"), [str(path)]))
    assert text.split("\n\n") == ["the first answer", "the second", "r0", "Who?"]
    assert [f for f, _ in fields] == ["answers", "id", "question"]
    assert "passage" not in text
