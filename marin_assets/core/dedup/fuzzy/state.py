"""The run's state, handed from step to step: inputs, settings, the previous run's state, the
numbering of the documents, the tasks run so far, and what each step leaves for the next."""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from marin_assets.core.dedup import fanin, manifest, shuffle
from marin_assets.core.dedup.decisions import DedupError, FuzzyDedupParams
from marin_assets.core.dedup.fuzzy.layout import LAYOUT, RANK_SHIFT, STATE_FILE, FuzzyScale, nodes_uri
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.runner import ShardResult, ShardRunner, ShardTask

# One shard as the steps after the map see it: (source, normalized shard, node table, first node,
# rows, node ranges; None: its first rows, the usual case)
Shard = tuple[str, str, str, int, int, tuple[tuple[int, int], ...] | None]


def step_of(output: str) -> str:
    """A task's step, from its output's folder."""
    parts = output.rstrip("/").split("/")
    if parts[-2].startswith(("merged-", "level-")):
        return "merge"
    if "cc" in parts or parts[-2] in ("labels", "delta"):
        return "components"
    if parts[-2] in ("edges", "members", "plan", "gather", "verify", "removals", "publish"):
        return parts[-2]
    return "map"


@dataclasses.dataclass
class TaskCosts:
    """Every task's costs as the summary reports them, added up as each step ends: the run keeps
    these, not every result (~250,000 of them at the pool's size). ``steps``: per step, tasks,
    CPU seconds of the tasks run now, peak RSS."""

    tasks: int = 0
    cpu_s: float = 0.0
    warmup_cpu_s: float = 0.0
    max_rss_kb: int = 0
    steps: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)

    def add(self, results: Sequence[ShardResult]) -> None:
        for r in results:
            rss, cpu = int(r.stats.get("rss_kb", 0)), 0.0 if r.reused else float(r.stats.get("cpu_s", 0))
            self.tasks += 1
            self.max_rss_kb = max(self.max_rss_kb, rss)
            self.cpu_s += cpu
            self.warmup_cpu_s += 0.0 if r.reused else float(r.stats.get("warmup_cpu_s", 0))
            entry = self.steps.setdefault(step_of(r.output), {"tasks": 0, "cpu_s": 0.0, "max_rss_kb": 0})
            entry["tasks"] += 1
            entry["cpu_s"] = round(entry["cpu_s"] + cpu, 3)
            entry["max_rss_kb"] = max(entry["max_rss_kb"], rss)


@dataclasses.dataclass
class FuzzyRun:
    """One run of the fuzzy steps. ``slot``/``next_row``/``added_base``: the document numbering
    (:func:`number_documents`); ``state``: what this run writes for the next one."""

    shards: Mapping[str, Sequence[tuple[str, str, int]]]  # per source: (bucket shard, normalized shard, rows), :class:`SourceShards`
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
    costs: TaskCosts = dataclasses.field(default_factory=TaskCosts)
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
        """Run one step's tasks; their costs join the run's (:class:`TaskCosts`). A
        task's many inputs are named by the step's manifest (:mod:`.manifest`), not listed.
        Each result is made compact as it arrives (:class:`CompactResults`), so what the
        driver holds grows with the tasks by a few hundred bytes each, not by the sources."""
        self.widest = max([self.widest, *(manifest.count(t.inputs) for t in tasks)])
        done = self.runner.map(manifest.name_inputs(tasks, storage.join(self.work, "manifests")), CompactResults(self.num_examples))
        self.costs.add(done)
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


def _smallest(values: list[int]) -> np.ndarray:
    """``values`` in the narrowest integer type that holds them."""
    return np.array(values, np.min_scalar_type(max(values, default=0)) if min(values, default=0) >= 0 else np.int64)


class RankCounts(Mapping[str, int]):
    """A verify task's count per source rank (the ``{str(rank): n}`` it returns) as two arrays
    of the narrowest integer types: a few bytes a source, not ~100 (a dict entry with its key and
    value objects); 16,384 verify tasks x 146 sources would otherwise hold ~0.5 GB in the driver."""

    __slots__ = ("_ranks", "_counts")

    def __init__(self, counts: Mapping[str, int]) -> None:
        self._ranks = _smallest([int(k) for k in counts])
        self._counts = _smallest([int(v) for v in counts.values()])

    def __getitem__(self, key: str) -> int:
        hit = np.flatnonzero(self._ranks == int(key))
        if not len(hit):
            raise KeyError(key)
        return int(self._counts[hit[0]])

    def __iter__(self) -> Iterator[str]:
        return (str(r) for r in self._ranks.tolist())

    def __len__(self) -> int:
        return len(self._ranks)

    def items(self) -> Any:  # one pass over the arrays, not a lookup per key
        return list(zip(map(str, self._ranks.tolist()), self._counts.tolist()))


class CompactResults:
    """The runner's ``on_done`` for one step: each result's per-source counts become
    :class:`RankCounts`, a plan task's requested node ranges an array, and of the examples (each with two excerpts) only those still among the
    step's ``keep`` best (by ``_key``) stay with their result; the rest are dropped as better
    ones arrive. The summary takes its examples from these."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.best: list[tuple[Any, int, dict[str, Any]]] = []  # (key, arrival, example), at most ``keep``, heap of the worst first
        self.holders: dict[int, list[dict[str, Any]]] = {}
        self.arrived = 0

    def __call__(self, result: ShardResult) -> None:
        stats = result.stats
        for key in ("removed_by_rank", "removed_chars_by_rank"):
            if isinstance(stats.get(key), dict):
                stats[key] = RankCounts(stats[key])
        if isinstance(stats.get("requested_runs"), list):  # a plan task's node ranges: 16 bytes each
            stats["requested_runs"] = np.asarray(stats["requested_runs"], np.uint64).reshape(-1, 2)
        if stats.get("examples"):
            self._offer(stats["examples"])

    def _offer(self, examples: list[dict[str, Any]]) -> None:
        self.arrived += 1
        for example in examples:
            entry = (_Desc(example["_key"]), self.arrived, example)
            if len(self.best) < self.keep:
                heapq.heappush(self.best, entry)
            elif entry > self.best[0]:
                _, _, dropped = heapq.heapreplace(self.best, entry)
                dropped.clear()  # emptied in place: its result no longer offers it
            else:
                example.clear()
        examples[:] = [e for e in examples if e]


class _Desc:
    """A sort key reversed: the heap's smallest entry is the worst example (the largest ``_key``)."""

    __slots__ = ("key",)

    def __init__(self, key: Any) -> None:
        self.key = key

    def __lt__(self, other: _Desc) -> bool:
        return self.key > other.key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Desc) and self.key == other.key


class Shards(Sequence[Shard]):
    """Every shard as :data:`Shard`, held as arrays (~16 bytes a shard, not ~350 for a tuple
    and its node table's name): the names are derived when asked for, the normalized shard's
    from the run's pairing, the node table's from its map task's output."""

    def __init__(self, run: FuzzyRun, outputs: Sequence[str], runs: Mapping[int, tuple[tuple[int, int], ...]]) -> None:
        self._pairs, self._sources, self._outputs, self._runs = run.shards, run.sources, outputs, runs
        self._per = run.scale.shards_per_map
        counts = np.array([len(run.shards[s]) for s in run.sources], np.int64)
        self._start = np.r_[0, np.cumsum(counts)]
        self._first_task = np.r_[0, np.cumsum(-(-counts // self._per))]
        self.rows = np.fromiter((rows for s in run.sources for _, _, rows in run.shards[s]), np.int64, count=int(self._start[-1]))
        source = np.repeat(np.arange(len(counts)), counts)
        before = np.cumsum(self.rows) - self.rows  # rows before each shard in the run
        self.first = (np.array([run.slot[s] for s in run.sources], np.int64) << RANK_SHIFT)[source] + before - before[self._start[:-1][source]]

    def __len__(self) -> int:
        return int(self._start[-1])

    def __getitem__(self, i: int) -> Shard:  # type: ignore[override]
        r = int(np.searchsorted(self._start, i, side="right")) - 1
        return self._shard(r, i - int(self._start[r]), i)

    def __iter__(self) -> Iterator[Shard]:
        for r, source in enumerate(self._sources):
            for j in range(len(self._pairs[source])):
                yield self._shard(r, j, int(self._start[r]) + j)

    def runs_of(self, i: int) -> tuple[tuple[int, int], ...] | None:
        return self._runs.get(i)

    def _shard(self, r: int, j: int, i: int) -> Shard:
        source = self._sources[r]
        task = int(self._first_task[r]) + j // self._per
        return (source, self._pairs[source][j][1], nodes_uri(self._outputs[task], j % self._per), int(self.first[i]), int(self.rows[i]), self._runs.get(i))


@dataclasses.dataclass(frozen=True)
class Mapped:
    """What the map step leaves: its tasks and results, every shard's numbering, the shard
    groups (one members task each) and the stored node cuts of their node ranges."""

    tasks: list[ShardTask]
    results: list[ShardResult]
    shards: Shards
    groups: list[range]
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


class SourceShards(Sequence[tuple[str, str, int]]):
    """One source's shards as (bucket shard, normalized shard, rows), held as two name lists and
    an array: a tuple per shard cost ~50 bytes more (34 MiB at twice the pool's shards)."""

    __slots__ = ("buckets", "normalized", "rows")

    def __init__(self, buckets: list[str], normalized: list[str], rows: np.ndarray) -> None:
        self.buckets, self.normalized, self.rows = buckets, normalized, rows

    def __len__(self) -> int:
        return len(self.buckets)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self.buckets[i], self.normalized[i], int(self.rows[i])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)


def pair_shards(
    buckets: Mapping[str, Sequence[str]], normalized: Mapping[str, Sequence[str]], rows: Mapping[str, Sequence[int]] | None = None
) -> dict[str, SourceShards]:
    """Per source: (bucket shard, normalized shard, rows) in basename order; the rows from
    ``rows`` (per source, in ``buckets``' order) where given, else from each file's footer."""
    if set(buckets) != set(normalized):
        missing = sorted(set(buckets) ^ set(normalized))
        raise DedupError(
            f"sources {missing} have minhash buckets or normalized shards but not both; "
            "materialize minhash_buckets for every normalized source (or drop the source from both)"
        )
    out: dict[str, SourceShards] = {}
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
        names = sorted(b)
        counts = np.fromiter((int(counted[name]) if name in counted else storage.parquet_num_rows(b[name]) for name in names), np.int64, count=len(names))
        out[source] = SourceShards([b[name] for name in names], [n[name] for name in names], counts)
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


@dataclasses.dataclass(frozen=True)
class VerifyPass:
    """One plan, gather and verify pass: its files' name prefix, per verify partition the
    previous outputs it reads, whether clusters that only gained members replay, and the verify
    partitions it runs (None: all)."""

    prefix: str
    previous: Sequence[tuple[str, ...]]
    replay: bool
    parts: tuple[int, ...] | None = None
