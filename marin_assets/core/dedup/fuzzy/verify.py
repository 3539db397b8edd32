"""Step 7, verify: the rule on each requested cluster of a label range; the previous verdict for every other."""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from marin_assets.core.dedup import fanin, shuffle
from marin_assets.core.dedup.decisions import (
    DedupError,
    GreedyVerifier,
    ngram_sets,
    size_bin,
)
from marin_assets.core.dedup.fuzzy.clusters import (
    VerifyParams,
    clusters_of,
    member_key,
    member_sets,
    pass_params,
    previous_rows,
    replay_plan,
    reusable,
    row_sums,
    streamed_labels,
    warm_clusters,
    whole_replays,
    with_fresh_previous_rows,
)
from marin_assets.core.dedup.fuzzy.layout import CLUSTER_SCHEMA, HEAD_TEXT_SHARE, TEXT_SCHEMA, VERDICT_SCHEMA, clusters_uri, streamed_uri
from marin_assets.core.dedup.fuzzy.state import Components, FuzzyRun, Mapped, Members, VerifyPass
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.runner import ShardResult, ShardTask


def _warm_ngrams() -> None:
    """Load the compiled n-gram kernels (from numba's disk cache) once per process."""
    ngram_sets(["warm up the kernels"], 3, 100)


@shuffle.measured(warm=(_warm_ngrams, warm_clusters))
def fuzzy_verify(inputs: list[str], output: str, params: VerifyParams) -> dict[str, Any]:
    """Verify the requested clusters of a label range; copy the previous verdict of the others."""
    return with_fresh_previous_rows(_verify, inputs, output, params)


@dataclasses.dataclass
class _Verdicts:
    """What a verify task decides as it goes: removal rows (in VERDICT_SCHEMA order), per cluster
    verified in full its retained member keys (and texts while few), the retained members'
    excerpts (for the examples), the examples kept and the counters."""

    rows: list[tuple] = dataclasses.field(default_factory=list)
    retained: dict[int, tuple[list[str], list[str]]] = dataclasses.field(default_factory=dict)
    excerpts: dict[int, str] = dataclasses.field(default_factory=dict)
    examples: list[tuple[int, dict[str, Any]]] = dataclasses.field(default_factory=list)
    counters: dict[str, int] = dataclasses.field(default_factory=dict)

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + int(n)


def _untouched(params: VerifyParams, sizes: pl.DataFrame, before: pl.DataFrame | None) -> tuple[pl.DataFrame | None, pl.DataFrame | None]:
    """Incremental components: every previous cluster of the range that no added document
    reached is the previous one (same label, same members): its rows and record are carried
    over. Returns those clusters' records and the remaining previous ones."""
    if not params.remap or before is None:
        return None, before
    remap = storage.read_parquet(params.remap, columns=["node", "label", "fresh"])
    changed = pc.and_(pc.invert(remap.column("fresh")), pc.not_equal(remap.column("node"), remap.column("label")))
    dead = set(remap.column("node").filter(changed).to_pylist()) | set(sizes["label"].to_list())
    hit = pl.col("label").is_in(list(dead))
    return before.filter(~hit), before.filter(hit)


def _verify(inputs: list[str], output: str, params: VerifyParams) -> dict[str, Any]:
    member_files, text_files = inputs[: params.member_files], inputs[params.member_files :]
    text_files, streamed_files = text_files[: params.text_files], text_files[params.text_files :]
    frame = clusters_of(member_files, params.lo, params.hi, params.member_blocks)
    sizes = member_sets(frame)
    reuse, before_clusters = reusable(frame, params, sizes)
    untouched, before_clusters = _untouched(params, sizes, before_clusters)
    untouched_labels = set(untouched["label"].to_list()) if untouched is not None else set()
    todo, replay = replay_plan(frame, params, reuse, before_clusters)
    # The texts of the clusters not streamed, at once, from this range's blocks (the range is
    # sized to hold them).
    part = shuffle.read_ranges_blocks(text_files, shuffle.partition_cuts(params.text_blocks), [(params.lo, params.hi)], TEXT_SCHEMA)
    text_of: dict[int, str] = dict(zip(part.column("node").to_pylist(), part.column("text").to_pylist()))
    found = _Verdicts(counters={"reused_clusters": len(reuse) + len(untouched_labels)})
    exempt = {params.sources.index(s) for s in params.exempt if s in params.sources}
    replayed, failed = _replay(replay, params, text_of, exempt, found.rows, found.examples)
    at_once = failed & set(whole_replays(frame, replay, params))  # every member's text was gathered: verified in full now
    failed -= at_once
    if at_once:
        todo = pl.concat([todo, frame.filter(pl.col("label").is_in(list(at_once)))])
    found.counters |= {"replayed_clusters": len(replayed), "replay_failed": len(failed), "replay_failed_at_once": len(at_once)}
    _verify_clusters(todo, params, text_of, streamed_files, exempt, found)
    records = _records(sizes, found.retained, before_clusters, reuse | replayed, failed)
    if untouched is not None and untouched.height:
        records = pl.concat([records, untouched.select(CLUSTER_SCHEMA.names)], how="vertical_relaxed")
    storage.write_parquet(records.to_arrow().cast(CLUSTER_SCHEMA), clusters_uri(output))
    columns = list(zip(*found.rows)) if found.rows else [[] for _ in VERDICT_SCHEMA]
    verdict = pa.table([pa.array(list(c), type=f.type) for c, f in zip(columns, VERDICT_SCHEMA)], schema=VERDICT_SCHEMA)
    changes = None  # no previous run: every source's rows are new
    if before_clusters is not None:
        # Carried rows are the previous ones: the change is this run's rows against the previous
        # rows of the clusters it decided again (or that are gone).
        now = row_sums(verdict)
        before = row_sums(previous_rows(params, set(before_clusters["label"].to_list()) - reuse - replayed))
        changes = {str(r): (now.get(r, 0) - before.get(r, 0)) % (1 << 128) for r in now.keys() | before.keys()}
    if reuse | untouched_labels | replayed:  # the previous rows of reused and replayed clusters, as they were
        carried = previous_rows(params, reuse | untouched_labels | replayed).select(VERDICT_SCHEMA.names).cast(VERDICT_SCHEMA)
        verdict = pa.concat_tables([verdict, carried]).combine_chunks()
    verdict = verdict.set_column(0, "key", pa.array(shuffle.prefix_keys(verdict.column("id"))))
    # Keyed by id, in blocks of equal ranges: a removals task (there are at most as many as verify
    # partitions) reads only the blocks of its id range.
    shuffle.write_keyed(verdict, output, params.text_blocks)
    return _verify_counters(found, records, verdict) | {"row_changes": changes}


def _verify_counters(found: _Verdicts, records: pl.DataFrame, verdict: pa.Table) -> dict[str, Any]:
    """The task's counters: clusters, sizes, removals per source rank, the examples."""
    histogram: dict[str, int] = {}
    for size in records["size"].to_list():
        histogram[size_bin(size)] = histogram.get(size_bin(size), 0) + 1
    by_rank = pl.from_arrow(verdict.select(["rank", "chars"])).group_by("rank").agg(pl.len().alias("n"), pl.col("chars").sum().alias("c"))
    counters = {k: 0 for k in ("verified_clusters", "verified_members", "streamed_clusters", "comparisons", "exempt_kept", "spilled_bytes", "largest_index_bytes")} | found.counters
    return counters | {
        "clusters": records.height,
        "clustered_docs": int(records["size"].sum() or 0) if records.height else 0,
        "largest_cluster": int(records["size"].max() or 0) if records.height else 0,
        "histogram": histogram,
        "removed_by_rank": {str(r): int(n) for r, n in zip(by_rank["rank"].to_list(), by_rank["n"].to_list())},
        "removed_chars_by_rank": {str(r): int(c) for r, c in zip(by_rank["rank"].to_list(), by_rank["c"].to_list())},
        "examples": [e for _, e in sorted(found.examples, key=lambda kv: -kv[0])],
    }


def _verify_clusters(todo: pl.DataFrame, params: VerifyParams, text_of: Mapping[int, str], streamed_files: Sequence[str], exempt: set[int], found: _Verdicts) -> None:
    """The rule on each cluster of ``todo`` (members in processing order). Clusters with more
    text than ``stream_chars`` are read batch by batch (in processing order) from the streamed
    files; the others' texts are in ``text_of``."""
    if not todo.height:
        return
    big = set(shuffle.hash_keys(streamed_labels(todo, params)).tolist())
    labels = todo["label"].to_numpy()
    starts = np.flatnonzero(np.r_[True, labels[1:] != labels[:-1]])
    ends = np.append(starts[1:], labels.size)
    members = _Members(todo["id"].to_list(), todo["rank"].to_list(), todo["chars"].to_list(), todo["node"].to_list(), labels)
    # the streamed files opened once per task, their read-aheads together about one batch's text
    with shuffle.SliceReader(streamed_files if big else (), "pos", ["node", "text"], params.batch_chars) as texts:
        for s, e, ckey in zip(starts.tolist(), ends.tolist(), shuffle.hash_keys(labels[starts]).tolist()):
            streamed = ckey in big
            found.count("verified_clusters")
            found.count("verified_members", e - s)
            found.count("streamed_clusters", streamed)
            if streamed:
                batches = (_read_batch(texts, ckey, a - s, b - s, members.nodes[a:b]) for a, b in _batches(members.chars, s, e, params))
            else:
                batches = ([text_of.get(members.nodes[i]) for i in range(a, b)] for a, b in _batches(members.chars, s, e, params))
            _verify_cluster(members, s, e, batches, params, exempt, found)


@dataclasses.dataclass(frozen=True)
class _Members:
    """A verify task's members in processing order, column by column."""

    ids: list[str]
    ranks: list[int]
    chars: list[int]
    nodes: list[int]
    labels: np.ndarray


def _batches(chars: Sequence[int], s: int, e: int, params: VerifyParams) -> list[tuple[int, int]]:
    """Rows ``[a, b)`` of the cluster ``[s, e)`` whose texts make about ``batch_chars`` of n-grams at a time, in order."""
    out = []
    a = s
    while a < e:
        b, size = a, 0
        while b < e and (b == a or size < params.batch_chars):
            size += min(chars[b], params.rule.max_chars_per_doc)
            b += 1
        out.append((a, b))
        a = b
    return out


def _verify_cluster(members: _Members, s: int, e: int, batches: Any, params: VerifyParams, exempt: set[int], found: _Verdicts) -> None:
    """The rule on one cluster (rows ``[s, e)``), its texts arriving batch by batch."""
    ids, ranks, chars = members.ids, members.ranks, members.chars
    label = int(members.labels[s])
    verifier = GreedyVerifier(params.rule, params.index_bytes)
    kept, kept_texts = found.retained[label] = ([], [])
    kept_chars = 0
    i = s
    for texts in batches:
        if any(t is None for t in texts):
            raise DedupError(f"cluster {ids[s]}: member text missing from the gathered shards; rerun fuzzy_duplicates")
        grams = ngram_sets(texts, params.rule.ngram_size, params.rule.max_chars_per_doc)
        for k, text in enumerate(texts):
            removal = verifier.offer(i, chars[i], grams[k], ranks[i] in exempt)
            if removal is None:
                found.excerpts[i] = text[: params.excerpt_chars]
                kept.append(member_key(ranks[i], ids[i]))
                kept_chars += len(text)
                if len(kept) * HEAD_TEXT_SHARE <= e - s and kept_chars <= params.batch_chars:  # else the record keeps no texts
                    kept_texts.append(text)
            else:
                r = removal.representative
                found.rows.append((0, ranks[i], ids[i], label, ids[s], ids[r], params.sources[ranks[r]], removal.containment, removal.jaccard, chars[i]))
                _offer_example(found.examples, params, params.sources[ranks[i]], ids[i], params.sources[ranks[r]], ids[r], removal, text, found.excerpts[r])
            i += 1
    found.count("comparisons", verifier.comparisons)
    found.count("exempt_kept", verifier.exempt_kept)
    found.count("spilled_bytes", verifier.retained.spilled)
    found.counters["largest_index_bytes"] = max(found.counters.get("largest_index_bytes", 0), verifier.retained.held)
    verifier.close()


def _records(sizes: pl.DataFrame, retained: Mapping[int, tuple[list[str], list[str]]], before: pl.DataFrame | None, carried: set[int], failed: set[int]) -> pl.DataFrame:
    """The cluster records of this run's clusters: retained keys (and texts, where every retained
    member's was kept) as verified now, or the previous ones where the previous decisions stand
    (reused, replayed). A cluster whose replay failed gets no digest and no retained keys: the
    second pass verifies it in full."""
    texts = [t if len(t) == len(k) else [None] * len(k) for k, t in retained.values()]
    fresh = pl.DataFrame(
        {"label": list(retained), "retained": [k for k, _ in retained.values()], "texts": texts},
        schema={"label": pl.Int64, "retained": pl.List(pl.String), "texts": pl.List(pl.String)},
    )
    if before is not None and carried:
        fresh = pl.concat([fresh, before.filter(pl.col("label").is_in(list(carried))).select("label", "retained", "texts")])
    records = sizes.join(fresh, on="label", how="left", maintain_order="left")
    if failed:
        gone = pl.col("label").is_in(list(failed))
        records = records.with_columns(
            pl.when(gone).then(pl.lit("")).otherwise(pl.col("members")).alias("members"),
            *(pl.when(gone).then(None).otherwise(pl.col(c)).alias(c) for c in ("retained", "texts")),
        )
    return records


def _replay(replay: pl.DataFrame, params: VerifyParams, text_of: Mapping[int, str], exempt: set[int], rows: list, examples: list) -> tuple[set[int], set[int]]:
    """Clusters that only gained members: the previous decisions stand while every added member
    is removed by the previous run's retained members before it (removed members never
    represent, so no other decision can change). ``replay`` holds, per cluster, the retained and
    the added members in processing order. Appends the added members' rows (the previous ones
    stand); returns the replayed labels and the failed ones (an added member is retained, or a
    retained one removed: verify in full)."""
    replayed: set[int] = set()
    failed: set[int] = set()
    if not replay.height:
        return replayed, failed
    labels = replay["label"].to_numpy()
    starts = np.flatnonzero(np.r_[True, labels[1:] != labels[:-1]])
    ends = np.append(starts[1:], labels.size)
    ids, ranks, chars, nodes, added, kept = (replay[c].to_list() for c in ("id", "rank", "chars", "node", "added", "text"))
    for s, e in zip(starts.tolist(), ends.tolist()):
        label = int(labels[s])
        texts = [kept[i] if kept[i] is not None else text_of.get(nodes[i]) for i in range(s, e)]
        if any(t is None for t in texts):
            raise DedupError(f"cluster {ids[s]}: member text missing from the gathered shards; rerun fuzzy_duplicates")
        grams = ngram_sets(texts, params.rule.ngram_size, params.rule.max_chars_per_doc)
        verifier = GreedyVerifier(params.rule, params.index_bytes)
        new_rows, new_examples, ok = [], [], True
        for k, i in enumerate(range(s, e)):
            removal = verifier.offer(i, chars[i], grams[k], ranks[i] in exempt)
            if (removal is None) == added[i]:  # an added member retained, or a retained one removed
                ok = False
                break
            if removal is not None:
                r = removal.representative
                new_rows.append((0, ranks[i], ids[i], label, ids[s], ids[r], params.sources[ranks[r]], removal.containment, removal.jaccard, chars[i]))
                new_examples.append((params.sources[ranks[i]], ids[i], params.sources[ranks[r]], ids[r], removal, texts[k], texts[r - s][: params.excerpt_chars]))
        verifier.close()
        if not ok:
            failed.add(label)
            continue
        replayed.add(label)
        rows.extend(new_rows)
        for example in new_examples:
            _offer_example(examples, params, *example)
    return replayed, failed


def _read_batch(texts: Any, key: int, lo: int, hi: int, nodes: Sequence[int]) -> list[str | None]:
    """Texts of members ``lo <= pos < hi`` of the cluster keyed ``key`` (from ``texts``, a
    :class:`.shuffle.SliceReader` of the streamed files), in processing order."""
    table = texts.read(key, lo, hi)
    text_of = dict(zip(table.column("node").to_pylist(), table.column("text").to_pylist()))
    return [text_of.get(n) for n in nodes]


def _offer_example(heap: list, params: VerifyParams, source: str, doc: str, rep_source: str, rep: str, removal: Any, text: str, rep_text: str) -> None:
    """Keep the removals with the smallest hash of (source, id): a stable sample."""
    if not params.num_examples:
        return
    key = xxhash.xxh3_64_intdigest(f"{source}\x00{doc}".encode())
    entry = {
        "source": source,
        "id": doc,
        "representative_source": rep_source,
        "representative_id": rep,
        "containment": round(removal.containment, 4),
        "jaccard": round(removal.jaccard, 4),
        "excerpt": text[: params.excerpt_chars],
        "representative_excerpt": rep_text[: params.excerpt_chars],
        "_key": key,
    }
    if len(heap) < params.num_examples:
        heapq.heappush(heap, (-key, entry))
    elif -heap[0][0] > key:
        heapq.heapreplace(heap, (-key, entry))


# --------------------------------------------------------------------------- scheduling


def run_verify(run: FuzzyRun, mapped: Mapped, members: Members, comps: Components, vpass: VerifyPass, gathered: Sequence[ShardResult]) -> list[ShardResult]:
    """Verify tasks, one per label range (a second pass: per range it verifies again): the member
    files, then the gathered texts' block files, then the big clusters' streamed files."""
    text_files = tuple(u for r in gathered for u in (*r.stats.get("sections", ()), r.output))
    text_files = tuple(run.merged(text_files, storage.join(run.work, "gather", vpass.prefix + "texts"), max(2, run.scale.max_inputs_per_task // 4), blocks=members.verify_parts))

    streamed_files = _bounded_streamed(run, gathered, members.verify_parts, run.scale.max_inputs_per_task - len(members.files) - len(text_files), vpass.prefix)
    return run.run(
        [
            ShardTask(
                fuzzy_verify,
                members.files + text_files + streamed_files[p],
                storage.join(run.work, "verify", vpass.prefix + shuffle.block_name(p, members.verify_parts)),
                dataclasses.replace(pass_params(run, mapped, members, comps, vpass, p, lo, hi), member_files=len(members.files), text_files=len(text_files)),
            )
            for p, (lo, hi) in enumerate(shuffle.partition_bounds(members.verify_parts))
            if vpass.parts is None or p in vpass.parts
        ]
    )


def _bounded_streamed(run: FuzzyRun, gathered: Sequence[ShardResult], parts: int, limit: int, prefix: str) -> list[tuple[str, ...]]:
    """Per verify partition, the files holding its big clusters' streamed texts: those of the
    gather tasks that streamed some, merged sorted into fewer files
    (:func:`fanin.merge_sorted_files`, the partitions' merges run together) while more than
    ``limit`` remain (levels until they fit). A sorted merge holds about two row groups
    (``verify_batch_chars``) per input, so it merges at most ``merge_bytes`` / that many files
    (but 16: a few MiB, within any task's size)."""
    by_part: list[list[str]] = [[] for _ in range(parts)]
    for r in gathered:  # one walk over the gather tasks (not one per partition: 16,384 x 23,284 at the pool's size)
        for p in r.stats.get("streamed_parts", ()):
            if p < parts:
                by_part[p].append(streamed_uri(r.output))
    files = [tuple(f) for f in by_part]
    limit, level = max(2, limit), 0
    fan_in = max(2, min(limit, max(16, run.scale.merge_bytes // (2 * run.scale.verify_batch_chars))))
    while any(len(f) > limit for f in files):
        tasks, owner = [], []
        for p, group in enumerate(files):
            if len(group) <= limit:
                continue
            count = -(-len(group) // fan_in)
            size = -(-len(group) // count)
            for g in range(count):
                out = storage.join(run.work, "gather", f"merged-{prefix}streamed-{level}", f"p{p:06d}-{g:05d}.parquet")
                tasks.append(ShardTask(fanin.merge_sorted_files, group[g * size : (g + 1) * size], out, fanin.MergeSortedParams(group_bytes=run.scale.verify_batch_chars)))
                owner.append(p)
        results = run.run(tasks)
        for p in set(owner):
            files[p] = tuple(r.output for r, q in zip(results, owner) if q == p)
        level += 1
    return files
