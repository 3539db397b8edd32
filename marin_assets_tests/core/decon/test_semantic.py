"""The semantic tier: the paraphrase fixture, the eval embedding index (rebuilt only for a new
lock or model), recall and false positives with the bundled model, and the policy."""

from __future__ import annotations

import dataclasses
import re
import shutil
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from marin_assets.core.decon import rules as decon
from marin_assets.core.decon import semantic
from marin_assets.core.embed import embeddings as embed
from marin_assets.core.runtime import stages, storage
from marin_assets.core.runtime.integrity import text_ids
from marin_assets.core.specs import EVAL_EMBEDDINGS
from marin_assets.testing import paraphrase

ITEMS = paraphrase.load_items()


def test_the_fixture_has_three_sets_of_items_each_with_a_paraphrase_of_its_own() -> None:
    per_set = Counter(i.eval_set for i in ITEMS)
    assert len(ITEMS) >= 60 and len(per_set) >= 3 and min(per_set.values()) >= 20
    assert len({(i.eval_set, i.row_id) for i in ITEMS}) == len(ITEMS)
    for item in ITEMS:
        assert len(item.fields) == 2 and all(text.strip() for _, text in item.fields), item.row_id
        assert len(item.paraphrase.split()) >= 20, item.row_id
        # reworded: no run of 13 words of the row survives in the paraphrase
        row, para = item.text.lower().split(), " ".join(item.paraphrase.lower().split())
        assert not any(" ".join(row[k:k + 13]) in para for k in range(len(row) - 12)), item.row_id
    calibration, held_out, judged = paraphrase.split(ITEMS)
    groups = [{(i.eval_set, i.row_id) for i in group} for group in (calibration, held_out, judged)]
    assert sum(map(len, groups)) == len(set().union(*groups)) == len(ITEMS)  # each item in one group
    newest = max(i.generation for i in ITEMS)
    assert {i.eval_set for i in judged} == {i.eval_set for i in ITEMS} and all(i.generation == newest for i in judged)
    # every earlier generation is tuning material, in both halves
    assert {i.generation for i in calibration} == {i.generation for i in held_out} == set(range(newest))


def test_the_newest_generation_present_is_judged_and_row_ids_stay_unique(tmp_path) -> None:
    """Without the newest generation's files the one before is judged; a row id used again by a
    later generation is refused, naming the row (a flag is judged by the row it names)."""
    newest = max(i.generation for i in ITEMS)
    for path in paraphrase.FIXTURE.glob("*.txt"):
        if not path.name.startswith(paraphrase.GENERATIONS[newest]):
            shutil.copy(path, tmp_path / path.name)
    older = paraphrase.load_items(tmp_path)
    judged = paraphrase.split(older)[2]
    assert {i.generation for i in judged} == {newest - 1} and len(older) == sum(i.generation < newest for i in ITEMS)
    first = (paraphrase.FIXTURE / "qa.txt").read_text(encoding="utf-8")
    (tmp_path / f"{paraphrase.GENERATIONS[newest]}qa.txt").write_text(first, encoding="utf-8")
    with pytest.raises(ValueError, match="fixture_qa:qa-01"):
        paraphrase.load_items(tmp_path)


@pytest.mark.system
def test_planted_documents_hold_the_paraphrase_standalone_and_deep_inside_long_documents() -> None:
    docs = paraphrase.planted_documents(ITEMS[:6] + ITEMS[-3:])
    assert Counter(kind for kind, _, _ in docs) == {"standalone": 9, "long": 9}
    for kind, item, text in docs:
        if kind == "standalone":
            assert text == item.paraphrase
        else:
            at = text.index(item.paraphrase)
            assert len(text[:at].split()) >= paraphrase.LONG_OFFSET_WORDS
            assert len(text.split()) >= paraphrase.LONG_MIN_WORDS


@pytest.mark.system
def test_the_clean_documents_are_real_text_of_the_items_topics() -> None:
    docs = paraphrase.clean_documents()
    kinds = Counter(kind for kind, _ in docs)
    assert len(docs) >= 2_000 and kinds["code"] >= 500 and kinds["math"] >= 300, kinds
    assert not any(item.paraphrase in text for item in ITEMS for _, text in docs[::7])


def test_the_index_is_keyed_by_lock_and_model_only(tmp_path) -> None:
    """A new policy or threshold reuses the built index; a new lock or model rebuilds it."""
    from marin_assets.defs.decon.assets import eval_embeddings_key

    layout = storage.Layout(str(tmp_path))
    built = []

    def materialize(digest: str, encoder: embed.EncoderParams, params: semantic.SemanticParams) -> str:
        fingerprint_params, extra = eval_embeddings_key(encoder, params)
        manifest = stages.run_global(
            EVAL_EMBEDDINGS, layout, inputs={"registry": stages.StageInput("lock", digest)}, params=fingerprint_params,
            extra_fingerprint=extra, build=lambda out: built.append(out) or {"rows": 1})
        return manifest["uri"]

    offline = embed.offline_encoder_params()
    first = materialize("lock-a", offline, semantic.SemanticParams())
    assert materialize("lock-a", offline, semantic.SemanticParams(policy="drop", thresholds=())) == first
    assert len(built) == 1
    assert materialize("lock-b", offline, semantic.SemanticParams()) != first
    assert materialize("lock-a", dataclasses.replace(offline, model="other/model", revision="abc"),
                       semantic.SemanticParams()) != first
    assert len(built) == 3


def test_a_model_without_calibrated_thresholds_flags_nothing_and_says_so() -> None:
    params = semantic.SemanticParams(thresholds=())
    index = semantic.EvalEmbeddings({"model": "other/model"}, None, [], [], [], {})
    marks = semantic.mark_semantic(["text"], np.zeros((1, 4), np.float32), index, embed.offline_encoder_params(), params)
    assert not marks.flagged.any() and marks.counters["uncalibrated_model"] == 1
    with pytest.raises(ValueError, match="policy"):
        semantic.SemanticParams(policy="remove").check()


@pytest.fixture(scope="module")
def built_index(tmp_path_factory) -> str:
    """The index of the tuning generations, the one the bundled model's thresholds were calibrated
    with: a fixed threshold flags more clean documents as the index grows (docs/decontamination.md),
    so the flag tests hold the rule to the index it was set for."""
    out = str(tmp_path_factory.mktemp("eval_embeddings"))
    calibration, held_out, _ = paraphrase.split(ITEMS)
    semantic.build_eval_embeddings([i.row() for i in calibration + held_out], out, embed.offline_encoder_params())
    return out


def test_a_number_and_the_words_it_is_written_with_are_the_same_terms() -> None:
    written_out = semantic.words("Eighty-four apples and one thousand two hundred pears, 7 left")
    assert semantic.words("84 apples and 1200 pears, 7 left") == written_out
    assert semantic.words("seven left") != semantic.words("7 left")  # small numbers stay digits (code)
    assert semantic.words("id 12345678") == ["id"]
    assert semantic.words("\u0668\u0664 apples") == semantic.words("84 apples")  # decimal digits of another script
    assert semantic.words("2\u2076\u2074 bytes") == ["2", "\u2076\u2074", "byte"]  # superscripts are not a number: a word, not a crash


def test_a_candidate_document_encodes_each_paragraph_once() -> None:
    """Overlapping windows that cut to the same paragraph are encoded once; further windows
    (elsewhere in the document) are looked at too."""
    item = next(i for i in ITEMS if i.eval_set == "fixture_math")
    units = semantic.eval_units([item.row()], 8)
    texts = [u[3] for u in units]
    params = semantic.SemanticParams(max_term_fraction=1.0)
    index = semantic.EvalEmbeddings({}, None, [u[0] for u in units], [u[1] for u in units], texts,
                                    semantic.lexicons(texts, params))
    filler = " ".join(["plain filler text about nothing"] * 40)
    document = "\n\n".join([filler, item.text, filler, item.paraphrase, filler])
    windows = semantic._candidate_windows([document], index, params)
    spans = [span for _, span, _ in windows]
    assert len(spans) == len(set(spans)) >= 2  # the copied row's paragraphs and the paraphrase
    assert any(s in item.paraphrase and len(s) >= 0.95 * len(item.paraphrase) for s in spans)  # its words' span
    assert not any("filler" in s for s in spans)


def _math_index(params: semantic.SemanticParams) -> tuple[semantic.EvalEmbeddings, list]:
    """An exact index of the math items, with orthonormal stand-in vectors (one per unit)."""
    import faiss

    units = semantic.eval_units([i.row() for i in ITEMS if i.eval_set == "fixture_math"], 8)
    texts = [u[3] for u in units]
    flat = faiss.IndexFlatIP(len(units))
    flat.add(np.eye(len(units), dtype=np.float32))
    model = params.thresholds[0][0]
    return semantic.EvalEmbeddings({"model": model}, flat, [u[0] for u in units], [u[1] for u in units], texts,
                                   semantic.lexicons(texts, params)), units


def test_a_documents_score_adds_the_share_of_its_units_rare_words_to_the_cosine() -> None:
    """At the same cosine, text holding the unit's rare words scores higher than text that holds
    none, by the words weight times its share; with no weights the score is the cosine."""
    params = semantic.SemanticParams()
    index, units = _math_index(params)
    vectors = np.zeros((2, len(units)), np.float32)
    vectors[:, 0] = 0.6  # the same cosine to unit 0 for both texts, 0 to the rest
    texts = [units[0][3], "plain filler text about nothing in particular"]
    score, cosine, unit = semantic.evidence_scores(texts, vectors, index, params)
    assert np.allclose(cosine, 0.6) and (unit == 0).all()
    density = 0.6 / params.density_units  # its mean cosine to its nearest units: 0.6 and zeros
    background = 2 * 0.6 / params.background_top  # unit 0's nearest documents: these two at 0.6, none else
    assert score[1] == pytest.approx(0.6 - params.density_weight * density - params.background_weight * background, abs=1e-5)
    assert score[0] - score[1] == pytest.approx(params.words_weight, abs=1e-4)
    plain = dataclasses.replace(params, words_weight=0.0, code_weight=0.0, density_weight=0.0, background_weight=0.0)
    assert np.allclose(semantic.evidence_scores(texts, vectors, index, plain)[0], 0.6)


def test_a_document_near_many_units_scores_lower_than_one_near_its_own() -> None:
    """Two texts at the same cosine to unit 0: the one as near to many other units (a generic
    text) scores lower, by the density weight times its higher mean cosine; both name unit 0."""
    params = semantic.SemanticParams()
    index, units = _math_index(params)
    assert len(units) > params.density_units
    vectors = np.zeros((2, len(units)), np.float32)
    vectors[:, 0] = 0.7
    vectors[1, 1:params.density_units] = 0.5  # generic: near its 19 next units as well
    texts = ["plain filler text about nothing in particular"] * 2
    score, cosine, unit = semantic.evidence_scores(texts, vectors, index, params)
    assert (unit == 0).all() and np.allclose(cosine, 0.7)
    gap = params.density_weight * 0.5 * (params.density_units - 1) / params.density_units
    assert score[0] - score[1] == pytest.approx(gap, abs=1e-5)


def test_a_unit_many_of_the_shards_documents_lie_near_sets_a_higher_bar() -> None:
    """The same document at the same cosine to unit 0 scores lower in a shard whose ordinary
    documents lie near unit 0 (a stock problem) than in one where they lie near no unit, by the
    background weight times unit 0's mean cosine to its nearest documents; the sample of the
    shard is every k-th document, at most background_docs of them."""
    params = dataclasses.replace(semantic.SemanticParams(), background_docs=40)
    index, units = _math_index(params)
    doc = np.zeros(len(units), np.float32)
    doc[0] = 0.8
    stock = np.tile(doc, (100, 1))
    stock[:, 0] = 0.5  # ordinary text of the shard, near unit 0
    alone = np.zeros((100, len(units)), np.float32)
    alone[:, 1] = 0.3  # ordinary text near another unit
    texts = ["plain filler text about nothing in particular"] * 101
    in_stock = semantic.evidence_scores(texts, np.vstack([doc, stock]), index, params)[0][0]
    in_alone = semantic.evidence_scores(texts, np.vstack([doc, alone]), index, params)[0][0]
    sampled = np.vstack([doc, stock])[::3]  # 101 documents, at most 40: every third
    expected = np.sort(sampled[:, 0])[::-1][:params.background_top].mean() - 0.8 / params.background_top
    assert in_alone - in_stock == pytest.approx(params.background_weight * expected, abs=1e-5)
    assert (semantic.unit_background(np.vstack([doc, alone]), index, params)[2:] == 0).all()


def test_the_window_look_skips_documents_their_kept_vector_saw_whole_or_flags() -> None:
    """A short document holding an item is judged by its kept vector alone, as is a long one that
    vector already flags; a long one it does not flag is a candidate for the window look."""
    params = semantic.SemanticParams()
    index, units = _math_index(params)
    filler = "\n\n".join(["plain filler text about nothing"] * 80)
    long_document = filler + "\n\n" + units[0][3] + "\n\n" + filler
    assert len(long_document) > params.head_chars and semantic._candidate_windows([long_document], index, params)
    near, far = np.zeros(len(units), np.float32), np.zeros(len(units), np.float32)
    near[0], far[1] = 1.0, 0.05  # flagged by the kept vector / not
    texts = [units[0][3], long_document]
    marks = semantic.mark_semantic(texts, np.stack([far, near]), index, embed.offline_encoder_params(), params)
    assert len(texts[0]) <= params.head_chars and not marks.looked.any() and marks.counters["windows_encoded"] == 0
    assert marks.flagged.tolist() == [False, True]


def test_code_terms_do_not_see_renamed_identifiers_or_docstrings() -> None:
    original = 'def count_vowels(word):\n    """Vowels in word."""\n    return sum(1 for ch in word if ch in "aeiou")  # all\n'
    renamed = "def vowel_total(text):\n    '''How many vowels text has.'''\n    return sum(1 for c in text if c in 'aeiou')\n"
    terms = [t for *_, t in semantic.code_terms(original, 4)]
    assert terms == [t for *_, t in semantic.code_terms(renamed, 4)]
    assert "( 1 for _" in terms and 'if _ in "aeiou"' in terms  # builtins, keywords and literals stay
    assert semantic.is_code(original) and not semantic.is_code(ITEMS[0].text)


def test_a_code_item_with_renamed_identifiers_is_a_candidate_inside_a_module() -> None:
    """The code channel picks the renamed function's block out of a module; the module's own
    functions, which share names with items but not their shape, are not encoded."""
    code = [i for i in ITEMS if i.eval_set == "fixture_code" and not i.generation]
    units = semantic.eval_units([i.row() for i in code], 8)
    texts = [u[3] for u in units]
    params = semantic.SemanticParams()
    index = semantic.EvalEmbeddings({}, None, [u[0] for u in units], [u[1] for u in units], texts,
                                    semantic.lexicons(texts, params))
    host = "\n\n".join(f"def helper_{k}(self, operations, balance):\n    total = self.lookup(operations)\n"
                       f"    self.amount_{k} = len(total) * balance\n    return total" for k in range(40))
    item = next(i for i in code if i.row_id == "code-01")
    windows = semantic._candidate_windows([host + "\n\n" + item.paraphrase + "\n\n" + host], index, params)
    assert windows and all(span in item.paraphrase for _, span, _ in windows)
    assert semantic._candidate_windows([host], index, params) == []


@pytest.mark.system
def test_reworded_items_are_found_and_clean_code_and_word_problems_are_not(built_index) -> None:
    """Held-out items (thresholds were calibrated on the other half), the bundled model, the
    kept vectors stored as int8 as the embeddings asset stores them. The clean side is the two
    kinds where flags fall (functions and word problems on the items' topics) in a shard of ~300
    documents, whose background is thinner than a production shard's 2,048 sampled documents:
    at most 3% flagged here, 0.7-0.8% of the bench's ~2,450 documents of every kind."""
    index = semantic.load_eval_embeddings(built_index)
    _, held_out, _ = paraphrase.split(ITEMS)
    picked = held_out[::3]
    planted = paraphrase.planted_documents(picked)
    clean = paraphrase.python_functions(120) + paraphrase.math_word_problems(80)
    texts = [t for _, _, t in planted] + clean
    encoder = embed.offline_encoder_params()
    vectors = embed.dequantize_int8(embed.quantize_int8(embed.encode_texts(texts, encoder)[0]))
    marks = semantic.mark_semantic(texts, embed._normalize(vectors), index, encoder)
    kinds = np.array([k for k, _, _ in planted])
    found = marks.flagged[:len(planted)]
    assert found[kinds == "standalone"].mean() >= 0.75
    assert found[kinds == "long"].mean() >= 0.5
    assert marks.flagged[len(planted):].mean() <= 0.03
    named = [(item, index.labels[u].split("#")[0]) for (_, item, _), f, u in zip(planted, found, marks.unit[:len(planted)]) if f]
    right = [label == f"{item.eval_set}:{item.row_id}" or _restates(item, label) for item, label in named]
    assert sum(right) >= 0.9 * len(right)  # its own row, or a row that restates the same problem
    assert marks.looked[len(planted):].mean() < 0.1  # the window look is for candidates only


def _restates(item: paraphrase.Item, label: str) -> bool:
    """Whether the row ``label`` (set:row) restates ``item``'s problem: over a third of their
    words in common (the second fresh generation repeats some earlier problems)."""
    other = next(i for i in ITEMS if f"{i.eval_set}:{i.row_id}" == label)
    a, b = (set(re.findall(r"[a-z]{3,}", x.text.lower())) for x in (item, other))
    return len(a & b) >= 0.35 * len(a | b)


def _shard(tmp_path, index_dir: str, texts: list[str]) -> tuple[list[str], decon.DeconParams]:
    """A normalized shard, its kept embeddings and the 13-gram index of the fixture's rows."""
    ids = text_ids(texts)  # as normalize makes them (its readers check them)
    normalized = str(tmp_path / "normalized" / "shard-00000.parquet")
    # typed as normalized shards are; the embeddings shard stores plain strings
    storage.write_parquet(pa.table({"id": pa.array(ids, pa.large_string()), "text": pa.array(texts, pa.large_string())}), normalized)
    vectors = str(tmp_path / "embeddings" / "shard-00000.parquet")
    embed.embed_shard([normalized], vectors, embed.EmbedParams(encoder=embed.offline_encoder_params()))
    ngrams = str(tmp_path / "ngrams")
    decon.build_eval_index([i.row() for i in ITEMS], ngrams, decon.DeconParams(),
                           expected={s: n for s, n in Counter(i.eval_set for i in ITEMS).items()})
    params = decon.DeconParams(index_uri=ngrams, semantic_index_uri=index_dir, encoder=embed.offline_encoder_params())
    return [normalized, vectors], params


@pytest.mark.system
def test_policy_flag_reports_and_drop_removes(tmp_path, built_index) -> None:
    item = ITEMS[0]
    texts = [item.paraphrase, item.text, "The weather in the mountains changed quickly that afternoon."]
    inputs, params = _shard(tmp_path, built_index, texts)
    outputs = {}
    for policy in semantic.POLICIES:
        out = str(tmp_path / f"{policy}.parquet")
        stats = decon.contamination_shard(inputs, out, dataclasses.replace(params, semantic=semantic.SemanticParams(policy=policy)))
        outputs[policy] = storage.read_parquet(out).to_pydict()
        assert stats["semantic_by_eval"] == {item.eval_set: 2}
    flag, drop = outputs["flag"], outputs["drop"]
    assert flag["contaminated_semantic"] == [True, True, False]
    assert flag["semantic_row"][0].startswith(f"{item.eval_set}:{item.row_id}")
    assert flag["contaminated"] == [False, True, False]  # the 13-gram flag alone: the verbatim row
    assert drop["contaminated"] == [True, True, False]
    for column in ("contaminated_marin", "contaminated_coverage", "matched_rows", "max_overlap"):
        assert flag[column] == drop[column]


@pytest.mark.system
def test_kept_embeddings_of_another_model_are_refused(tmp_path, built_index) -> None:
    inputs, params = _shard(tmp_path, built_index, ["some text about nothing in particular"])
    other = dataclasses.replace(params, encoder=dataclasses.replace(params.encoder, model="other/model"),
                                semantic=semantic.SemanticParams())
    with pytest.raises(ValueError, match="same encoder"):
        decon.contamination_shard(inputs, str(tmp_path / "out.parquet"), other)
