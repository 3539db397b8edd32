"""Step 5, readable labels: which sample rows the labels read (a random subset and each topic's
nearest rows), their texts read by tasks from the co-partitioned normalized shards (ids
checked), c-TF-IDF terms and excerpts."""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from marin_assets.core.embed.topics import layout
from marin_assets.core.embed.topics.layout import SourceShards, TopicParams
from marin_assets.core.embed.topics.model import TopicLabel, TopicModel
from marin_assets.core.embed.topics.sampling import EmbeddingSample, float32_batches, read_rows
from marin_assets.core.runtime import storage


def ctfidf_terms(texts: Sequence[str], topics: np.ndarray, n_topics: int, params: TopicParams) -> list[list[str]]:
    """Top class-based TF-IDF terms per topic: tf within the topic x log(1 + A / frequency overall)."""
    from scipy import sparse  # noqa: PLC0415
    from sklearn.feature_extraction.text import CountVectorizer  # noqa: PLC0415

    if not texts:
        return [[] for _ in range(n_topics)]
    vectorizer = CountVectorizer(
        ngram_range=(1, 2),
        stop_words="english",
        max_features=params.label_max_features,
        token_pattern=r"(?u)\b[^\W\d_]{2,}\b",
        lowercase=True,
    )
    try:
        counts = vectorizer.fit_transform(texts)
    except ValueError:  # nothing but stop-words and numbers
        return [[] for _ in range(n_topics)]
    n_docs = len(topics)
    membership = sparse.csr_matrix((np.ones(n_docs), (topics, np.arange(n_docs))), shape=(n_topics, n_docs))
    per_topic = np.asarray((membership @ counts).todense(), dtype=np.float64)
    words = per_topic.sum(axis=1, keepdims=True)
    tf = per_topic / np.maximum(words, 1.0)
    average_words = float(words.sum()) / max(int((words > 0).sum()), 1)
    idf = np.log1p(average_words / np.maximum(per_topic.sum(axis=0), 1.0))
    scores = tf * idf
    vocabulary = vectorizer.get_feature_names_out()
    out = []
    for t in range(n_topics):
        top = np.argsort(-scores[t], kind="stable")[: params.label_terms]
        out.append([str(vocabulary[i]) for i in top if scores[t, i] > 0])
    return out


def short_label(terms: Sequence[str], topic: int, n_terms: int = 3) -> str:
    """A few top terms, skipping one whose words an earlier (bigram) term already shows."""
    chosen: list[str] = []
    for term in terms:
        shown = {w for c in chosen for w in c.split()}
        if set(term.split()) <= shown:
            continue
        chosen.append(term)
        if len(chosen) == n_terms:
            break
    return ", ".join(chosen) if chosen else f"topic {topic:02d}"


@dataclasses.dataclass(frozen=True)
class TextParams:
    picks: tuple[tuple[str, str, tuple[int, ...], tuple[bytes, ...]], ...]  # per input shard: source, embeddings shard, rows, their ids
    max_chars: int | None


def read_texts(input_uris: list[str], output_uri: str, params: TextParams) -> dict[str, Any]:
    """A task: the texts of sample rows (cut to ``max_chars``) from a chunk of normalized shards,
    ids checked against the embeddings', stored in order as a JSON list at ``output_uri``."""
    texts: list[str] = []
    for text_uri, (source, emb_uri, rows, ids) in zip(input_uris, params.picks, strict=True):
        table = read_rows(text_uri, np.asarray(rows, dtype=np.int64), ["id", "text"])
        got = np.asarray(table.column("id").to_pylist(), dtype="S32")
        if not np.array_equal(got, np.asarray(ids, dtype="S32")):
            raise ValueError(
                f"source {source}: ids of {emb_uri} do not match {text_uri} row for row; "
                "the embeddings are stale, rebuild them for this source"
            )
        texts += [(text or "")[:params.max_chars] if params.max_chars else (text or "") for text in table.column("text").to_pylist()]
    storage.write_json(output_uri, texts)
    return {"rows": len(texts)}


def concat_text_parts(input_uris: list[str], output_uri: str, params: None = None) -> dict[str, Any]:
    """A task: text parts (JSON lists) put together in order, stored at ``output_uri``."""
    texts = [text for uri in input_uris for text in storage.read_json(uri)]
    storage.write_json(output_uri, texts)
    return {"rows": len(texts)}


def _read_texts(sample: EmbeddingSample | LabelRows, rows: np.ndarray, max_chars: int | None = None, runner: Any = None, work_uri: str = "") -> dict[int, str]:
    """Texts of sample rows (cut to ``max_chars``), read from the co-partitioned normalized shards
    (ids checked) by tasks of ``SHARDS_PER_SAMPLE_TASK`` shards, their parts put together by tasks.

    Cutting as they are read caps the label step at rows x ``max_chars`` characters; the ~10^5
    shards that hold the label rows are read by tasks, not one after another by the step.
    """
    from marin_assets.core.runtime.runner import (  # noqa: PLC0415
        ShardRunner,
        ShardTask,
        combined_by_tasks,
    )

    shard_of = sample.shard[rows]
    order = np.argsort(shard_of, kind="stable")  # rows by shard, in row order within one: no pass over all rows per shard
    keys, starts = np.unique(shard_of[order], return_index=True)
    held = [(int(k), mine) for k, mine in zip(keys, np.split(rows[order], starts[1:])) if sample.shards[int(k)][2] is not None]
    if not held:
        return {}
    step, work = layout.SHARDS_PER_SAMPLE_TASK, work_uri or tempfile.mkdtemp(prefix="topic-texts-")
    chunks = [held[i:i + step] for i in range(0, len(held), step)]
    tasks = [
        ShardTask(read_texts, tuple(sample.shards[k][2] for k, _ in chunk), storage.join(work, f"part-{c:06d}.json"),
                  TextParams(tuple((sample.sources[sample.shards[k][0]].source, sample.shards[k][1], tuple(sample.row[mine].tolist()),
                                    tuple(sample.ids[mine].tolist())) for k, mine in chunk), max_chars))
        for c, chunk in enumerate(chunks)
    ]  # fmt: skip
    runner = runner or ShardRunner()
    parts = [r.output for r in runner.map(tasks)]
    combined = combined_by_tasks(parts, storage.join(work, "combined"), concat_text_parts, None, runner, layout.PARTS_PER_COMBINE_TASK)
    texts = [text for uri in combined for text in storage.read_json(uri)]
    storage.remove(work, recursive=True)  # put together: the parts are not needed again
    return dict(zip(np.concatenate([mine for _, mine in held]).tolist(), texts, strict=True))


@dataclasses.dataclass
class LabelRows:
    """The sample rows the labels read (10^5 of the 10^7), as the fit task chose them: where each
    came from (the fields ``_read_texts`` reads, as an ``EmbeddingSample`` has them), its topic,
    and per topic its nearest rows (positions here, nearest first)."""

    ids: np.ndarray
    shard: np.ndarray
    row: np.ndarray
    topic: np.ndarray
    nearest: list[np.ndarray]
    sources: list[SourceShards]
    shards: list[tuple[int, str, str | None]]

    def __len__(self) -> int:
        return len(self.row)


def topic_labels_of(labels: LabelRows, texts: Mapping[int, str], model: TopicModel, params: TopicParams) -> list[TopicLabel]:
    """Step 5: c-TF-IDF terms over the label rows' texts (``texts``: by position in ``labels``)
    and each topic's nearest excerpts."""
    n_topics = model.n_topics
    have = np.asarray([r for r in range(len(labels)) if r in texts], dtype=np.int64)
    terms = ctfidf_terms([texts[int(r)][: params.label_text_chars] for r in have], labels.topic[have], n_topics, params)
    total = float(model.fine_weights.sum())
    out = []
    for t in range(n_topics):
        members = model.fine_to_topic == t
        weight = float(model.fine_weights[members].sum())
        excerpts = tuple(texts[int(r)][: params.excerpt_chars] for r in labels.nearest[t] if int(r) in texts)
        out.append(
            TopicLabel(
                topic=t,
                label=short_label(terms[t], t),
                terms=tuple(terms[t]),
                excerpts=excerpts,
                weight=weight,
                weight_fraction=weight / total,
                fine_clusters=int(members.sum()),
            )
        )
    return out


def choose_label_rows(vectors: np.ndarray, topic_of_row: np.ndarray, centroids: np.ndarray, params: TopicParams) -> tuple[np.ndarray, list[np.ndarray]]:
    """Step 5's rows: a random ``label_sample_size`` of the sample plus each topic's
    ``label_excerpts`` rows nearest its centroid (``centroids``: the topics'). Returns the sorted
    row numbers and, per topic, its nearest rows, nearest first."""
    n, n_topics = len(vectors), len(centroids)
    similarity = np.empty(n, dtype=np.float32)
    for start, batch in zip(range(0, n, params.batch_rows), float32_batches(vectors, params.batch_rows)):
        part = slice(start, start + len(batch))
        similarity[part] = np.sum(batch * centroids[topic_of_row[part]], axis=1)
    rows = np.arange(n)
    order = np.lexsort((rows, -similarity, topic_of_row))
    first = np.searchsorted(topic_of_row[order], np.arange(n_topics))
    nearest = [order[first[t] : first[t] + params.label_excerpts] for t in range(n_topics)]
    nearest = [m[topic_of_row[m] == t] for t, m in enumerate(nearest)]
    rng = np.random.default_rng(params.seed)
    subset = rows if n <= params.label_sample_size else np.sort(rng.choice(rows, params.label_sample_size, replace=False))
    nearest_rows = np.concatenate(nearest) if nearest else np.zeros(0, dtype=np.int64)
    return np.union1d(subset, nearest_rows).astype(np.int64), nearest
