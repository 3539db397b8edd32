"""`make rehearse`, the global stages: each one's step code at the full pool's counts inside a real
Dagster step, its tasks answered by a dry runner (``bench/rehearse_kit.py``) with the counters such
a task returns, and the small metadata the step reads back (per-shard manifests, the topic fit
task's output) written where the step looks for it, uncounted, as the upstream steps and the tasks
would write it. One task is run for real: topic_model's fit (``measure_fit``), which holds the
sample, at two reduced sample sizes of the production dimension, projected to the pool's sample.
"""

from __future__ import annotations

import ctypes
import dataclasses
import gc
import io
import json
import math
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import dagster as dg
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench import slow_store
from bench.harness import MIB
from bench.rehearse_kit import (
    DOCS_PER_SHARD,
    SHARD_BYTES,
    DryRunner,
    SourceSize,
    global_step,
    shard_names,
)
from marin_assets.core import specs
from marin_assets.core.dedup import exact, fanin, manifest, shuffle, star_rounds
from marin_assets.core.dedup.decisions import ExactDedupParams
from marin_assets.core.dedup.fuzzy.layout import RANK_SHIFT
from marin_assets.core.embed import quality, topics
from marin_assets.core.mixture import swarm
from marin_assets.core.pool import curated, groups
from marin_assets.core.runtime import stages, storage
from marin_assets.core.runtime.runner import WORKER_ENV, ShardTask
from marin_assets.defs.ray import step_progress


def local_path(uri: str) -> Path:
    """Where the counting store keeps ``uri``: what an upstream step or a task wrote is put there directly (uncounted)."""
    path = Path(slow_store.SlowStore._strip_protocol(uri))
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def per_shard_output(root: str, stage: str, src: SourceSize) -> stages.StageInput:
    """A per-shard stage's finished output for ``src`` as ``run_shards`` records it: a manifest
    naming every shard with its counters (its rows)."""
    uri = storage.join(root, stage, src.name)
    names = [storage.shard_name(i, src.shards) for i in range(src.shards)]
    per_shard = [{"rows": DOCS_PER_SHARD}] * src.shards
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
    if task.fn is fanin.merge_files:
        return {"rows": 0, "files": manifest.count(task.inputs), "spans": 1}
    if task.fn is fanin.index_files:
        return {"files": manifest.count(task.inputs), "blocks": 0}
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
    """topic_model's sample tasks: the rows they return. Nothing is written: only the fit task
    reads the parts, and it is answered too (the step reads no count from the combining tasks)."""
    if task.fn is topics.concat_sample_parts:
        return {"rows": 0}
    return {"rows": sum(p[2] for p in task.params.picks)}


def fit_answer(task: ShardTask) -> dict[str, Any]:
    """The fit task's output at the pool's counts, as the step reads it back: the model's arrays
    (5,000 fine centroids of 1,024 dimensions in 40 topics) and 10^5 + 200 label rows (their
    numbers among the 10^7, topics, ids, rows in their shards, each topic's 5 nearest); its stats."""
    p, n = task.params.topic, task.params.rows
    rng = np.random.default_rng(0)
    centroids = rng.normal(size=(p.k_fine, 1024)).astype(np.float32)
    fine_to_topic = (np.arange(p.k_fine) % p.n_topics).astype(np.int16)
    model = topics.TopicModel(centroids / np.linalg.norm(centroids, axis=1, keepdims=True), fine_to_topic, np.full(p.k_fine, n // p.k_fine), [], {})
    topics.save_topic_arrays(model, task.output)
    near = p.n_topics * p.label_excerpts
    index = np.sort(rng.choice(n, p.label_sample_size + near, replace=False))
    buf = io.BytesIO()
    np.savez(buf, index=index, topic=rng.integers(0, p.n_topics, len(index)), ids=np.array([b"%032x" % i for i in index.tolist()], "S32"),
             rows=rng.integers(0, DOCS_PER_SHARD, len(index)), nearest=rng.choice(index, near, replace=False),
             nearest_counts=np.full(p.n_topics, p.label_excerpts))  # fmt: skip
    storage.write_bytes(storage.join(task.output, topics.LABEL_ROWS), buf.getvalue())
    return {"sample_rows": n, "method": p.method, "train_rows": p.k_fine * p.points_per_centroid, "k_fine": p.k_fine, "n_topics": p.n_topics}


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


def topic_model_answer(task: ShardTask) -> dict[str, Any]:
    if task.fn in (topics.sample_shards, topics.concat_sample_parts):
        return sample_answer(task)
    return fit_answer(task) if task.fn is topics.fit_topics else text_answer(task)


def rehearse_topic_model(root: str, sources: list[SourceSize], instance: dg.DagsterInstance) -> dict[str, Any]:
    """topic_model as its step runs it: the current embeddings and normalized outputs found, the
    shards and the sample's quotas from the embeddings manifests, the 10^7 rows drawn by tasks and
    their parts put together by tasks, the fit task (which holds the sample: ``measure_fit``), its
    model and 10^5 label rows read back, their texts read by tasks from the ~10^5 normalized shards
    that hold them, c-TF-IDF over them, the model saved."""
    seen = {"tasks": 0, "spec": 0, "inputs": 0}
    embedded = {src.name: per_shard_output(root, specs.EMBEDDINGS.name, src) for src in sources}

    def body(context: Any) -> None:
        find_current_outputs(sources)  # embeddings, then normalized
        find_current_outputs(sources)
        runner = DryRunner(uncounted(topic_model_answer), seen, progress=step_progress())
        stats = topics.train_topic_model(embedded_sources(embedded, root), f"{root}/topic_model", topics.TopicParams(), runner)
        assert sum(stats["sample_rows_per_source"].values()) == topics.TopicParams().sample_size

    global_step(instance, specs.TOPIC_MODEL.name, body, seen)
    return seen


def compacted_index(root: str, src: SourceSize) -> str:
    """A source's compacted pool index as pool compaction leaves it: per group, one merged file
    per ``group_file_tokens`` tokens or ``max_files_per_task`` shards (4 bytes of text a token)."""

    params, names = curated.CompactParams(), quality.all_groups()
    tokens = src.shards * SHARD_BYTES // 4 // len(names)
    per_group = max(1, -(-tokens // params.group_file_tokens), -(-src.shards // params.max_files_per_task))
    rows = [(g, f"{g}/{curated.source_slug(src.name)}-{k:05d}.parquet") for g in names for k in range(per_group)]
    n = len(rows)
    table = pa.table([pa.array([g for g, _ in rows]), pa.array([f for _, f in rows]), pa.array([src.name] * n),
                      pa.array([src.shards * DOCS_PER_SHARD // n] * n, pa.int64()), pa.array([tokens // per_group] * n, pa.int64())],
                     schema=curated.INDEX_SCHEMA)  # fmt: skip
    index_dir = storage.join(root, specs.POOL.name, src.name)
    pq.write_table(table, local_path(storage.join(index_dir, curated.GROUP_FILES)))
    return index_dir


def rehearse_sampling_groups(root: str, sources: list[SourceSize], instance: dg.DagsterInstance) -> dict[str, Any]:
    """sampling_groups as its step runs it: per source, the current pool and the four inputs its
    staleness check reads (their ``_current.json`` and manifests) and the pool's manifest, then
    each compacted index read once into the counts and the pool's file list, the groups and
    their weights written."""
    seen = {"tasks": 0, "spec": 0, "inputs": 0}
    index_dirs = {src.name: compacted_index(root, src) for src in sources}
    out = storage.join(root, specs.SAMPLING_GROUPS.name)

    def body(context: Any) -> None:
        for _ in range(5):  # the pool, then normalized, topics, quality_scores, contamination
            find_current_outputs(sources)
        for _ in sources:  # the pool's manifest (its counters)
            for kind in ("stat", "get"):
                slow_store.SlowStore.request(kind)
        per_source = [(name, curated.pool_index_uris(d), storage.join(root, "pool_data", name)) for name, d in sorted(index_dirs.items())]
        counts = curated.group_counts_and_files(per_source, storage.join(out, "pool_files.parquet"))
        result = groups.sampling_groups(counts, {t: f"topic {t}" for t in range(40)}, groups.MixtureParams())
        groups.write_sampling_groups(result, out)

    global_step(instance, specs.SAMPLING_GROUPS.name, body, seen)
    return seen


def rehearse_mixture(root: str, sources: list[SourceSize], instance: dg.DagsterInstance) -> dict[str, Any]:
    """mixture_swarm of a study with the default parameters (64 mixtures and 4 replicate runs)
    on the sampling groups and pool file list that sampling_groups wrote: the proposals, then
    one trainer config per run (JSON and YAML), each naming its groups' pool files."""
    seen = {"tasks": 0, "spec": 0, "inputs": 0}
    out = storage.join(root, specs.SAMPLING_GROUPS.name)

    def body(context: Any) -> None:
        table, _ = groups.read_sampling_groups(out)
        pool_files = curated.read_pool_files(storage.join(out, "pool_files.parquet"))
        params = swarm.StudyParams("rehearsal", trainer="external")
        built = swarm.build_swarm(table, pool_files, params, storage.join(root, "studies", "results"))
        swarm.write_swarm(built, storage.join(root, "studies", "swarm"), pool_files)

    global_step(instance, specs.MIXTURE_SWARM.name, body, seen)
    return seen


@dataclasses.dataclass(frozen=True)
class FuzzyPool:
    """What fuzzy dedup's tasks find in the pool, assumed (the text is not there to find it):
    a share of the documents in clusters of about ``cluster_size``, ``edges_per_member`` star
    edges each, components converging after ``rounds`` large-star rounds, and a few verify
    partitions holding giant clusters (boilerplate) whose texts every gather task streams."""

    sources: tuple[tuple[str, int], ...]  # (name, shards), in the run's source order
    clustered_share: float = 0.15
    cluster_size: int = 3
    edges_per_member: int = 2
    rounds: int = 4
    big_parts: int = 4
    chars_per_doc: int = SHARD_BYTES // DOCS_PER_SHARD

    @property
    def shards(self) -> int:
        return sum(n for _, n in self.sources)

    @property
    def clustered(self) -> int:
        return int(self.shards * DOCS_PER_SHARD * self.clustered_share)

    @property
    def removed(self) -> int:
        return self.clustered - self.clustered // self.cluster_size

    def requested_runs(self) -> list[list[int]]:
        """A plan task's requested nodes' ranges (``fuzzy_plan``: at most 64): its label range's
        members lie densely in every source, so each source's nodes are one range, and the
        smallest gaps between sources are closed until 64 remain."""
        runs = [[rank << RANK_SHIFT, (rank << RANK_SHIFT) + n * DOCS_PER_SHARD] for rank, (_, n) in enumerate(self.sources)]
        gaps = sorted(range(1, len(runs)), key=lambda i: runs[i][0] - runs[i - 1][1])[: max(0, len(runs) - 64)]
        for i in sorted(gaps, reverse=True):  # close a gap: a range takes in the next one
            runs[i - 1][1] = runs.pop(i)[1]
        return runs


def fuzzy_answer(pool: FuzzyPool) -> Any:
    """Each fuzzy task's counters as the task returns them, sized by its share of the pool (a
    key range's share of the key space, a group's of the shards); nothing is written."""
    from marin_assets.core.dedup.fuzzy import edges, gather, map as fuzzy_map, members, plan, publish, verify  # noqa: PLC0415

    runs, key_space, shards = pool.requested_runs(), shuffle.KEY_SPACE, pool.shards
    ranks = range(len(pool.sources))

    def share(params: Any) -> float:
        return (params.hi - params.lo) / key_space

    def star(task: ShardTask) -> dict[str, Any]:
        p = task.params
        if p.mode == "labels":
            return {"nodes": pool.clustered // p.partitions, "rows_held": 0, "rows_read": 0}
        rnd = int(task.output.rsplit("round-", 1)[1][:3])
        edges_in = 2 * pool.edges_per_member * pool.clustered // p.partitions
        return {"edges_in": edges_in, "rows_held": edges_in, "rows_read": edges_in} | ({"unconverged": int(rnd + 1 < pool.rounds) * edges_in // 100} if p.mode == "large" else {})

    def verified(task: ShardTask) -> dict[str, Any]:
        docs = int(pool.clustered * share(task.params))
        removed = docs - docs // pool.cluster_size
        per_rank = {str(r): removed * n // shards for r, (_, n) in zip(ranks, pool.sources)}
        example = {"source": pool.sources[0][0], "id": "0" * 32, "representative_source": pool.sources[-1][0], "representative_id": "1" * 32,
                   "containment": 0.9, "jaccard": 0.8, "excerpt": "x" * 240, "representative_excerpt": "y" * 240}  # fmt: skip
        return {"verified_clusters": docs // pool.cluster_size, "verified_members": docs, "streamed_clusters": 0, "comparisons": 2 * docs,
                "exempt_kept": 0, "spilled_bytes": 0, "largest_index_bytes": 1 << 20, "reused_clusters": 0, "replayed_clusters": 0,
                "replay_failed": 0, "clusters": docs // pool.cluster_size, "clustered_docs": docs, "largest_cluster": 10_000,
                "histogram": {"2": docs // 6, "3-4": docs // 8, "5-8": docs // 40, "8193-16384": 1},
                "removed_by_rank": per_rank, "removed_chars_by_rank": {k: v * pool.chars_per_doc for k, v in per_rank.items()},
                "examples": [example | {"_key": [k, 0]} for k in range(5)], "row_changes": None}  # fmt: skip

    def group(task: ShardTask, docs: int) -> dict[str, Any]:
        if task.fn is members.fuzzy_members_group:
            return {"members": docs, "member_chars": docs * pool.chars_per_doc}
        return {"gathered": docs, "shard_read": len(task.params.shards), "streamed": docs // 100, "streamed_parts": [k * task.params.text_blocks // pool.big_parts for k in range(pool.big_parts)], "sections": []}

    def answer(task: ShardTask) -> dict[str, Any]:
        fn, p = task.fn, task.params
        if fn is fuzzy_map.fuzzy_map:
            docs = DOCS_PER_SHARD * len(p.bases)
            first = [(p.slot << RANK_SHIFT) + b for b in p.bases]
            return {"bands": 20, "docs": docs, "chars": docs * pool.chars_per_doc, "records": 20 * docs, "added": 0, "runs": [[[f, f + DOCS_PER_SHARD]] for f in first]}
        if fn is fanin.merge_files or fn is fanin.merge_sorted_files:
            return {"rows": 0, "files": manifest.count(task.inputs), "spans": 1, "row_groups": 0}
        if fn is fanin.index_files:
            return {"files": manifest.count(task.inputs), "blocks": 0}
        if fn is edges.fuzzy_edges:
            return {"records": 20 * shards * DOCS_PER_SHARD // p.tasks, "edges": pool.edges_per_member * pool.clustered // p.tasks, "largest_bucket": 1000}
        if fn is star_rounds.star_round:
            return star(task)
        if fn in (members.fuzzy_members_group, gather.fuzzy_gather_group):
            return group(task, int(pool.clustered * len(p.shards) / shards))
        if fn is plan.fuzzy_plan:
            return {"requested_members": int(pool.clustered * share(p)), "requested_runs": runs}
        if fn is verify.fuzzy_verify:
            return verified(task)
        if fn is publish.fuzzy_removals:
            return {"removed": int(pool.removed * share(p))}
        if fn is publish.fuzzy_publish:
            return {"sources": [{"removed": pool.removed * pool.sources[r][1] // shards, "digest": "0" * 16, "copied": 0} for r in p.ranks]}
        raise AssertionError(f"fuzzy rehearsal: no answer for {fn.__name__}")

    return answer


def rehearse_fuzzy(root: str, sources: list[SourceSize], instance: dg.DagsterInstance) -> dict[str, Any]:
    """fuzzy_duplicates as its step runs it, a full run: both inputs' current outputs found and
    listed (the bucket shards and their rows from the map's manifest), then the whole of
    ``find_fuzzy_duplicates``: pairing, numbering, map, edges, components (star rounds), members,
    plan, gather, verify, removals, publish and the state and scratch collection, every task
    answered with the counters ``FuzzyPool`` sizes. The driver reads back only what it wrote
    itself (the node cuts, the manifests, the state)."""
    from marin_assets.core.dedup.decisions import FuzzyDedupParams  # noqa: PLC0415
    from marin_assets.core.dedup.fuzzy.driver import find_fuzzy_duplicates  # noqa: PLC0415

    seen = {"tasks": 0, "spec": 0, "inputs": 0}
    pool = FuzzyPool(tuple((src.name, src.shards) for src in sorted(sources, key=lambda s: s.name)))  # the run's source order

    def body(context: Any) -> None:
        find_current_outputs(sources)  # minhash_buckets, then normalized
        find_current_outputs(sources)
        slow_store.SlowStore.request("get")  # the previous run's ``_current.json`` (none: a full run)
        buckets, rows = {}, {}
        for src in sources:  # the map's manifest: its shards and each one's documents, one read
            slow_store.SlowStore.request("get")
            buckets[src.name] = [storage.join(root, specs.MINHASH_BUCKETS.name, src.name, storage.shard_name(i, src.shards)) for i in range(src.shards)]
            rows[src.name] = [DOCS_PER_SHARD] * src.shards
        normalized = {src.name: shard_names(root, specs.NORMALIZED.name, src) for src in sources}
        stats = find_fuzzy_duplicates(buckets, normalized, (), f"{root}/fuzzy/run", FuzzyDedupParams(), runner=DryRunner(fuzzy_answer(pool), seen, progress=step_progress()),
                                      cache_uri=f"{root}/fuzzy/_cache", fingerprints={src.name: f"{i:016x}" for i, src in enumerate(sources)}, bucket_rows=rows)  # fmt: skip
        assert stats["docs"] == DOCS_PER_SHARD * pool.shards and stats["verify_passes"] == 1 and stats["cc_rounds"] == pool.rounds
        seen["removed"] = stats["removed"]

    global_step(instance, specs.FUZZY_DUPLICATES.name, body, seen)
    return seen


FIT_ROWS = (40_000, 160_000)  # the fit task measured at 1/250 and 1/62.5 of the pool's sample
FIT_PARTS = 46  # the pool's sample reaches the fit task in ~46 combined parts
FIT_CHILD = """
import json, pickle, sys
from marin_assets.core.runtime.runner import _run_in_worker
result = _run_in_worker(pickle.loads(open(sys.argv[1], "rb").read()))
print(json.dumps({"peak": result.peak_rss_bytes, "cpu": result.cpu_seconds, "seconds": result.seconds, "stats": result.stats}))
"""


def fit_task_at(work: Path, rows: int) -> ShardTask:
    """The fit task on ``rows`` sample rows of 1,024 dimensions (clustered unit vectors, float16)
    in ``FIT_PARTS`` parts over 146 sources, ``k_fine`` and the label rows scaled with the rows
    (the training subset stays k_fine x 512 = 25.6% of the sample) and 10 topics (fewer fine
    centroids than the 40 topics would make the rows themselves the centroids)."""
    full = topics.TopicParams()
    params = dataclasses.replace(full, sample_size=rows, k_fine=rows * full.k_fine // full.sample_size, n_topics=10,
                                 label_sample_size=rows * full.label_sample_size // full.sample_size)  # fmt: skip
    rng = np.random.default_rng(rows)
    directions = rng.normal(size=(200, 1024)).astype(np.float32)
    parts = []
    for k, n in enumerate(len(p) for p in np.array_split(np.arange(rows), FIT_PARTS)):
        x = directions[rng.integers(0, 200, n)] + rng.normal(scale=0.8, size=(n, 1024)).astype(np.float32)
        buf = io.BytesIO()
        np.savez(buf, vectors=(x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float16),
                 ids=np.array([b"%032x" % i for i in range(n)], "S32"), rows=np.arange(n, dtype=np.int64))  # fmt: skip
        parts.append(str(work / f"fit-{rows}" / f"part-{k:06d}.npz"))
        storage.write_bytes(parts[-1], buf.getvalue())
    source_rows = tuple(len(p) for p in np.array_split(np.arange(rows), 146))
    return ShardTask(topics.fit_topics, tuple(parts), str(work / f"fit-{rows}" / "fit"), topics.FitParams(params, rows, source_rows))


def measure_fit(work: Path) -> bool:
    """The fit task for real (FAISS k-means, coarsening, the label rows) at ``FIT_ROWS``, each in a
    fresh process with a Ray worker's environment: its peak (VmHWM) and CPU, and both projected to
    the pool's 10^7 rows against the task's reservation (``TopicParams.fit_memory_bytes``)."""
    measured = {}
    for rows in FIT_ROWS:
        task_file = work / f"fit-{rows}.pickle"
        task_file.write_bytes(pickle.dumps(fit_task_at(work, rows)))
        env = {**os.environ, **WORKER_ENV, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
        done = subprocess.run([sys.executable, "-c", FIT_CHILD, str(task_file)], env=env, check=True, capture_output=True, text=True)
        measured[rows] = json.loads(done.stdout.strip().splitlines()[-1])
        m, stats = measured[rows], measured[rows]["stats"]
        print(f"rehearse task topic_model fit: {rows:,} rows x 1,024 dimensions ({stats['k_fine']} fine centroids, {stats['train_rows']:,} training rows, "
              f"{stats['n_topics']} topics): peak {m['peak'] / MIB:,.0f} MiB, CPU {m['cpu']:.1f} s ({m['seconds']:.1f} s wall)", flush=True)  # fmt: skip
    (small, a), (large, b) = sorted(measured.items())
    per_row = (b["peak"] - a["peak"]) / (large - small)
    full = topics.TopicParams()
    peak = b["peak"] + per_row * (full.sample_size - large)
    exponent = math.log(b["cpu"] / a["cpu"]) / math.log(large / small)
    cpu_hours = b["cpu"] * (full.sample_size / large) ** 2 / 3600
    ok = peak <= full.fit_memory_bytes
    print(f"rehearse task topic_model fit at {full.sample_size:,} rows x 1,024 (projected: {per_row:,.0f} bytes a row from {small:,} to {large:,} rows): "
          f"peak {peak / 2**30:.1f} GiB, its reservation {full.fit_memory_bytes / 2**30:.0f} GiB {'PASS' if ok else 'MISS'}; CPU {cpu_hours:,.0f} CPU-hours "
          f"(projected as training rows x fine centroids, (10^7 / {large:,})^2; measured growth n^{exponent:.2f}; FAISS threads {full.threads})", flush=True)  # fmt: skip
    return ok


NOT_MEASURED: dict[str, str] = {}  # stage -> why its driver is not rehearsed (none now)


def released() -> None:
    """What earlier rehearsals freed, handed back to the system (a step's peak starts from what
    the process holds: without this, the heap an earlier stage left behind would count as this one's)."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)


FUZZY_DRIVER_PEAK_MIB = 1536  # the fuzzy driver's goal, at the pool's shards and at twice them


def rehearse_fuzzy_doubled(root: str, sources: list[SourceSize], instance: dg.DagsterInstance) -> dict[str, Any]:
    """fuzzy_duplicates at twice the pool's shards (every source twice its size): its driver
    holds no more than its goal there too."""
    return rehearse_fuzzy(f"{root}/doubled", [dataclasses.replace(s, shards=2 * s.shards) for s in sources], instance)


FUZZY_ROWS = {"fuzzy_duplicates": rehearse_fuzzy, "fuzzy_duplicates (2x shards)": rehearse_fuzzy_doubled}


def rehearse_global_stages(root: str, sources: list[SourceSize], instance: dg.DagsterInstance, only: tuple[str, ...] = ()) -> dict[str, dict[str, Any]]:
    """Each global stage's row (``only``: those rows), each started on a process that has handed
    back what the stages before it freed."""
    stages_ = {"exact_duplicates": rehearse_exact, **FUZZY_ROWS, "sampling_groups": rehearse_sampling_groups,
               "mixture_swarm": rehearse_mixture, "topic_model": rehearse_topic_model}  # fmt: skip
    rows = {}
    for name, rehearse in stages_.items():
        if only and name not in only:
            continue
        released()
        rows[name] = rehearse(root, sources, instance)
    return rows
