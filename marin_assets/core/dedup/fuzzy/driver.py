"""The fuzzy dedup run: the steps in order, each a list of tasks, with the run's state passed between them."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from marin_assets.core.dedup import shuffle
from marin_assets.core.dedup.components import connected_components
from marin_assets.core.dedup.decisions import (
    DedupError,
    FuzzyDedupParams,
    removal_ratios,
    removed_uri,
)
from marin_assets.core.dedup.fuzzy.added import AddedParams, HitsParams, fuzzy_bucket_hits, fuzzy_edges_added
from marin_assets.core.dedup.fuzzy.clusters import VerifyParams
from marin_assets.core.dedup.fuzzy.edges import RangeParams, fuzzy_edges
from marin_assets.core.dedup.fuzzy.gather import GatherGroupParams, GatherParams, fuzzy_gather_group
from marin_assets.core.dedup.fuzzy.layout import (
    LAYOUT,
    RANK_SHIFT,
    RELABEL_FILES,
    STATE_FILE,
    FuzzyScale,
    added_uri,
    clusters_uri,
    gone_uri,
    merge_runs,
    nodes_uri,
    shard_runs,
    streamed_uri,
)
from marin_assets.core.dedup.fuzzy.map import MapParams, fuzzy_map
from marin_assets.core.dedup.fuzzy.members import GroupParams, ShardParams, fuzzy_members_group
from marin_assets.core.dedup.fuzzy.merge import MergeParams, RelabelParams, fuzzy_merge_labels, fuzzy_relabel
from marin_assets.core.dedup.fuzzy.plan import fuzzy_plan
from marin_assets.core.dedup.fuzzy.publish import PublishParams, RemovalParams, fuzzy_publish, fuzzy_removals
from marin_assets.core.dedup.fuzzy.verify import fuzzy_verify
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.runner import ShardResult, ShardRunner, ShardTask

# --------------------------------------------------------------------------- the driver


SCRATCH_STEPS = ("edges", "cc", "delta", "members", "plan", "gather", "removals", "publish")


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


def verify_partitions(members: int, member_chars: int, scale: FuzzyScale) -> int:
    """Plan and verify tasks: a power of two of label ranges, each of at most about
    ``members_per_partition`` members and ``member_chars_per_partition`` characters."""
    wanted = max(shuffle.partitions_for(members, scale.members_per_partition), shuffle.partitions_for(member_chars, scale.member_chars_per_partition))
    return 1 << max(0, (wanted - 1).bit_length())


def step_costs(results: Sequence[ShardResult]) -> dict[str, dict[str, float]]:
    """Per step (the task output's folder): tasks, CPU seconds of the tasks run now, peak RSS."""
    out: dict[str, dict[str, float]] = {}
    for r in results:
        parts = r.output.rstrip("/").split("/")
        if "cc" in parts or parts[-2] in ("labels", "delta"):
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


def _source_fingerprint(uris: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(sorted(uris)).encode()).hexdigest()[:16]


def _pair(buckets: Mapping[str, Sequence[str]], normalized: Mapping[str, Sequence[str]]) -> dict[str, list[tuple[str, str, int]]]:
    """Per source: (bucket shard, normalized shard, rows) in basename order."""
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
        out[source] = [(b[name], n[name], storage.parquet_num_rows(b[name])) for name in sorted(b)]
    return out


def find_fuzzy_duplicates(
    buckets: Mapping[str, Sequence[str]],
    normalized: Mapping[str, Sequence[str]],
    exempt: Collection[str],
    out_dir_uri: str,
    params: FuzzyDedupParams = FuzzyDedupParams(),
    *,
    scale: FuzzyScale = FuzzyScale(),
    runner: ShardRunner | None = None,
    cache_uri: str | None = None,
    fingerprints: Mapping[str, str] | None = None,
    previous_uri: str | None = None,
    num_examples: int = 5,
    excerpt_chars: int = 240,
) -> dict[str, Any]:
    """Candidate clusters from shared buckets, verified; writes one removal list per source.

    A cluster is processed longest first, ties by source name then id; its ``cluster_id`` is
    the id of that first member, which is always kept. Removed rows: ``id``, ``cluster_id``,
    ``representative_id``, ``representative_source``, ``containment`` and ``jaccard``.

    Incremental: ``cache_uri`` keeps each source's map output under its ``fingerprints`` entry
    (default: a hash of its shard URIs), and ``previous_uri`` (an earlier output of this
    function over the same sources) lends the verdicts of the clusters no changed source
    touches. Without them, or when the sources or task sizes differ, everything is verified;
    the removals are the same either way.
    """
    runner = runner or ShardRunner()
    shards = _pair(buckets, normalized)
    sources = tuple(shards)
    rank = {s: i for i, s in enumerate(sources)}
    fps = {s: (fingerprints or {}).get(s) or _source_fingerprint([b for b, _, _ in shards[s]]) for s in sources}
    before = None
    if previous_uri and storage.exists(storage.join(previous_uri, STATE_FILE)):
        before = storage.read_json(storage.join(previous_uri, STATE_FILE))
    if before is not None and (before.get("layout") != LAYOUT or any(k not in before for k in ("slots", "fingerprints", "next_row", "node_tables"))):
        before = None  # written by an older version: a full run (the answer is the same)
    # Slots: an unchanged source keeps its slot (node numbers). A changed one keeps its slot too,
    # and each document it still has (same id, same buckets) keeps its node; added documents get
    # nodes past the source's ``next_row``. A new source gets a fresh slot.
    old_slots = {s: int(v) for s, v in (before or {}).get("slots", {}).items()}
    next_slot = max(old_slots.values(), default=-1) + 1
    slot: dict[str, int] = {}
    added_base: dict[str, int] = {}  # changed sources that keep their nodes: first added row
    rows_of = {s: sum(rows for _, _, rows in shards[s]) for s in sources}
    next_row: dict[str, int] = {}
    for source in sources:
        if before is None:
            slot[source], next_row[source] = rank[source], rows_of[source]
        elif source in old_slots and before["fingerprints"].get(source) == fps[source]:
            slot[source], next_row[source] = old_slots[source], int(before["next_row"][source])
        elif source in old_slots and int(before["next_row"][source]) + rows_of[source] < 1 << RANK_SHIFT:
            slot[source], added_base[source] = old_slots[source], int(before["next_row"][source])
            next_row[source] = added_base[source] + rows_of[source]
        else:
            slot[source], next_slot = next_slot, next_slot + 1
            next_row[source] = rows_of[source]
    if max(slot.values(), default=0) >= 1 << (63 - RANK_SHIFT):
        slot = {s: rank[s] for s in sources}  # slots exhausted: renumber (this run verifies everything)
        next_row, added_base, before = dict(rows_of), {}, None
    work = storage.join(out_dir_uri, "_work")
    cache = cache_uri or storage.join(work, "cache")
    exempt_t = tuple(sorted(set(exempt) & set(sources)))
    results: list[ShardResult] = []

    def run(tasks: list[ShardTask]) -> list[ShardResult]:
        done = runner.map(tasks)
        results.extend(done)
        return done

    # 1. map
    group_dirs: dict[str, str] = {}
    map_tasks: list[ShardTask] = []
    shard_plan: list[tuple[str, str, str, int, int, int, int]] = []  # (source, normalized shard, node table, first node, rows, map task, shard in group)
    node_tables: dict[str, dict[str, str]] = {}
    lost_shards = False  # a changed source lost a shard name: its documents there are gone
    renumbered = False  # an unchanged source's stored index is gone: its nodes may differ from the previous run's
    maps = sum(-(-len(shards[s]) // scale.shards_per_map) for s in sources)
    for source in sources:
        base = 0
        entry = f"{fps[source]}-s{slot[source]}-g{scale.shards_per_map}-n{LAYOUT}"  # node tables with node numbers and bucket digests
        if before is not None and source not in added_base and before["fingerprints"].get(source) == fps[source]:
            kept_entry = before.get("cache_entries", {}).get(source)
            if kept_entry and storage.exists(storage.join(cache, source, kept_entry)):
                entry = kept_entry  # the stored index of an unchanged source, with its node numbers
            else:
                renumbered = True
        previous_tables: Mapping[str, str] = {}
        if source in added_base:
            previous_tables = before["node_tables"].get(source, {})
            lost_shards |= bool(set(previous_tables) - {storage.basename(b) for b, _, _ in shards[source]})
            entry += "-k" + hashlib.sha256(json.dumps([added_base[source], sorted(previous_tables.items())]).encode()).hexdigest()[:12]
        group_dir = group_dirs[source] = storage.join(cache, source, entry)
        node_tables[source] = {}
        for g in range(0, len(shards[source]), scale.shards_per_map):
            group = shards[source][g : g + scale.shards_per_map]
            out = storage.join(group_dir, f"group-{g // scale.shards_per_map:05d}.blocks")
            bases = []
            for k, (b_uri, n_uri, rows) in enumerate(group):
                bases.append(base)
                shard_plan.append((source, n_uri, nodes_uri(out, k), (slot[source] << RANK_SHIFT) + base, rows, len(map_tasks), k))
                node_tables[source][storage.basename(b_uri)] = nodes_uri(out, k)
                base += rows
            previous = tuple(previous_tables.get(storage.basename(b_uri), "") for b_uri, _, _ in group) if source in added_base else ()
            params_k = MapParams(source, slot[source], tuple(bases), previous, added_base.get(source, -1), maps, scale.records_per_partition)
            map_tasks.append(ShardTask(fuzzy_map, tuple(u for b_uri, n_uri, _ in group for u in (b_uri, n_uri)), out, params_k))
        if base >= 1 << RANK_SHIFT:
            raise DedupError(f"source {source!r} has {base} documents, more than the {1 << RANK_SHIFT} a node number holds; split the source")
    mapped = run(map_tasks)
    bands = {r.stats["bands"] for r in mapped if r.stats["bands"]}
    if len(bands) > 1:
        odd = [(t.params.source, t.inputs[0]) for t, r in zip(map_tasks, mapped) if r.stats["bands"] and r.stats["bands"] != min(bands)]
        raise DedupError(f"minhash buckets have {sorted(bands)} bands per document across shards (e.g. {odd[:3]}); rematerialize minhash_buckets of every source with the same MinHashParams")
    docs_per_source = {s: 0 for s in sources}
    chars_per_source = {s: 0 for s in sources}
    for t, r in zip(map_tasks, mapped):
        docs_per_source[t.params.source] += int(r.stats["docs"])
        chars_per_source[t.params.source] += int(r.stats["chars"])
    shard_list = []  # (source, normalized shard, node table, first node, rows, node ranges)
    for source, n_uri, nodes, first, rows, m, k in shard_plan:
        runs = mapped[m].stats.get("runs")
        shard_list.append((source, n_uri, nodes, first, rows, tuple(tuple(r) for r in runs[k]) if runs else ()))
    # Groups of shards_per_map shards: one members task (and, full, one gather task) each. The
    # steps keyed by node (labels, requests) write one block per cut of the groups' node ranges,
    # so each group reads exactly its rows from every file (not a row group of each).
    shard_groups = [list(range(g, min(g + scale.shards_per_map, len(shard_list)))) for g in range(0, len(shard_list), scale.shards_per_map)]
    group_runs = [merge_runs([r for i in idx for r in shard_runs(*shard_list[i][3:6])]) for idx in shard_groups]
    node_cuts = storage.join(work, "members", "node_cuts.bin")
    shuffle.write_cuts(node_cuts, sorted({0, shuffle.KEY_SPACE} | {x for runs in group_runs for run_ in runs for x in run_}))

    # Incremental: the previous run's state says which sources changed.
    state: dict[str, Any] = {"layout": LAYOUT, "sources": list(sources), "fingerprints": fps, "slots": slot, "next_row": next_row, "node_tables": node_tables}
    state |= {"rule": dataclasses.asdict(params), "exempt": list(exempt_t), "cache_entries": {s: storage.basename(group_dirs[s]) for s in sources}}
    changed: list[str] | None = None
    usable = before is not None and all(storage.exists(clusters_uri(f)) for f in before.get("verify_files", [None]) if f)
    if usable and all(before.get(k) == state[k] for k in ("sources", "rule", "exempt")):
        changed = [s for s in sources if before["fingerprints"].get(s) != fps[s]]
    # Incremental components: every changed source kept its nodes and lost no document (same
    # id, same buckets), so the previous components stay whole and only merge.
    gone_files = tuple(gone_uri(t.output) for t in map_tasks if t.params.source in added_base)
    incremental = (
        changed is not None
        and set(changed) <= set(added_base)
        and not lost_shards
        and not renumbered
        and bool(before.get("label_files"))
        and all(storage.exists(f) for f in before["label_files"])
        and all(storage.exists(added_uri(t.output)) for t in map_tasks if t.params.source in added_base)
    )
    records = sum(int(r.stats["records"]) for r in mapped)
    edge_parts = shuffle.pow2_partitions(records, scale.records_per_partition)
    bounds_e = shuffle.partition_bounds(edge_parts)
    cc_stats: dict[str, Any]
    label_rows: list[int | None] = []
    if incremental:
        # 2. edges of the buckets an added document is in; 3. merge the previous components over them
        added_ranges = tuple(((slot[s] << RANK_SHIFT) + added_base[s], (slot[s] << RANK_SHIFT) + next_row[s]) for s in changed)
        # 2a. the records of the buckets an added document is in: whole map files scanned once
        # (a few per task), per key range of the added records
        added_files = tuple(added_uri(t.output) for t in map_tasks if t.params.source in added_base)
        added_records = sum(int(r.stats.get("added_records", 0)) for r in mapped)
        hit_ranges = shuffle.partition_bounds(shuffle.partitions_for(added_records, scale.records_per_partition))
        chunks: list[list[str]] = [[]]
        size = 0
        for r in mapped:
            if chunks[-1] and size + int(r.stats["records"]) > scale.scan_records_per_task:
                chunks.append([])
                size = 0
            chunks[-1].append(r.output)
            size += int(r.stats["records"])
        hits = run(
            [
                ShardTask(fuzzy_bucket_hits, (*added_files, *chunk), storage.join(work, "edges", f"hits-{p:05d}-{c:06d}.parquet"), HitsParams(lo, hi, len(added_files)))
                for p, (lo, hi) in enumerate(hit_ranges)
                for c, chunk in enumerate(chunks)
            ]
        )
        hit_parts = shuffle.partitions_for(sum(int(r.stats["hits"]) for r in hits), scale.records_per_partition)
        edge_results = run(
            [
                ShardTask(fuzzy_edges_added, tuple(r.output for r in hits), storage.join(work, "edges", "added-" + storage.shard_name(p, hit_parts)), AddedParams(lo, hi, added_ranges))
                for p, (lo, hi) in enumerate(shuffle.partition_bounds(hit_parts))
            ]
        )
        edges = sum(int(r.stats["edges"]) for r in edge_results)
        incremental = edges <= scale.merge_max_edges  # else: components over every edge
    if incremental:
        fresh_labels = storage.join(work, "labels", "fresh.parquet")
        merge_inputs = (*(r.output for r in edge_results), *gone_files, *before["label_files"])
        (merged,) = run([ShardTask(fuzzy_merge_labels, merge_inputs, storage.join(work, "cc", "remap.parquet"), MergeParams(len(edge_results), len(gone_files), fresh_labels))])
        incremental = int(merged.stats["split"]) == 0  # else: a cluster lost a member, components over every edge
    if incremental:
        old_labels = list(before["label_files"])
        old_rows = list(before.get("label_rows") or [])
        old_rows = old_rows if len(old_rows) == len(old_labels) else [None] * len(old_labels)
        # the same format as the previous file: one whose labels did not move is a byte copy
        relabelled_files = [storage.join(work, "labels", f"{i:06d}" + (shuffle.BLOCK_SUFFIX if old.endswith(shuffle.BLOCK_SUFFIX) else ".parquet")) for i, old in enumerate(old_labels)]
        fresh_count = int(merged.stats["fresh"])
        # Compaction: while the last label file is a small one of earlier fresh labels, this run's
        # fresh labels join it, so incremental runs do not add a label file each.
        append = bool(old_rows) and old_rows[-1] is not None and int(old_rows[-1]) + fresh_count <= scale.members_per_partition
        if append:
            label_files, label_rows = relabelled_files, [*old_rows[:-1], int(old_rows[-1]) + fresh_count]
        else:
            label_files, label_rows = relabelled_files + [fresh_labels], [*old_rows, fresh_count]
        # One task per RELABEL_FILES previous label files; each writes one file of touched rows.
        # The last one also reads the fresh labels (their touched rows; appended when compacting).
        starts = list(range(0, max(1, len(old_labels)), RELABEL_FILES))
        relabelled = run(
            [
                ShardTask(
                    fuzzy_relabel,
                    (merged.output, *old_labels[i : i + RELABEL_FILES], *([fresh_labels] if i == starts[-1] else [])),
                    storage.join(work, "delta", f"{i // RELABEL_FILES:06d}.blocks"),
                    RelabelParams(tuple(relabelled_files[i : i + RELABEL_FILES]), append_fresh=append and i == starts[-1], delta_cuts=node_cuts),
                )
                for i in starts
            ]
        )
        member_label_files = [r.output for r in relabelled]
        if append and storage.exists(fresh_labels):
            storage.remove(fresh_labels)  # its rows are in the last label file now
        cc_stats = {"cc_method": "incremental", "cc_rounds": 0, "touched_clusters": int(merged.stats["touched"])}
    else:
        # 2. edges
        edge_results = run(
            [
                ShardTask(fuzzy_edges, tuple(r.output for r in mapped), storage.join(work, "edges", shuffle.block_name(p, edge_parts)), RangeParams(lo, hi, edge_parts, scale.edges_per_task))
                for p, (lo, hi) in enumerate(bounds_e)
            ]
        )
        edges = sum(int(r.stats["edges"]) for r in edge_results)
        # 3. components
        label_files, cc_stats = connected_components(
            [r.output for r in edge_results],
            edges,
            work,
            runner,
            union_find_max_edges=scale.union_find_max_edges,
            edges_per_task=scale.edges_per_task,
            labels_dir=storage.join(work, "labels"),
            label_cuts=node_cuts,
        )
        labelled = sum(int(r.stats.get("nodes", 0)) for r in cc_stats["cc_results"])  # = the clustered documents
        results.extend(cc_stats.pop("cc_results"))
        member_label_files = label_files
    state["label_files"] = list(label_files)
    state["label_rows"] = label_rows if incremental else [None] * len(label_files)  # rows per label file where known (compaction)

    # 4. members (incremental: of the touched clusters only), one task per group of shards. The
    # member files hold one block per verify partition: incremental, the count is known now (the
    # previous totals); full, from the clustered documents at the corpus' mean length (a finer
    # verify partitioning, when the members' text is longer, reads its covering block and filters).
    if incremental:
        docs_before = int(before.get("clustered_docs", 0))
        estimate = docs_before + int(merged.stats["fresh"])
        member_blocks = verify_partitions(estimate, int(before.get("member_chars", 0)) * estimate // max(1, docs_before), scale)
    else:
        mean_chars = sum(chars_per_source.values()) // max(1, sum(docs_per_source.values()))
        member_blocks = verify_partitions(labelled, labelled * mean_chars, scale)
    members = run(
        [
            ShardTask(
                fuzzy_members_group,
                (*(shard_list[i][2] for i in idx), *member_label_files),
                storage.join(work, "members", f"g{m:06d}.blocks"),
                GroupParams(
                    tuple(ShardParams(shard_list[i][0], shard_list[i][3], shard_list[i][4], rank[shard_list[i][0]], shard_list[i][5]) for i in idx),
                    node_cuts,
                    member_blocks,
                    delta=incremental,
                ),
            )
            for m, idx in enumerate(shard_groups)
        ]
    )
    in_clusters = sum(int(r.stats["members"]) for r in members)
    member_chars = sum(int(r.stats["member_chars"]) for r in members)
    if incremental:
        # The members read were the touched clusters': the totals are the previous ones plus the
        # newly clustered documents (their characters at the previous mean).
        docs_before = int(before.get("clustered_docs", 0))
        in_clusters = docs_before + int(merged.stats["fresh"])
        member_chars = int(before.get("member_chars", 0)) * in_clusters // max(1, docs_before)
    verify_parts = verify_partitions(in_clusters, member_chars, scale)
    state["clustered_docs"], state["member_chars"] = in_clusters, member_chars
    state["verify_partitions"] = verify_parts
    bounds = shuffle.partition_bounds(verify_parts)
    previous_files: list[tuple[str, ...]] = [()] * verify_parts
    if changed is not None:
        old_bounds = shuffle.partition_bounds(int(before["verify_partitions"]))
        # Each label range reads the previous outputs whose ranges overlap it (counts may differ).
        previous_files = [tuple(f for f, (a, b) in zip(before["verify_files"], old_bounds) if a < hi and lo < b) for lo, hi in bounds]
    member_files = tuple(r.output for r in members)
    remap_uri = merged.output if incremental else ""

    def verify_params(p: int, lo: int, hi: int) -> VerifyParams:
        return VerifyParams(
            lo,
            hi,
            sources,
            exempt_t,
            previous_files[p],
            params,
            num_examples,
            excerpt_chars,
            stream_chars=scale.cluster_chars_in_memory,
            batch_chars=scale.verify_batch_chars,
            remap=remap_uri,
            member_blocks=member_blocks,
            request_cuts=node_cuts,
            text_blocks=verify_parts,
        )

    plan_parts = verify_parts
    if incremental:
        touched_members = sum(int(r.stats["members"]) for r in members)
        plan_parts = min(verify_parts, 1 << max(0, (shuffle.partitions_for(touched_members, scale.members_per_partition) - 1).bit_length()))

    # 5. plan, 6. gather, 7. verify
    def verify_pass(prefix: str, previous: Sequence[tuple[str, ...]], replay: bool) -> tuple[list[ShardResult], list[ShardResult]]:
        def vp(p: int, lo: int, hi: int) -> VerifyParams:
            return dataclasses.replace(verify_params(p, lo, hi), previous=previous[p], replay=replay)

        # Incremental: the member files hold the touched clusters only, so a plan task covers
        # several consecutive label ranges (members_per_partition touched members each).
        spans = verify_parts // plan_parts
        plans = run(
            [
                ShardTask(
                    fuzzy_plan,
                    member_files,
                    storage.join(work, "plan", prefix + shuffle.block_name(q, plan_parts)),
                    dataclasses.replace(
                        vp(q * spans, bounds[q * spans][0], bounds[(q + 1) * spans - 1][1]), previous=tuple(dict.fromkeys(f for p in range(q * spans, (q + 1) * spans) for f in previous[p]))
                    ),
                )
                for q in range(plan_parts)
            ]
        )
        plan_files = tuple(r.output for r in plans)
        wanted = [tuple(x) for r in plans for x in r.stats.get("requested_runs", [[0, shuffle.KEY_SPACE]])]

        def requested(first: int, rows: int, runs: Sequence[tuple[int, int]]) -> bool:
            return any(a < hi and lo < b for a, b in runs or ((first, first + rows),) for lo, hi in wanted)

        def gp(i: int) -> GatherParams:
            source, _, _, first, rows, runs = shard_list[i]
            return GatherParams(source, first, rows, params.max_chars_per_doc, scale.verify_batch_chars, runs)

        wanted_shards = [i for i, (_, _, _, first, rows, runs) in enumerate(shard_list) if requested(first, rows, runs)]
        if incremental:  # few rows requested: one task per shards_per_map requested shards
            gather_groups = [wanted_shards[g : g + scale.shards_per_map] for g in range(0, len(wanted_shards), scale.shards_per_map)]
        else:  # one task per group of shards with a requested row: it reads exactly its blocks
            chosen = set(wanted_shards)
            gather_groups = [idx for idx in ([i for i in group if i in chosen] for group in shard_groups) if idx]
        gathered = run(
            [
                ShardTask(
                    fuzzy_gather_group,
                    (*(u for i in idx for u in shard_list[i][1:3]), *plan_files),
                    storage.join(work, "gather", f"{prefix}g{g:06d}.blocks"),
                    GatherGroupParams(tuple(gp(i) for i in idx), node_cuts, verify_parts, scale.member_chars_per_partition),
                )
                for g, idx in enumerate(gather_groups)
            ]
        )
        text_files = tuple(u for r in gathered for u in (*r.stats.get("sections", ()), r.output))
        streamed_files = tuple(streamed_uri(r.output) for r in gathered if int(r.stats.get("streamed", 0)))
        verified = run(
            [
                ShardTask(
                    fuzzy_verify,
                    member_files + text_files + streamed_files,
                    storage.join(work, "verify", prefix + shuffle.block_name(p, verify_parts)),
                    dataclasses.replace(vp(p, lo, hi), member_files=len(member_files), text_files=len(text_files)),
                )
                for p, (lo, hi) in enumerate(bounds)
            ]
        )
        return gathered, verified

    gathered, verified = verify_pass("", previous_files, True)
    replayed = sum(int(r.stats.get("replayed_clusters", 0)) for r in verified)
    passes = [verified]
    if any(int(r.stats.get("replay_failed", 0)) for r in verified):
        # A cluster whose added member was retained is verified in full, every other verdict
        # taken from the first pass.
        more, verified = verify_pass("full-", [(r.output,) for r in verified], False)
        gathered = gathered + more
        passes.append(verified)

    # 8. removals by id range, then one file per source. Incremental: a source whose removal rows
    # are the previous run's (its row hash sums over the label ranges moved by zero) keeps the
    # previous file.
    moved: set[int] | None = None
    kept: dict[str, dict[str, Any]] = {}
    if changed is not None and all(r.stats.get("row_changes") is not None for rs in passes for r in rs):
        sums: dict[int, int] = {}
        for r in (r for rs in passes for r in rs):
            for k, h in r.stats["row_changes"].items():
                sums[int(k)] = (sums.get(int(k), 0) + int(h)) % (1 << 128)
        moved = {k for k, h in sums.items() if h}
        for s in sources:
            old = (before or {}).get("published", {}).get(s)
            if rank[s] not in moved and old is not None and storage.exists(old["uri"]):
                kept[s] = old
        moved = {rank[s] for s in sources if s not in kept}
    removed_total = sum(int(n) for r in verified for k, n in r.stats["removed_by_rank"].items() if moved is None or int(k) in moved)
    removal_parts = min(verify_parts, shuffle.pow2_partitions(removed_total, scale.members_per_partition))  # the verify outputs' blocks cut these ranges
    ranks_filter = None if moved is None else tuple(sorted(moved))
    parts = run(
        [
            ShardTask(fuzzy_removals, tuple(r.output for r in verified), storage.join(work, "removals", shuffle.block_name(p, removal_parts)), RemovalParams(lo, hi, ranks_filter))
            for p, (lo, hi) in enumerate(shuffle.partition_bounds(removal_parts))
        ]
    )
    groups = [sources[g : g + scale.sources_per_publish] for g in range(0, len(sources), scale.sources_per_publish)]
    publish_tasks = [
        ShardTask(
            fuzzy_publish,
            tuple(r.output for r in parts),
            storage.join(work, "publish", f"group-{g:05d}"),
            PublishParams(tuple(rank[s] for s in group), tuple(removed_uri(out_dir_uri, s) for s in group), tuple(kept.get(s) for s in group)),
        )
        for g, group in enumerate(groups)
    ]
    published = {s: stats for group, r in zip(groups, run(publish_tasks)) for s, stats in zip(group, r.stats["sources"])}
    state["published"] = {s: {"uri": removed_uri(out_dir_uri, s), "removed": int(published[s]["removed"]), "digest": str(published[s]["digest"])} for s in sources}
    state["clustered_docs"] = sum(int(r.stats.get("clustered_docs", 0)) for r in verified)
    storage.write_json(storage.join(out_dir_uri, STATE_FILE), state | {"verify_files": [r.output for r in verified]})
    fs, work_path = storage.filesystem(work)
    scratch_bytes = int(fs.du(work_path)) if fs.exists(work_path) else 0  # at its largest, before the collection
    for r in passes[0] if len(passes) > 1 else ():  # the first pass's verdicts live on in the second's
        for uri in (r.output, clusters_uri(r.output)):
            if storage.exists(uri):
                storage.remove(uri)
    collect_scratch(work, cache, state["cache_entries"], (before or {}).get("cache_entries", {}))

    # Counters from what the tasks returned.
    removed_per_source = {s: int(published[s]["removed"]) for s in sources}
    removed_chars = {s: 0 for s in sources}
    histogram: dict[str, int] = {}
    totals = {"clusters": 0, "verified_clusters": 0, "reused_clusters": 0, "verified_members": 0, "streamed_clusters": 0, "comparisons": 0, "exempt_kept": 0}
    examples: list[dict[str, Any]] = []
    for r in verified:
        totals["clusters"] += int(r.stats["clusters"])
    for r in passes[0]:
        totals["reused_clusters"] += int(r.stats["reused_clusters"])
    for r in (r for rs in passes for r in rs):
        for key in ("verified_clusters", "verified_members", "streamed_clusters", "comparisons", "exempt_kept"):
            totals[key] += int(r.stats[key])
    for r in verified:
        for k, c in r.stats["removed_chars_by_rank"].items():
            removed_chars[sources[int(k)]] += int(c)
        for k, n in r.stats["histogram"].items():
            histogram[k] = histogram.get(k, 0) + int(n)
        examples.extend(r.stats["examples"])
    examples = [{k: v for k, v in e.items() if k != "_key"} for e in sorted(examples, key=lambda e: e["_key"])[:num_examples]]
    fresh = [r for r in results if not r.reused]
    return {
        "docs": sum(docs_per_source.values()),
        "docs_per_source": docs_per_source,
        "chars_per_source": chars_per_source,
        "bucket_records": records,
        "bucket_partitions": edge_parts,
        "candidate_edges": edges,
        "largest_bucket": max((int(r.stats["largest_bucket"]) for r in edge_results), default=0),
        **cc_stats,
        "docs_in_clusters": sum(int(r.stats.get("clustered_docs", 0)) for r in verified),
        "largest_cluster": max((int(r.stats["largest_cluster"]) for r in verified), default=0),
        "cluster_size_histogram": dict(sorted(histogram.items(), key=lambda kv: int(kv[0].split("-")[0]))),
        "verify_partitions": verify_parts,
        **totals,
        "replayed_clusters": replayed,
        "verify_passes": len(passes),
        "changed_sources": changed,
        "shards_read_for_text": sum(int(r.stats["shard_read"]) for r in gathered),
        "removed": sum(removed_per_source.values()),
        "removed_per_source": removed_per_source,
        "removed_chars_per_source": removed_chars,
        "removal_ratio_per_source": removal_ratios(removed_per_source, docs_per_source),
        "removed_ids_digest": {s: str(published[s]["digest"]) for s in sources},
        "scratch_bytes": scratch_bytes,
        "sources_republished": sum(1 for s in sources if not published[s]["copied"]),
        "exempt_sources": list(exempt_t),
        "examples": examples,
        "tasks": len(results),
        "task_cpu_s": round(sum(float(r.stats.get("cpu_s", 0)) for r in fresh), 3),
        "warmup_cpu_s": round(sum(float(r.stats.get("warmup_cpu_s", 0)) for r in fresh), 3),
        "max_task_rss_kb": max(int(r.stats.get("rss_kb", 0)) for r in results),
        "steps": step_costs(results),
    }
