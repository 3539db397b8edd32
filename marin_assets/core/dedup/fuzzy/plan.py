"""Step 5, plan: request the text of every member of the clusters this run must verify, keyed by node."""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from marin_assets.core.dedup import shuffle
from marin_assets.core.dedup.fuzzy.clusters import VerifyParams, clusters_of, replay_plan, reusable, streamed_labels, warm_clusters, with_fresh_previous_rows
from marin_assets.core.dedup.fuzzy.layout import REQUEST_SCHEMA, node_runs


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
    gathered = replay.filter(pl.col("text").is_null())  # a replay's texts that its record did not keep
    todo = pl.concat([full, gathered.select(full.columns)]) if gathered.height else full
    node = todo["node"].to_numpy()
    pos = todo.select(pl.int_range(pl.len()).over("label"))[:, 0].to_numpy() if todo.height else np.zeros(0, np.int64)
    big_rows = np.isin(todo["label"].to_numpy(), big) if todo.height else np.zeros(0, bool)
    requests = pa.table([pa.array(node.astype(np.int64)), pa.array(shuffle.hash_keys(todo["label"].to_numpy())), pa.array(pos.astype(np.int64)), pa.array(big_rows)], schema=REQUEST_SCHEMA)
    shuffle.write_blocks(requests, output, cuts=shuffle.read_cuts(params.request_cuts))  # one block per gather group's node ranges
    # Where the requested nodes lie (a few ranges): gather runs only on shards that overlap them.
    return {"requested_members": int(node.size), "requested_runs": node_runs(node, 64)}
