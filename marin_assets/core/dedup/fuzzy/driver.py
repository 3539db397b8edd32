"""The fuzzy dedup run: the steps in order, each a list of tasks, with the run's state
(:class:`FuzzyRun`) and each step's outputs handed to the next."""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from marin_assets.core.dedup import shuffle
from marin_assets.core.dedup.decisions import FuzzyDedupParams, removal_ratios, removed_uri
from marin_assets.core.dedup.fuzzy.added import run_added_edges
from marin_assets.core.dedup.fuzzy.edges import run_full_components
from marin_assets.core.dedup.fuzzy.gather import run_gather
from marin_assets.core.dedup.fuzzy.layout import LAYOUT, STATE_FILE, FuzzyScale, added_uri, clusters_uri
from marin_assets.core.dedup.fuzzy.map import node_tables, run_map
from marin_assets.core.dedup.fuzzy.members import run_members
from marin_assets.core.dedup.fuzzy.merge import run_merge, run_relabel
from marin_assets.core.dedup.fuzzy.plan import run_plan
from marin_assets.core.dedup.fuzzy.publish import run_publish
from marin_assets.core.dedup.fuzzy.state import (
    Components,
    FuzzyRun,
    Mapped,
    Members,
    VerifyPass,
    collect_scratch,
    number_documents,
    pair_shards,
    previous_state,
    source_fingerprint,
)
from marin_assets.core.dedup.fuzzy.verify import run_verify
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.runner import ShardResult, ShardRunner


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
    bucket_rows: Mapping[str, Sequence[int]] | None = None,
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
    the removals are the same either way. ``bucket_rows``: per source, each bucket shard's rows
    as its map task counted them (in ``buckets``' order); a source without them is counted
    from its files' footers, a request or two per shard.
    """
    shards = pair_shards(buckets, normalized, bucket_rows)
    fps = {s: (fingerprints or {}).get(s) or source_fingerprint([b for b, _, _ in shards[s]]) for s in shards}
    cache = cache_uri or storage.join(out_dir_uri, "_work", "cache")
    exempt_sources = tuple(sorted(set(exempt) & set(shards)))
    run = FuzzyRun(shards, fps, exempt_sources, out_dir_uri, cache, params, scale, runner or ShardRunner(), num_examples, excerpt_chars, previous_state(previous_uri))
    number_documents(run)
    mapped = run_map(run)
    run.state = {"layout": LAYOUT, "sources": list(run.sources), "fingerprints": fps, "slots": run.slot, "next_row": run.next_row} | run.state
    run.state |= {"rule": dataclasses.asdict(params), "exempt": list(run.exempt)}
    changed = changed_sources(run)
    comps = components(run, mapped, changed)
    members = run_members(run, mapped, comps, changed)
    gathered, passes, final = verify_passes(run, mapped, members, comps, changed)
    published = run_publish(run, passes, final, changed is not None, members.verify_parts)
    scratch_bytes = finish(run, mapped, passes, final, published)
    return summary(run, mapped, comps, members, gathered, passes, final, published, changed) | {"scratch_bytes": scratch_bytes}


def changed_sources(run: FuzzyRun) -> list[str] | None:
    """The sources whose shards changed since the previous run, or None: no usable previous run
    (none, its outputs gone, or other sources, rule or exempt sources): verify everything."""
    before = run.before
    usable = before is not None and all(storage.exists(clusters_uri(f)) for f in before.get("verify_files", [None]) if f)
    if usable and all(before.get(k) == run.state[k] for k in ("sources", "rule", "exempt")):
        return [s for s in run.sources if before["fingerprints"].get(s) != run.fingerprints[s]]
    return None


def _can_merge(run: FuzzyRun, mapped: Mapped, changed: list[str] | None) -> bool:
    """Incremental components: every changed source kept its nodes and lost no document (same
    id, same buckets), so the previous components stay whole and only merge."""
    before = run.before
    return (
        changed is not None
        and set(changed) <= set(run.added_base)
        and not mapped.lost_shards
        and not mapped.renumbered
        and bool(before.get("label_files"))
        and all(storage.exists(f) for f in before["label_files"])
        and all(storage.exists(added_uri(t.output)) for t in mapped.tasks if t.params.source in run.added_base)
    )


def components(run: FuzzyRun, mapped: Mapped, changed: list[str] | None) -> Components:
    """Steps 2-3: incremental (the added documents' edges merge the previous components, while
    they are few and no cluster lost a member), else edges and components over every edge."""
    if _can_merge(run, mapped, changed):
        edge_results = run_added_edges(run, mapped, changed)
        if sum(int(r.stats["edges"]) for r in edge_results) <= run.scale.merge_max_edges:
            merged = run_merge(run, mapped, edge_results)
            if int(merged.stats["split"]) == 0:
                return run_relabel(run, mapped, merged, edge_results)
    return run_full_components(run, mapped)


def verify_passes(run: FuzzyRun, mapped: Mapped, members: Members, comps: Components, changed: list[str] | None) -> tuple[list[ShardResult], list[list[ShardResult]], list[ShardResult]]:
    """Steps 5-7, plan, gather and verify; a second pass when a replay failed whose cluster's
    texts were not all gathered (such a cluster is verified in full), over the label ranges
    holding one only, every other verdict taken from the first. Returns the gather results, each
    pass's verify results and, per label range, its final verify result."""
    gathered, verified = verify_pass(run, mapped, members, comps, VerifyPass("", members.previous_files, True))
    passes, final = [verified], list(verified)
    failed = tuple(p for p, r in enumerate(verified) if int(r.stats.get("replay_failed", 0)))
    if failed:
        more, again = verify_pass(run, mapped, members, comps, VerifyPass("full-", [(r.output,) for r in verified], False, failed))
        gathered = gathered + more
        passes.append(again)
        for p, r in zip(failed, again):
            final[p] = r
    return gathered, passes, final


def verify_pass(run: FuzzyRun, mapped: Mapped, members: Members, comps: Components, vpass: VerifyPass) -> tuple[list[ShardResult], list[ShardResult]]:
    plans = run_plan(run, mapped, members, comps, vpass)
    gathered = run_gather(run, mapped, plans, comps.incremental, members.verify_parts, vpass.prefix)
    return gathered, run_verify(run, mapped, members, comps, vpass, gathered)


def finish(run: FuzzyRun, mapped: Mapped, passes: Sequence[Sequence[ShardResult]], verified: Sequence[ShardResult], published: Mapping[str, Mapping[str, Any]]) -> int:
    """Write the state for the next run, then collect the scratch; returns the scratch's bytes
    at its largest (before the collection)."""
    run.state["published"] = {s: {"uri": removed_uri(run.out_dir, s), "removed": int(published[s]["removed"]), "digest": str(published[s]["digest"])} for s in run.sources}
    run.state["clustered_docs"] = sum(int(r.stats.get("clustered_docs", 0)) for r in verified)
    write_state(storage.join(run.out_dir, STATE_FILE), run.state | {"verify_files": [r.output for r in verified]}, node_tables(run, mapped))
    fs, work_path = storage.filesystem(run.work)
    scratch_bytes = int(fs.du(work_path)) if fs.exists(work_path) else 0
    final = {r.output for r in verified}
    for r in (r for r in passes[0] if r.output not in final):  # the first pass's verdicts live on in the second's
        for uri in (r.output, clusters_uri(r.output)):
            if storage.exists(uri):
                storage.remove(uri)
    collect_scratch(run.work, run.cache, run.state["cache_entries"], (run.before or {}).get("cache_entries", {}))
    return scratch_bytes


def write_state(uri: str, state: Mapping[str, Any], node_tables: Iterable[tuple[str, dict[str, str]]]) -> None:
    """The state as JSON, its ``node_tables`` written one source at a time: at twice the pool's
    shards they are ~1.5 million names, which as one dict held ~0.2 GB more at the driver's peak."""
    with storage.open_atomic(uri) as handle:
        text = io.TextIOWrapper(handle, encoding="utf-8")
        text.write(json.dumps(state, indent=2, sort_keys=True).removesuffix("\n}") + ',\n  "node_tables": {')
        for k, (source, tables) in enumerate(node_tables):
            text.write(("," if k else "") + f"\n    {json.dumps(source)}: {json.dumps(tables, sort_keys=True)}")
        text.write("\n  }\n}")
        text.detach()  # flushes into ``handle``, which the block closes


def _verify_totals(passes: Sequence[Sequence[ShardResult]], final: Sequence[ShardResult]) -> dict[str, int]:
    totals = {"clusters": sum(int(r.stats["clusters"]) for r in final), "verified_clusters": 0, "reused_clusters": sum(int(r.stats["reused_clusters"]) for r in passes[0])}
    for key in ("verified_members", "streamed_clusters", "comparisons", "exempt_kept", "verify_spilled_bytes"):
        totals[key] = 0
    for r in (r for rs in passes for r in rs):
        for key in ("verified_clusters", "verified_members", "streamed_clusters", "comparisons", "exempt_kept"):
            totals[key] += int(r.stats[key])
        totals["verify_spilled_bytes"] += int(r.stats.get("spilled_bytes", 0))
    totals["largest_verify_index_bytes"] = max((int(r.stats.get("largest_index_bytes", 0)) for rs in passes for r in rs), default=0)
    return totals


def _removals_summary(run: FuzzyRun, verified: Sequence[ShardResult], published: Mapping[str, Mapping[str, Any]], docs: Mapping[str, int]) -> dict[str, Any]:
    """Removed documents and characters per source, the cluster-size histogram and the examples, from what the verify tasks returned."""
    removed = {s: int(published[s]["removed"]) for s in run.sources}
    removed_chars = {s: 0 for s in run.sources}
    histogram: dict[str, int] = {}
    examples: list[dict[str, Any]] = []
    for r in verified:
        for k, c in r.stats["removed_chars_by_rank"].items():
            removed_chars[run.sources[int(k)]] += int(c)
        for k, n in r.stats["histogram"].items():
            histogram[k] = histogram.get(k, 0) + int(n)
        examples.extend(e for e in r.stats["examples"] if e)  # emptied: not among the step's best (``CompactResults``)
    return {
        "docs_in_clusters": sum(int(r.stats.get("clustered_docs", 0)) for r in verified),
        "largest_cluster": max((int(r.stats["largest_cluster"]) for r in verified), default=0),
        "cluster_size_histogram": dict(sorted(histogram.items(), key=lambda kv: int(kv[0].split("-")[0]))),
        "removed": sum(removed.values()),
        "removed_per_source": removed,
        "removed_chars_per_source": removed_chars,
        "removal_ratio_per_source": removal_ratios(removed, docs),
        "removed_ids_digest": {s: str(published[s]["digest"]) for s in run.sources},
        "sources_republished": sum(1 for s in run.sources if not published[s]["copied"]),
        "examples": [{k: v for k, v in e.items() if k != "_key"} for e in sorted(examples, key=lambda e: e["_key"])[: run.num_examples]],
    }


def summary(
    run: FuzzyRun,
    mapped: Mapped,
    comps: Components,
    members: Members,
    gathered: Sequence[ShardResult],
    passes: Sequence[Sequence[ShardResult]],
    final: Sequence[ShardResult],
    published: Mapping[str, Mapping[str, Any]],
    changed: list[str] | None,
) -> dict[str, Any]:
    """The run's counters, from what the tasks returned (nothing re-reads the corpus)."""
    return {
        "docs": sum(mapped.docs_per_source.values()),
        "docs_per_source": mapped.docs_per_source,
        "chars_per_source": mapped.chars_per_source,
        "bucket_records": mapped.records,
        "bucket_partitions": shuffle.pow2_partitions(mapped.records, run.scale.records_per_task),
        "candidate_edges": comps.edges,
        "largest_bucket": max((int(r.stats["largest_bucket"]) for r in comps.edge_results), default=0),
        **comps.stats,
        "verify_partitions": members.verify_parts,
        **_verify_totals(passes, final),
        "replayed_clusters": sum(int(r.stats.get("replayed_clusters", 0)) for r in passes[0]),
        "replays_verified_at_once": sum(int(r.stats.get("replay_failed_at_once", 0)) for r in passes[0]),
        "verify_passes": len(passes),
        "changed_sources": changed,
        "shards_read_for_text": sum(int(r.stats["shard_read"]) for r in gathered),
        **_removals_summary(run, final, published, mapped.docs_per_source),
        "exempt_sources": list(run.exempt),
        "tasks": run.costs.tasks,
        "task_cpu_s": round(run.costs.cpu_s, 3),
        "warmup_cpu_s": round(run.costs.warmup_cpu_s, 3),
        "max_task_rss_kb": run.costs.max_rss_kb,
        "max_task_inputs": run.widest,
        "max_inputs_per_task": run.scale.max_inputs_per_task,
        "steps": run.costs.steps,
    }
