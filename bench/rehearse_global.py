"""`make rehearse`, the global stages: each one's step code at the full pool's counts inside a real
Dagster step, its tasks answered by a dry runner (``bench/rehearse_kit.py``) with the counters such
a task returns, and the small metadata the step reads back (per-shard manifests, sample parts)
written where the step looks for it, uncounted, as the upstream steps and the tasks would write it.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import dagster as dg
import numpy as np

from bench import slow_store
from bench.rehearse_kit import DOCS_PER_SHARD, DryRunner, SourceSize, global_step, shard_names
from marin_assets.core import specs
from marin_assets.core.dedup import exact
from marin_assets.core.dedup.decisions import ExactDedupParams
from marin_assets.core.embed import topics
from marin_assets.core.runtime import stages, storage
from marin_assets.core.runtime.runner import ShardTask
from marin_assets.defs.ray import step_progress


def local_path(uri: str) -> Path:
    """Where the counting store keeps ``uri``: what an upstream step or a task wrote is put there directly (uncounted)."""
    path = Path(slow_store.SlowStore._strip_protocol(uri))
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def per_shard_output(root: str, stage: str, src: SourceSize, stats: dict[str, Any] | None = None) -> stages.StageInput:
    """A per-shard stage's finished output for ``src`` as ``run_shards`` records it: a manifest
    naming every shard with its counters (``rows`` by default)."""
    uri = storage.join(root, stage, src.name)
    names = [storage.shard_name(i, src.shards) for i in range(src.shards)]
    per_shard = [stats or {"rows": DOCS_PER_SHARD}] * src.shards
    local_path(storage.manifest_uri(uri)).write_text(json.dumps({"stage": stage, "shards": names, "per_shard": per_shard}))
    return stages.StageInput(uri, "0" * 16, stage)


def uncounted(answer: Any) -> Any:
    """``answer`` for a task that the dry runner runs for real in the step's process: its requests
    are the task's own, not the step's, so the store's counts are put back as they were."""

    def run(task: Any) -> Any:
        before = slow_store.SlowStore.requests.copy()
        try:
            return answer(task)
        finally:
            slow_store.SlowStore.requests.clear()
            slow_store.SlowStore.requests.update(before)

    return run


def find_current_outputs(sources: list[SourceSize]) -> None:
    """``stages.current_inputs``' requests: per source, its ``_current.json`` (exists, read) and its manifest (exists)."""
    for _ in sources:
        for kind in ("stat", "get", "stat"):
            slow_store.SlowStore.request(kind)


def exact_answer(task: ShardTask) -> dict[str, Any]:
    """What exact dedup's tasks return, for a pool with no id in two sources (the counters' size
    does not follow the duplicates found, only the sources: one entry per source with removals)."""
    if task.fn is exact.exact_map:
        return {"docs": DOCS_PER_SHARD * len(task.inputs), "chars": 4 * DOCS_PER_SHARD * len(task.inputs)}
    if task.fn is exact.exact_reduce:
        return {"docs": 0, "unique_ids": 0, "within_source_repeats": 0, "ids_in_several_sources": 0,
                "removed_by_rank": {}, "removed_chars_by_rank": {}, "pairs": {}}  # fmt: skip
    return {"sources": [{"removed": 0, "digest": "0" * 16} for _ in task.params.ranks]}


def rehearse_exact(root: str, sources: list[SourceSize], instance: dg.DagsterInstance) -> dict[str, Any]:
    """exact_duplicates as its step runs it: the current normalized outputs found, their shards
    listed, ``find_exact_duplicates`` (maps of 16 shards, reduces of an id range over every map
    file, publishes of 16 sources), the documents per source from the maps' counters."""
    seen = {"tasks": 0, "spec": 0, "inputs": 0}

    def body(context: Any) -> None:
        find_current_outputs(sources)
        shards = {src.name: shard_names(root, specs.NORMALIZED.name, src) for src in sources}
        stats = exact.find_exact_duplicates(shards, f"{root}/exact", ExactDedupParams(), runner=DryRunner(exact_answer, seen, progress=step_progress()))
        assert sum(stats["docs_per_source"].values()) == DOCS_PER_SHARD * sum(src.shards for src in sources)

    global_step(instance, specs.EXACT_DUPLICATES.name, body, seen)
    return seen


def sample_answer(task: ShardTask) -> dict[str, Any]:
    """topic_model's sample tasks: a part as a sample task writes it (1-dim vectors, empty ids),
    and the real task that puts parts together."""
    if task.fn is topics.concat_sample_parts:
        return topics.concat_sample_parts(list(task.inputs), task.output)
    q = sum(p[2] for p in task.params.picks)
    buf = io.BytesIO()
    np.savez(buf, vectors=np.ones((q, 1), np.float16), ids=np.zeros(q, "S32"), rows=np.zeros(q, np.int64))
    local_path(task.output).write_bytes(buf.getvalue())
    return {"rows": q}


def embedded_sources(embedded: dict[str, stages.StageInput], root: str) -> list[topics.SourceShards]:
    """The step's view of each source: embeddings shards and row counts from the manifests, the
    normalized shards of the same names for the labels."""
    shards = []
    for name, inp in embedded.items():
        uris, per_shard = stages.shards_of(inp)
        texts = tuple(storage.join(root, specs.NORMALIZED.name, name, storage.basename(u)) for u in uris)
        shards.append(topics.SourceShards(name, tuple(uris), texts, rows=tuple(s["rows"] for s in per_shard)))
    return shards


def text_answer(task: ShardTask) -> dict[str, Any]:
    """The labels' text tasks: a part as a text task writes it (a short text per row), and the
    real task that puts parts together."""
    if task.fn is topics.concat_text_parts:
        return topics.concat_text_parts(list(task.inputs), task.output)
    texts = [f"words of topic {r % 97} and more" for _, _, rows, _ in task.params.picks for r in rows]
    local_path(task.output).write_text(json.dumps(texts))
    return {"rows": len(texts)}


def rehearse_topic_labels(root: str, sources: list[SourceSize], instance: dg.DagsterInstance) -> dict[str, Any]:
    """topic_model's labels on the full pool's sample (drawn before the step, as the sample row
    measures it): c-TF-IDF over 10^5 sample texts plus each topic's nearest excerpts, the texts
    read by tasks from the ~10^5 normalized shards that hold them. The fit itself (k-means on the
    sample) is the step's own CPU, sized by its pod, and is not run here."""
    seen = {"tasks": 0, "spec": 0, "inputs": 0}
    params = topics.TopicParams()
    embedded = {src.name: per_shard_output(root, specs.EMBEDDINGS.name, src) for src in sources}
    shards = embedded_sources(embedded, root)
    sample = topics.sample_embeddings(shards, params, DryRunner(uncounted(sample_answer), {"tasks": 0, "spec": 0, "inputs": 0}), f"{root}/labels/_sample")
    n_topics = params.n_topics
    model = topics.TopicModel(np.ones((n_topics, 1), np.float32), np.arange(n_topics, dtype=np.int16), np.ones(n_topics, np.int64), [], {})
    topic_of_row = np.random.default_rng(0).integers(0, n_topics, len(sample))

    def body(context: Any) -> None:
        runner = DryRunner(uncounted(text_answer), seen, progress=step_progress())
        topics.label_topics(sample, topic_of_row, model, params, runner, f"{root}/labels/_texts")

    global_step(instance, specs.TOPIC_MODEL.name, body, seen)
    return seen


NOT_MEASURED = {
    "fuzzy_duplicates": "its task specs are being changed to name manifests; the run's many steps read back state files of their own",
    "sampling_groups": "reads each pool's shard index, whose layout pool compaction is changing",
    "mixture": "the study launcher submits one training run per swarm member: no per-shard driver",
}


def rehearse_global_stages(root: str, sources: list[SourceSize], instance: dg.DagsterInstance) -> dict[str, dict[str, Any]]:
    return {"exact_duplicates": rehearse_exact(root, sources, instance), "topic_model labels": rehearse_topic_labels(root, sources, instance)}
