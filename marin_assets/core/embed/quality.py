"""Quality: a score per document from its embedding, calibrated to [0, 1], and 5 bands per topic.

**Scorer.** A regression head over the document embedding, trained on (embedding, label)
pairs of an annotation set: by default ``HuggingFaceFW/fineweb-edu-llama3-annotations`` (an LLM
grading how educational a web page is, 0-5) at a pinned revision. The default head is ridge
regression on the L2-normalized embedding, its penalty chosen by leave-one-out on the training
split. Any other head (another annotation set, an external classifier) plugs in through the
:class:`Scorer` protocol and :func:`register_scorer`.

**Held-out metrics.** A stratified fraction of the labels is held out: Spearman correlation of
the raw score with the label, and F1 of "raw score rounds to >= 3" against "label >= 3".

**Calibration.** A monotone piecewise-linear map of the raw score to [0, 1], fitted on the
held-out predictions: the median raw score of each label *level*; cutpoints at the midpoints
between adjacent medians, forced non-decreasing; with L levels the cutpoints map to 1/L, ...,
(L-1)/L, the raw minimum to 0 and the raw maximum to 1 (scores beyond them are clipped). The
annotation scale 0-5 has six values; labels 0 ("no educational value") and 1 ("basic
information among ads or boilerplate") are merged into the bottom level so that five levels
remain and the cutpoints land on 0.2, 0.4, 0.6 and 0.8: a document calibrated into the fixed
band q<k> scores like the documents of level k.

**Bands.** Five bands within each topic, by default quintiles of the calibrated score over all
sources, so every topic contributes a bottom and a top fifth whatever its score level. Edges
come from per-topic fixed-resolution histograms that shards add up, so no step holds all
scores. The alternative is the fixed absolute edges 0.2/0.4/0.6/0.8 (``method="fixed"``).
Topic t and band b name the sampling group ``c<tt>q<b>`` (``c00q0`` .. ``c39q4``).
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np
import pyarrow as pa

from marin_assets.core.embed.embeddings import vectors_from_table
from marin_assets.core.runtime import storage
from marin_assets.errors import BadInput

ANNOTATIONS_REPO = "HuggingFaceFW/fineweb-edu-llama3-annotations"
ANNOTATIONS_REVISION = "72df4c92fb1b48beceb16016e8f695ec40a6c3a5"

SCORER_JSON = "scorer.json"
CALIBRATION_JSON = "calibration.json"
METRICS_JSON = "metrics.json"
BAND_EDGES_JSON = "band_edges.json"


class QualityError(BadInput, RuntimeError):
    """A quality input is missing or inconsistent; the message names the file and the fix."""


@dataclasses.dataclass(frozen=True)
class QualityParams:
    """Training of the quality scorer; defaults are the production values.

    ``label_levels`` groups (rounded) label values into calibration levels, lowest first.
    ``ridge_alphas`` are the penalties tried by leave-one-out on the training split (one value
    fixes it). ``positive_label`` is the threshold of the held-out F1 (label >= 3 is
    "educational"); a raw score counts as positive when it rounds to at least that label.
    """

    annotations_repo: str = ANNOTATIONS_REPO
    annotations_revision: str = ANNOTATIONS_REVISION
    text_field: str = "text"
    label_field: str = "score"
    label_min: float = 0.0
    label_max: float = 5.0
    label_levels: tuple[tuple[int, ...], ...] = ((0, 1), (2,), (3,), (4,), (5,))
    heldout_fraction: float = 0.1
    seed: int = 42
    scorer: str = "ridge"
    ridge_alphas: tuple[float, ...] = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0)
    positive_label: float = 3.0


# --------------------------------------------------------------------------- annotations


def read_annotations(uris: Sequence[str], params: QualityParams = QualityParams()) -> tuple[list[str], np.ndarray, dict[str, int]]:
    """Texts and labels of annotation files (Parquet or JSON lines), with counters of bad rows.

    A row without text, or whose label is missing, not a number or outside
    ``[label_min, label_max]``, is skipped and counted, never silently.
    """
    texts: list[str] = []
    labels: list[float] = []
    counters = {"rows": 0, "null_text": 0, "bad_label": 0}
    for uri in uris:
        for text, label in _annotation_rows(uri, params):
            counters["rows"] += 1
            if not isinstance(text, str) or not text.strip():
                counters["null_text"] += 1
                continue
            try:
                value = float(label)
            except (TypeError, ValueError):
                counters["bad_label"] += 1
                continue
            if not math.isfinite(value) or not params.label_min <= value <= params.label_max:
                counters["bad_label"] += 1
                continue
            texts.append(text)
            labels.append(value)
    counters["used"] = len(texts)
    return texts, np.asarray(labels, dtype=np.float64), counters


def _annotation_rows(uri: str, params: QualityParams) -> Iterable[tuple[Any, Any]]:
    name = storage.basename(uri)
    if name.endswith(".parquet"):
        table = storage.read_parquet(uri)
        missing = [f for f in (params.text_field, params.label_field) if f not in table.column_names]
        if missing:
            raise QualityError(
                f"annotation file {uri} has no column(s) {missing} (columns: {table.column_names}); "
                "set QualityParams.text_field / label_field to the annotation set's field names"
            )
        return zip(table.column(params.text_field).to_pylist(), table.column(params.label_field).to_pylist())
    if name.endswith((".jsonl", ".json", ".jsonl.gz")):
        import gzip  # noqa: PLC0415

        data = storage.read_bytes(uri)
        if name.endswith(".gz"):
            data = gzip.decompress(data)
        rows = []
        for line_no, line in enumerate(data.decode("utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise QualityError(f"annotation file {uri}, line {line_no}: not JSON ({exc}); fix or remove the line") from exc
            rows.append((record.get(params.text_field), record.get(params.label_field)))
        return rows
    raise QualityError(f"annotation file {uri}: unknown format; use Parquet (.parquet) or JSON lines (.jsonl)")


def label_levels(labels: np.ndarray, params: QualityParams = QualityParams()) -> np.ndarray:
    """The calibration level (0 = lowest) of each label, after rounding to the nearest integer."""
    rounded = np.rint(np.asarray(labels, dtype=np.float64)).astype(np.int64)
    levels = np.full(len(rounded), -1, dtype=np.int64)
    for level, values in enumerate(params.label_levels):
        levels[np.isin(rounded, values)] = level
    if (levels < 0).any():
        stray = sorted(set(rounded[levels < 0].tolist()))
        raise QualityError(f"labels {stray} belong to no level of {params.label_levels}; add them to QualityParams.label_levels")
    return levels


def heldout_split(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """A boolean mask of held-out rows: ``fraction`` of each label value, at least one per value
    that has two or more rows (so every level is seen on both sides when it can be)."""
    labels = np.asarray(labels)
    mask = np.zeros(len(labels), dtype=bool)
    if fraction <= 0:
        return mask
    rng = np.random.default_rng(seed)
    for value in np.unique(labels):
        rows = np.flatnonzero(labels == value)
        take = int(round(len(rows) * fraction))
        if len(rows) >= 2:
            take = min(max(take, 1), len(rows) - 1)
        else:
            take = 0
        mask[rng.permutation(rows)[:take]] = True
    return mask


# --------------------------------------------------------------------------- scorers


@runtime_checkable
class Scorer(Protocol):
    """A quality head: learns raw scores from features and labels, and stores itself.

    ``input`` says what it reads: ``"embedding"`` (the stored document vectors) or ``"text"``
    (then :func:`quality_scores_shard` also takes the normalized shard).
    """

    kind: ClassVar[str]
    input: ClassVar[str]

    def fit(self, features: Any, labels: np.ndarray) -> dict[str, Any]: ...

    def score(self, features: Any) -> np.ndarray: ...

    def save(self, uri: str) -> None: ...

    @classmethod
    def load(cls, uri: str) -> Scorer: ...


SCORERS: dict[str, type] = {}


def register_scorer(cls: type) -> type:
    """Make a scorer class available by its ``kind`` (usable as a decorator)."""
    SCORERS[cls.kind] = cls
    return cls


def make_scorer(kind: str, params: QualityParams) -> Scorer:
    if kind not in SCORERS:
        raise QualityError(f"unknown scorer {kind!r}; known: {sorted(SCORERS)} (register one with register_scorer)")
    cls = SCORERS[kind]
    return cls.from_params(params) if hasattr(cls, "from_params") else cls()


@register_scorer
class RidgeScorer:
    """Ridge regression of the label on the embedding; the penalty chosen by leave-one-out."""

    kind: ClassVar[str] = "ridge"
    input: ClassVar[str] = "embedding"
    FILE: ClassVar[str] = "ridge.npz"

    def __init__(self, alphas: Sequence[float] = (1.0,), coef: np.ndarray | None = None, intercept: float = 0.0, alpha: float | None = None):
        self.alphas = tuple(float(a) for a in alphas)
        self.coef = coef
        self.intercept = float(intercept)
        self.alpha = alpha

    @classmethod
    def from_params(cls, params: QualityParams) -> RidgeScorer:
        return cls(alphas=params.ridge_alphas)

    def fit(self, features: np.ndarray, labels: np.ndarray) -> dict[str, Any]:
        from sklearn.linear_model import Ridge, RidgeCV  # noqa: PLC0415

        x = np.asarray(features, dtype=np.float64)
        y = np.asarray(labels, dtype=np.float64)
        if len(self.alphas) == 1:
            model = Ridge(alpha=self.alphas[0]).fit(x, y)
            self.alpha = self.alphas[0]
        else:
            model = RidgeCV(alphas=self.alphas).fit(x, y)
            self.alpha = float(model.alpha_)
        self.coef = np.asarray(model.coef_, dtype=np.float32)
        self.intercept = float(model.intercept_)
        return {"alpha": self.alpha, "alphas_tried": list(self.alphas)}

    def score(self, features: np.ndarray) -> np.ndarray:
        if self.coef is None:
            raise QualityError("the ridge scorer is not fitted; train it with train_quality_model first")
        x = np.asarray(features, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != len(self.coef):
            raise QualityError(
                f"the ridge scorer expects {len(self.coef)}-dimensional embeddings, got shape {x.shape}; "
                "score with embeddings from the encoder the quality model was trained with"
            )
        return (x @ self.coef + np.float32(self.intercept)).astype(np.float32)

    def save(self, uri: str) -> None:
        buf = io.BytesIO()
        np.savez(buf, coef=self.coef, intercept=np.float64(self.intercept), alpha=np.float64(self.alpha or 0.0), alphas=np.asarray(self.alphas))
        storage.write_bytes(storage.join(uri, self.FILE), buf.getvalue())

    @classmethod
    def load(cls, uri: str) -> RidgeScorer:
        data = np.load(io.BytesIO(storage.read_bytes(storage.join(uri, cls.FILE))), allow_pickle=False)
        return cls(tuple(data["alphas"].tolist()), data["coef"], float(data["intercept"]), float(data["alpha"]))


# --------------------------------------------------------------------------- calibration


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Monotone piecewise-linear map: ``knots_raw`` (non-decreasing) to ``knots_score``."""

    knots_raw: tuple[float, ...]
    knots_score: tuple[float, ...]
    level_medians: tuple[float | None, ...]

    def apply(self, raw: np.ndarray) -> np.ndarray:
        raw = np.asarray(raw, dtype=np.float64)
        xs = np.asarray(self.knots_raw, dtype=np.float64)
        ys = np.asarray(self.knots_score, dtype=np.float64)
        # Tied knots (equal medians) make a step; a tiny spread keeps np.interp well defined.
        spread = max(float(xs[-1] - xs[0]), 1.0) * 1e-12
        xs = xs + spread * np.arange(len(xs))
        return np.clip(np.interp(raw, xs, ys), 0.0, 1.0).astype(np.float32)


def fit_calibration(raw: np.ndarray, levels: np.ndarray, n_levels: int) -> Calibration:
    """Median raw score per level; cutpoints at midpoints of adjacent medians (non-decreasing).

    With ``n_levels`` L the cutpoints map to k/L (0.2 .. 0.8 for five levels), the raw minimum
    to 0 and the raw maximum to 1. A level without examples takes its median by linear
    interpolation between its neighbours (or the nearest one at the ends).
    """
    raw = np.asarray(raw, dtype=np.float64)
    levels = np.asarray(levels)
    if len(raw) == 0:
        raise QualityError("cannot calibrate on zero predictions; provide labelled data")
    medians = np.full(n_levels, np.nan)
    for level in range(n_levels):
        hit = raw[levels == level]
        if len(hit):
            medians[level] = float(np.median(hit))
    seen = np.flatnonzero(~np.isnan(medians))
    filled = np.interp(np.arange(n_levels), seen, medians[seen])
    lo, hi = float(raw.min()), float(raw.max())
    cuts = np.maximum.accumulate((filled[:-1] + filled[1:]) / 2.0)
    cuts = np.clip(cuts, lo, hi)
    knots_raw = (lo, *cuts.tolist(), hi)
    knots_score = tuple(k / n_levels for k in range(n_levels + 1))
    return Calibration(
        tuple(float(v) for v in knots_raw),
        knots_score,
        tuple(None if math.isnan(m) else float(m) for m in medians),
    )


# --------------------------------------------------------------------------- metrics


def heldout_metrics(raw: np.ndarray, labels: np.ndarray, positive_label: float) -> dict[str, Any]:
    """Spearman/Pearson of raw score vs label, F1/precision/recall at ``label >= positive_label``."""
    from scipy import stats as sps  # noqa: PLC0415

    raw = np.asarray(raw, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.float64)
    out: dict[str, Any] = {"n": int(len(raw))}
    if len(raw) < 2 or np.ptp(labels) == 0 or np.ptp(raw) == 0:
        out.update(spearman=None, pearson=None)
    else:
        out["spearman"] = float(sps.spearmanr(raw, labels).statistic)
        out["pearson"] = float(np.corrcoef(raw, labels)[0, 1])
    truth = labels >= positive_label
    predicted = raw >= positive_label - 0.5  # rounds to the threshold or above
    tp = int((truth & predicted).sum())
    fp = int((~truth & predicted).sum())
    fn = int((truth & ~predicted).sum())
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    out.update(
        f1=2 * precision * recall / (precision + recall) if precision + recall else 0.0,
        precision=precision,
        recall=recall,
        positives=int(truth.sum()),
        mae=float(np.mean(np.abs(raw - labels))) if len(raw) else None,
        rounded_accuracy=float(np.mean(np.rint(raw) == labels)) if len(raw) else None,
    )
    return out


# --------------------------------------------------------------------------- the model


@dataclasses.dataclass
class QualityModel:
    scorer: Scorer
    calibration: Calibration
    meta: dict[str, Any]

    @property
    def input(self) -> str:
        return self.scorer.input

    def score(self, features: Any) -> tuple[np.ndarray, np.ndarray]:
        """Raw and calibrated scores (float32)."""
        raw = np.asarray(self.scorer.score(features), dtype=np.float32)
        return raw, self.calibration.apply(raw)


def save_quality_model(model: QualityModel, uri: str, metrics: Mapping[str, Any] | None = None) -> None:
    model.scorer.save(uri)
    storage.write_json(storage.join(uri, CALIBRATION_JSON), dataclasses.asdict(model.calibration))
    if metrics is not None:
        storage.write_json(storage.join(uri, METRICS_JSON), dict(metrics))
    # scorer.json last: its presence means the model is complete.
    storage.write_json(storage.join(uri, SCORER_JSON), {"kind": model.scorer.kind, "input": model.scorer.input, **model.meta})


def load_quality_model(uri: str) -> QualityModel:
    """The scorer and calibration stored at ``uri`` by :func:`train_quality_model`."""
    if not storage.exists(storage.join(uri, SCORER_JSON)):
        raise QualityError(f"no quality model at {uri} ({SCORER_JSON} missing); materialize quality_model first")
    meta = storage.read_json(storage.join(uri, SCORER_JSON))
    kind = meta.get("kind")
    if kind not in SCORERS:
        raise QualityError(f"quality model at {uri} uses scorer {kind!r}, which is not registered; import the module that registers it")
    cal = storage.read_json(storage.join(uri, CALIBRATION_JSON))
    calibration = Calibration(tuple(cal["knots_raw"]), tuple(cal["knots_score"]), tuple(cal["level_medians"]))
    return QualityModel(SCORERS[kind].load(uri), calibration, meta)


def train_quality_model(
    texts: Sequence[str],
    labels: Sequence[float] | np.ndarray,
    encode_fn: Callable[[list[str]], np.ndarray],
    out_uri: str,
    params: QualityParams = QualityParams(),
) -> dict[str, Any]:
    """Fit the scorer on the training split, calibrate and measure on the held-out split, save.

    ``encode_fn`` turns texts into L2-normalized vectors with the encoder the documents were
    embedded with (ignored by text scorers). Returns the metrics, also stored as
    ``metrics.json``. With ``heldout_fraction=0`` the calibration uses the training predictions.
    """
    labels = np.asarray(labels, dtype=np.float64)
    if len(texts) != len(labels):
        raise QualityError(f"{len(texts)} texts but {len(labels)} labels; they must pair up one to one")
    levels = label_levels(labels, params)
    scorer = make_scorer(params.scorer, params)
    if scorer.input == "embedding":
        features: Any = np.asarray(encode_fn(list(texts)), dtype=np.float32)
        if features.shape[0] != len(texts):
            raise QualityError(f"encode_fn returned {features.shape[0]} vectors for {len(texts)} texts")
    else:
        features = np.asarray(list(texts), dtype=object)
    held = heldout_split(np.rint(labels), params.heldout_fraction, params.seed)
    train = ~held
    fit_info = scorer.fit(features[train], labels[train])
    train_raw = np.asarray(scorer.score(features[train]), dtype=np.float64)
    held_raw = np.asarray(scorer.score(features[held]), dtype=np.float64) if held.any() else np.zeros(0)
    cal_raw, cal_levels = (held_raw, levels[held]) if held.any() else (train_raw, levels[train])
    calibration = fit_calibration(cal_raw, cal_levels, len(params.label_levels))
    held_cal = calibration.apply(held_raw)
    fixed_band = np.searchsorted(np.asarray(calibration.knots_score[1:-1]), held_cal, side="right")
    metrics = {
        "scorer": scorer.kind,
        **fit_info,
        "annotations": f"{params.annotations_repo}@{params.annotations_revision}",
        "n_labels": int(len(labels)),
        "n_train": int(train.sum()),
        "n_heldout": int(held.sum()),
        "label_counts": {str(int(v)): int(c) for v, c in zip(*np.unique(np.rint(labels), return_counts=True))},
        "train": heldout_metrics(train_raw, labels[train], params.positive_label),
        "heldout": heldout_metrics(held_raw, labels[held], params.positive_label),
        "heldout_level_agreement": float(np.mean(fixed_band == levels[held])) if held.any() else None,
        "calibrated_on": "heldout" if held.any() else "train",
        "calibration": dataclasses.asdict(calibration),
        "feature_dim": int(features.shape[1]) if scorer.input == "embedding" else None,
    }
    meta = {"params": dataclasses.asdict(params), "feature_dim": metrics["feature_dim"]}
    save_quality_model(QualityModel(scorer, calibration, meta), out_uri, metrics)
    return metrics


# --------------------------------------------------------------------------- per shard


@dataclasses.dataclass(frozen=True)
class QualityScoreParams:
    """Scoring of one embeddings shard with the quality model stored at ``model_uri``."""

    model_uri: str
    text_column: str = "text"


@functools.lru_cache(maxsize=2)
def _cached_quality_model(uri: str) -> QualityModel:
    return load_quality_model(uri)


def quality_scores_shard(input_uris: list[str], output_uri: str, params: QualityScoreParams) -> dict[str, Any]:
    """``id``, ``raw_score`` and calibrated ``score`` (float32) for one embeddings shard.

    Inputs: the embeddings shard; a text scorer also needs the co-partitioned normalized shard
    as the second input. Rows keep the input order.
    """
    if not 1 <= len(input_uris) <= 2:
        raise ValueError(f"quality_scores_shard takes an embeddings shard (and a normalized shard for text scorers), got {input_uris}")
    model = _cached_quality_model(params.model_uri)
    table = storage.read_parquet(input_uris[0], columns=["id", "embedding"])
    if model.input == "embedding":
        features: Any = vectors_from_table(table)
    else:
        if len(input_uris) < 2:
            raise QualityError(f"the quality model at {params.model_uri} scores text; pass the normalized shard after {input_uris[0]}")
        texts_table = storage.read_parquet(input_uris[1], columns=["id", params.text_column])
        _check_aligned(table, texts_table, input_uris[0], input_uris[1])
        features = np.asarray([t or "" for t in texts_table.column(params.text_column).to_pylist()], dtype=object)
    try:
        raw, score = model.score(features) if len(table) else (np.zeros(0, np.float32), np.zeros(0, np.float32))
    except QualityError as exc:
        raise QualityError(f"{input_uris[0]}: {exc}") from exc
    out = pa.table(
        {"id": table.column("id"), "raw_score": pa.array(raw, pa.float32()), "score": pa.array(score, pa.float32())}
    )
    storage.write_parquet(out, output_uri)
    fixed = np.searchsorted(np.asarray(FIXED_EDGES), score, side="right")
    return {
        "rows": len(out),
        "mean_score": float(score.mean()) if len(score) else 0.0,
        "mean_raw_score": float(raw.mean()) if len(raw) else 0.0,
        "fixed_band_rows": np.bincount(fixed, minlength=len(FIXED_EDGES) + 1).tolist(),
    }


def _check_aligned(left: pa.Table, right: pa.Table, left_uri: str, right_uri: str) -> None:
    if len(left) != len(right) or not left.column("id").cast(pa.large_string()).equals(right.column("id").cast(pa.large_string())):
        raise QualityError(
            f"{left_uri} and {right_uri} are not co-partitioned (different ids or row order); "
            "rebuild the attribute from the current normalized shards"
        )


# --------------------------------------------------------------------------- bands

FIXED_EDGES = (0.2, 0.4, 0.6, 0.8)


@dataclasses.dataclass(frozen=True)
class BandParams:
    """Band edges: ``"quantile"`` (per topic, over all sources; default) or ``"fixed"``.

    ``histogram_bins`` is the resolution of the streamed per-topic histograms of the calibrated
    score (1e-4 by default). A topic with fewer than ``n_bands`` documents keeps the fixed edges.
    """

    method: str = "quantile"
    n_topics: int = 40
    n_bands: int = 5
    fixed_edges: tuple[float, ...] = FIXED_EDGES
    histogram_bins: int = 10_000


def group_name(topic: int, band: int) -> str:
    """``c12q3``: topic 12, band 3."""
    return f"c{int(topic):02d}q{int(band)}"


def all_groups(n_topics: int = 40, n_bands: int = 5) -> list[str]:
    return [group_name(t, b) for t in range(n_topics) for b in range(n_bands)]


def parse_group(name: str) -> tuple[int, int]:
    if len(name) < 4 or name[0] != "c" or "q" not in name:
        raise ValueError(f"{name!r} is not a group name like 'c12q3'")
    topic, band = name[1:].split("q", 1)
    return int(topic), int(band)


class ScoreHistogram:
    """Per-topic counts of the calibrated score in fixed-width bins over [0, 1]; shards add up."""

    def __init__(self, n_topics: int = 40, bins: int = 10_000, counts: np.ndarray | None = None):
        self.n_topics = n_topics
        self.bins = bins
        self.counts = np.zeros((n_topics, bins), dtype=np.int64) if counts is None else np.asarray(counts, dtype=np.int64)
        self.invalid = 0

    def add(self, topics: np.ndarray, scores: np.ndarray) -> None:
        topics = np.asarray(topics, dtype=np.float64)  # nulls arrive as NaN
        scores = np.asarray(scores, dtype=np.float64)
        valid = np.isfinite(scores) & np.isfinite(topics) & (topics >= 0) & (topics < self.n_topics)
        self.invalid += int((~valid).sum())
        cells = np.minimum((np.clip(scores[valid], 0.0, 1.0) * self.bins).astype(np.int64), self.bins - 1)
        flat = np.bincount(topics[valid].astype(np.int64) * self.bins + cells, minlength=self.n_topics * self.bins)
        self.counts += flat.reshape(self.n_topics, self.bins)

    def merge(self, other: ScoreHistogram) -> ScoreHistogram:
        if (other.n_topics, other.bins) != (self.n_topics, self.bins):
            raise ValueError("histograms of different shapes cannot be merged")
        self.counts += other.counts
        self.invalid += other.invalid
        return self

    def documents(self) -> np.ndarray:
        return self.counts.sum(axis=1)

    def save(self, uri: str) -> None:
        """Store as compressed ``.npz`` (partial histograms, e.g. one per source, merge later)."""
        buf = io.BytesIO()
        np.savez_compressed(buf, counts=self.counts, invalid=np.int64(self.invalid))
        storage.write_bytes(uri, buf.getvalue())

    @classmethod
    def load(cls, uri: str) -> ScoreHistogram:
        data = np.load(io.BytesIO(storage.read_bytes(uri)), allow_pickle=False)
        hist = cls(data["counts"].shape[0], data["counts"].shape[1], data["counts"])
        hist.invalid = int(data["invalid"])
        return hist

    def quantile_edges(self, topic: int, n_bands: int) -> list[float]:
        """Edges that put ``1/n_bands`` of the topic below each, interpolating inside a bin."""
        counts = self.counts[topic]
        total = int(counts.sum())
        cum = np.cumsum(counts)
        edges = []
        for k in range(1, n_bands):
            target = k * total / n_bands
            i = int(np.searchsorted(cum, target, side="left"))
            before = cum[i] - counts[i]
            edges.append((i + (target - before) / counts[i]) / self.bins)
        return edges


def score_histogram(pairs: Iterable[tuple[str, str]], params: BandParams = BandParams()) -> tuple[ScoreHistogram, dict[str, int]]:
    """Add up the histograms of co-partitioned (topics shard, quality scores shard) pairs."""
    hist = ScoreHistogram(params.n_topics, params.histogram_bins)
    shards = rows = 0
    for topics_uri, quality_uri in pairs:
        topics = storage.read_parquet(topics_uri, columns=["id", "topic"])
        scores = storage.read_parquet(quality_uri, columns=["id", "score"])
        _check_aligned(topics, scores, topics_uri, quality_uri)
        hist.add(
            topics.column("topic").to_numpy(zero_copy_only=False).astype(np.float64),
            scores.column("score").to_numpy(zero_copy_only=False).astype(np.float64),
        )
        shards += 1
        rows += len(topics)
    return hist, {"shards": shards, "rows": rows, "invalid": hist.invalid}


PAIRS_PER_HISTOGRAM_TASK = 128  # a task's spec names its shards: 128 pairs is ~30 KiB


def histogram_part(input_uris: list[str], output_uri: str, params: BandParams) -> dict[str, int]:
    """A task: the histogram of a chunk of (topics shard, quality scores shard) pairs, given as
    alternating inputs, stored as ``.npz`` at ``output_uri``."""
    hist, counters = score_histogram(zip(input_uris[0::2], input_uris[1::2]), params)
    hist.save(output_uri)
    return counters | {"topics": hist.documents().nonzero()[0].tolist()}


PARTS_PER_COMBINE_TASK = 64  # the step reads ~1/64 of the partial histograms (~50 for the pool)


def add_histograms(input_uris: list[str], output_uri: str, params: BandParams) -> dict[str, int]:
    """A task: the sum of partial histograms (``.npz``), stored at ``output_uri``."""
    hist = ScoreHistogram(params.n_topics, params.histogram_bins)
    for uri in input_uris:
        hist.merge(ScoreHistogram.load(uri))
    hist.save(output_uri)
    return {"parts": len(input_uris)}


def score_histogram_by_tasks(
    pairs: Mapping[str, Sequence[tuple[str, str]]], work_uri: str, params: BandParams, runner: Any
) -> tuple[ScoreHistogram, dict[str, int], dict[str, list[int]]]:
    """:func:`score_histogram` over the whole pool (``source -> (topics, scores) shard pairs``) as
    shard tasks of at most ``PAIRS_PER_HISTOGRAM_TASK`` pairs of one source, whose partial
    histograms tasks add up ``PARTS_PER_COMBINE_TASK`` at a time; the step adds up those (the
    same counts: sums of integers) and notes, per source, the topics it has documents in (from
    the tasks' counters: a source's slice of the band edges)."""
    from marin_assets.core.runtime.runner import ShardTask, combined_by_tasks  # noqa: PLC0415

    step = PAIRS_PER_HISTOGRAM_TASK
    tasks, source_of = [], []
    for source, own in pairs.items():
        for i in range(0, len(own), step):
            output = storage.join(work_uri, f"part-{len(tasks):06d}.npz")
            tasks.append(ShardTask(histogram_part, tuple(u for pair in own[i:i + step] for u in pair), output, params))
            source_of.append(source)
    counters = {"shards": 0, "rows": 0, "invalid": 0}
    topics: dict[str, set[int]] = {source: set() for source in pairs}
    results = runner.map(tasks)
    for source, result in zip(source_of, results):
        found = result.stats.get("topics")
        found = ScoreHistogram.load(result.output).documents().nonzero()[0] if found is None else found  # a part from before topics were counted
        topics[source].update(int(t) for t in found)
        for key in counters:
            counters[key] += int(result.stats[key])
    hist = ScoreHistogram(params.n_topics, params.histogram_bins)
    for uri in combined_by_tasks([r.output for r in results], storage.join(work_uri, "combined"), add_histograms, params, runner, PARTS_PER_COMBINE_TASK):
        hist.merge(ScoreHistogram.load(uri))
    storage.remove(work_uri, recursive=True)  # added up: the parts are not needed again
    return hist, counters, {source: sorted(found) for source, found in topics.items()}


@dataclasses.dataclass(frozen=True)
class BandEdges:
    """Per topic, the ``n_bands - 1`` ascending edges; band = number of edges <= score."""

    method: str
    edges: tuple[tuple[float, ...], ...]
    documents: tuple[int, ...]
    fallback_topics: tuple[int, ...] = ()

    @property
    def n_topics(self) -> int:
        return len(self.edges)

    @property
    def n_bands(self) -> int:
        return len(self.edges[0]) + 1 if self.edges else 0

    def as_array(self) -> np.ndarray:
        return np.asarray(self.edges, dtype=np.float64).reshape(len(self.edges), -1)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, payload: Mapping[str, Any]) -> BandEdges:
        return cls(
            payload["method"],
            tuple(tuple(float(e) for e in row) for row in payload["edges"]),
            tuple(int(d) for d in payload["documents"]),
            tuple(int(t) for t in payload.get("fallback_topics", ())),
        )


def band_edges(topic_scores: ScoreHistogram | Mapping[int, np.ndarray] | None, params: BandParams = BandParams()) -> BandEdges:
    """Edges of ``n_bands`` bands for each topic.

    ``topic_scores`` is a streamed :class:`ScoreHistogram` (production) or, for small data, a
    mapping topic -> calibrated scores, whose quintile edges are then exact (midway between the
    neighbouring order statistics). ``method="fixed"`` uses ``fixed_edges`` for every topic.
    """
    fixed = tuple(float(e) for e in params.fixed_edges)
    if len(fixed) != params.n_bands - 1:
        raise ValueError(f"{params.n_bands} bands need {params.n_bands - 1} fixed edges, got {fixed}")
    if isinstance(topic_scores, ScoreHistogram):
        documents = topic_scores.documents().tolist()
    elif topic_scores is None:
        documents = [0] * params.n_topics
    else:
        documents = [len(np.asarray(topic_scores.get(t, ()))) for t in range(params.n_topics)]
    if params.method == "fixed":
        return BandEdges("fixed", tuple(fixed for _ in range(params.n_topics)), tuple(int(d) for d in documents))
    if params.method != "quantile":
        raise ValueError(f"unknown band method {params.method!r}: use 'quantile' or 'fixed'")
    if topic_scores is None:
        raise ValueError("quantile bands need the topics' scores (a ScoreHistogram or per-topic arrays)")
    edges: list[tuple[float, ...]] = []
    fallback: list[int] = []
    for topic in range(params.n_topics):
        if documents[topic] < params.n_bands:
            edges.append(fixed)
            fallback.append(topic)
        elif isinstance(topic_scores, ScoreHistogram):
            edges.append(tuple(float(e) for e in topic_scores.quantile_edges(topic, params.n_bands)))
        else:
            edges.append(_exact_quantile_edges(np.asarray(topic_scores[topic], dtype=np.float64), params.n_bands))
    return BandEdges("quantile", tuple(edges), tuple(int(d) for d in documents), tuple(fallback))


def _exact_quantile_edges(scores: np.ndarray, n_bands: int) -> tuple[float, ...]:
    ordered = np.sort(scores[np.isfinite(scores)])
    n = len(ordered)
    edges = []
    for k in range(1, n_bands):
        m = min(max(int(round(k * n / n_bands)), 1), n - 1)
        edges.append(float((ordered[m - 1] + ordered[m]) / 2.0))
    return tuple(edges)


def band_of(scores: np.ndarray, topics: np.ndarray, edges: BandEdges) -> np.ndarray:
    """Band (int8, 0 = lowest) of each score within its topic: how many of the topic's edges are <= it."""
    scores = np.asarray(scores, dtype=np.float64)
    topics = np.asarray(topics, dtype=np.int64)
    table = edges.as_array()
    if len(topics) and (topics.min() < 0 or topics.max() >= edges.n_topics):
        raise QualityError(f"topic ids must lie in [0, {edges.n_topics}); got {int(topics.min())}..{int(topics.max())}")
    return (scores[:, None] >= table[topics]).sum(axis=1).astype(np.int8)


def save_band_edges(edges: BandEdges, dir_uri: str) -> str:
    uri = storage.join(dir_uri, BAND_EDGES_JSON)
    storage.write_json(uri, edges.to_json())
    return uri


def load_band_edges(uri: str) -> BandEdges:
    """From ``band_edges.json`` or the directory holding it."""
    if not uri.endswith(".json"):
        uri = storage.join(uri, BAND_EDGES_JSON)
    if not storage.exists(uri):
        raise QualityError(f"no band edges at {uri}; materialize quality_bands first")
    return BandEdges.from_json(storage.read_json(uri))


def band_summary(hist: ScoreHistogram, edges: BandEdges) -> dict[str, Any]:
    """Documents per band of each topic, from the histogram (a bin goes to the band of its centre)."""
    rows = []
    centers = (np.arange(hist.bins) + 0.5) / hist.bins
    table = edges.as_array()
    for topic in range(min(hist.n_topics, edges.n_topics)):
        bands = (centers[:, None] >= table[topic]).sum(axis=1)
        rows.append(np.bincount(bands, weights=hist.counts[topic], minlength=edges.n_bands).astype(np.int64).tolist())
    return {"documents_per_band": rows}


def band_slices(stats: dict) -> dict[str, str] | None:
    """Per source, a digest of the band edges of the topics it has documents in: what its pool
    reads of ``quality_bands`` (``None`` for an output recorded before topics were kept per source)."""
    topics_of, digests = stats.get("topics_per_source"), stats.get("per_topic_digest")
    if topics_of is None or digests is None:
        return None
    return {s: storage.fingerprint("bands", [digests[str(t)] for t in topics]) for s, topics in sorted(topics_of.items())}
