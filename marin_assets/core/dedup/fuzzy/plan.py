"""Step 5, plan: request the text of every member of the clusters this run must verify, keyed by node."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from marin_assets.core.dedup import shuffle
from marin_assets.core.dedup.fuzzy.clusters import VerifyParams, clusters_of, pass_params, replay_plan, reusable, streamed_labels, warm_clusters, whole_replays, with_fresh_previous_rows
from marin_assets.core.dedup.fuzzy.layout import REQUEST_SCHEMA, node_runs
from marin_assets.core.dedup.fuzzy.state import Components, FuzzyRun, Mapped, Members, VerifyPass
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.runner import ShardResult, ShardTask


@shuffle.measured(warm=(warm_clusters,))
def fuzzy_plan(inputs: list[str], output: str, params: VerifyParams) -> dict[str, Any]:
    """Request the text of every member of the clusters this run must verify, keyed by node."""
    return with_fresh_previous_rows(_plan, inputs, output, params)


def _plan(inputs: list[str], output: str, params: VerifyParams) -> dict[str, Any]:
    frame = clusters_of(inputs, params.lo, params.hi, params.member_blocks)
    reuse, before = reusable(frame, params, frame_only=True)
    full, replay = replay_plan(frame, params, reuse, before, columns=("label", "rank", "id"))
    # The clusters verify reads batch by batch (as verify finds them: verified in full, not replayed)
    big = streamed_labels(full, params)
    whole = whole_replays(frame, replay, params)  # every member's text, in case the replay fails
    gathered = replay.filter(pl.col("text").is_null() & ~pl.col("label").is_in(whole))  # a replay's texts that its record did not keep
    todo = pl.concat([full, gathered.select(full.columns), frame.filter(pl.col("label").is_in(whole)).select(full.columns)])
    node = todo["node"].to_numpy()
    pos = todo.select(pl.int_range(pl.len()).over("label"))[:, 0].to_numpy() if todo.height else np.zeros(0, np.int64)
    big_rows = np.isin(todo["label"].to_numpy(), big) if todo.height else np.zeros(0, bool)
    requests = pa.table([pa.array(node.astype(np.int64)), pa.array(shuffle.hash_keys(todo["label"].to_numpy())), pa.array(pos.astype(np.int64)), pa.array(big_rows)], schema=REQUEST_SCHEMA)
    shuffle.write_blocks(requests, output, cuts=shuffle.read_cuts(params.request_cuts))  # one block per gather group's node ranges
    # Where the requested nodes lie (a few ranges): gather runs only on shards that overlap them.
    return {"requested_members": int(node.size), "requested_runs": node_runs(node, 64)}


# --------------------------------------------------------------------------- scheduling


def run_plan(run: FuzzyRun, mapped: Mapped, members: Members, comps: Components, vpass: VerifyPass) -> list[ShardResult]:
    """Plan tasks. Incremental: the member files hold the touched clusters only, so a plan task
    covers several consecutive label ranges (members_per_task touched members each); a
    second pass plans only the ranges it verifies again."""
    bounds = shuffle.partition_bounds(members.verify_parts)
    spans = members.verify_parts // members.plan_parts
    planned = range(members.plan_parts) if vpass.parts is None else sorted({p // spans for p in vpass.parts})

    def params(q: int) -> VerifyParams:
        first, last = q * spans, (q + 1) * spans - 1
        previous = tuple(dict.fromkeys(f for p in range(first, last + 1) for f in vpass.previous[p]))
        return dataclasses.replace(pass_params(run, mapped, members, comps, vpass, first, bounds[first][0], bounds[last][1]), previous=previous)

    return run.run([ShardTask(fuzzy_plan, members.files, storage.join(run.work, "plan", vpass.prefix + shuffle.block_name(q, members.plan_parts)), params(q)) for q in planned])
