"""Step 1, the sample: rows per source and per shard (largest remainder), drawn by tasks that
read only the row groups holding them, so the step never holds the sample nor reads the corpus."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from marin_assets.core.embed.embeddings import vectors_from_table
from marin_assets.core.embed.topics import layout
from marin_assets.core.embed.topics.layout import SourceShards, TopicParams
from marin_assets.core.runtime import storage


def largest_remainder(total: int, weights: Sequence[float], caps: Sequence[int] | None = None) -> list[int]:
    """Split ``total`` into integers proportional to ``weights``, each at most its cap.

    Floors first, then the leftover units go to the largest fractional parts (ties: lower
    index). A share cut by its cap is redistributed over the others.
    """
    n = len(weights)
    caps_arr = np.asarray(caps if caps is not None else [total] * n, dtype=np.int64)
    w = np.asarray(weights, dtype=np.float64)
    out = np.zeros(n, dtype=np.int64)
    free = np.ones(n, dtype=bool) & (w > 0) & (caps_arr > 0)
    budget = int(min(total, caps_arr[free].sum())) if free.any() else 0
    while budget > 0 and free.any():
        idx = np.flatnonzero(free)
        ideal = budget * w[idx] / w[idx].sum()
        share = np.floor(ideal).astype(np.int64)
        leftover = budget - int(share.sum())
        order = np.lexsort((idx, -(ideal - share)))[:leftover]
        share[order] += 1
        over = share > caps_arr[idx] - out[idx]
        if not over.any():
            out[idx] += share
            break
        capped = idx[over]
        budget -= int((caps_arr[capped] - out[capped]).sum())
        out[capped] = caps_arr[capped]
        free[capped] = False
    return out.tolist()


def source_quotas(row_counts: Mapping[str, int], sample_size: int, small_source_rows: int = 1_000) -> dict[str, int]:
    """Rows to sample per source: proportional to size, one row for a small source."""
    total = sum(row_counts.values())
    if total <= sample_size:
        return dict(row_counts)
    names = sorted(row_counts)
    small = [s for s in names if 0 < row_counts[s] <= small_source_rows]
    large = [s for s in names if row_counts[s] > small_source_rows]
    quotas = {s: 0 for s in names} | {s: 1 for s in small}
    budget = max(sample_size - len(small), 0)
    shares = largest_remainder(budget, [row_counts[s] for s in large], [row_counts[s] for s in large])
    quotas.update(zip(large, shares))
    return quotas


def shard_seed(seed: int, source: str, shard_uri: str) -> int:
    """Per-shard generator seed: independent of other shards and of the storage root."""
    digest = hashlib.sha256(f"{seed}:{source}:{storage.basename(shard_uri)}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def read_rows(uri: str, rows: np.ndarray, columns: Sequence[str]) -> pa.Table:
    """Rows ``rows`` (sorted positions) of a Parquet file, reading only the row groups that hold them.

    A 10M-row sample out of 10^10 documents touches a small part of each shard; reading whole
    shards would make the sample cost the corpus.
    """
    rows = np.asarray(rows, dtype=np.int64)
    fs, path = storage.filesystem(uri)
    with storage.reading_parquet(uri), fs.open(path, "rb") as handle:
        parquet = storage.parquet_file(handle)
        meta = parquet.metadata
        sizes = np.array([meta.row_group(g).num_rows for g in range(meta.num_row_groups)], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(sizes)])
        group_of = np.searchsorted(starts, rows, side="right") - 1
        groups = np.unique(group_of).tolist()
        if not groups:
            return parquet.schema_arrow.empty_table().select(list(columns))
        table = parquet.read_row_groups(groups, columns=list(columns))
    offsets = np.concatenate([[0], np.cumsum(sizes[groups])])
    local = offsets[np.searchsorted(groups, group_of)] + (rows - starts[group_of])
    return table.take(pa.array(local, pa.int64()))


@dataclasses.dataclass
class EmbeddingSample:
    """Sampled rows: unit vectors (float16 to halve memory), where each row came from, its id."""

    vectors: np.ndarray
    ids: np.ndarray  # bytes (S32)
    source: np.ndarray  # index into sources
    shard: np.ndarray  # index into shards
    row: np.ndarray  # row within its shard
    sources: list[SourceShards]
    shards: list[tuple[int, str, str | None]]  # (source index, embeddings uri, text uri)

    def __len__(self) -> int:
        return len(self.row)


def float32_batches(vectors: np.ndarray, batch_rows: int):
    """float32 batches of ``vectors``, so memory stays bounded."""
    for start in range(0, len(vectors), batch_rows):
        yield np.ascontiguousarray(vectors[start : start + batch_rows], dtype=np.float32)


@dataclasses.dataclass(frozen=True)
class SampleParams:
    seed: int
    picks: tuple[tuple[str, int, int], ...]  # per input shard: its source, its rows, rows to draw


def sample_shards(input_uris: list[str], output_uri: str, params: SampleParams) -> dict[str, Any]:
    """A task: the sampled rows of a chunk of embedding shards (each read only in the row groups
    that hold them), stored as ``.npz`` (float16 vectors, ids, row numbers) at ``output_uri``."""
    vectors, ids, rows_drawn = [], [], []
    for uri, (source, n, q) in zip(input_uris, params.picks, strict=True):
        rng = np.random.default_rng(shard_seed(params.seed, source, uri))
        rows = np.sort(rng.choice(n, size=q, replace=False))
        table = read_rows(uri, rows, ["id", "embedding"])
        vectors.append(vectors_from_table(table).astype(np.float16))
        ids.append(np.asarray(table.column("id").to_pylist(), dtype="S32"))
        rows_drawn.append(rows.astype(np.int64))
    buf = io.BytesIO()
    np.savez(buf, vectors=np.concatenate(vectors), ids=np.concatenate(ids), rows=np.concatenate(rows_drawn))
    storage.write_bytes(output_uri, buf.getvalue())
    return {"rows": int(sum(len(r) for r in rows_drawn))}


def concat_sample_parts(input_uris: list[str], output_uri: str, params: None = None) -> dict[str, Any]:
    """A task: sample parts (``.npz``) put together in order, stored at ``output_uri``."""
    parts = [np.load(io.BytesIO(storage.read_bytes(uri)), allow_pickle=False) for uri in input_uris]
    buf = io.BytesIO()
    np.savez(buf, **{key: np.concatenate([part[key] for part in parts]) for key in ("vectors", "ids", "rows")})
    storage.write_bytes(output_uri, buf.getvalue())
    return {"rows": int(sum(len(part["rows"]) for part in parts))}


def load_sample_parts(uris: Sequence[str], n_rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(vectors, ids, rows) of ``n_rows`` sample rows from their parts, in order: each part read
    into arrays made once, so the sample is held once, not once more while it is put together."""
    vectors = ids = rows = None
    at = 0
    for uri in uris:
        part = np.load(io.BytesIO(storage.read_bytes(uri)), allow_pickle=False)
        if vectors is None:
            vectors = np.empty((n_rows, part["vectors"].shape[1]), dtype=part["vectors"].dtype)
            ids, rows = np.empty(n_rows, dtype=part["ids"].dtype), np.empty(n_rows, dtype=np.int64)
        n = len(part["rows"])
        vectors[at : at + n], ids[at : at + n], rows[at : at + n] = part["vectors"], part["ids"], part["rows"]
        at += n
    if vectors is None or at != n_rows:
        raise ValueError(f"the sample's parts hold {at} rows, {n_rows} were drawn; rerun topic_model (its sample is redrawn)")
    return vectors, ids, rows


def _shards_and_rows(sources: Sequence[SourceShards]) -> tuple[list[tuple[int, str, str | None]], list[int]]:
    shard_list: list[tuple[int, str, str | None]] = []
    shard_rows: list[int] = []
    for si, src in enumerate(sources):
        if src.texts and len(src.texts) != len(src.embeddings):
            raise ValueError(
                f"source {src.source}: {len(src.embeddings)} embedding shards but {len(src.texts)} normalized "
                "shards; they must be co-partitioned (rebuild the embeddings for this source)"
            )
        text_by_name = {storage.basename(u): u for u in src.texts}
        for k, uri in enumerate(src.embeddings):
            text_uri = text_by_name.get(storage.basename(uri)) if src.texts else None
            if src.texts and text_uri is None:
                raise ValueError(
                    f"source {src.source}: embedding shard {uri} has no normalized shard of the same name; "
                    "rebuild the embeddings for this source"
                )
            shard_list.append((si, uri, text_uri))
            shard_rows.append(src.rows[k] if len(src.rows) == len(src.embeddings) else storage.parquet_num_rows(uri))
    return shard_list, shard_rows


@dataclasses.dataclass(frozen=True)
class SamplePlan:
    """Where the sample's rows come from, by runs: ``pick_rows[i]`` rows of shard ``pick_shard[i]``,
    in source order, then shard order (the order of the rows in the parts); nothing per row."""

    sources: list[SourceShards]
    shards: list[tuple[int, str, str | None]]  # (source index, embeddings uri, text uri)
    shard_rows: list[int]
    pick_shard: np.ndarray
    pick_rows: np.ndarray

    @property
    def rows(self) -> int:
        return int(self.pick_rows.sum())

    def source_rows(self) -> list[int]:
        """Rows drawn per source, in source order (each source's rows follow each other)."""
        of_pick = np.asarray([self.shards[k][0] for k in self.pick_shard.tolist()], dtype=np.int64)
        return np.bincount(of_pick, weights=self.pick_rows, minlength=len(self.sources)).astype(np.int64).tolist()

    def shard_of(self, index: np.ndarray) -> np.ndarray:
        """The shard (index into ``shards``) of sample rows ``index``."""
        return self.pick_shard[np.searchsorted(np.cumsum(self.pick_rows), index, side="right")]


def plan_sample(sources: Sequence[SourceShards], params: TopicParams) -> SamplePlan:
    """Rows to draw per shard (step 1): per source in proportion to its rows, per shard within it."""
    shard_list, shard_rows = _shards_and_rows(sources)
    per_source = {src.source: 0 for src in sources}
    for (si, _, _), n in zip(shard_list, shard_rows):
        per_source[sources[si].source] += n
    quotas = source_quotas(per_source, params.sample_size, params.small_source_rows)
    picks: list[tuple[int, int]] = []  # (shard index, rows to draw) in source order, then shard order
    for si, src in enumerate(sources):
        members = [k for k, (s, _, _) in enumerate(shard_list) if s == si]
        counts = [shard_rows[k] for k in members]
        picks += [(k, q) for k, q in zip(members, largest_remainder(quotas[src.source], counts, counts)) if q]
    if not picks:
        names = ", ".join(s.source for s in sources) or "none"
        raise ValueError(f"no embedded documents to train topics on (sources: {names}); materialize embeddings first")
    pick_shard, pick_rows = (np.asarray(column, dtype=np.int64) for column in zip(*picks))
    return SamplePlan(list(sources), shard_list, shard_rows, pick_shard, pick_rows)


def draw_sample(plan: SamplePlan, seed: int, runner: Any, work_uri: str) -> list[str]:
    """The sample's parts on storage, in row order: rows drawn by tasks of ``SHARDS_PER_SAMPLE_TASK``
    shards on ``runner``, their parts put together ``PARTS_PER_COMBINE_TASK`` at a time by tasks."""
    from marin_assets.core.runtime.runner import ShardTask, combined_by_tasks  # noqa: PLC0415

    picks, step = list(zip(plan.pick_shard.tolist(), plan.pick_rows.tolist())), layout.SHARDS_PER_SAMPLE_TASK
    chunks = [picks[i:i + step] for i in range(0, len(picks), step)]
    tasks = [
        ShardTask(sample_shards, tuple(plan.shards[k][1] for k, _ in chunk), storage.join(work_uri, f"part-{c:06d}.npz"),
                  SampleParams(seed, tuple((plan.sources[plan.shards[k][0]].source, plan.shard_rows[k], q) for k, q in chunk)))
        for c, chunk in enumerate(chunks)
    ]  # fmt: skip
    parts = [r.output for r in runner.map(tasks)]
    return combined_by_tasks(parts, storage.join(work_uri, "combined"), concat_sample_parts, None, runner, layout.PARTS_PER_COMBINE_TASK)


def sample_embeddings(sources: Sequence[SourceShards], params: TopicParams, runner: Any = None, work_uri: str = "") -> EmbeddingSample:
    """The whole training sample in this process, with where each row came from (tests and
    benchmarks; the step never holds it): drawn by tasks on ``runner`` (in this process when
    None), then read."""
    from marin_assets.core.runtime.runner import ShardRunner  # noqa: PLC0415

    plan = plan_sample(sources, params)
    work = work_uri or tempfile.mkdtemp(prefix="topic-sample-")
    vectors, ids, rows = load_sample_parts(draw_sample(plan, params.seed, runner or ShardRunner(), work), plan.rows)
    storage.remove(work, recursive=True)  # read: the parts are not needed again
    index = np.arange(plan.rows)
    return EmbeddingSample(
        vectors=vectors,
        ids=ids,
        source=np.repeat(np.arange(len(sources), dtype=np.int32), plan.source_rows()),
        shard=plan.shard_of(index).astype(np.int32),
        row=rows,
        sources=list(sources),
        shards=plan.shards,
    )
