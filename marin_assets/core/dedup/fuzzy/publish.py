"""Step 8, removals by id range and publish: one removal file per source."""

from __future__ import annotations

import dataclasses
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from marin_assets.core.dedup import shuffle
from marin_assets.core.dedup.decisions import (
    FUZZY_SCHEMA,
)
from marin_assets.core.dedup.fuzzy.layout import VERDICT_SCHEMA

# --------------------------------------------------------------------------- 8. removals and publish

PART_SCHEMA = pa.schema([(f.name, f.type) for f in VERDICT_SCHEMA if f.name not in ("key", "label", "chars")])


@dataclasses.dataclass(frozen=True)
class RemovalParams:
    lo: int
    hi: int
    ranks: tuple[int, ...] | None = None  # only these sources' rows (the others keep their files); None: all


@shuffle.measured
def fuzzy_removals(inputs: list[str], output: str, params: RemovalParams) -> dict[str, Any]:
    table = shuffle.read_range(inputs, params.lo, params.hi, PART_SCHEMA.names, VERDICT_SCHEMA).select(PART_SCHEMA.names)
    if params.ranks is not None:
        table = table.filter(pc.is_in(table.column("rank"), pa.array(params.ranks, pa.int32())))
    if table.num_rows:
        table = table.take(pc.sort_indices(table, sort_keys=[("rank", "ascending"), ("id", "ascending")]))
    shuffle.write_sorted_by_rank(table, output)
    return {"removed": table.num_rows}


@dataclasses.dataclass(frozen=True)
class PublishParams:
    ranks: tuple[int, ...]  # a group of sources, published by one task
    outputs: tuple[str, ...]
    keep: tuple[dict[str, Any] | None, ...]  # per source: the previous run's file and counts, when its removals did not move


def _to_fuzzy(table: pa.Table) -> pa.Table:
    return table.select(FUZZY_SCHEMA.names).cast(FUZZY_SCHEMA)


@shuffle.measured
def fuzzy_publish(inputs: list[str], output: str, params: PublishParams) -> dict[str, Any]:
    """A group of sources' removal files from the id-range parts, each part read once for the
    group; a source whose removals did not move since the previous run gets a byte copy of its
    previous file (the same rows give the same bytes). ``output`` names the group; the counts per
    source are the task's result."""
    built = [k for k, keep in enumerate(params.keep) if keep is None]
    made = shuffle.publish_removals(inputs, [params.ranks[k] for k in built], [params.outputs[k] for k in built], FUZZY_SCHEMA, _to_fuzzy) if built else []
    sources = dict(zip(built, (m | {"copied": 0} for m in made)))
    for k, keep in enumerate(params.keep):
        if keep is not None:
            shuffle.copy_file(keep["uri"], params.outputs[k])
            sources[k] = {"removed": int(keep["removed"]), "digest": str(keep["digest"]), "copied": 1}
    return {"sources": [sources[k] for k in range(len(params.ranks))]}
