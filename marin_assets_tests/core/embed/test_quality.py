"""Quality: scorer on the real offline encoder, calibration, per-shard scores, bands and groups."""

from __future__ import annotations

import json
from importlib import resources
from typing import ClassVar

import numpy as np
import pyarrow as pa
import pytest

from marin_assets.core.embed import embeddings as embed
from marin_assets.core.embed import quality
from marin_assets.core.runtime import storage

HELDOUT = 0.3


@pytest.fixture(scope="module")
def labelled() -> tuple[list[str], np.ndarray, np.ndarray]:
    """The committed fixture, encoded once for the module with the bundled offline model."""
    lines = resources.files("marin_assets.demo").joinpath("quality_labels.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines if line.strip()]
    texts = [r["text"] for r in rows]
    labels = np.asarray([r["score"] for r in rows], dtype=np.float64)
    vectors, _ = embed.encode_texts(texts, embed.offline_encoder_params())
    return texts, labels, vectors


@pytest.fixture(scope="module")
def trained(labelled, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict, quality.QualityParams]:
    texts, labels, vectors = labelled
    params = quality.QualityParams(heldout_fraction=HELDOUT)
    cache = dict(zip(texts, vectors))
    uri = str(tmp_path_factory.mktemp("quality_model"))
    metrics = quality.train_quality_model(texts, labels, lambda ts: np.stack([cache[t] for t in ts]), uri, params)
    return uri, metrics, params


def test_fixture_spans_all_labels_and_domains(labelled) -> None:
    texts, labels, _ = labelled
    assert 150 <= len(texts) <= 300
    counts = np.bincount(labels.astype(int), minlength=6)
    assert (counts >= 20).all()
    assert len(set(texts)) == len(texts)


def test_scores_rise_with_labels_on_heldout_data(labelled, trained) -> None:
    from scipy import stats as sps  # noqa: PLC0415 (here, not at collection: every test worker collects this module)

    texts, labels, vectors = labelled
    uri, metrics, params = trained
    assert metrics["heldout"]["spearman"] > 0.5
    assert metrics["n_heldout"] == int(quality.heldout_split(labels, HELDOUT, params.seed).sum())
    model = quality.load_quality_model(uri)
    held = quality.heldout_split(labels, HELDOUT, params.seed)
    raw, score = model.score(vectors[held])
    assert sps.spearmanr(score, labels[held]).statistic > 0.5
    assert np.isclose(sps.spearmanr(raw, labels[held]).statistic, metrics["heldout"]["spearman"])
    assert score.dtype == np.float32 and 0.0 <= score.min() and score.max() <= 1.0
    levels = quality.label_levels(labels[held], params)
    assert score[levels == 0].mean() < score[levels == 2].mean() < score[levels == 4].mean()
    assert 0.0 <= metrics["heldout"]["f1"] <= 1.0 and metrics["heldout"]["f1"] > 0.5


def test_stored_calibration_maps_medians_midpoints_to_fixed_edges(trained) -> None:
    uri, metrics, _ = trained
    model = quality.load_quality_model(uri)
    knots = np.asarray(model.calibration.knots_raw)
    assert np.all(np.diff(knots) >= 0)
    np.testing.assert_allclose(model.calibration.apply(knots), [0.0, 0.2, 0.4, 0.6, 0.8, 1.0], atol=1e-6)
    assert metrics["calibrated_on"] == "heldout"


def test_calibration_exact_small_case() -> None:
    raw = np.array([k + d for k in range(5) for d in (0.5, 1.0, 1.5)])  # level medians 1..5
    levels = np.repeat(np.arange(5), 3)
    cal = quality.fit_calibration(raw, levels, 5)
    assert cal.knots_raw == (0.5, 1.5, 2.5, 3.5, 4.5, 5.5)
    assert cal.level_medians == (1.0, 2.0, 3.0, 4.0, 5.0)
    out = cal.apply(np.array([-10.0, 0.5, 1.5, 2.0, 2.5, 4.5, 5.5, 10.0]))
    np.testing.assert_allclose(out, [0.0, 0.0, 0.2, 0.3, 0.4, 0.8, 1.0, 1.0], atol=1e-6)


def test_calibration_cutpoints_forced_non_decreasing_and_monotone() -> None:
    # level 2's predictions sit below level 1's: its cutpoint may not go backwards
    raw = np.array([0.0, 0.1, 3.0, 3.1, 1.0, 1.1, 4.0, 4.1, 5.0, 5.1])
    levels = np.array([0, 0, 1, 1, 2, 2, 3, 3, 4, 4])
    cal = quality.fit_calibration(raw, levels, 5)
    assert all(a <= b for a, b in zip(cal.knots_raw, cal.knots_raw[1:]))
    grid = np.linspace(-1, 6, 500)
    assert np.all(np.diff(cal.apply(grid)) >= 0)


def test_calibration_fills_a_missing_level() -> None:
    raw = np.array([0.0, 1.0, 3.0, 4.0])
    levels = np.array([0, 1, 3, 4])
    cal = quality.fit_calibration(raw, levels, 5)
    assert cal.level_medians[2] is None
    assert cal.knots_raw == (0.0, 0.5, 1.5, 2.5, 3.5, 4.0)


def test_label_levels_merge_zero_and_one() -> None:
    params = quality.QualityParams()
    np.testing.assert_array_equal(quality.label_levels(np.array([0, 1, 2, 2.4, 3, 4, 5]), params), [0, 0, 1, 1, 2, 3, 4])
    with pytest.raises(quality.QualityError, match="label_levels"):
        quality.label_levels(np.array([7.0]), params)


def test_heldout_split_is_stratified_and_seeded() -> None:
    labels = np.repeat(np.arange(6), [2, 5, 10, 20, 3, 1])
    mask = quality.heldout_split(labels, 0.2, 42)
    for value in range(5):
        rows = labels == value
        assert 0 < mask[rows].sum() < rows.sum()
    assert not mask[labels == 5].any()  # a single example stays in training
    np.testing.assert_array_equal(mask, quality.heldout_split(labels, 0.2, 42))
    assert not np.array_equal(mask, quality.heldout_split(labels, 0.2, 43))


def test_read_annotations_counts_bad_rows(tmp_path) -> None:
    lines = [
        {"text": "Photosynthesis turns light into chemical energy.", "score": 4},
        {"text": None, "score": 3},
        {"text": "   ", "score": 1},
        {"text": "ok", "score": "high"},
        {"text": "too good", "score": 7},
        {"text": "Buy now!", "score": 0},
    ]
    uri = str(tmp_path / "ann.jsonl")
    storage.write_bytes(uri, "\n".join(json.dumps(x) for x in lines).encode())
    texts, labels, counters = quality.read_annotations([uri])
    assert texts == ["Photosynthesis turns light into chemical energy.", "Buy now!"]
    assert labels.tolist() == [4.0, 0.0]
    assert counters == {"rows": 6, "null_text": 2, "bad_label": 2, "used": 2}
    parquet = str(tmp_path / "ann.parquet")
    storage.write_parquet(pa.table({"content": ["a text"], "grade": [2]}), parquet)
    with pytest.raises(quality.QualityError, match="text_field"):
        quality.read_annotations([parquet])
    texts, labels, _ = quality.read_annotations([parquet], quality.QualityParams(text_field="content", label_field="grade"))
    assert texts == ["a text"] and labels.tolist() == [2.0]


def test_quality_scores_shard_is_row_aligned_and_matches_the_model(labelled, trained, tmp_path) -> None:
    texts, _, vectors = labelled
    uri, _, _ = trained
    ids = [f"{i:032x}" for i in range(40)]
    table, _ = embed.embeddings_table(ids, vectors[:40], embed.EmbedParams(encoder=embed.offline_encoder_params()))
    emb_uri = str(tmp_path / "emb" / "part-00000-of-00001.parquet")
    out_uri = str(tmp_path / "q" / "part-00000-of-00001.parquet")
    storage.write_parquet(table, emb_uri)
    stats = quality.quality_scores_shard([emb_uri], out_uri, quality.QualityScoreParams(uri))
    out = storage.read_parquet(out_uri)
    assert out.column_names == ["id", "raw_score", "score"]
    assert out.schema.field("score").type == pa.float32() and out.schema.field("raw_score").type == pa.float32()
    assert out.column("id").to_pylist() == ids
    raw, score = quality.load_quality_model(uri).score(embed.vectors_from_table(table))
    np.testing.assert_array_equal(out.column("raw_score").to_numpy(), raw)
    np.testing.assert_array_equal(out.column("score").to_numpy(), score)
    assert stats["rows"] == 40 and sum(stats["fixed_band_rows"]) == 40
    # int8 storage barely moves the score
    exact_raw, _ = quality.load_quality_model(uri).score(vectors[:40])
    assert np.abs(exact_raw - raw).max() < 0.1


@quality.register_scorer
class _CentroidScorer:
    """Projection on (mean of good - mean of bad): a second head to show the protocol plugs in."""

    kind: ClassVar[str] = "test-centroid"
    input: ClassVar[str] = "embedding"

    def __init__(self, direction: np.ndarray | None = None) -> None:
        self.direction = direction

    def fit(self, features, labels):
        self.direction = features[labels >= 3].mean(axis=0) - features[labels < 3].mean(axis=0)
        return {"norm": float(np.linalg.norm(self.direction))}

    def score(self, features):
        return np.asarray(features, dtype=np.float32) @ self.direction.astype(np.float32)

    def save(self, uri):
        storage.write_json(storage.join(uri, "direction.json"), self.direction.tolist())

    @classmethod
    def load(cls, uri):
        return cls(np.asarray(storage.read_json(storage.join(uri, "direction.json")), dtype=np.float32))


def test_another_scorer_plugs_in(labelled, tmp_path) -> None:
    texts, labels, vectors = labelled
    params = quality.QualityParams(scorer="test-centroid", heldout_fraction=HELDOUT)
    assert isinstance(_CentroidScorer(), quality.Scorer)
    metrics = quality.train_quality_model(texts, labels, lambda ts: vectors, str(tmp_path), params)
    model = quality.load_quality_model(str(tmp_path))
    assert isinstance(model.scorer, _CentroidScorer) and metrics["scorer"] == "test-centroid"
    assert metrics["heldout"]["spearman"] > 0.5
    with pytest.raises(quality.QualityError, match="unknown scorer"):
        quality.train_quality_model(texts, labels, lambda ts: vectors, str(tmp_path / "x"), quality.QualityParams(scorer="nope"))


# --------------------------------------------------------------------------- bands


def _topic_scores(seed: int = 0, n: int = 1000) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {0: rng.beta(2, 5, n), 1: rng.beta(5, 2, n), 2: rng.uniform(0, 1, n), 3: rng.beta(0.5, 0.5, n)}


def test_within_topic_bands_hold_a_fifth_each_from_arrays_and_histograms() -> None:
    scores = _topic_scores()
    params = quality.BandParams(n_topics=4)
    exact = quality.band_edges(scores, params)
    hist = quality.ScoreHistogram(4, params.histogram_bins)
    for part in range(4):  # four "shards", merged
        shard = quality.ScoreHistogram(4, params.histogram_bins)
        for t, s in scores.items():
            piece = s[part::4]
            shard.add(np.full(len(piece), t), piece)
        hist.merge(shard)
    streamed = quality.band_edges(hist, params)
    for edges in (exact, streamed):
        for t, s in scores.items():
            counts = np.bincount(quality.band_of(s, np.full(len(s), t), edges), minlength=5)
            assert np.all(np.abs(counts / len(s) - 0.2) <= 0.01), (edges.method, t, counts)
    for t, s in scores.items():
        assert np.bincount(quality.band_of(s, np.full(len(s), t), exact), minlength=5).tolist() == [200] * 5
    np.testing.assert_allclose(exact.as_array(), streamed.as_array(), atol=0.01)
    # different topics get different edges: bands are relative to the topic
    assert exact.edges[0][2] < exact.edges[2][2] < exact.edges[1][2]


def test_fixed_edge_bands_follow_their_edges() -> None:
    edges = quality.band_edges(_topic_scores(), quality.BandParams(method="fixed", n_topics=4))
    s = np.array([0.0, 0.1999, 0.2, 0.39, 0.4, 0.6, 0.7999, 0.8, 1.0])
    for t in range(4):
        assert quality.band_of(s, np.full(len(s), t), edges).tolist() == [0, 0, 1, 1, 2, 3, 3, 4, 4]
    assert quality.band_of(s.astype(np.float32), np.zeros(len(s), int), edges).tolist() == [0, 0, 1, 1, 2, 3, 3, 4, 4]
    assert edges.documents == (1000, 1000, 1000, 1000)


def test_small_topics_fall_back_to_fixed_edges_and_bad_topics_are_refused() -> None:
    edges = quality.band_edges({0: np.linspace(0, 1, 50), 1: np.array([0.5, 0.6])}, quality.BandParams(n_topics=3))
    assert edges.fallback_topics == (1, 2)
    assert edges.edges[1] == quality.FIXED_EDGES and edges.edges[2] == quality.FIXED_EDGES
    with pytest.raises(quality.QualityError, match="topic ids"):
        quality.band_of(np.array([0.5]), np.array([3]), edges)


def test_band_edges_round_trip_and_histogram_alignment_check(tmp_path) -> None:
    edges = quality.band_edges(_topic_scores(), quality.BandParams(n_topics=4))
    quality.save_band_edges(edges, str(tmp_path))
    assert quality.load_band_edges(str(tmp_path)) == edges
    ids = [f"{i:032x}" for i in range(5)]
    storage.write_parquet(pa.table({"id": ids, "topic": pa.array([0, 1, 2, 3, 0], pa.int16())}), str(tmp_path / "t.parquet"))
    storage.write_parquet(pa.table({"id": ids[::-1], "score": pa.array([0.1] * 5, pa.float32())}), str(tmp_path / "q.parquet"))
    with pytest.raises(quality.QualityError, match="co-partitioned"):
        quality.score_histogram([(str(tmp_path / "t.parquet"), str(tmp_path / "q.parquet"))], quality.BandParams(n_topics=4))
    storage.write_parquet(pa.table({"id": ids, "score": pa.array([0.1, 0.2, None, 0.4, 0.5], pa.float32())}), str(tmp_path / "q.parquet"))
    hist, stats = quality.score_histogram([(str(tmp_path / "t.parquet"), str(tmp_path / "q.parquet"))], quality.BandParams(n_topics=4))
    assert stats == {"shards": 1, "rows": 5, "invalid": 1} and hist.documents().tolist() == [2, 1, 0, 1]
    hist.save(str(tmp_path / "hist.npz"))
    back = quality.ScoreHistogram.load(str(tmp_path / "hist.npz"))
    assert np.array_equal(back.counts, hist.counts) and back.invalid == 1


def test_the_histogram_built_by_tasks_adds_up_to_the_serial_one(tmp_path, monkeypatch) -> None:
    from marin_assets.core.runtime.runner import ShardRunner

    rng = np.random.default_rng(3)
    pairs = []
    for shard in range(5):
        ids = [f"{shard:04d}{i:028x}" for i in range(50)]
        t, q = str(tmp_path / f"t{shard}.parquet"), str(tmp_path / f"q{shard}.parquet")
        storage.write_parquet(pa.table({"id": ids, "topic": pa.array(rng.integers(0, 4, 50), pa.int16())}), t)
        scores = [None if i % 17 == 0 else float(v) for i, v in enumerate(rng.random(50))]
        storage.write_parquet(pa.table({"id": ids, "score": pa.array(scores, pa.float32())}), q)
        pairs.append((t, q))
    params = quality.BandParams(n_topics=4)
    serial, serial_stats = quality.score_histogram(pairs, params)
    kinds: list[int] = []

    class Counting(ShardRunner):
        def map(self, tasks, on_done=None):
            kinds.append(len(tasks))
            return super().map(tasks, on_done)

    monkeypatch.setattr(quality, "PAIRS_PER_HISTOGRAM_TASK", 2)
    monkeypatch.setattr(quality, "PARTS_PER_COMBINE_TASK", 2)
    work = tmp_path / "work"
    by_tasks, stats, topics_of = quality.score_histogram_by_tasks({"a": pairs[:3], "b": pairs[3:]}, str(work), params, Counting())
    assert kinds == [3, 2] and stats == serial_stats  # a: 2 tasks of 3 pairs, b: 1 of 2; their 3 parts added up by 2 tasks
    assert topics_of == {s: sorted(int(t) for t in quality.score_histogram(own, params)[0].documents().nonzero()[0])
                         for s, own in (("a", pairs[:3]), ("b", pairs[3:]))}
    assert np.array_equal(by_tasks.counts, serial.counts) and by_tasks.invalid == serial.invalid
    assert not work.exists()  # the parts are removed once added up


def test_group_names() -> None:
    groups = quality.all_groups()
    assert len(groups) == len(set(groups)) == 200
    assert groups[0] == "c00q0" and groups[-1] == "c39q4" and "c12q3" in groups
    assert all(quality.group_name(*quality.parse_group(g)) == g for g in groups)


def test_scoring_embeddings_of_another_encoder_names_the_file(trained, tmp_path) -> None:
    uri, _, _ = trained
    rng = np.random.default_rng(0)
    table, _ = embed.embeddings_table(["a" * 32, "b" * 32], rng.normal(size=(2, 8)).astype(np.float32), embed.EmbedParams())
    emb_uri = str(tmp_path / "part-00000-of-00001.parquet")
    storage.write_parquet(table, emb_uri)
    with pytest.raises(quality.QualityError, match=r"part-00000-of-00001.*384-dimensional.*same encoder|part-00000-of-00001.*expects 384"):
        quality.quality_scores_shard([emb_uri], str(tmp_path / "out.parquet"), quality.QualityScoreParams(uri))
