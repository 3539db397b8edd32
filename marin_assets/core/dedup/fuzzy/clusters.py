"""What plan and verify share: a label range's members in processing order, the previous run's clusters and rows, and which clusters are reused, replayed or verified in full."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import xxhash

from marin_assets.core.dedup import shuffle
from marin_assets.core.dedup.decisions import (
    VERIFY_BATCH_CHARS,
    FuzzyDedupParams,
)
from marin_assets.core.dedup.fuzzy.layout import CLUSTER_SCHEMA, MEMBER_SCHEMA, REPLAY_READ_SHARE, VERDICT_SCHEMA, clusters_uri
from marin_assets.core.dedup.fuzzy.state import Components, FuzzyRun, Mapped, Members, VerifyPass
from marin_assets.core.runtime import storage


@dataclasses.dataclass(frozen=True)
class VerifyParams:
    lo: int
    hi: int
    sources: tuple[str, ...]
    exempt: tuple[str, ...]
    previous: tuple[str, ...]  # the previous run's verify outputs overlapping this label range (none: verify all)
    rule: FuzzyDedupParams
    num_examples: int = 5
    excerpt_chars: int = 240
    member_files: int = 0  # verify: its inputs are this many member files, then the gathered texts
    stream_chars: int = 1 << 26  # clusters with more member text are read batch by batch
    batch_chars: int = VERIFY_BATCH_CHARS
    index_bytes: int = 1 << 30  # the verifier's memory budget (:class:`marin_assets.core.dedup.retained.RetainedIndex`)
    replay: bool = True  # a cluster that only gained members replays its previous decisions
    remap: str = ""  # incremental components: the member files hold the touched clusters only; the remap names them
    member_blocks: int = 1  # the member files are block files of this many equal key ranges
    request_cuts: str = ""  # plan: write the requests as blocks at these stored node cuts (the gather groups' ranges)
    text_files: int = 0  # verify: after the member files, this many gathered text block files, then the streamed texts' files
    text_blocks: int = 1  # the gathered text files' blocks: this many equal key ranges (the verify partitions)


def clusters_of(member_files: Sequence[str], lo: int, hi: int, blocks: int) -> pl.DataFrame:
    """Members of a label range in processing order: cluster, longest first, source, id (from
    block files of ``blocks`` equal key ranges: the blocks covering the range)."""
    table = shuffle.read_ranges_blocks(member_files, shuffle.partition_cuts(blocks), [(lo, hi)], MEMBER_SCHEMA)
    frame = pl.from_arrow(table.select(["key", "label", "node", "rank", "id", "chars", "added"]))
    return frame.sort(["label", "chars", "rank", "id"], descending=[False, True, False, False])


def member_key(rank: int, doc: str) -> str:
    return f"{rank}\x00{doc}"


def _with_member_keys(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with its rows' :func:`member_key` as column ``mkey``."""
    return frame.with_columns(pl.concat_str([pl.col("rank").cast(pl.String), pl.lit("\x00"), pl.col("id")]).alias("mkey"))


def member_sets(frame: pl.DataFrame) -> pl.DataFrame:
    """Per cluster: label, size and a 128-bit hash of its sorted (source rank, id) members."""
    rows = _with_member_keys(frame.select("label", "rank", "id").sort(["label", "rank", "id"]))
    grouped = rows.group_by("label", maintain_order=True).agg(pl.len().cast(pl.Int64).alias("size"), (pl.col("mkey") + pl.lit("\n")).str.join("").alias("text"))
    digests = [xxhash.xxh3_128_hexdigest(t.encode()) for t in grouped["text"].to_list()]
    return pl.DataFrame({"label": grouped["label"], "size": grouped["size"], "members": digests}, schema={"label": pl.Int64, "size": pl.Int64, "members": pl.String})


def _previous_clusters(params: VerifyParams, only: Sequence[int] | None = None) -> pl.DataFrame:
    """The previous run's cluster records whose labels fall in this task's range (and are in
    ``only``, when given)."""
    parts = []
    for uri in params.previous:
        table = storage.read_parquet(clusters_uri(uri))
        keys = shuffle.hash_keys(table.column("label").to_numpy())
        mask = (keys >= params.lo) & (keys < params.hi)
        if only is not None:
            mask &= np.isin(table.column("label").to_numpy(), np.asarray(only, np.int64))
        parts.append(pl.from_arrow(table.filter(pa.array(mask))))
    return pl.concat(parts, how="diagonal_relaxed")


def reusable(frame: pl.DataFrame, params: VerifyParams, sets: pl.DataFrame | None = None, frame_only: bool = False) -> tuple[set[int], pl.DataFrame | None]:
    """Labels whose verdict can be copied: the previous run had a cluster with the same label
    and exactly the same (source, id) members; ids hash the text, so the verdict is the same.
    Also the previous clusters read (with ``frame_only``, only those labelled as one in
    ``frame``, which is all that reuse and replay look at). The first pass of an incremental run
    (``remap``, replaying) sees only touched clusters, each of which gained a member: nothing to
    compare."""
    if not params.previous:
        return set(), None
    before = _previous_clusters(params, frame["label"].unique().to_list() if frame_only else None)
    if params.remap and params.replay:
        return set(), before
    sets = member_sets(frame) if sets is None else sets
    joined = sets.join(before.select("label", "size", "members"), on=["label", "size", "members"], how="inner")
    return set(joined["label"].to_list()), before


_ROW_FIELDS = ("rank", "id", "cluster_id", "representative_id", "representative_source", "containment", "jaccard")  # a removal row as published


def row_sums(table: pa.Table) -> dict[int, int]:
    """Per source rank, the sum modulo 2**128 of a 128-bit hash of each removal row as
    published. Summed over every label range, two runs' sums of a source are equal exactly when
    its rows are (but for a 2**-128 collision), wherever the rows' clusters went, so a source
    whose sum did not move keeps its removal file. (Polars' hash is the same in every process of
    one Polars version, which all tasks of a run share.)"""
    if table.num_rows == 0:
        return {}
    row = pl.struct(list(_ROW_FIELDS))
    halves = [e for seed in (1, 2) for e in ((row.hash(seed) & 0xFFFFFFFF).alias(f"lo{seed}"), (row.hash(seed) // (1 << 32)).alias(f"hi{seed}"))]
    sums = pl.from_arrow(table.select(list(_ROW_FIELDS))).select(pl.col("rank"), *halves).group_by("rank").sum()
    out = {}
    for rank, lo1, hi1, lo2, hi2 in sums.select("rank", "lo1", "hi1", "lo2", "hi2").iter_rows():
        out[int(rank)] = ((((hi1 << 32) + lo1) << 64) + (hi2 << 32) + lo2) % (1 << 128)
    return out


_PREVIOUS_ROWS: dict[tuple[str, ...], pa.Table] = {}  # one verify task's previous verify outputs, read once


def previous_rows(params: VerifyParams, labels: set[int], columns: tuple[str, ...] | None = None) -> pa.Table:
    """The previous run's removal rows of the clusters ``labels``. Verify asks several times for
    its range's rows: the files are read once per task. Plan asks once, for a few ``columns``,
    maybe over many label ranges: each file is filtered as it is read (only the asked rows held)."""
    wanted = pa.array(sorted(labels), pa.int64())
    if columns is not None:
        parts = [t.filter(pc.is_in(t.column("label"), wanted)) for t in (_verdicts(uri, columns) for uri in params.previous)]
        return pa.concat_tables(parts) if parts else pa.schema([VERDICT_SCHEMA.field(c) for c in columns]).empty_table()
    before = _PREVIOUS_ROWS.get(params.previous)
    if before is None:
        _PREVIOUS_ROWS.clear()
        before = _PREVIOUS_ROWS[params.previous] = pa.concat_tables([_verdicts(uri) for uri in params.previous])
    return before.filter(pc.is_in(before.column("label"), wanted))


def _verdicts(uri: str, columns: Sequence[str] | None = None) -> pa.Table:
    """All removal rows of a verify output (``columns``: only those)."""
    table = shuffle.read_whole(uri, VERDICT_SCHEMA)
    return table if columns is None else table.select(list(columns))


def replay_plan(frame: pl.DataFrame, params: VerifyParams, reuse: set[int], before: pl.DataFrame | None, columns: tuple[str, ...] | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Split the clusters not reused into those verified in full and those replayed: a cluster
    that only gained members since the previous run (same label, every previous member still in
    it) replays the previous decisions, reading only its added members and the previous run's
    retained ones (the removed ones never represent). Returns both row sets in processing order;
    the replayed rows' ``added`` flag says which members are new to the cluster, and ``text`` is
    a retained member's text where its record kept it (else null: gathered).

    Incremental components mark the added members (a cluster without any other is new); else
    the previous members are the cluster's retained keys and removal rows (``columns``: read
    file by file with those columns, as plan does)."""
    todo = frame.filter(~pl.col("label").is_in(list(reuse))) if reuse else frame
    if not params.replay or before is None or not todo.height:
        return todo, todo.clear().with_columns(pl.lit(None, pl.String).alias("text"))
    prior = before.filter(pl.col("retained").is_not_null()).join(todo.select("label").unique(), on="label", how="semi")
    keyed = _with_member_keys(todo)
    if not params.remap:
        removed = pl.from_arrow(previous_rows(params, set(prior["label"].to_list()), columns).select(["label", "rank", "id"]))
        previous = pl.concat([_with_member_keys(removed).select("label", "mkey"), prior.select("label", pl.col("retained").alias("mkey")).explode("mkey")])
        lost = previous.join(keyed, on=["label", "mkey"], how="anti").select("label").unique()  # a previous member is gone: verify in full
        prior = prior.join(lost, on="label", how="anti")
        keyed = keyed.drop("added").join(previous.with_columns(pl.lit(False).alias("added")), on=["label", "mkey"], how="left", maintain_order="left").with_columns(pl.col("added").fill_null(True))
    kept = prior.select("label", pl.col("retained").alias("mkey"), pl.col("texts").alias("text"), pl.lit(True).alias("kept")).explode(["mkey", "text"])
    marked = keyed.join(kept, on=["label", "mkey"], how="left", maintain_order="left")
    labels, added = marked["label"].to_numpy(), marked["added"].to_numpy()
    read = added | marked["kept"].is_not_null().to_numpy()  # the rows a replay reads
    new = np.r_[True, labels[1:] != labels[:-1]]
    cluster = np.cumsum(new) - 1
    # A cluster replays when it had members before (a record) and its first row to read is a
    # previously retained member: an added member processed before every previously retained one
    # is retained itself, so that cluster is verified in full at once (no second pass).
    at = np.flatnonzero(read)
    clusters_read, first = np.unique(cluster[at], return_index=True)
    first_added = np.ones(int(new.sum()), bool)
    first_added[clusters_read] = added[at[first]]
    rows = (~first_added & np.isin(labels[new], prior["label"].to_numpy()))[cluster]
    return todo.filter(pl.Series(~rows)), marked.filter(pl.Series(rows & read)).drop("mkey", "kept")


def whole_replays(frame: pl.DataFrame, replay: pl.DataFrame, params: VerifyParams) -> list[int]:
    """The replayed clusters whose every member's text is gathered (plan and verify agree): the
    replay reads at least one in ``REPLAY_READ_SHARE`` of the members (a small cluster, or one
    that retained many), and the text is not streamed. Should an added member be retained, the
    verify task verifies such a cluster in full at once, no second pass; reading the rest costs
    at most ``REPLAY_READ_SHARE`` times the replay's own reads."""
    if not replay.height:
        return []
    read = replay.group_by("label").agg(pl.len().alias("read"))
    sizes = frame.join(read, on="label", how="semi").select("label", pl.col("chars").clip(upper_bound=params.rule.max_chars_per_doc)).group_by("label").agg(pl.len().alias("size"), pl.col("chars").sum())
    fits = sizes.join(read, on="label").filter((pl.col("read") * REPLAY_READ_SHARE >= pl.col("size")) & (pl.col("chars") <= params.stream_chars))
    return sorted(fits["label"].to_list())


def warm_clusters() -> None:
    """Load once per process what the plan and verify steps' Parquet list/string readers and
    polars' string, list and join kernels load lazily on first use (tiny tables, no work)."""
    import io  # noqa: PLC0415

    frame = pl.DataFrame(
        {"label": [1, 1], "node": [1, 2], "rank": [0, 1], "id": ["a", "b"], "chars": [2, 1], "added": [False, True]},
        schema={"label": pl.Int64, "node": pl.Int64, "rank": pl.Int32, "id": pl.String, "chars": pl.Int64, "added": pl.Boolean},
    )
    records = member_sets(frame).with_columns(pl.lit(["0\x00a"]).alias("retained"), pl.lit(["a"], pl.List(pl.String)).alias("texts"))
    for table in (records.to_arrow().cast(CLUSTER_SCHEMA), VERDICT_SCHEMA.empty_table(), MEMBER_SCHEMA.empty_table()):
        buffer = io.BytesIO()
        pq.write_table(table, buffer, compression=storage.PARQUET_COMPRESSION)
        pq.ParquetFile(io.BytesIO(buffer.getvalue())).read()
    replay_plan(frame, VerifyParams(0, 1, ("a", "b"), (), ("warm",), FuzzyDedupParams(), remap="warm"), set(), records)
    pc.is_in(pa.array([1], pa.int64()), pa.array([1], pa.int64()))


def with_fresh_previous_rows(step: Any, inputs: list[str], output: str, params: VerifyParams) -> dict[str, Any]:
    """Run a plan or verify task with its own cache of the previous run's rows: cleared before and
    after, so a worker that runs many tasks never carries one task's rows into the next."""
    _PREVIOUS_ROWS.clear()
    try:
        return step(inputs, output, params)
    finally:
        _PREVIOUS_ROWS.clear()


def streamed_labels(todo: pl.DataFrame, params: VerifyParams) -> np.ndarray:
    """Labels of the clusters (all members in ``todo``) with more text than ``stream_chars``:
    verified batch by batch, their texts read from storage (the others' at once)."""
    capped = todo.select("label", pl.col("chars").clip(upper_bound=params.rule.max_chars_per_doc).alias("c")).group_by("label").agg(pl.col("c").sum())
    return capped.filter(pl.col("c") > params.stream_chars)["label"].to_numpy()


def pass_params(run: FuzzyRun, mapped: Mapped, members: Members, comps: Components, vpass: VerifyPass, p: int, lo: int, hi: int) -> VerifyParams:
    """The plan and verify tasks' parameters for label range ``[lo, hi)`` (verify partition ``p``)."""
    return VerifyParams(
        lo,
        hi,
        run.sources,
        run.exempt,
        vpass.previous[p],
        run.rule,
        run.num_examples,
        run.excerpt_chars,
        replay=vpass.replay,
        stream_chars=run.scale.cluster_chars_in_memory,
        batch_chars=run.scale.verify_batch_chars,
        index_bytes=run.scale.verify_index_bytes,
        remap=comps.merged.output if comps.merged is not None else "",
        member_blocks=members.blocks,
        request_cuts=mapped.node_cuts,
        text_blocks=members.verify_parts,
    )
