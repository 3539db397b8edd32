"""The curated pool: every surviving document of a source, filed under its sampling group.

Per normalized shard, joined with its co-partitioned attributes (topics, quality scores,
contamination, token counts) and the source's sparse duplicate lists, documents are dropped in
this order, each drop counted once under the first reason that applies:

1. contaminated (13-gram overlap with an eval set);
2. verified near-duplicate, unless the source is fuzzy-exempt (then counted as exempted);
3. exact duplicate of a document kept in another source;
4. bad rows: no text, or no topic or score (counted, never silently lost).

A survivor gets its band within its topic from the global band edges and its token count from
the shard's token counts (:mod:`.tokens`: counted once, so the pool tokenizes nothing), and is
written to ``<pool dir>/<group>/<source slug>-<shard basename>`` with ``id``, ``text``,
``source``, ``source_id``, ``topic``, ``band``, ``score``, ``tokens``. The shard's *index*
(group, file, documents, tokens), written last at the task's output URI, says which group files
the shard produced. Output files depend only on the inputs, so a rerun rewrites identical files,
and the runner's per-shard marker makes a resumed run skip finished shards. After the map, :func:`compact_pool` merges a source's group files into a bounded number
per group, indexed in ``group_files.parquet`` (what the sampling groups are counted from).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from marin_assets.core.embed.quality import BandEdges, all_groups, band_of, group_name, load_band_edges
from marin_assets.core.pool.tokens import TOKENIZER_KEY, tokenizer_calls
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.integrity import check_text_ids
from marin_assets.errors import BadInput

INDEX_SCHEMA = pa.schema(
    [("group", pa.string()), ("file", pa.string()), ("source", pa.string()), ("documents", pa.int64()), ("tokens", pa.int64())]
)


class PoolError(BadInput, RuntimeError):
    """A pool input is missing or inconsistent; the message names the source, the file and the fix."""


# --------------------------------------------------------------------------- per shard


@dataclasses.dataclass(frozen=True)
class PoolParams:
    """One source's pool build.

    ``exact_removed_uri`` / ``fuzzy_removed_uri``: the source's sparse ``removed.parquet`` files
    of the global exact and fuzzy dedup; ``band_edges_uri``: the global band edges;
    ``pool_dir``: where the group folders live.
    """

    source: str
    pool_dir: str
    band_edges_uri: str
    exact_removed_uri: str
    fuzzy_removed_uri: str
    fuzzy_exempt: bool = False
    text_column: str = "text"
    removed_batch_rows: int = 1 << 20
    row_group_size: int = 8_192


def source_slug(source: str) -> str:
    """A file-name-safe form of a source name: ``nemotron_cc_v2/high_quality`` -> ``nemotron_cc_v2__high_quality``."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", source.replace("/", "__"))


def pool_file(group: str, source: str, shard_basename: str) -> str:
    """A group file's path relative to the pool directory."""
    return f"{group}/{source_slug(source)}-{shard_basename}"


@functools.lru_cache(maxsize=4)
def _cached_band_edges(uri: str) -> BandEdges:
    return load_band_edges(uri)


def _overlaps(row_group: Any, column: int, low: str, high: str) -> bool:
    """Whether a row group's ``id`` statistics may hold ids in [low, high] (no statistics: yes)."""
    stats = row_group.column(column).statistics
    if stats is None or not stats.has_min_max:
        return True
    lo, hi = stats.min, stats.max
    lo = lo.decode() if isinstance(lo, bytes) else str(lo)
    hi = hi.decode() if isinstance(hi, bytes) else str(hi)
    return not (hi < low or lo > high)


def _removed_ids_in_shard(removed_uri: str, shard_ids: pa.Array, params: PoolParams, what: str) -> pa.Array:
    """The ids of ``shard_ids`` that a sparse removal list names.

    A normalized shard is one contiguous id range and removal lists are sorted by id, so only
    the row groups whose id statistics overlap the shard's range are read: each shard reads its
    own slice of the list, not the whole list (which would make the pool quadratic in shards).
    Memory stays bounded by one row group plus the shard.
    """
    if not storage.exists(removed_uri):
        raise PoolError(
            f"source {params.source!r}: the {what} removal list {removed_uri} does not exist; "
            f"materialize the {what} dedup asset for all sources first"
        )
    fs, path = storage.filesystem(removed_uri)
    found: list[pa.Array] = []
    if len(shard_ids) == 0:
        return pa.array([], pa.string())
    low, high = pc.min(shard_ids).as_py(), pc.max(shard_ids).as_py()
    with storage.reading_parquet(removed_uri), fs.open(path, "rb") as handle:
        parquet = storage.parquet_file(handle)
        if "id" not in parquet.schema_arrow.names:
            raise PoolError(f"source {params.source!r}: {removed_uri} has no 'id' column; rebuild the {what} dedup output")
        column = parquet.schema_arrow.names.index("id")
        meta = parquet.metadata
        wanted = [g for g in range(meta.num_row_groups) if _overlaps(meta.row_group(g), column, low, high)]
        for batch in parquet.iter_batches(batch_size=params.removed_batch_rows, row_groups=wanted, columns=["id"]):
            ids = batch.column(0)
            hits = ids.filter(pc.is_in(ids, value_set=shard_ids))
            if len(hits):
                found.append(hits)
    return pa.concat_arrays(found) if found else pa.array([], pa.string())


def _null_mask(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Null mask of an Arrow column as a numpy bool array."""
    return pc.is_null(column, nan_is_null=False).to_numpy(zero_copy_only=False).astype(bool)


def _column_names(uri: str) -> list[str]:
    fs, path = storage.filesystem(uri)
    with storage.reading_parquet(uri), fs.open(path, "rb") as handle:
        return list(storage.parquet_file(handle).schema_arrow.names)


def _aligned(ids: pa.ChunkedArray, table: pa.Table, uri: str, normalized_uri: str, source: str, stage: str) -> None:
    # string and large_string (polars writes the latter) hold the same ids
    if len(table) != len(ids) or not table.column("id").cast(pa.large_string()).equals(ids.cast(pa.large_string())):
        raise PoolError(
            f"source {source!r}: {uri} is not row-aligned with {normalized_uri} (different ids or order); "
            f"rebuild the {stage} attribute of this source from its current normalized shards"
        )


def pool_shard(input_uris: list[str], output_uri: str, params: PoolParams) -> dict[str, Any]:
    """Filter one normalized shard, file its survivors by group; write the shard index last.

    Inputs, co-partitioned (same basename): normalized, topics, quality scores, contamination,
    token counts. ``output_uri`` receives the index (``group``, ``file``, ``source``,
    ``documents``, ``tokens``); ``file`` is relative to ``params.pool_dir``.
    """
    if len(input_uris) != 5:
        raise ValueError(f"pool_shard takes normalized, topics, quality, contamination and token count shards, got {input_uris}")
    calls = tokenizer_calls()
    normalized_uri, topics_uri, quality_uri, contamination_uri, tokens_uri = input_uris
    basename = storage.basename(normalized_uri)
    source = params.source
    available = _column_names(normalized_uri)
    for column in ("id", params.text_column):
        if column not in available:
            raise PoolError(f"source {source!r}: {normalized_uri} has no {column!r} column; re-run normalized for this source")
    # Only the pool's columns are read: provider columns can be most of a shard.
    normalized = storage.read_parquet(normalized_uri, columns=[c for c in ("id", params.text_column, "source_id") if c in available])
    ids = normalized.column("id")
    check_text_ids(normalized_uri, ids, normalized.column(params.text_column))
    n = len(ids)
    topics = storage.read_parquet(topics_uri, columns=["id", "topic"])
    scores = storage.read_parquet(quality_uri, columns=["id", "score"])
    contamination = storage.read_parquet(contamination_uri, columns=["id", "contaminated"])
    token_counts = storage.read_parquet(tokens_uri, columns=["id", "tokens"])
    _aligned(ids, topics, topics_uri, normalized_uri, source, "topics")
    _aligned(ids, token_counts, tokens_uri, normalized_uri, source, "token_counts")
    _aligned(ids, scores, quality_uri, normalized_uri, source, "quality_scores")
    _aligned(ids, contamination, contamination_uri, normalized_uri, source, "contamination")

    shard_ids = ids.combine_chunks()
    contaminated_flag = contamination.column("contaminated").to_numpy(zero_copy_only=False)
    unknown_contamination = np.asarray(_null_mask(contamination.column("contaminated")))
    contaminated = np.where(unknown_contamination, False, contaminated_flag).astype(bool)
    fuzzy_hit = pc.is_in(shard_ids, value_set=_removed_ids_in_shard(params.fuzzy_removed_uri, shard_ids, params, "fuzzy")).to_numpy(zero_copy_only=False)
    exact_hit = pc.is_in(shard_ids, value_set=_removed_ids_in_shard(params.exact_removed_uri, shard_ids, params, "exact")).to_numpy(zero_copy_only=False)
    text_col = normalized.column(params.text_column)
    null_text = np.asarray(_null_mask(text_col))
    topic_values = topics.column("topic").to_numpy(zero_copy_only=False).astype(np.float64)
    score_values = scores.column("score").to_numpy(zero_copy_only=False).astype(np.float64)
    missing_attr = ~np.isfinite(topic_values) | ~np.isfinite(score_values) | unknown_contamination

    alive = np.ones(n, dtype=bool)
    counters: dict[str, Any] = {"source": source, "shard": basename, "documents": n}

    def drop(name: str, mask: np.ndarray) -> None:
        hit = alive & mask
        counters[name] = int(hit.sum())
        alive[hit] = False

    drop("dropped_contaminated", contaminated)
    if params.fuzzy_exempt:
        counters["dropped_fuzzy_duplicate"] = 0
        counters["fuzzy_duplicates_exempted"] = int((alive & fuzzy_hit).sum())
    else:
        drop("dropped_fuzzy_duplicate", fuzzy_hit)
    drop("dropped_exact_duplicate", exact_hit)
    drop("bad_rows_null_text", null_text)
    drop("bad_rows_missing_attributes", missing_attr)

    edges = _cached_band_edges(params.band_edges_uri)
    keep = np.flatnonzero(alive)
    topic_kept = topic_values[keep].astype(np.int64)
    if len(keep) and (topic_kept.min() < 0 or topic_kept.max() >= edges.n_topics):
        raise PoolError(
            f"source {source!r}: {topics_uri} has topic ids outside [0, {edges.n_topics}) of the band edges at "
            f"{params.band_edges_uri}; rebuild quality_bands from the current topics"
        )
    score_kept = score_values[keep]
    band = band_of(score_kept, topic_kept, edges)
    tokens = token_counts.column("tokens").to_numpy(zero_copy_only=False)[keep].astype(np.int64)
    has_source_id = "source_id" in normalized.column_names
    if not has_source_id:
        counters["missing_source_id_column"] = True

    def group_rows(take: np.ndarray) -> pa.Table:
        """The pool rows of the survivors ``keep[take]``."""
        rows = pa.array(keep[take], pa.int64())
        return pa.table(
            {
                "id": ids.take(rows),
                "text": text_col.take(rows),
                "source": pa.array([source] * len(take), pa.string()),
                "source_id": normalized.column("source_id").take(rows).cast(pa.string()) if has_source_id else pa.nulls(len(take), pa.string()),
                "topic": pa.array(topic_kept[take], pa.int16()),
                "band": pa.array(band[take], pa.int8()),
                "score": pa.array(score_kept[take], pa.float32()),
                "tokens": pa.array(tokens[take], pa.int32()),
            }
        )
    code = topic_kept * edges.n_bands + band.astype(np.int64)
    order = np.argsort(code, kind="stable")  # within a group, the shard's id order
    index_rows: list[tuple[str, str, str, int, int]] = []
    if len(order):
        sorted_code = code[order]
        starts = np.flatnonzero(np.r_[True, sorted_code[1:] != sorted_code[:-1]])
        ends = np.r_[starts[1:], len(order)]
        for start, end in zip(starts.tolist(), ends.tolist()):
            take = order[start:end]
            group = group_name(int(sorted_code[start]) // edges.n_bands, int(sorted_code[start]) % edges.n_bands)
            relative = pool_file(group, source, basename)
            part = group_rows(take)
            storage.write_parquet(part, storage.join(params.pool_dir, relative), row_group_size=params.row_group_size)
            group_tokens = int(tokens[take].sum())
            index_rows.append((group, relative, source, int(len(take)), group_tokens))
    index = pa.table([pa.array(col, type=f.type) for col, f in zip(zip(*index_rows), INDEX_SCHEMA)], schema=INDEX_SCHEMA) if index_rows else INDEX_SCHEMA.empty_table()
    storage.write_parquet(index, output_uri)
    counters.update(
        kept=int(len(keep)),
        tokens=int(tokens.sum()),
        tokenizer=(token_counts.schema.metadata or {}).get(TOKENIZER_KEY, b"").decode(),
        fuzzy_exempt=params.fuzzy_exempt,
        tokenizer_calls=tokenizer_calls() - calls,
    )
    return counters


# --------------------------------------------------------------------------- group files per source

GROUP_FILES = "group_files.parquet"  # a source's compacted index (INDEX_SCHEMA), next to its shard indexes
_SHARD_NAME = re.compile(r"part-(\d+)-of-(\d+)\.parquet$")


@dataclasses.dataclass(frozen=True)
class CompactParams:
    """How a source's per-shard group files are merged into a bounded number of files per group.

    Planned from names alone: merge task k of a group takes the group files of the source's shards
    ``[k*m, (k+1)*m)`` (``m = max_files_per_task``; a small source's groups share a task, up to
    ``m`` names in all) and writes files of at most ``group_file_tokens`` tokens, counted from the
    rows it streams (memory: one row group whatever the count). A source then has about
    ``tokens in the group / group_file_tokens + shards / m`` files per group, not one per shard.
    """

    group_file_tokens: int = 1 << 28  # ~1 GB of text
    max_files_per_task: int = 1_024
    row_group_size: int = 8_192


def merged_file(group: str, source: str, number: int, part: int = 0) -> str:
    """The merged file of ``group`` from the source's shard range ``number``, relative to the pool
    directory (``part`` > 0: the continuations of a merge whose rows pass the token limit)."""
    return pool_file(group, source, f"group-{number:05d}" + (f"-{part}" if part else "") + ".parquet")


@dataclasses.dataclass(frozen=True)
class ShardGroupFiles(Sequence[str]):
    """A merge's inputs by arithmetic: per group (in order), the group files of the source's shards
    ``first .. stop - 1`` of ``total`` (:func:`pool_file`). A shard with no row in a group has no
    such file. The task spec holds a few names and numbers, however many files."""

    pool_dir: str
    source: str
    groups: tuple[str, ...]
    first: int
    stop: int
    total: int

    def __len__(self) -> int:
        return len(self.groups) * (self.stop - self.first)

    def __iter__(self) -> Iterator[str]:
        for group in self.groups:
            for i in range(self.first, self.stop):
                yield storage.join(self.pool_dir, pool_file(group, self.source, storage.shard_name(i, self.total)))

    def __getitem__(self, index: Any) -> Any:
        return list(self)[index]


@dataclasses.dataclass(frozen=True)
class MergeParams:
    """One merge task: its groups (its inputs are an equal run of names per group, in this order),
    its shard range's number k (which names its files, :func:`merged_file`) and the limits."""

    source: str
    pool_dir: str
    groups: tuple[str, ...]
    number: int
    group_file_tokens: int = 1 << 28
    row_group_size: int = 8_192


def merge_group_files(input_uris: list[str], output_uri: str, params: MergeParams) -> dict[str, Any]:
    """Merged group files from the shard group files that exist among the inputs (names of shards
    without rows in a group are skipped). Returns each merged file (group, file, documents, tokens:
    counted from the rows written); the receipt at ``output_uri`` also names the files read, for
    the deletes that follow once the source's index is written."""
    per_group = len(input_uris) // max(1, len(params.groups))
    merged: list[list[Any]] = []
    read: list[str] = []
    for g, group in enumerate(params.groups):
        name = functools.partial(merged_file, group, params.source, params.number)
        for file, rows, tokens in _merge_group(input_uris[g * per_group : (g + 1) * per_group], name, read, params):
            merged.append([group, file, rows, tokens])
    stats = {"merged": merged, "inputs": len(input_uris), "read": len(read)}
    prefix = params.pool_dir.rstrip("/") + "/"
    storage.write_json(output_uri, {**stats, "read_files": [u.removeprefix(prefix) for u in read]})
    return stats


def _merge_group(uris: Sequence[str], name: Any, read: list[str], params: MergeParams) -> list[tuple[str, int, int]]:
    """One group's rows, in input order, into files of at most ``group_file_tokens`` tokens
    (``name(0)``, ``name(1)``, ...; a single larger document goes alone)."""
    written: list[tuple[str, int, int]] = []
    tables = _row_groups(uris, read)
    rest = next(tables, None)
    while rest is not None:
        relative = name(len(written))
        with _merged_sink(storage.join(params.pool_dir, relative)) as sink:
            rows, tokens, rest = _fill(sink, rest, tables, params)
        written.append((relative, rows, tokens))
    return written


def _row_groups(uris: Sequence[str], read: list[str]) -> Iterator[pa.Table]:
    """The row groups of the files that exist, streamed; those read are appended to ``read``.

    Local files are read through Arrow's native files (the same bytes, without a Python file
    object under every read: a merge takes up to 1,024 small files)."""
    for uri in uris:
        path = storage.local_path(uri)
        with contextlib.ExitStack() as stack:
            try:
                if path is None:
                    fs, remote = storage.filesystem(uri)
                    parquet = storage.parquet_file(stack.enter_context(fs.open(remote, "rb")))
                else:
                    parquet = storage.parquet_file(path)
            except FileNotFoundError:
                continue  # the shard has no row in this group
            read.append(uri)
            for group in range(parquet.metadata.num_row_groups):
                table = parquet.read_row_group(group)
                if len(table):
                    yield table


@contextlib.contextmanager
def _merged_sink(uri: str) -> Iterator[Any]:
    """Where one merged file is written: a native local path or an object's buffer; it appears
    complete or not at all."""
    path = storage.local_path(uri)
    if path is None:
        with storage.open_atomic(uri) as handle:
            yield handle
    else:
        with storage.atomic_local_path(path) as tmp:
            yield tmp


def _fill(sink: Any, table: pa.Table, tables: Iterator[pa.Table], params: MergeParams) -> tuple[int, int, pa.Table | None]:
    """Rows into one merged file until the next would pass the token limit: its rows, its tokens
    and the rows left for the next file (None: the inputs are done)."""
    writer: pq.ParquetWriter | None = None
    rows = tokens = 0
    try:
        while True:
            cumulative = np.cumsum(table.column("tokens").to_numpy(zero_copy_only=False), dtype=np.int64)
            take = max(int(np.searchsorted(cumulative, params.group_file_tokens - tokens, side="right")), 0 if rows else 1)
            if take:
                part = table if take == len(table) else table.slice(0, take)
                if writer is None:
                    writer = pq.ParquetWriter(sink, part.schema, **storage.PARQUET_WRITE_OPTIONS)
                writer.write_table(part.cast(writer.schema), row_group_size=params.row_group_size)
                rows, tokens = rows + take, tokens + int(cumulative[take - 1])
            if take < len(table):
                return rows, tokens, table.slice(take)
            following = next(tables, None)
            if following is None:
                return rows, tokens, None
            table = following
    finally:
        if writer is not None:
            writer.close()


def group_names(band_edges_uri: str) -> list[str]:
    """The sampling groups the band edges make (c00q0 .. c39q4 at the reference 40 topics x 5 bands)."""
    edges = _cached_band_edges(band_edges_uri)
    return all_groups(edges.n_topics, edges.n_bands)


def merge_tasks(source: str, pool_dir: str, index_dir: str, groups: Sequence[str], shards: int, params: CompactParams) -> list[Any]:
    """A source's merges, group by group and shard range by range (no index read): ranges of
    ``m = min(shards, max_files_per_task)`` shards, and ``max_files_per_task // m`` groups a task."""
    from marin_assets.core.runtime.runner import ShardTask  # noqa: PLC0415

    per_range = max(1, min(shards, params.max_files_per_task))
    per_task = max(1, params.max_files_per_task // per_range)
    tasks = []
    for g in range(0, len(groups), per_task):
        chosen = tuple(groups[g : g + per_task])
        for first in range(0, shards, per_range):
            tasks.append(ShardTask(
                merge_group_files,
                ShardGroupFiles(pool_dir, source, chosen, first, min(first + per_range, shards), shards),
                storage.join(index_dir, "_merged", f"{len(tasks):06d}.json"),
                MergeParams(source, pool_dir, chosen, first // per_range, params.group_file_tokens, params.row_group_size),
            ))  # fmt: skip
    return tasks


def shard_count(index_uris: Sequence[str], source: str) -> int:
    """How many shards the source has, from its shards' names (``part-<i>-of-<n>.parquet``)."""
    totals = set()
    for uri in index_uris:
        match = _SHARD_NAME.search(storage.basename(uri))
        if match is None:
            raise PoolError(f"source {source!r}: shard {uri} is not named part-<i>-of-<n>.parquet; re-run normalized for this source")
        totals.add(int(match.group(2)))
    if len(totals) > 1:
        raise PoolError(f"source {source!r}: its shards come from different splits ({sorted(totals)} shards); re-run normalized for this source")
    return totals.pop() if totals else 0


def compact_pool(
    shards: Sequence[Any], index_dir: str, pool_dir: str, source: str, groups: Sequence[str], params: CompactParams, runner: Any
) -> dict[str, Any]:
    """Merge a source's per-shard group files into a bounded number per group and index them.

    ``shards``: the pool map's results (their outputs name the shards; their ``kept`` and
    ``tokens`` counters must equal what the merges count). The merges are planned from names
    (:func:`merge_tasks`) and tasks read the files; the index ``<index_dir>/group_files.parquet``
    (what the sampling groups read) is written from what the merges return, so the step reads no
    shard index. The shard files are removed by tasks only after every merged file and the index
    are written, so a killed run resumes (finished merges and deletes are kept) and never loses rows.
    """
    from marin_assets.core.runtime.runner import ShardTask  # noqa: PLC0415

    tasks = merge_tasks(source, pool_dir, index_dir, groups, shard_count([s.output for s in shards], source), params)
    results = runner.map(tasks)
    merged = [row for result in results for row in result.stats["merged"]]
    counted = (sum(r[2] for r in merged), sum(r[3] for r in merged))
    kept = (sum(int(s.stats.get("kept", 0)) for s in shards), sum(int(s.stats.get("tokens", 0)) for s in shards))
    if counted != kept:
        raise PoolError(
            f"source {source!r}: the merged group files hold {counted[0]:,} documents and {counted[1]:,} tokens, its shards "
            f"kept {kept[0]:,} and {kept[1]:,} (a shard group file is missing or was changed); rerun pool for this source"
        )
    columns = list(zip(*merged)) or [(), (), (), ()]
    index = pa.table(
        [pa.array(columns[0], pa.string()), pa.array(columns[1], pa.string()), pa.array([source] * len(merged), pa.string()),
         pa.array(columns[2], pa.int64()), pa.array(columns[3], pa.int64())],
        schema=INDEX_SCHEMA,
    )  # fmt: skip
    storage.write_parquet(index, storage.join(index_dir, GROUP_FILES))
    # Each merge's inputs go by a task of its own, in batched deletes (not a request or two per file
    # from this process: ~200 files per shard).
    removals = storage.join(index_dir, "_removals")
    runner.map([ShardTask(remove_merged_inputs, (task.output,), storage.join(removals, f"{k:06d}.json"), pool_dir) for k, task in enumerate(tasks)])
    storage.remove(removals, recursive=True)
    return {"group_files": len(merged), "shard_group_files": sum(r.stats["read"] for r in results), "merge_tasks": len(tasks),
            "resumed_merges": sum(r.reused for r in results)}  # fmt: skip


def remove_merged_inputs(input_uris: list[str], output_uri: str, pool_dir: str) -> dict[str, int]:
    """A task: delete the shard group files one merge read (named in its receipt) in batched calls
    (an object store deletes up to 100 per request); files already gone (a retried task) are skipped."""
    uris = [storage.join(pool_dir, name) for name in storage.read_json(input_uris[0])["read_files"]]
    if not uris:
        return {"removed": 0}
    fs, _ = storage.filesystem(uris[0])
    paths = [storage.filesystem(u)[1] for u in uris]
    try:
        fs.rm(paths)
    except FileNotFoundError:
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                fs.rm_file(path)
    return {"removed": len(paths)}


def pool_index_uris(index_dir: str) -> list[str]:
    """A source's pool index: its compacted ``group_files.parquet`` when there, else its shard indexes."""
    compacted = storage.join(index_dir, GROUP_FILES)
    return [compacted] if storage.exists(compacted) else storage.list_shards(index_dir)


def read_pool_index(uris: Sequence[str]) -> pa.Table:
    """The concatenated shard indexes (``group``, ``file``, ``source``, ``documents``, ``tokens``)."""
    if not uris:
        return INDEX_SCHEMA.empty_table()
    paths = [storage.local_path(u) for u in uris]
    if len(uris) > 1 and all(paths):  # many local files: one native multi-file read
        import polars as pl  # noqa: PLC0415

        return pl.read_parquet(paths, columns=INDEX_SCHEMA.names).to_arrow().cast(INDEX_SCHEMA)
    return pa.concat_tables([storage.read_parquet(u).cast(INDEX_SCHEMA) for u in uris])


POOL_FILES_SCHEMA = pa.schema([("group", pa.string()), ("source", pa.string()), ("file", pa.string())])


def _index_frame(uris: Sequence[str]) -> Any:
    """One source's pool index as a polars frame: many local files in one native multi-file scan
    of the index columns (no Arrow round trip; one chunk per file, as :func:`read_pool_index`
    reads them), else through :func:`read_pool_index`."""
    import polars as pl  # noqa: PLC0415

    paths = [storage.local_path(u) for u in uris]
    if len(paths) > 1 and all(paths):
        schema = {"group": pl.Utf8, "file": pl.Utf8, "source": pl.Utf8, "documents": pl.Int64, "tokens": pl.Int64}
        return pl.scan_parquet(paths).select(INDEX_SCHEMA.names).cast(schema).collect()  # type: ignore[arg-type]
    return pl.from_arrow(read_pool_index(uris))


def group_counts_and_files(sources: Sequence[tuple[str, Sequence[str], str]], files_uri: str) -> Any:
    """Documents and tokens per (group, source), and every pool file listed per group.

    ``sources`` holds, per source, its name, its shard index URIs and its pool directory. Each
    source's index is read once, aggregated on its own (at most one row per group) before the
    sources are combined, and its files are streamed into ``files_uri`` (Parquet: ``group``,
    ``source``, ``file``; one write per source), so memory follows one source's index, never the
    whole pool's file list.
    """
    import polars as pl  # noqa: PLC0415

    from marin_assets.core.pool.groups import group_counts_from_index  # noqa: PLC0415

    counts = []
    with storage.open_atomic(files_uri) as handle, pq.ParquetWriter(handle, POOL_FILES_SCHEMA, **storage.PARQUET_WRITE_OPTIONS) as writer:
        for _source, index_uris, pool_dir in sources:
            index = _index_frame(index_uris)
            counts.append(group_counts_from_index(index))
            prefix = pool_dir.rstrip("/") + "/"
            listed = index.select("group", "source", (pl.lit(prefix) + pl.col("file").str.strip_chars("/")).alias("file"))
            del index
            # Chunks as read (the writer's pages follow them): the same bytes as the rows always had.
            writer.write_table(listed.to_arrow().cast(POOL_FILES_SCHEMA))
            del listed
    if not counts:
        return pl.DataFrame(schema={"group": pl.Utf8, "source": pl.Utf8, "documents": pl.Int64, "tokens": pl.Int64})
    return pl.concat(counts).sort("group", "source")


def read_pool_files(files_uri: str) -> dict[str, list[str]]:
    """group -> pool files, from a ``pool_files.parquet`` (small pools and tests: it is all in memory)."""
    table = storage.read_parquet(files_uri)
    out: dict[str, list[str]] = {}
    for group, file in zip(table.column("group").to_pylist(), table.column("file").to_pylist()):
        out.setdefault(group, []).append(file)
    return out


def check_pool_rows(pool_dir: str, index: pa.Table) -> dict[str, int]:
    """Compare each indexed group file's rows and tokens with the file itself (an asset check)."""
    mismatched = missing = 0
    for file, documents, tokens in zip(index.column("file").to_pylist(), index.column("documents").to_pylist(), index.column("tokens").to_pylist()):
        uri = storage.join(pool_dir, file)
        if not storage.exists(uri):
            missing += 1
            continue
        table = storage.read_parquet(uri, columns=["tokens"])
        if len(table) != documents or int(pc.sum(table.column("tokens")).as_py() or 0) != tokens:
            mismatched += 1
    return {"files": len(index), "missing_files": missing, "mismatched_files": mismatched}
