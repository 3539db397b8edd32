"""The global training in order: the sample by tasks, the fit as one task, the labels; this
process holds the label rows, never the sample."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from marin_assets.core.embed.topics.fit import FitParams, fit_topics, read_fit
from marin_assets.core.embed.topics.labels import _read_texts, topic_labels_of
from marin_assets.core.embed.topics.layout import TRAIN_STATS_JSON, SourceShards, TopicParams
from marin_assets.core.embed.topics.model import save_topic_model
from marin_assets.core.embed.topics.sampling import draw_sample, plan_sample
from marin_assets.core.runtime import storage


def train_topic_model(sources: Sequence[SourceShards], output_uri: str, params: TopicParams, runner: Any = None) -> dict[str, Any]:
    """Sample (by shard tasks on ``runner``, in this process when None), fit (one task that holds
    the sample, reserving ``fit_reservation``), label (texts read by tasks) and
    save the topic model under ``output_uri``; returns training stats. This process holds the
    label rows, never the sample's rows.

    The caller writes the output's manifest once this returns (files here are written first).
    """
    from marin_assets.core.runtime.runner import ShardRunner, ShardTask, TaskResources  # noqa: PLC0415

    runner = runner or ShardRunner()
    started = time.perf_counter()
    plan = plan_sample(sources, params)
    sample_work, fit_work = storage.join(output_uri, "_sample"), storage.join(output_uri, "_fit")
    parts = draw_sample(plan, params.seed, runner, sample_work)
    source_rows = plan.source_rows()
    stats = {"sample_seconds": round(time.perf_counter() - started, 3), "sample_rows_per_source": dict(zip([s.source for s in sources], source_rows))}
    cpus, memory = params.fit_reservation(plan.rows)
    params = dataclasses.replace(params, threads=cpus)  # what the fit runs with, and its topics.json records
    fit = ShardTask(fit_topics, tuple(parts), storage.join(fit_work, "fit"), FitParams(params, plan.rows, tuple(source_rows)),
                    TaskResources(cpus=cpus, memory_bytes=memory))  # fmt: skip
    stats.update(runner.map([fit])[0].stats)
    model, labels = read_fit(fit.output, plan)
    started = time.perf_counter()
    texts = _read_texts(labels, np.arange(len(labels)), max(params.label_text_chars, params.excerpt_chars), runner, storage.join(output_uri, "_labels"))
    model.topics = topic_labels_of(labels, texts, model, params)
    stats["label_seconds"] = round(time.perf_counter() - started, 3)
    fractions = [t.weight_fraction for t in model.topics]
    stats["min_topic_fraction"] = min(fractions)
    stats["max_topic_fraction"] = max(fractions)
    model.meta = {"n_topics": model.n_topics, "k_fine": stats["k_fine"], "dim": int(model.fine_centroids.shape[1]), "params": params.model_params()}
    save_topic_model(model, output_uri)
    storage.write_json(storage.join(output_uri, TRAIN_STATS_JSON), stats)
    for work in (sample_work, fit_work):  # the model is saved: the sample and the fit's output are not needed again
        storage.remove(work, recursive=True)
    return stats
