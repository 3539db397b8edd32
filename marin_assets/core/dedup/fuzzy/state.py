"""The run's state, handed from step to step: inputs, settings, the previous run's state, the
numbering of the documents, the tasks run so far, and what each step leaves for the next."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from marin_assets.core.dedup import fanin, manifest, shuffle
from marin_assets.core.dedup.decisions import DedupError, FuzzyDedupParams
from marin_assets.core.dedup.fuzzy.layout import LAYOUT, RANK_SHIFT, STATE_FILE, FuzzyScale
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.runner import ShardResult, ShardRunner, ShardTask

# One shard as the steps after the map see it: (source, normalized shard, node table, first node, rows, node ranges)
Shard = tuple[str, str, str, int, int, tuple[tuple[int, int], ...]]


@dataclasses.dataclass
class FuzzyRun:
    """One run of the fuzzy steps. ``slot``/``next_row``/``added_base``: the document numbering
    (:func:`number_documents`); ``state``: what this run writes for the next one."""

    shards: dict[str, list[tuple[str, str, int]]]  # per source: (bucket shard, normalized shard, rows)
    fingerprints: dict[str, str]
    exempt: tuple[str, ...]
    out_dir: str
    cache: str
    rule: FuzzyDedupParams
    scale: FuzzyScale
    runner: ShardRunner
    num_examples: int
    excerpt_chars: int
    before: dict[str, Any] | None
    slot: dict[str, int] = dataclasses.field(default_factory=dict)
    next_row: dict[str, int] = dataclasses.field(default_factory=dict)
    added_base: dict[str, int] = dataclasses.field(default_factory=dict)
    results: list[ShardResult] = dataclasses.field(default_factory=list)
    state: dict[str, Any] = dataclasses.field(default_factory=dict)
    widest: int = 0  # the most input files any task of the run was given

    @property
    def sources(self) -> tuple[str, ...]:
        return tuple(self.shards)

    @property
    def rank(self) -> dict[str, int]:
        return {s: i for i, s in enumerate(self.shards)}

    @property
    def work(self) -> str:
        return storage.join(self.out_dir, "_work")

    def run(self, tasks: list[ShardTask]) -> list[ShardResult]:
        """Run one step's tasks; their results join the run's (for the costs and counters). A
        task's many inputs are named by the step's manifest (:mod:`.manifest`), not listed."""
        self.widest = max([self.widest, *(len(t.inputs) for t in tasks)])
        done = self.runner.map(manifest.name_inputs(tasks, storage.join(self.work, "manifests")))
        self.results.extend(done)
        return done

    def map(self, tasks: list[ShardTask]) -> list[ShardResult]:
        """:meth:`run`, as a runner's ``map`` (for the shared components step)."""
        return self.run(tasks)

    def merged(self, files: Sequence[str], folder: str, limit: int | None = None, **cut: Any) -> list[str]:
        """``files`` of one step, merged (:func:`fanin.bounded`) until at most ``limit`` remain
        (default ``max_inputs_per_task``; less where a reader has other inputs too); ``cut``:
        how they are cut (:class:`fanin.MergeFilesParams`)."""
        limit = self.scale.max_inputs_per_task if limit is None else limit
        return fanin.bounded(self.run, files, folder, limit, fanin.MergeFilesParams(budget_bytes=self.scale.merge_bytes, **cut))


@dataclasses.dataclass(frozen=True)
class Mapped:
    """What the map step leaves: its tasks and results, every shard's numbering, the shard
    groups (one members task each) and the stored node cuts of their node ranges."""

    tasks: list[ShardTask]
    results: list[ShardResult]
    shards: list[Shard]
    groups: list[list[int]]
    node_cuts: str
    docs_per_source: dict[str, int]
    chars_per_source: dict[str, int]
    lost_shards: bool  # a changed source lost a shard name: its documents there are gone
    renumbered: bool  # an unchanged source's stored index is gone: its nodes may differ from the previous run's

    @property
    def records(self) -> int:
        return sum(int(r.stats["records"]) for r in self.results)


@dataclasses.dataclass(frozen=True)
class Components:
    """What the components leave: the label files the members step reads (incremental: the
    touched clusters' rows), the edges and their counters."""

    edge_results: list[ShardResult]
    edges: int
    member_label_files: list[str]
    stats: dict[str, Any]
    labelled: int = 0  # full: the clustered documents
    merged: ShardResult | None = None  # incremental: the remap task's result

    @property
    def incremental(self) -> bool:
        return self.merged is not None


@dataclasses.dataclass(frozen=True)
class Members:
    """What the members step leaves: member files (blocks of ``blocks`` equal label-key ranges)
    and the verify partitioning that follows from the clustered documents."""

    files: tuple[str, ...]
    blocks: int
    verify_parts: int
    plan_parts: int
    previous_files: list[tuple[str, ...]]  # per verify partition: the previous run's outputs overlapping it


def pair_shards(
    buckets: Mapping[str, Sequence[str]], normalized: Mapping[str, Sequence[str]], rows: Mapping[str, Sequence[int]] | None = None
) -> dict[str, list[tuple[str, str, int]]]:
    """Per source: (bucket shard, normalized shard, rows) in basename order; the rows from
    ``rows`` (per source, in ``buckets``' order) where given, else from each file's footer."""
    if set(buckets) != set(normalized):
        missing = sorted(set(buckets) ^ set(normalized))
        raise DedupError(
            f"sources {missing} have minhash buckets or normalized shards but not both; "
            "materialize minhash_buckets for every normalized source (or drop the source from both)"
        )
    out: dict[str, list[tuple[str, str, int]]] = {}
    for source in sorted(buckets):
        b = {storage.basename(u): u for u in buckets[source]}
        n = {storage.basename(u): u for u in normalized[source]}
        if set(b) != set(n):
            odd = sorted(set(b) ^ set(n))
            raise DedupError(
                f"source {source!r}: minhash_buckets and normalized are not co-partitioned (shards {odd} "
                f"are on one side only); rematerialize minhash_buckets for {source!r}"
            )
        known = rows.get(source) if rows else None
        counted = dict(zip((storage.basename(u) for u in buckets[source]), known)) if known is not None and len(known) == len(buckets[source]) else {}
        out[source] = [(b[name], n[name], int(counted[name]) if name in counted else storage.parquet_num_rows(b[name])) for name in sorted(b)]
    return out


def source_fingerprint(uris: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(sorted(uris)).encode()).hexdigest()[:16]


def previous_state(previous_uri: str | None) -> dict[str, Any] | None:
    """The previous run's state, or None (none, or written by an older version: a full run, the
    answer is the same)."""
    if not previous_uri or not storage.exists(storage.join(previous_uri, STATE_FILE)):
        return None
    before = storage.read_json(storage.join(previous_uri, STATE_FILE))
    if before.get("layout") != LAYOUT or any(k not in before for k in ("slots", "fingerprints", "next_row", "node_tables")):
        return None
    return before


def number_documents(run: FuzzyRun) -> None:
    """Slots: an unchanged source keeps its slot (node numbers). A changed one keeps its slot
    too, and each document it still has (same id, same buckets) keeps its node; added documents
    get nodes past the source's ``next_row``. A new source gets a fresh slot."""
    before, rank = run.before, run.rank
    old_slots = {s: int(v) for s, v in (before or {}).get("slots", {}).items()}
    next_slot = max(old_slots.values(), default=-1) + 1
    rows_of = {s: sum(rows for _, _, rows in run.shards[s]) for s in run.sources}
    for source in run.sources:
        if before is None:
            run.slot[source], run.next_row[source] = rank[source], rows_of[source]
        elif source in old_slots and before["fingerprints"].get(source) == run.fingerprints[source]:
            run.slot[source], run.next_row[source] = old_slots[source], int(before["next_row"][source])
        elif source in old_slots and int(before["next_row"][source]) + rows_of[source] < 1 << RANK_SHIFT:
            run.slot[source], run.added_base[source] = old_slots[source], int(before["next_row"][source])
            run.next_row[source] = run.added_base[source] + rows_of[source]
        else:
            run.slot[source], next_slot = next_slot, next_slot + 1
            run.next_row[source] = rows_of[source]
    if max(run.slot.values(), default=0) >= 1 << (63 - RANK_SHIFT):
        run.slot = {s: rank[s] for s in run.sources}  # slots exhausted: renumber (this run verifies everything)
        run.next_row, run.added_base, run.before = dict(rows_of), {}, None


def verify_partitions(members: int, member_chars: int, scale: FuzzyScale) -> int:
    """Plan and verify tasks: a power of two of label ranges, each of at most about
    ``members_per_task`` members and ``member_chars_per_task`` characters."""
    wanted = max(shuffle.tasks_for(members, scale.members_per_task), shuffle.tasks_for(member_chars, scale.member_chars_per_task))
    return 1 << max(0, (wanted - 1).bit_length())


SCRATCH_STEPS = ("edges", "cc", "delta", "members", "plan", "gather", "removals", "publish", "manifests")


def collect_scratch(work: str, cache: str, current: Mapping[str, str], superseded: Mapping[str, str]) -> list[str]:
    """After a successful publish, remove the scratch no later run reads: every step's shuffle
    files except the verify outputs and the label files (the next incremental run copies
    verdicts from the one and merges components over the other), and
    the cached map outputs the previous run used that this run replaced (``superseded`` and
    ``current``: the entry per source; the current ones are the stored index the next run
    joins a changed source against). Entries of other runs are left alone. Returns what was
    removed."""
    removed = []
    for step in SCRATCH_STEPS:
        uri = storage.join(work, step)
        if storage.exists(uri):
            storage.remove(uri, recursive=True)
            removed.append(uri)
    for source, name in sorted(superseded.items()):
        uri = storage.join(cache, source, name)
        if name != current.get(source) and storage.exists(uri):
            storage.remove(uri, recursive=True)
            removed.append(uri)
    return removed


def step_costs(results: Sequence[ShardResult]) -> dict[str, dict[str, float]]:
    """Per step (the task output's folder): tasks, CPU seconds of the tasks run now, peak RSS."""
    out: dict[str, dict[str, float]] = {}
    for r in results:
        parts = r.output.rstrip("/").split("/")
        if parts[-2].startswith(("merged-", "level-")):
            step = "merge"
        elif "cc" in parts or parts[-2] in ("labels", "delta"):
            step = "components"
        elif parts[-2] in ("edges", "members", "plan", "gather", "verify", "removals", "publish"):
            step = parts[-2]
        else:
            step = "map"
        entry = out.setdefault(step, {"tasks": 0, "cpu_s": 0.0, "max_rss_kb": 0})
        entry["tasks"] += 1
        entry["cpu_s"] = round(entry["cpu_s"] + (0.0 if r.reused else float(r.stats.get("cpu_s", 0))), 3)
        entry["max_rss_kb"] = max(entry["max_rss_kb"], int(r.stats.get("rss_kb", 0)))
    return out


@dataclasses.dataclass(frozen=True)
class VerifyPass:
    """One plan, gather and verify pass: its files' name prefix, per verify partition the
    previous outputs it reads, whether clusters that only gained members replay, and the verify
    partitions it runs (None: all)."""

    prefix: str
    previous: Sequence[tuple[str, ...]]
    replay: bool
    parts: tuple[int, ...] | None = None
