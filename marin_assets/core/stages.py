"""Running a per-source attribute stage over a source's shards, with reuse and resume.

An attribute stage maps a per-shard function over shards that are co-partitioned with the
source's normalized output (same basenames, same row order). Its output folder is named by a
fingerprint of the stage, its parameters, its code version and its inputs' fingerprints; a
complete folder (manifest present) is reused as is, an incomplete one is finished shard by
shard.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from marin_assets.core import storage
from marin_assets.core.runner import ShardFn, ShardRunner, ShardTask


class MissingInput(RuntimeError):
    """An upstream stage has no current output for this source."""


@dataclasses.dataclass(frozen=True)
class StageInput:
    """A co-partitioned input: the upstream stage's current output folder and fingerprint."""

    uri: str
    fingerprint: str


def current_input(layout: storage.Layout, stage: str, source: str | None = None) -> StageInput:
    """The current output of ``stage`` (for ``source``), or a clear error naming what to run."""
    record = storage.read_current(layout.group(stage, source))
    if record is None or not storage.is_complete(record["uri"]):
        where = f" for partition '{source}'" if source else ""
        raise MissingInput(f"no complete '{stage}' output{where} under {layout.root}; materialize {stage}{where} first")
    return StageInput(record["uri"], record["fingerprint"])


def summed(stats: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Numeric counters of all shards, added up (booleans and non-numbers are skipped)."""
    totals: dict[str, float] = {}
    for shard in stats:
        for key, value in shard.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                totals[key] = totals.get(key, 0) + value
    return totals


def stage_fingerprint(stage: str, params: Any, code_version: str, inputs: Sequence[StageInput], extra: Any = None) -> str:
    """The fingerprint ``run_attribute_stage`` gives an output (callers that must know it first use this)."""
    return storage.fingerprint(stage, {"params": params, "extra": extra}, code_version, [i.fingerprint for i in inputs])


def run_attribute_stage(
    *,
    stage: str,
    source: str,
    layout: storage.Layout,
    inputs: Sequence[StageInput],
    shard_fn: ShardFn,
    params: Any,
    code_version: str,
    runner: ShardRunner | None = None,
    extra_fingerprint: Any = None,
    fingerprint_params: Any = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Map ``shard_fn`` over the shards of ``inputs[0]``; each task gets the same-named shard of every input.

    ``fingerprint_params`` replaces ``params`` in the fingerprint when the parameters carry
    storage paths (which must not be hashed: a moved root keeps its fingerprints).
    Returns the manifest plus ``uri``, ``fingerprint`` and ``reused``.
    """
    fp = stage_fingerprint(stage, params if fingerprint_params is None else fingerprint_params, code_version, inputs, extra_fingerprint)
    out_dir = layout.attributes(stage, source, fp)
    group = layout.group(stage, source)
    manifest = storage.read_manifest(out_dir)
    if manifest is not None:
        storage.publish_current(group, fp, out_dir)
        return manifest | {"uri": out_dir, "fingerprint": fp, "reused": True}
    shards = storage.list_shards(inputs[0].uri)
    tasks = [
        ShardTask(shard_fn, tuple(storage.join(i.uri, storage.basename(s)) for i in inputs), storage.join(out_dir, storage.basename(s)), params)
        for s in shards
    ]
    say = progress or (lambda _m: None)
    results = (runner or ShardRunner()).map(tasks, on_done=lambda r: say(f"{stage} {source}: {storage.basename(r.output)} {'reused' if r.reused else 'done'}"))
    per_shard = [r.stats for r in results]
    manifest = {
        "stage": stage,
        "source": source,
        "fingerprint": fp,
        "code_version": code_version,
        "inputs": [dataclasses.asdict(i) for i in inputs],
        "shards": [storage.basename(r.output) for r in results],
        "totals": summed(per_shard),
        "per_shard": per_shard,
        "resumed_shards": sum(r.reused for r in results),
    }
    storage.write_manifest(out_dir, manifest)
    storage.publish_current(group, fp, out_dir)
    return manifest | {"uri": out_dir, "fingerprint": fp, "reused": False}


def current_inputs(layout: storage.Layout, stage: str, sources: Sequence[str]) -> tuple[dict[str, StageInput], list[str]]:
    """Current outputs of ``stage`` for each source that has one, and the sources that have none."""
    found: dict[str, StageInput] = {}
    missing: list[str] = []
    for source in sources:
        try:
            found[source] = current_input(layout, stage, source)
        except MissingInput:
            missing.append(source)
    return found, missing


def run_global_stage(
    *,
    stage: str,
    layout: storage.Layout,
    inputs: Mapping[str, StageInput],
    params: Any,
    code_version: str,
    build: Callable[[str], Mapping[str, Any]],
    extra_fingerprint: Any = None,
) -> dict[str, Any]:
    """Run ``build(out_dir)`` once per distinct set of inputs and parameters, then record it.

    ``inputs`` maps a name (a source, or an upstream global asset) to its current output; the
    fingerprint covers every input's fingerprint, so a changed source gives a new output while
    an unchanged set reuses the finished one.
    """
    fp = storage.fingerprint(
        stage,
        {"params": params, "extra": extra_fingerprint},
        code_version,
        [f"{name}={inp.fingerprint}" for name, inp in sorted(inputs.items())],
    )
    out_dir = layout.global_(stage, fp)
    manifest = storage.read_manifest(out_dir)
    if manifest is None:
        stats = dict(build(out_dir))
        manifest = {"stage": stage, "fingerprint": fp, "code_version": code_version, "inputs": {k: dataclasses.asdict(v) for k, v in sorted(inputs.items())}, "stats": stats}
        storage.write_manifest(out_dir, manifest)
        reused = False
    else:
        reused = True
    storage.publish_current(layout.group(stage), fp, out_dir)
    return manifest | {"uri": out_dir, "fingerprint": fp, "reused": reused}


CHARS_PER_TOKEN = 4.0  # rough estimate until the pool counts tokens with the pinned tokenizer


def removed_text_chars(removed_file: str, normalized_dir: str) -> int:
    """Characters of text in the documents a sparse removal list names (for token estimates)."""
    import polars as pl  # noqa: PLC0415

    if not storage.exists(removed_file):
        return 0
    removed = pl.from_arrow(storage.read_parquet(removed_file, ["id"]))
    if not removed.height:  # type: ignore[union-attr]
        return 0
    total = 0
    for shard in storage.list_shards(normalized_dir):
        frame = pl.from_arrow(storage.read_parquet(shard, ["id", "text"]))
        hit = frame.join(removed, on="id", how="semi")  # type: ignore[union-attr,arg-type]
        total += int(hit.select(pl.col("text").str.len_chars().sum()).item() or 0)
    return total
