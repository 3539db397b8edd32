"""Global exact and fuzzy dedup over small generated corpora written as real shards."""

from __future__ import annotations

import dataclasses
import functools
import json
import random
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from marin_assets.core.dedup import decisions as dedup
from marin_assets.core.dedup.fuzzy import clusters as fuzzy_clusters
from marin_assets.core.dedup.fuzzy import state as fuzzy_state
from marin_assets.core.dedup.fuzzy import layout as fuzzy_layout
from marin_assets.core.dedup import manifest, minhash
from marin_assets.core.dedup import shuffle as dedup_shuffle
from marin_assets.core.dedup.decisions import ExactDedupParams, FuzzyDedupParams
from marin_assets.core.dedup.exact import find_exact_duplicates
from marin_assets.core.dedup.fuzzy import FuzzyScale, find_fuzzy_duplicates
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.runner import ShardRunner, ShardTask
from marin_assets.testing import dedup_corpus
from marin_assets.testing.dedup_corpus import doc_id, near_copies
from marin_assets_tests.core.test_minhash import shingle_jaccard, stdlib_documents
from marin_assets_tests.dedup_reference import reference_fuzzy_removals


def write_normalized(root: Path, source: str, texts: list[str], shards: int) -> list[str]:
    """Normalized-like shards: rows hash-partitioned by id, sorted by id within a shard."""
    return dedup_corpus.write_normalized(str(root), source, texts, shards)


def write_source(root: Path, source: str, texts: list[str], shards: int) -> tuple[list[str], list[str]]:
    normalized = write_normalized(root, source, texts, shards)
    buckets = []
    for uri in normalized:
        out = str(root / "buckets" / source / storage.basename(uri))
        minhash.minhash_shard([uri], out, minhash.MinHashParams())
        buckets.append(out)
    return normalized, buckets


def read_removed(out_dir: str, source: str) -> list[dict]:
    return storage.read_parquet(dedup.removed_uri(out_dir, source)).to_pylist()


# --------------------------------------------------------------------------- exact


def doc_text(n: int) -> str:
    return f"document number {n} " + " ".join(["filler"] * n)


def exact_corpus(root: Path, shards: int = 1) -> dict[str, list[str]]:
    texts = {n: doc_text(n) for n in range(1, 6)}
    members = {"a_src": [1, 2, 3], "b_src": [2, 3, 4], "c_src": [3, 4, 5], "d_src": []}
    return {source: write_normalized(root, source, [texts[n] for n in ns], shards) for source, ns in members.items()}


def test_exact_keeps_the_first_source_in_name_order(tmp_path: Path) -> None:
    sources = exact_corpus(tmp_path)
    ids = {n: doc_id(f"document number {n} " + " ".join(["filler"] * n)) for n in range(1, 6)}
    out = str(tmp_path / "exact")
    stats = find_exact_duplicates(sources, out, ExactDedupParams())
    assert read_removed(out, "a_src") == []
    assert read_removed(out, "d_src") == []
    assert read_removed(out, "b_src") == sorted([{"id": ids[2], "kept_source": "a_src"}, {"id": ids[3], "kept_source": "a_src"}], key=lambda r: r["id"])
    assert read_removed(out, "c_src") == sorted([{"id": ids[3], "kept_source": "a_src"}, {"id": ids[4], "kept_source": "b_src"}], key=lambda r: r["id"])
    assert stats["removed_per_source"] == {"a_src": 0, "b_src": 2, "c_src": 2, "d_src": 0}
    assert stats["unique_ids"] == 5 and stats["docs"] == 9
    assert stats["docs_per_source"] == {"a_src": 3, "b_src": 3, "c_src": 3, "d_src": 0}  # counted by the maps, not from footers
    json.dumps(stats)


def test_exact_keeper_rule_is_configurable(tmp_path: Path) -> None:
    sources = exact_corpus(tmp_path)
    out = str(tmp_path / "exact")
    stats = find_exact_duplicates(sources, out, ExactDedupParams(source_priority=("c_src",)))
    assert stats["keep_order"] == ["c_src", "a_src", "b_src", "d_src"]
    assert read_removed(out, "c_src") == []
    assert {r["kept_source"] for r in read_removed(out, "a_src")} == {"c_src"}
    assert sorted(r["kept_source"] for r in read_removed(out, "b_src")) == ["a_src", "c_src", "c_src"]


def test_exact_spilled_partitions_and_shard_counts_give_identical_files(tmp_path: Path) -> None:
    one = str(tmp_path / "one")
    many = str(tmp_path / "many")
    find_exact_duplicates(exact_corpus(tmp_path / "s1", shards=1), one)
    stats = find_exact_duplicates(exact_corpus(tmp_path / "s3", shards=3), many, ids_per_partition=2, work_dir=str(tmp_path))
    assert stats["partitions"] > 1
    for source in ("a_src", "b_src", "c_src", "d_src"):
        assert storage.read_bytes(dedup.removed_uri(one, source)) == storage.read_bytes(dedup.removed_uri(many, source))


class InputsSeen(ShardRunner):
    """The default runner, noting the most input files any task was given."""

    def map(self, tasks, on_done=None):
        tasks = list(tasks)
        object.__setattr__(self, "most", max([getattr(self, "most", 0), *(len(t.inputs) for t in tasks)]))
        return ShardRunner.map(self, tasks, on_done)


def test_exact_merges_map_files_and_parts_past_the_input_bound_into_identical_files(tmp_path: Path) -> None:
    one = str(tmp_path / "one")
    bounded = str(tmp_path / "bounded")
    find_exact_duplicates(exact_corpus(tmp_path / "s1", shards=1), one)
    runner = InputsSeen()
    stats = find_exact_duplicates(exact_corpus(tmp_path / "s3", shards=3), bounded, ids_per_partition=2, shards_per_map=1, max_inputs=3, runner=runner)
    assert stats["partitions"] > 3 and runner.most == 3  # 12 map files and the reduce parts, merged to at most 3 per task
    assert stats["tasks"] > 12 + stats["partitions"] + 1
    for source in ("a_src", "b_src", "c_src", "d_src"):
        assert storage.read_bytes(dedup.removed_uri(one, source)) == storage.read_bytes(dedup.removed_uri(bounded, source))
    assert not storage.exists(storage.join(bounded, "_work", "map-merged"))


def test_a_merge_at_stored_cuts_reads_the_cuts_once_and_keeps_every_row(tmp_path: Path, monkeypatch) -> None:
    """Merging block files cut at stored cuts: the cuts file is read once per task, not once per
    input and span (at the pool's counts 1,024 inputs x ~170 spans)."""
    from marin_assets.core.dedup import fanin

    cuts_uri = str(tmp_path / "cuts.bin")
    cuts = [0, 100, 250, 900, dedup_shuffle.KEY_SPACE]
    dedup_shuffle.write_cuts(cuts_uri, cuts)
    inputs = []
    for k in range(3):
        keys = np.arange(k, 1000, 7, dtype=np.int64)
        inputs.append(str(tmp_path / f"in-{k}.blocks"))
        with open(inputs[-1], "wb") as handle:
            writer = dedup_shuffle.BlockWriter(handle, cuts, inputs[-1])
            writer.add(pa.table({"key": keys, "node": keys}), len(cuts) - 1)
            writer.finish()
    reads = []
    monkeypatch.setattr(dedup_shuffle, "read_cuts", lambda uri, real=dedup_shuffle.read_cuts: reads.append(uri) or real(uri))
    out = str(tmp_path / "merged.blocks")
    stats = fanin.merge_files(inputs, out, fanin.MergeFilesParams(cuts=cuts_uri, budget_bytes=512))
    assert reads == [cuts_uri] and stats["spans"] > 1
    merged = dedup_shuffle.read_whole(out, pa.schema([("key", pa.int64()), ("node", pa.int64())]))
    assert sorted(merged.column("node").to_pylist()) == sorted(k for i in range(3) for k in range(i, 1000, 7))


def _store_requests(fn, *args, **kwargs) -> tuple[int, object]:
    """The latency store's requests ``fn`` makes here, and what it returns."""
    from bench import slow_store

    before = slow_store.SlowStore.total()
    out = fn(*args, **kwargs)
    return slow_store.SlowStore.total() - before, out


def test_a_merge_reads_each_input_in_one_request_whatever_its_size_and_spans(tmp_path: Path) -> None:
    """A merge task's requests follow its inputs, not their bytes or the spans its budget cuts
    them into: each input is one GET read front to back as it arrives, and the merged file one
    upload, whether the inputs are a few KiB or several MiB and whether one span or many."""
    from bench import slow_store
    from marin_assets.core.dedup import fanin

    schema = pa.schema([("key", pa.int64()), ("node", pa.int64())])
    counts, rows = {}, {}
    for per_input in (500, 200_000):
        inputs = []
        for k in range(4):
            nodes = np.arange(k * per_input, (k + 1) * per_input, dtype=np.int64)
            inputs.append(slow_store.uri(str(tmp_path / f"{per_input}" / f"in-{k}.blocks")))
            dedup_shuffle.write_blocks(pa.table({"key": dedup_shuffle.hash_keys(nodes), "node": nodes}), inputs[-1], cuts=dedup_shuffle.partition_cuts(64))
        for budget in (1 << 30, 8 << 10):  # one span; many spans
            out = slow_store.uri(str(tmp_path / f"{per_input}" / f"merged-{budget}.blocks"))
            requests, stats = _store_requests(fanin.merge_files, inputs, out, fanin.MergeFilesParams(blocks=64, budget_bytes=budget))
            counts[per_input, budget] = (requests, stats["spans"])
            rows[per_input, budget] = dedup_shuffle.read_whole(out, schema)
        assert rows[per_input, 1 << 30].equals(rows[per_input, 8 << 10]) and rows[per_input, 1 << 30].num_rows == 4 * per_input
        assert sorted(rows[per_input, 1 << 30].column("node").to_pylist()) == list(range(4 * per_input))
    assert all(requests == 4 + 1 for requests, _ in counts.values()), counts  # per input one GET; one upload
    assert counts[200_000, 1 << 30][1] == 1 and counts[200_000, 8 << 10][1] == 64, counts


def test_a_merge_refuses_a_cut_input_naming_it_and_the_fix(tmp_path: Path) -> None:
    """An input whose end is not its block offsets (cut short, or no block file) is an error that
    names the file, not a merge of the rows that happened to arrive."""
    from marin_assets.core.dedup import fanin

    nodes = np.arange(5000, dtype=np.int64)
    whole, cut = str(tmp_path / "whole.blocks"), str(tmp_path / "cut.blocks")
    dedup_shuffle.write_blocks(pa.table({"key": dedup_shuffle.hash_keys(nodes), "node": nodes}), whole, cuts=dedup_shuffle.partition_cuts(8))
    with open(whole, "rb") as src, open(cut, "wb") as dst:
        dst.write(src.read()[:-24])
    with pytest.raises(ValueError, match=r"cut\.blocks is no whole block file.*remove the run's _work folder"):
        fanin.merge_files([whole, cut], str(tmp_path / "merged.blocks"), fanin.MergeFilesParams(blocks=8))


def test_readers_of_a_final_merge_level_fetch_each_file_in_one_request_at_any_file_size(tmp_path: Path) -> None:
    """The last merge level writes an offsets index beside its files: a reader of one block of
    every merged file makes one request for the index's row (the files and blocks are in their
    names) and one per file with rows, whether the files are a few KiB (where a tail read holds
    a whole file) or many MiB, and gets the rows the files hold, in file order, as from the same
    files without an index."""
    from bench import slow_store
    from marin_assets.core.dedup import block_index, fanin

    schema = pa.schema([("key", pa.int64()), ("node", pa.int64())])
    counts = {}
    for rows_per_input in (100, 200_000):
        root = tmp_path / f"r{rows_per_input}"
        inputs = []
        for k in range(9):
            nodes = np.arange(k * rows_per_input, (k + 1) * rows_per_input, dtype=np.int64)
            inputs.append(slow_store.uri(str(root / "map" / f"in-{k}.blocks")))
            dedup_shuffle.write_blocks(pa.table({"key": dedup_shuffle.hash_keys(nodes), "node": nodes}), inputs[-1], cuts=dedup_shuffle.partition_cuts(8))
        runner = ShardRunner()
        merged = fanin.bounded(runner.map, inputs, slow_store.uri(str(root / "step")), 3, fanin.MergeFilesParams(blocks=8))
        assert len(merged) == 3 and all(block_index.index_of(uri) for uri in merged)
        plain = []  # the same files where no index is looked for
        for k, uri in enumerate(merged):
            plain.append(slow_store.uri(str(root / "plain" / f"copy-{k}.blocks")))
            dedup_shuffle.copy_file(uri, plain[-1])
        for block in (0, 5):
            requests, table = _store_requests(dedup_shuffle.read_blocks, merged, block, schema, 8)
            assert table.equals(dedup_shuffle.read_blocks(plain, block, schema, 8))
            assert table.num_rows > 0 and requests == 1 + len(merged), requests
            counts[rows_per_input, block] = requests
        keyed = _store_requests(dedup_shuffle.read_range, merged, 1 << 61, 1 << 62, ["node"], schema)
        assert keyed[1].equals(dedup_shuffle.read_range(plain, 1 << 61, 1 << 62, ["node"], schema)) and keyed[0] == 1 + len(merged)
        with pytest.raises(ValueError, match="expect 16"):
            dedup_shuffle.read_blocks(merged, 0, schema, 16)
    assert len(set(counts.values())) == 1, counts


def test_a_reader_of_many_spans_fetches_nearby_ones_in_one_request_per_file(tmp_path: Path) -> None:
    """A gather or members task reads the blocks of its shards' node ranges, spans apart (other
    shards' blocks between them): spans less than a read's gap apart are one ranged read per
    file, from plain block files (after their tail) and through an offsets index alike, and give
    the rows of reading each span alone."""
    from bench import slow_store
    from marin_assets.core.dedup import block_index, fanin

    schema = pa.schema([("key", pa.int64()), ("node", pa.int64())])
    files = []
    for k in range(3):
        nodes = np.arange(k * 40_000, (k + 1) * 40_000, dtype=np.int64)
        files.append(slow_store.uri(str(tmp_path / "map" / f"in-{k}.blocks")))
        dedup_shuffle.write_blocks(pa.table({"key": dedup_shuffle.hash_keys(nodes), "node": nodes}), files[-1], cuts=dedup_shuffle.partition_cuts(64))
    merged = fanin.bounded(ShardRunner().map, files, slow_store.uri(str(tmp_path / "step")), 2, fanin.MergeFilesParams(blocks=64))
    assert all(block_index.index_of(uri) for uri in merged)
    spans = [(1, 3), (20, 21), (40, 44)]
    for uris, expected in ((files, 2 * len(files)), (merged, 1 + len(merged))):
        requests, table = _store_requests(dedup_shuffle.read_block_spans, uris, spans, schema, 64)
        alone = pa.concat_tables([dedup_shuffle.read_block_spans([uri], [span], schema, 64) for uri in uris for span in spans])
        assert requests == expected and table.num_rows == alone.num_rows > 0, (requests, expected)
        assert sorted(table.column("node").to_pylist()) == sorted(alone.column("node").to_pylist())


def _merged_here(files: list[str], tmp_path: Path) -> str:
    """``files`` copied to local disk and merged there (the rows a merge must give, anywhere)."""
    from marin_assets.core.dedup import fanin

    local = []
    for k, uri in enumerate(files):
        local.append(str(tmp_path / "copies" / f"in-{k}.blocks"))
        dedup_shuffle.copy_file(uri, local[-1])
    out = str(tmp_path / "copies" / "merged.blocks")
    fanin.merge_files(local, out, fanin.MergeFilesParams(blocks=4))
    return out


@pytest.mark.parametrize("where", ["local", "gcs"])
def test_an_offsets_index_reads_the_same_rows_on_local_disk_and_the_gcs_emulator(where: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """The index's reads are ranged reads of an object's end and of byte ranges, and a merge's
    one streamed GET per input, as the GCS emulator serves them too: the rows read through the
    index equal each file's own blocks, a file of another merge level's cut is refused with the
    fix, and a merge there gives the rows a merge of local copies gives."""
    from marin_assets.core.dedup import block_index, fanin

    root = str(tmp_path) if where == "local" else request.getfixturevalue("gcs_prefix")
    schema = pa.schema([("key", pa.int64()), ("node", pa.int64())])
    folder = storage.join(root, "step", block_index.merged_folder(0, 4))
    files = [storage.join(folder, dedup_shuffle.block_name(g, 3)) for g in range(3)]
    for g, uri in enumerate(files):
        nodes = np.arange(g * 5000, (g + 1) * 5000, dtype=np.int64)
        dedup_shuffle.write_blocks(pa.table({"key": dedup_shuffle.hash_keys(nodes), "node": nodes}), uri, cuts=dedup_shuffle.partition_cuts(4))
    assert block_index.write_index(files, storage.join(folder, block_index.INDEX_NAME)) == 4 and all(block_index.index_of(u) for u in files)
    whole = [dedup_shuffle.read_all_blocks(uri, schema) for uri in files]  # each file's own blocks, in order
    for block, (lo, hi) in enumerate(dedup_shuffle.partition_bounds(4)):
        own = pa.concat_tables([dedup_shuffle.keep_ranges(table, [(lo, hi)]) for table in whole])
        assert own.num_rows and dedup_shuffle.read_blocks(files, block, schema, 4).equals(own)
    with pytest.raises(ValueError, match="remove the run's _work folder"):
        dedup_shuffle.read_blocks(files, 0, schema, 8)
    # a merge streams each file in one GET (on the emulator: the media download, read as it arrives)
    merged = storage.join(root, "step", "again.blocks")
    assert fanin.merge_files(files, merged, fanin.MergeFilesParams(blocks=4, budget_bytes=4 << 10))["spans"] == 4
    assert dedup_shuffle.read_whole(merged, schema).equals(dedup_shuffle.read_whole(_merged_here(files, tmp_path), schema))


def test_a_streamed_cluster_read_batch_by_batch_opens_each_file_once(tmp_path: Path) -> None:
    """A verify task reads a streamed cluster's texts a batch at a time: its files are opened
    once per task, so its requests do not grow with the batches (a cluster's text, read in file
    order, comes from each file's read-ahead)."""
    from bench import slow_store

    uris = []
    for f in range(3):
        pos = np.arange(f, 3000, 3, dtype=np.int64)
        table = pa.table({"key": np.full(pos.size, 7, np.int64), "pos": pos, "node": pos, "text": pa.array([f"text {p}" for p in pos.tolist()], pa.large_string())})
        uris.append(slow_store.uri(str(tmp_path / f"streamed-{f}.parquet")))
        storage.write_parquet(table, uris[-1], row_group_size=100)

    def read(batches: int) -> list[int]:
        with dedup_shuffle.SliceReader(uris, "pos", ["node", "text"], budget_bytes=4 << 20) as reader:
            edges = np.linspace(0, 3000, batches + 1).astype(int).tolist()
            return [n for lo, hi in zip(edges[:-1], edges[1:]) for n in sorted(reader.read(7, lo, hi).column("node").to_pylist())]

    (few, nodes_few), (many, nodes_many) = _store_requests(read, 1), _store_requests(read, 30)
    assert nodes_few == nodes_many == list(range(3000))
    assert many == few, (few, many)


def test_exact_names_the_source_and_file_when_id_is_missing(tmp_path: Path) -> None:
    uri = str(tmp_path / "bad" / storage.shard_name(0, 1))
    storage.write_parquet(pa.table({"text": ["no id here"]}), uri)
    with pytest.raises(dedup.DedupError, match="source 'bad_src'.*part-00000-of-00001"):
        find_exact_duplicates({"bad_src": [uri]}, str(tmp_path / "out"))


# --------------------------------------------------------------------------- fuzzy: verification rule


def grams(*ranges: range) -> np.ndarray:
    return np.unique(np.concatenate([np.arange(r.start, r.stop, dtype=np.uint64) for r in ranges]))


def test_removed_documents_never_act_as_representatives() -> None:
    a = grams(range(0, 100))
    b = grams(range(20, 120))  # 80% inside a
    c = grams(range(60, 80), range(100, 120), range(200, 210))  # 80% inside b, 40% inside a
    verdict = dedup.verify_cluster([300, 200, 100], [a, b, c], [False, False, False])
    assert [(r.index, r.representative) for r in verdict.removals] == [(1, 0)]
    assert verdict.removals[0].containment == pytest.approx(0.8)
    assert verdict.removals[0].jaccard == pytest.approx(80 / 120)


def test_exempt_members_are_kept_but_still_represent() -> None:
    a = grams(range(0, 100))
    b = grams(range(20, 120))
    c = grams(range(60, 80), range(100, 120), range(200, 210))
    verdict = dedup.verify_cluster([300, 200, 100], [a, b, c], [False, True, False])
    assert [(r.index, r.representative) for r in verdict.removals] == [(2, 1)]
    assert verdict.exempt_kept == 1


def in_processing_order(texts: list[str]) -> tuple[list[int], list[np.ndarray]]:
    texts = sorted(texts, key=lambda t: (-len(t), t))
    return [len(t) for t in texts], dedup.ngram_sets(texts)


@pytest.mark.parametrize("copies", [600, 6000])
def test_big_clusters_of_near_copies_keep_exactly_the_pairwise_survivors(copies: int) -> None:
    texts = near_copies(copies, seed=copies)
    assert shingle_jaccard(texts[0], texts[1]) >= 0.8
    lengths, grams = in_processing_order(texts)
    exempt = [i % 97 == 5 for i in range(copies)]
    greedy = dedup.verify_cluster(lengths, grams, exempt)
    pairwise = dedup.verify_cluster_pairwise(lengths, grams, exempt)
    assert [(r.index, r.representative, r.containment) for r in greedy.removals] == [(r.index, r.representative, r.containment) for r in pairwise.removals]
    assert greedy.exempt_kept == pairwise.exempt_kept
    survivors = copies - len(greedy.removals)
    assert survivors - greedy.exempt_kept < 10  # near-identical copies: a handful survive, as the rule says


def mixed_cluster(seed: int) -> tuple[list[int], list[np.ndarray], list[bool]]:
    """Four families of partial copies that borrow from each other, in processing order, and exempt flags."""
    rng = np.random.default_rng(seed)
    members, lengths = [], []
    for family in range(4):
        base = np.arange(family * 1000, family * 1000 + 120, dtype=np.uint64)
        for variant in range(60):
            keep = base[rng.random(base.size) < rng.uniform(0.4, 1.0)]
            other = np.arange(((family + 1) % 4) * 1000, ((family + 1) % 4) * 1000 + 120, dtype=np.uint64)
            borrowed = other[rng.random(other.size) < rng.uniform(0.0, 0.5)]
            unique = np.arange(rng.integers(0, 8), dtype=np.uint64) + np.uint64(10**6 + 100 * (family * 60 + variant))
            members.append(np.unique(np.concatenate([keep, borrowed, unique])))
            lengths.append(int(members[-1].size))
    order = sorted(range(len(members)), key=lambda i: -lengths[i])
    members = [members[i] for i in order]
    lengths = [lengths[i] for i in order]
    return lengths, members, [bool(x) for x in rng.random(len(members)) < 0.1]


def test_greedy_verification_equals_the_pairwise_rule_on_mixed_clusters() -> None:
    lengths, members, exempt = mixed_cluster(3)
    greedy = dedup.verify_cluster(lengths, members, exempt)
    pairwise = dedup.verify_cluster_pairwise(lengths, members, exempt)
    assert pairwise.removals and len(pairwise.removals) < len(members) - 20  # many retained: a real test of the filter
    assert [(r.index, r.representative, r.containment, r.jaccard) for r in greedy.removals] == [(r.index, r.representative, r.containment, r.jaccard) for r in pairwise.removals]
    assert greedy.exempt_kept == pairwise.exempt_kept
    assert greedy.comparisons < pairwise.comparisons


def test_a_verifier_past_its_memory_budget_spills_its_index_and_decides_the_same() -> None:
    """The retained members' n-grams go to memory-mapped files past the budget; the decisions
    are those of the pairwise rule (and of an unbounded verifier)."""
    lengths, members, exempt = mixed_cluster(8)
    pairwise = dedup.verify_cluster_pairwise(lengths, members, exempt)
    small = dedup.GreedyVerifier(FuzzyDedupParams(), memory_bytes=64 << 10)
    removals = [(r.index, r.representative, r.containment) for i, g in enumerate(members) if (r := small.offer(i, lengths[i], g, exempt[i])) is not None]
    assert small.retained.spilled > 0 and small.retained.held <= 64 << 10
    assert len(small.retained) > 20 and pairwise.removals  # many retained (spilled), some removed
    assert removals == [(r.index, r.representative, r.containment) for r in pairwise.removals]
    folder = small.retained.spill.folder
    small.close()
    assert folder and not Path(folder).exists()


def test_removal_ratio_helpers() -> None:
    ratios = dedup.removal_ratios({"a": 6, "b": 1}, {"a": 10, "b": 10, "c": 0})
    assert ratios == {"a": 0.6, "b": 0.1, "c": 0.0}
    assert dedup.sources_over_removal_limit(ratios, 0.5) == {"a": 0.6}


# --------------------------------------------------------------------------- fuzzy: end to end


def delete_words(text: str, count: int, rng: random.Random) -> str:
    words = text.split()
    drop = set(rng.sample(range(len(words)), count))
    return " ".join(w for i, w in enumerate(words) if i not in drop)


@functools.lru_cache(maxsize=1)
def fuzzy_corpus() -> tuple[list[str], dict[str, list[str]], dict[str, set[tuple[str, str]]]]:
    """Sources with planted near-duplicates: the base documents, texts per source and the
    expected (removed id, representative source) pairs per source."""
    rng = random.Random(17)
    base = stdlib_documents(40, per_doc=6, seed=17)
    near = {}
    for i in range(12):
        edited = delete_words(base[i], 2, rng)
        assert shingle_jaccard(base[i], edited) >= 0.9
        near[i] = edited
    far = [delete_words(base[i], len(base[i].split()) // 2, rng) for i in range(30, 34)]
    assert all(shingle_jaccard(base[30 + k], far[k]) < 0.5 for k in range(4))
    # a copy with a short tail added (5% of its words), whatever the docstring pool holds
    longer = {i: base[i] + "\n\n" + " ".join(base[39 - i].split()[: max(3, len(base[i].split()) // 20)]) for i in (17, 18)}
    assert all(shingle_jaccard(base[i], longer[i]) >= 0.9 for i in longer)
    texts = {
        "alpha": base[0:20] + base[30:34],
        "beta": [near[i] for i in range(0, 8)] + base[20:26] + [delete_words(base[20], 2, rng), longer[17]] + far,
        "gamma": [near[i] for i in range(8, 12)] + [longer[18]] + base[26:28],
        "delta": base[28:30],
    }
    expected = {
        "alpha": {(doc_id(base[17]), "beta"), (doc_id(base[18]), "gamma")},
        "beta": {(doc_id(near[i]), "alpha") for i in range(8)} | {(doc_id(texts["beta"][14]), "beta")},
        "gamma": set(),
        "delta": set(),
    }
    return base, texts, expected


def run_fuzzy(root: Path, shards: dict[str, int], **knobs) -> tuple[str, dict]:
    _, texts, _ = fuzzy_corpus()
    normalized, buckets = {}, {}
    for source, docs in texts.items():
        normalized[source], buckets[source] = write_source(root, source, docs, shards[source])
    out = str(root / "fuzzy")
    return out, find_fuzzy_duplicates(buckets, normalized, {"gamma"}, out, FuzzyDedupParams(), **knobs)


def test_fuzzy_finds_planted_near_duplicates_across_sources(tmp_path: Path) -> None:
    _, texts, expected = fuzzy_corpus()
    out, stats = run_fuzzy(tmp_path, {"alpha": 2, "beta": 1, "gamma": 1, "delta": 1})
    for source in texts:
        rows = read_removed(out, source)
        assert {(r["id"], r["representative_source"]) for r in rows} == expected[source], source
        for r in rows:
            assert r["containment"] >= 0.75 and 0 < r["jaccard"] <= 1
            assert r["representative_id"] != r["id"] or r["representative_source"] != source
    # The exempt source's contained copies were kept, and it still represents alpha's doc.
    assert stats["exempt_kept"] == 4
    assert stats["removed_per_source"] == {s: len(e) for s, e in expected.items()}
    assert stats["cluster_size_histogram"] and stats["examples"]
    json.dumps(stats)  # stats go into Dagster metadata as they are
    example = stats["examples"][0]
    assert example["excerpt"] and example["representative_excerpt"] and example["containment"] >= 0.75


def test_fuzzy_keeps_the_longest_copy(tmp_path: Path) -> None:
    base, texts, _ = fuzzy_corpus()
    out, _ = run_fuzzy(tmp_path, {"alpha": 1, "beta": 1, "gamma": 1, "delta": 1})
    rows = {r["id"]: r for r in read_removed(out, "alpha")}
    longer = texts["beta"][15]
    assert len(longer) > len(base[17])
    removed = rows[doc_id(base[17])]
    assert removed["representative_id"] == doc_id(longer) == removed["cluster_id"]
    assert doc_id(longer) not in {r["id"] for r in read_removed(out, "beta")}


def test_fuzzy_results_are_identical_across_reruns_shard_counts_and_spilling(tmp_path: Path) -> None:
    first, _ = run_fuzzy(tmp_path / "a", {"alpha": 1, "beta": 1, "gamma": 1, "delta": 1})
    again, _ = run_fuzzy(tmp_path / "b", {"alpha": 1, "beta": 1, "gamma": 1, "delta": 1})
    resharded, stats = run_fuzzy(
        tmp_path / "c",
        {"alpha": 3, "beta": 2, "gamma": 4, "delta": 2},
        scale=FuzzyScale(records_per_task=500, edges_per_task=10, union_find_max_edges=0, members_per_task=8),
    )
    assert stats["bucket_partitions"] > 1 and stats["verify_partitions"] > 1
    assert stats["cc_method"] == "star_rounds" and stats["cc_rounds"] >= 1
    for source in ("alpha", "beta", "gamma", "delta"):
        reference = storage.read_bytes(dedup.removed_uri(first, source))
        assert storage.read_bytes(dedup.removed_uri(again, source)) == reference
        assert storage.read_bytes(dedup.removed_uri(resharded, source)) == reference


def test_fuzzy_rejects_buckets_that_are_not_co_partitioned(tmp_path: Path) -> None:
    normalized, buckets = write_source(tmp_path, "alpha", stdlib_documents(4, seed=1), 2)
    with pytest.raises(dedup.DedupError, match="source 'alpha'.*rematerialize minhash_buckets"):
        find_fuzzy_duplicates({"alpha": buckets[:1]}, {"alpha": normalized}, set(), str(tmp_path / "out"))


# --------------------------------------------------------------------------- sharded steps


SMALL_TASKS = FuzzyScale(records_per_task=4000, edges_per_task=1500, union_find_max_edges=0, members_per_task=150)


def outputs(out: str, sources) -> dict[str, set[tuple[str, str, str]]]:
    return {s: {(r["id"], r["representative_source"], r["representative_id"]) for r in read_removed(out, s)} for s in sources}


def big_cluster_corpus(root: Path, extra: dict[str, list[str]] | None = None, shards: int = 2) -> tuple[dict, dict]:
    """Three sources sharing a 600-copy cluster, a few small clusters and unrelated documents."""
    copies = near_copies(600, seed=11)
    small = [t for k in range(6) for t in near_copies(k + 2, seed=100 + k, words=80)]
    loose = stdlib_documents(30, per_doc=4, seed=5)
    apart = [near_copies(3, seed=200 + k, words=60) for k in range(5)]  # clusters beta has no member of
    texts = {
        "alpha": copies[:300] + small[::2] + loose[:10] + [c for trio in apart for c in trio[:2]],
        "beta": copies[300:500] + small[1::2] + loose[10:20],
        "gamma": copies[500:] + loose[20:] + [trio[2] for trio in apart],
    }
    for source, more in (extra or {}).items():
        texts[source] = texts.get(source, []) + more
    normalized, buckets = {}, {}
    for source, docs in texts.items():
        normalized[source], buckets[source] = write_source(root, source, docs, shards)
    return normalized, buckets


def test_sharded_fuzzy_dedup_equals_the_pairwise_reference_with_a_600_copy_cluster(tmp_path: Path) -> None:
    normalized, buckets = big_cluster_corpus(tmp_path)
    out = str(tmp_path / "out")
    stats = find_fuzzy_duplicates(buckets, normalized, {"gamma"}, out, scale=SMALL_TASKS)
    assert stats["largest_cluster"] >= 550 and stats["cc_method"] == "star_rounds" and stats["verify_partitions"] > 1
    assert outputs(out, buckets) == reference_fuzzy_removals(buckets, normalized, {"gamma"})
    assert stats["removed"] > 400 and stats["streamed_clusters"] == 0
    # the big cluster verified batch by batch (texts read from storage 20 KB at a time): the same files
    streamed = str(tmp_path / "streamed")
    small_batches = dataclasses.replace(SMALL_TASKS, cluster_chars_in_memory=50_000, verify_batch_chars=20_000)
    streamed_stats = find_fuzzy_duplicates(buckets, normalized, {"gamma"}, streamed, scale=small_batches)
    assert streamed_stats["streamed_clusters"] == 1
    for source in buckets:
        assert storage.read_bytes(dedup.removed_uri(streamed, source)) == storage.read_bytes(dedup.removed_uri(out, source))


@dataclasses.dataclass(frozen=True)
class InputCountingRunner(ShardRunner):
    """The in-process runner, noting per task function the most input files one task was given."""

    widest: dict[str, int] = dataclasses.field(default_factory=dict, compare=False)

    def map(self, tasks, on_done=None):
        for task in tasks:
            name = task.fn.__name__
            self.widest[name] = max(self.widest.get(name, 0), manifest.count(task.inputs))
        return super().map(tasks, on_done)


def test_no_task_reads_more_files_than_the_bound_and_the_removals_stay_the_same(tmp_path: Path) -> None:
    """Twelve map files, star rounds over many partitions, a bound of six files per task: merge
    tasks combine each step's files first, and the removals are the unbounded run's, byte for byte."""
    normalized, buckets = big_cluster_corpus(tmp_path, shards=4)
    # the big cluster's texts streamed by each of the 12 gather tasks: their files merged too
    free = dataclasses.replace(SMALL_TASKS, shards_per_map=1, edges_per_task=400, cluster_chars_in_memory=50_000, verify_batch_chars=20_000)
    bound = dataclasses.replace(free, max_inputs_per_task=6, merge_bytes=4096)
    with pytest.raises(ValueError, match="MARIN_FUZZY_MAX_INPUTS_PER_TASK"):  # a gather task reads two files per shard
        dataclasses.replace(free, max_inputs_per_task=3)
    runner = InputCountingRunner()
    out = str(tmp_path / "bounded")
    stats = find_fuzzy_duplicates(buckets, normalized, {"gamma"}, out, scale=bound, runner=runner)
    assert max(runner.widest.values()) <= 6 and stats["max_task_inputs"] == max(runner.widest.values()), runner.widest
    assert runner.widest["merge_files"] == 6 and stats["steps"]["merge"]["tasks"] >= 3 and stats["streamed_clusters"] == 1
    assert 2 <= runner.widest["merge_sorted_files"] <= 6
    assert stats["cc_method"] == "star_rounds" and stats["steps"]["map"]["tasks"] == 12
    unbounded = str(tmp_path / "free")
    find_fuzzy_duplicates(buckets, normalized, {"gamma"}, unbounded, scale=free, runner=(free_runner := InputCountingRunner()))
    assert free_runner.widest["fuzzy_edges"] == 12  # what the bound replaced
    for source in buckets:
        assert storage.read_bytes(dedup.removed_uri(out, source)) == storage.read_bytes(dedup.removed_uri(unbounded, source))
    assert outputs(out, buckets) == reference_fuzzy_removals(buckets, normalized, {"gamma"})


def test_task_specs_name_a_manifest_not_every_input_at_production_counts(tmp_path: Path) -> None:
    """25,000 map files merged in 25 groups of 1,000, 16,384 edges tasks over the merged files,
    2,048 verify tasks of 1,024 files each (member files, texts, streamed texts), gather tasks
    of their own 32 files and the shared plan files: each spec pickles to at most 64 KiB
    (listed, the merge and verify specs are over 64 KiB), one manifest per step, and each task
    reads back exactly its inputs, in order."""
    import pickle

    from marin_assets.core.dedup.fanin import MergeFilesParams, merge_files
    from marin_assets.core.dedup.fuzzy.edges import RangeParams, fuzzy_edges
    from marin_assets.core.dedup.fuzzy.verify import fuzzy_verify

    work = "gs://marin-us-central2/global/fuzzy_duplicates/0123456789abcdef/_work"
    maps = [f"{work}/map/source-{s:03d}/{dedup_shuffle.block_name(k, 200)}" for s in range(125) for k in range(200)]
    merged = [f"{work}/edges/merged-0-b16384/{dedup_shuffle.block_name(g, 25)}" for g in range(25)]
    member = [f"{work}/members/merged/{dedup_shuffle.block_name(g, 256)}" for g in range(256)]
    texts = [f"{work}/gather/texts/{dedup_shuffle.block_name(g, 256)}" for g in range(256)]
    streamed = [f"{work}/gather/g{g:06d}.streamed.parquet" for g in range(25_000)]
    rule = FuzzyDedupParams()
    steps = {
        "merge": [ShardTask(merge_files, tuple(maps[g * 1000 : (g + 1) * 1000]), merged[g], MergeFilesParams(blocks=16_384)) for g in range(25)],
        "edges": [ShardTask(fuzzy_edges, tuple(merged), f"{work}/edges/{dedup_shuffle.block_name(p, 16_384)}", RangeParams(p, p + 1, 16_384)) for p in range(16_384)],
        "verify": [
            ShardTask(
                fuzzy_verify,
                (*member, *texts, *streamed[p * 7 % 24_000 : p * 7 % 24_000 + 512]),
                f"{work}/verify/{dedup_shuffle.block_name(p, 2048)}",
                fuzzy_clusters.VerifyParams(p, p + 1, tuple(f"source-{s:03d}" for s in range(125)), (), (), rule, member_files=256, text_files=256),
            )
            for p in range(2048)
        ],
    }
    # a gather task: its own 16 shards (and node tables) listed, the plan files shared by every task
    steps["gather"] = [ShardTask(fuzzy_edges, (*maps[32 * g : 32 * g + 32], *merged), f"{work}/gather/g{g:06d}.blocks") for g in range(700)]
    for step, tasks in steps.items():
        folder = str(tmp_path / step)
        named = manifest.name_inputs(tasks, folder)
        assert max(len(pickle.dumps(t)) for t in named) <= 64 << 10, step
        assert len(list((tmp_path / step).iterdir())) == 1
        for task, original in list(zip(named, tasks))[:: max(1, len(tasks) // 50)]:
            assert manifest.count(task.inputs) == len(original.inputs) and len(task.inputs) <= (33 if step == "gather" else 1 + manifest.OWN_LISTED)
            assert manifest.expand(task.inputs) == list(original.inputs)
    assert (tmp_path / "gather").iterdir().__next__().read_text().split() == merged  # only the shared names
    assert min(len(pickle.dumps(t)) for t in steps["merge"] + steps["verify"]) > 64 << 10
    # a map task's 32 inputs are its own: listed, no manifest; nor for a task of few inputs
    own = [ShardTask(fuzzy_edges, tuple(maps[32 * g : 32 * g + 32]), f"out-{g}") for g in range(10)]
    few = [ShardTask(fuzzy_edges, tuple(merged[:3]), "out", None)]
    assert manifest.name_inputs(own + few, str(tmp_path / "own")) == own + few and not (tmp_path / "own").exists()


def chained_corpus(root: Path, docs: int, copy_every: int) -> tuple[dict, dict, set[tuple[str, str]]]:
    """One source whose candidate component is a chain of ``docs`` distinct documents (each a
    60-word window of one random text, 20 words past the one before: neighbours share two
    thirds of their words, under the rule's threshold), written with MinHash buckets that link
    each document to the next (A~B, B~C, A not ~ C), plus a one-word-shorter copy of every
    ``copy_every``-th document in the same buckets. Returns the expected (removed, representative) ids."""
    rng = random.Random(3)
    vocab = [f"w{k}" for k in range(50_000)]
    words = [rng.choice(vocab) for _ in range(20 * docs + 60)]
    texts = [" ".join(words[20 * i : 20 * i + 60]) for i in range(docs)]
    copies = {i: " ".join(words[20 * i + 1 : 20 * i + 60]) for i in range(0, docs, copy_every)}
    rows = [(doc_id(t), t, [i // 2, docs + (i + 1) // 2]) for i, t in enumerate(texts)] + [(doc_id(c), c, [i // 2, docs + (i + 1) // 2]) for i, c in copies.items()]
    rows.sort()
    normalized = dedup_corpus.write_normalized(str(root), "chain", [t for _, t, _ in rows], 1)
    bucket_uri = str(root / "buckets" / "chain" / storage.basename(normalized[0]))
    table = pa.table({"id": [i for i, _, _ in rows], "buckets": pa.array([b for _, _, b in rows], pa.list_(pa.uint64())), "chars": [len(t) for _, t, _ in rows]})
    storage.write_parquet(table, bucket_uri)
    return {"chain": normalized}, {"chain": [bucket_uri]}, {(doc_id(c), doc_id(texts[i])) for i, c in copies.items()}


@pytest.mark.system
def test_a_chained_component_of_20000_distinct_documents_is_verified_within_the_index_budget(tmp_path: Path) -> None:
    normalized, buckets, expected = chained_corpus(tmp_path, 20_000, 1000)
    scale = dataclasses.replace(FuzzyScale(), verify_index_bytes=4 << 20)
    out = str(tmp_path / "out")
    stats = find_fuzzy_duplicates(buckets, normalized, set(), out, scale=scale)
    assert stats["largest_cluster"] == 20_000 + len(expected)
    assert {(r["id"], r["representative_id"]) for r in read_removed(out, "chain")} == expected
    assert stats["verify_spilled_bytes"] > 0 and stats["largest_verify_index_bytes"] <= 4 << 20


def test_a_small_chained_component_keeps_exactly_the_pairwise_survivors(tmp_path: Path) -> None:
    normalized, buckets, expected = chained_corpus(tmp_path, 400, 40)
    out = str(tmp_path / "out")
    stats = find_fuzzy_duplicates(buckets, normalized, set(), out, scale=dataclasses.replace(FuzzyScale(), verify_index_bytes=64 << 10))
    assert stats["largest_cluster"] == 400 + len(expected) and stats["verify_spilled_bytes"] > 0
    assert {(r["id"], r["representative_id"]) for r in read_removed(out, "chain")} == expected
    assert outputs(out, buckets) == reference_fuzzy_removals(buckets, normalized, set())


def test_verify_ranges_finer_than_the_member_blocks_read_their_covering_block(tmp_path: Path) -> None:
    """Member files are cut before their readers' count is known (from the clustered documents
    at the corpus' mean length); when the members' text is longer, verify uses more, finer key
    ranges, each reading its covering block and keeping its own rows: the same removals. The
    gather task, holding more text than a verify range, writes it to further block files."""
    rng = random.Random(5)
    words = [f"w{k}" for k in range(5000)]
    short = [" ".join(rng.choice(words) for _ in range(8)) for _ in range(1500)]  # unclustered, short: a low mean length
    normalized, buckets = big_cluster_corpus(tmp_path, extra={"beta": short})
    scale = dataclasses.replace(SMALL_TASKS, members_per_task=10**6, member_chars_per_task=40_000)
    out = str(tmp_path / "out")
    stats = find_fuzzy_duplicates(buckets, normalized, {"gamma"}, out, scale=scale)
    mean = sum(stats["chars_per_source"].values()) // stats["docs"]
    blocks = fuzzy_state.verify_partitions(stats["docs_in_clusters"], stats["docs_in_clusters"] * mean, scale)
    assert stats["verify_partitions"] >= 4 * blocks  # each verify range is a quarter (or less) of a member block
    assert outputs(out, buckets) == reference_fuzzy_removals(buckets, normalized, {"gamma"})


def test_a_block_file_gives_each_key_range_exactly_the_rows_a_sorted_file_gives(tmp_path: Path) -> None:
    from marin_assets.core.dedup.components import EDGE_SCHEMA, edge_table

    rng = np.random.default_rng(3)
    table = edge_table(rng.integers(0, 10**6, 5000), rng.integers(0, 10**6, 5000))
    sorted_uri, blocks_uri = str(tmp_path / "sorted.parquet"), str(tmp_path / "edges.blocks")
    dedup_shuffle.write_sorted(table, sorted_uri)
    bounds = dedup_shuffle.partition_bounds(7)
    assert dedup_shuffle.write_blocks(table, blocks_uri, bounds) == table.num_rows
    seen = 0
    for p, (lo, hi) in enumerate(bounds):
        want = dedup_shuffle.read_range([sorted_uri], lo, hi, ["a", "b"], EDGE_SCHEMA)
        got = dedup_shuffle.read_blocks([blocks_uri, blocks_uri], p, EDGE_SCHEMA)
        assert got.num_rows == 2 * want.num_rows
        assert sorted(zip(*(got.column(c).to_pylist() for c in ("key", "a", "b")))) == sorted(2 * list(zip(*(want.column(c).to_pylist() for c in ("key", "a", "b")))))
        assert got.column("key").to_pylist()[: want.num_rows] == sorted(want.column("key").to_pylist())
        seen += want.num_rows
    assert seen == table.num_rows
    one_key = dedup_shuffle.write_blocks(table.slice(0, 1), str(tmp_path / "one.blocks"), bounds)
    assert one_key == 1 and sum(dedup_shuffle.read_blocks([str(tmp_path / "one.blocks")], p, EDGE_SCHEMA).num_rows for p in range(len(bounds))) == 1
    with pytest.raises(ValueError, match="holds 7 blocks"):
        dedup_shuffle.read_blocks([blocks_uri], 7, EDGE_SCHEMA)


def test_sorted_runs_merge_into_one_sorted_stream_holding_one_table_of_each() -> None:
    """Runs of any lengths, cut into tables anywhere, with keys repeated within and across runs:
    the merge gives every row once, sorted by (key, pos)."""
    rng = np.random.default_rng(5)
    runs, everything = [], []
    for r in range(7):
        n = int(rng.integers(0, 300))
        table = pa.table({"key": rng.integers(0, 5, n), "pos": rng.integers(0, 50, n), "run": np.full(n, r)})
        table = table.take(pa.compute.sort_indices(table, sort_keys=[("key", "ascending"), ("pos", "ascending")]))
        cuts = sorted(rng.integers(0, n + 1, 4).tolist())
        runs.append(iter([table.slice(a, b - a) for a, b in zip([0, *cuts], [*cuts, n])]))
        everything.extend(zip(*(table.column(c).to_pylist() for c in ("key", "pos", "run"))))
    merged = pa.concat_tables(list(dedup_shuffle.merge_sorted(runs, ["key", "pos"])))
    rows = list(zip(*(merged.column(c).to_pylist() for c in ("key", "pos", "run"))))
    assert [r[:2] for r in rows] == sorted(r[:2] for r in rows)
    assert sorted(rows) == sorted(everything) and len(rows) > 300


def test_block_spans_give_any_key_ranges_exactly_the_rows_of_a_sorted_file(tmp_path: Path) -> None:
    """Readers of block files read the spans of blocks covering their key ranges (node runs of a
    shard group, or a verify range finer or coarser than the blocks) and get the rows a sorted
    file's range read gives: no other range's rows, none missing."""
    from marin_assets.core.dedup.components import LABEL_SCHEMA

    rng = np.random.default_rng(11)
    nodes = np.unique(rng.integers(0, 50_000, 6000))
    table = pa.table([pa.array(nodes), pa.array(nodes), pa.array(nodes // 7)], schema=LABEL_SCHEMA)
    groups = [[(0, 9000)], [(9000, 20_000), (31_000, 33_000)], [(20_000, 31_000)], [(33_000, 50_000)]]  # a group with two runs
    cuts = sorted({0, dedup_shuffle.KEY_SPACE} | {x for runs in groups for run in runs for x in run})
    files = []
    for k in range(3):  # each file holds some of the rows, as each label task does
        uri = str(tmp_path / f"labels-{k}.blocks")
        assert dedup_shuffle.write_blocks(table.filter(pa.array(nodes % 3 == k)), uri, cuts=cuts) == int((nodes % 3 == k).sum())
        files.append(uri)
        dedup_shuffle.write_sorted(table.filter(pa.array(nodes % 3 == k)), str(tmp_path / f"labels-{k}.parquet"))
    sorted_files = [str(tmp_path / f"labels-{k}.parquet") for k in range(3)]

    def rows(t: pa.Table) -> list[tuple]:
        return sorted(zip(*(t.column(c).to_pylist() for c in ("key", "node", "label"))))

    seen = 0
    for runs in groups:  # exact: every run edge is a cut
        spans, exact = dedup_shuffle.covering_spans(dedup_shuffle._as_cuts(cuts), runs)
        assert exact and len(spans) == len(runs)
        got = dedup_shuffle.read_ranges_blocks(files, dedup_shuffle._as_cuts(cuts), runs, LABEL_SCHEMA)
        assert rows(got) == rows(dedup_shuffle.read_ranges(sorted_files, runs, ["node", "label"], LABEL_SCHEMA))
        seen += got.num_rows
    assert seen == nodes.size
    # ranges whose edges are no cuts (a shard's own runs inside its group's): the covering blocks, filtered
    for ranges in ([(100, 200)], [(8_999, 9_001), (25_000, 40_000)], [(0, dedup_shuffle.KEY_SPACE)], [(49_999, dedup_shuffle.KEY_SPACE)]):
        got = dedup_shuffle.read_ranges_blocks(files, dedup_shuffle._as_cuts(cuts), ranges, LABEL_SCHEMA)
        assert rows(got) == rows(dedup_shuffle.read_ranges(sorted_files, ranges, ["node", "label"], LABEL_SCHEMA))
    # equal power-of-two blocks read by equal ranges of another power of two (coarser and finer)
    hashed = table.set_column(0, "key", pa.array(dedup_shuffle.hash_keys(nodes)))
    dedup_shuffle.write_blocks(hashed, str(tmp_path / "members.blocks"), cuts=dedup_shuffle.partition_cuts(8))
    dedup_shuffle.write_sorted(hashed, str(tmp_path / "members.parquet"))
    for parts in (1, 2, 8, 32):
        total = 0
        for lo, hi in dedup_shuffle.partition_bounds(parts):
            got = dedup_shuffle.read_ranges_blocks([str(tmp_path / "members.blocks")], dedup_shuffle.partition_cuts(8), [(lo, hi)], LABEL_SCHEMA)
            assert rows(got) == rows(dedup_shuffle.read_range([str(tmp_path / "members.parquet")], lo, hi, ["node", "label"], LABEL_SCHEMA))
            total += got.num_rows
        assert total == nodes.size
    # a span of several blocks is read with one offsets read and one data read; the whole file too
    eighths = dedup_shuffle.partition_bounds(8)
    want = dedup_shuffle.read_range([str(tmp_path / "members.parquet")], eighths[2][0], eighths[5][1], ["node", "label"], LABEL_SCHEMA)
    assert rows(dedup_shuffle.read_block_spans([str(tmp_path / "members.blocks")], [(2, 6)], LABEL_SCHEMA)) == rows(want)
    assert rows(dedup_shuffle.read_whole(str(tmp_path / "members.blocks"), LABEL_SCHEMA)) == rows(hashed)
    with pytest.raises(ValueError, match="keys outside"):
        dedup_shuffle.write_blocks(table, str(tmp_path / "bad.blocks"), cuts=[100, dedup_shuffle.KEY_SPACE])
    with pytest.raises(ValueError, match="holds 8 blocks where its readers expect 4"):  # cut at other ranges: an error, never wrong rows
        dedup_shuffle.read_ranges_blocks([str(tmp_path / "members.blocks")], dedup_shuffle.partition_cuts(4), [(0, 1 << 60)], LABEL_SCHEMA)


def test_star_rounds_label_components_like_union_find(tmp_path: Path) -> None:
    from marin_assets.core.dedup.components import LABEL_SCHEMA, connected_components, edge_table
    from marin_assets.core.runtime.runner import ShardRunner

    rng = np.random.default_rng(7)
    u = rng.integers(0, 3000, 2500)
    v = rng.integers(0, 3000, 2500)
    chain = np.arange(1000, 1400)  # a long path: the worst case for label propagation
    hub = rng.integers(0, 3000, 1500)  # a heavy centre: more spokes than a round task holds
    u, v = np.concatenate([u, chain[:-1], np.full(hub.size, 2999)]), np.concatenate([v, chain[1:], hub])
    files = []
    for k in range(3):
        uri = str(tmp_path / f"edges-{k}.parquet")
        dedup_shuffle.write_sorted(edge_table(u[k::3], v[k::3]), uri)
        files.append(uri)

    def labels(files: list[str], work: str, **sizes) -> dict[int, int]:
        out, stats = connected_components(files, len(u), work, ShardRunner(), **sizes)
        table = dedup_shuffle.read_range(out, 0, dedup_shuffle.KEY_SPACE, ["node", "label"])
        return dict(zip(table.column("node").to_pylist(), table.column("label").to_pylist())), stats

    one, one_stats = labels(files, str(tmp_path / "uf"), union_find_max_edges=10**9, edges_per_task=10**9)
    many, many_stats = labels(files, str(tmp_path / "stars"), union_find_max_edges=0, edges_per_task=500)
    assert one_stats["cc_method"] == "union_find" and many_stats["cc_method"] == "star_rounds"
    assert len(many_stats["cc_results"]) > 10
    split = [r for r in many_stats["cc_results"] if "split" in r.stats]
    assert split and max(r.stats["rows_held"] for r in many_stats["cc_results"]) < 1000  # the hub's range ran as slices
    assert one == many
    assert set(one) == set(u.tolist()) | set(v.tolist()) - {x for x, y in zip(u.tolist(), v.tolist()) if x == y and (u == x).sum() + (v == x).sum() == 2}
    assert one[1399] == 1000 or one[1399] < 1000  # the path's end is labelled with its component's minimum
    # Labels as block files cut at members tasks' node ranges: each range's blocks hold exactly the
    # rows the sorted label files give for it, with either method
    runs = [[(0, 700)], [(700, 1200), (2600, 3000)], [(1200, 2600)]]
    cuts_uri = str(tmp_path / "node_cuts.bin")
    dedup_shuffle.write_cuts(cuts_uri, sorted({0, dedup_shuffle.KEY_SPACE} | {x for r in runs for run in r for x in run}))
    for name, sizes in (("uf", {"union_find_max_edges": 10**9, "edges_per_task": 10**9}), ("stars", {"union_find_max_edges": 0, "edges_per_task": 500})):
        sorted_files, _ = connected_components(files, len(u), str(tmp_path / name), ShardRunner(), **sizes)
        block_files, _ = connected_components(files, len(u), str(tmp_path / f"{name}-blocks"), ShardRunner(), **sizes, label_cuts=cuts_uri)
        assert all(f.endswith(".blocks") for f in block_files) and len(block_files) == len(sorted_files)
        for r in runs:
            got = dedup_shuffle.read_ranges_blocks(block_files, dedup_shuffle.read_cuts(cuts_uri), r, LABEL_SCHEMA)
            want = dedup_shuffle.read_ranges(sorted_files, r, ["node", "label"], LABEL_SCHEMA)
            assert got.num_rows == want.num_rows > 0
            assert sorted(zip(got.column("node").to_pylist(), got.column("label").to_pylist())) == sorted(zip(want.column("node").to_pylist(), want.column("label").to_pylist()))
        whole = pa.concat_tables([dedup_shuffle.read_whole(f, LABEL_SCHEMA) for f in block_files])
        assert dict(zip(whole.column("node").to_pylist(), whole.column("label").to_pylist())) == one


def component_labels(files: list[str], edges: int, work: str, runner: ShardRunner | None = None, **sizes) -> tuple[dict[int, int], dict]:
    """Every node's label from :func:`connected_components` over edge files, and its counters."""
    from marin_assets.core.dedup.components import connected_components

    out, stats = connected_components(files, edges, work, runner or ShardRunner(), **sizes)
    table = dedup_shuffle.read_range(out, 0, dedup_shuffle.KEY_SPACE, ["node", "label"])
    return dict(zip(table.column("node").to_pylist(), table.column("label").to_pylist())), stats


def edge_files(root: Path, u: np.ndarray, v: np.ndarray, files: int) -> list[str]:
    """The undirected edges ``(u, v)`` as ``files`` key-sorted edge files (as edges tasks write them)."""
    from marin_assets.core.dedup.components import edge_table

    root.mkdir(parents=True, exist_ok=True)
    uris = [str(root / f"edges-{k}.parquet") for k in range(files)]
    for k, uri in enumerate(uris):
        dedup_shuffle.write_sorted(edge_table(u[k::files], v[k::files]), uri)
    return uris


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_heavy_centres_split_across_tasks_give_the_same_components_and_rounds(tmp_path: Path, seed: int) -> None:
    """Random graphs with a few centres of hundreds to thousands of spokes: the rounds with heavy
    ranges run as slices label every node as the unbounded rounds and union-find do, in as many rounds."""
    rng = np.random.default_rng(seed)
    n = 3000
    u, v = rng.integers(0, n, 1500), rng.integers(0, n, 1500)
    for centre, spokes in ((int(rng.integers(n)), 4000), (int(rng.integers(n)), 700), (int(rng.integers(n)), 300)):
        u, v = np.concatenate([u, np.full(spokes, centre)]), np.concatenate([v, rng.integers(0, n, spokes)])
    files = edge_files(tmp_path / "edges", u, v, 10)
    rounds = {"union_find_max_edges": 0, "edges_per_task": 1000}
    one, _ = component_labels(files, len(u), str(tmp_path / "uf"), union_find_max_edges=10**9, edges_per_task=10**9)
    whole, whole_stats = component_labels(files, len(u), str(tmp_path / "whole"), **rounds, max_task_rows=0)
    split, split_stats = component_labels(files, len(u), str(tmp_path / "split"), **rounds)
    assert split == whole == one
    assert split_stats["cc_rounds"] == whole_stats["cc_rounds"]
    held = [r.stats["rows_held"] for r in split_stats["cc_results"] if "rows_held" in r.stats]
    assert any("split" in r.stats for r in split_stats["cc_results"])
    # at most the bound (1.25 x edges_per_task) and the block being read; unbounded, the centre's range
    assert max(held) <= 2 * 1000 < 4000 <= max(r.stats["rows_held"] for r in whole_stats["cc_results"] if "rows_held" in r.stats)


def largest_round_task(stats: dict) -> tuple[int, int]:
    """The most rows one component task held and the largest task peak (VmHWM, bytes)."""
    results = stats["cc_results"]
    return max(r.stats.get("rows_held", 0) for r in results), max(r.peak_rss_bytes for r in results)


@pytest.mark.system
def test_a_star_of_a_million_nodes_runs_within_the_bound_of_ordinary_components(tmp_path: Path) -> None:
    """One component of 10^6 nodes around one centre (its edges fed to the component step
    directly), against 1,000 components of 1,000 nodes with as many edges and the same task size:
    the largest task holds no more rows and peaks no higher than 1.3x the ordinary run's (each
    task in a worker process of its own, so each peak is the task's)."""
    n, sizes = 1_000_000, {"union_find_max_edges": 0, "edges_per_task": 100_000}
    nodes = np.random.default_rng(0).permutation(n)
    runner = ShardRunner(processes=2)
    star = edge_files(tmp_path / "star", np.full(n - 1, nodes[0]), nodes[1:], 16)
    labels, stats = component_labels(star, n - 1, str(tmp_path / "star-cc"), runner, **sizes)
    assert len(labels) == n and set(labels.values()) == {0}
    assert any("split" in r.stats for r in stats["cc_results"])
    heads = nodes[np.arange(n) // 1000 * 1000]
    spoke = heads != nodes
    ordinary = edge_files(tmp_path / "ordinary", heads[spoke], nodes[spoke], 16)
    base_labels, base_stats = component_labels(ordinary, int(spoke.sum()), str(tmp_path / "ordinary-cc"), runner, **sizes)
    assert len(base_labels) == n and len(set(base_labels.values())) == 1000
    (rows, peak), (base_rows, base_peak) = largest_round_task(stats), largest_round_task(base_stats)
    assert rows <= 1.3 * base_rows and peak <= 1.3 * base_peak, (rows, base_rows, peak >> 20, base_peak >> 20)


def test_incremental_rebuild_of_one_changed_source_equals_a_full_rebuild(tmp_path: Path) -> None:
    # delta has a cluster of its own and no member in any cluster beta has one in
    delta = near_copies(4, seed=300, max_edits=1) + stdlib_documents(3, seed=301)
    normalized, buckets = big_cluster_corpus(tmp_path / "v1", extra={"delta": delta})
    cache = str(tmp_path / "cache")
    first = str(tmp_path / "first")
    full_stats = find_fuzzy_duplicates(buckets, normalized, {"gamma"}, first, scale=SMALL_TASKS, cache_uri=cache)
    # beta changes: new near copies of the big cluster and of a small one, one more unrelated doc
    more = near_copies(620, seed=11)[600:] + near_copies(9, seed=104, words=80)[-1:] + stdlib_documents(1, seed=77)
    normalized2, buckets2 = big_cluster_corpus(tmp_path / "v2", extra={"beta": more, "delta": delta})
    for source in ("alpha", "gamma", "delta"):  # unchanged sources keep their files (and fingerprints)
        normalized2[source], buckets2[source] = normalized[source], buckets[source]
    inc = str(tmp_path / "incremental")
    # verify ranges differ from the first run's; the added documents' buckets are found by
    # several key ranges, each scanning the map files in several tasks
    other_counts = dataclasses.replace(SMALL_TASKS, members_per_task=60, records_per_task=200, scan_records_per_task=3000)
    inc_stats = find_fuzzy_duplicates(buckets2, normalized2, {"gamma"}, inc, scale=other_counts, cache_uri=cache, previous_uri=first)
    full = str(tmp_path / "full")
    full2_stats = find_fuzzy_duplicates(buckets2, normalized2, {"gamma"}, full, scale=SMALL_TASKS)
    assert inc_stats["changed_sources"] == ["beta"] and inc_stats["verify_partitions"] != full_stats["verify_partitions"]
    assert inc_stats["cc_method"] == "incremental" and inc_stats["steps"]["edges"]["tasks"] > 4
    for source in buckets2:
        assert storage.read_bytes(dedup.removed_uri(inc, source)) == storage.read_bytes(dedup.removed_uri(full, source))
    assert inc_stats["removed_ids_digest"] == full2_stats["removed_ids_digest"]
    assert inc_stats["removed_ids_digest"]["gamma"] == full_stats["removed_ids_digest"]["gamma"]
    assert inc_stats["removed_ids_digest"]["beta"] != full_stats["removed_ids_digest"]["beta"]
    assert full_stats["removed_per_source"]["delta"] >= 1
    # beta's new copies are all removed by the clusters' previous survivors: those clusters replay
    # their previous decisions, and only beta, whose removals grew, is published again
    assert inc_stats["replayed_clusters"] >= 2 and inc_stats["sources_republished"] == 1 and full2_stats["sources_republished"] == 4
    assert inc_stats["reused_clusters"] > 0 and inc_stats["verified_clusters"] < full2_stats["verified_clusters"]
    assert inc_stats["shards_read_for_text"] < full2_stats["shards_read_for_text"] or inc_stats["verified_members"] < full2_stats["verified_members"]
    # a second change on top of the incremental run (its scratch already collected) still equals a full rebuild
    normalized3, buckets3 = big_cluster_corpus(tmp_path / "v3", extra={"beta": more, "delta": delta[:-1]})
    for source in ("alpha", "beta", "gamma"):
        normalized3[source], buckets3[source] = normalized2[source], buckets2[source]
    again = str(tmp_path / "again")
    again_stats = find_fuzzy_duplicates(buckets3, normalized3, {"gamma"}, again, scale=SMALL_TASKS, cache_uri=cache, previous_uri=inc)
    full3 = str(tmp_path / "full3")
    full3_stats = find_fuzzy_duplicates(buckets3, normalized3, {"gamma"}, full3, scale=SMALL_TASKS)
    # delta lost an unclustered document: its nodes, clusters and removals stay, nothing is republished
    assert again_stats["changed_sources"] == ["delta"] and again_stats["cc_method"] == "incremental" and again_stats["sources_republished"] == 0
    # no cluster touched: one plan task covers every label range
    assert again_stats["steps"]["plan"]["tasks"] == 1 < again_stats["verify_partitions"] == again_stats["steps"]["verify"]["tasks"]
    for source in buckets3:
        assert storage.read_bytes(dedup.removed_uri(again, source)) == storage.read_bytes(dedup.removed_uri(full3, source))
    assert again_stats["removed_ids_digest"] == full3_stats["removed_ids_digest"]


def test_the_incremental_merge_reads_only_the_label_blocks_of_the_added_edges_endpoints(tmp_path: Path) -> None:
    """One more near copy of a small cluster: the merge reads the blocks holding that cluster's
    nodes (label files are cut at the shard groups' node ranges), not every previous label."""
    scale = dataclasses.replace(SMALL_TASKS, shards_per_map=1)
    normalized, buckets = big_cluster_corpus(tmp_path / "v1", shards=4)
    cache, first = str(tmp_path / "cache"), str(tmp_path / "first")
    before = find_fuzzy_duplicates(buckets, normalized, {"gamma"}, first, scale=scale, cache_uri=cache)
    normalized2, buckets2 = big_cluster_corpus(tmp_path / "v2", extra={"gamma": near_copies(9, seed=104, words=80)[-1:]}, shards=4)
    for source in ("alpha", "beta"):
        normalized2[source], buckets2[source] = normalized[source], buckets[source]
    inc, full = str(tmp_path / "inc"), str(tmp_path / "full")
    stats = find_fuzzy_duplicates(buckets2, normalized2, {"gamma"}, inc, scale=scale, cache_uri=cache, previous_uri=first)
    find_fuzzy_duplicates(buckets2, normalized2, {"gamma"}, full, scale=scale)
    assert stats["cc_method"] == "incremental" and stats["changed_sources"] == ["gamma"]
    assert 0 < stats["label_rows_read"] < before["docs_in_clusters"] // 2
    # at a bound of 6 files per task, lookup tasks keep the needed rows of each few label files first
    runner, bounded = InputCountingRunner(), str(tmp_path / "bounded")
    bounded_stats = find_fuzzy_duplicates(buckets2, normalized2, {"gamma"}, bounded, scale=dataclasses.replace(scale, max_inputs_per_task=6), cache_uri=cache, previous_uri=first, runner=runner)
    assert bounded_stats["cc_method"] == "incremental" and len(storage.read_json(storage.join(first, fuzzy_layout.STATE_FILE))["label_files"]) > 6
    assert runner.widest["fuzzy_label_lookup"] <= 6 and max(runner.widest.values()) <= 6, str(runner.widest)
    assert bounded_stats["label_rows_read"] == stats["label_rows_read"]
    for source in buckets2:
        assert storage.read_bytes(dedup.removed_uri(inc, source)) == storage.read_bytes(dedup.removed_uri(full, source))
        assert storage.read_bytes(dedup.removed_uri(bounded, source)) == storage.read_bytes(dedup.removed_uri(full, source))


def test_incremental_components_follow_added_and_removed_documents_like_a_full_rebuild(tmp_path: Path) -> None:
    """beta changes three ways: it gains near copies (the previous clusters merge over the added
    documents' edges), it loses an unclustered document (still incremental), and it loses a
    clustered one (its cluster may fall apart: the components are recomputed over every edge)."""
    normalized, buckets = big_cluster_corpus(tmp_path / "v1")
    cache, first = str(tmp_path / "cache"), str(tmp_path / "first")
    first_stats = find_fuzzy_duplicates(buckets, normalized, {"gamma"}, first, scale=SMALL_TASKS, cache_uri=cache)
    state = storage.read_json(str(Path(first) / "_fuzzy_state.json"))
    retained = {k.split("\x00", 1)[1] for f in state["verify_files"] for keys in storage.read_parquet(fuzzy_layout.clusters_uri(f)).column("retained").to_pylist() for k in keys}
    in_clusters = retained | {r["id"] for s in buckets for r in read_removed(first, s)}
    lonely = next(t for t in stdlib_documents(30, per_doc=4, seed=5)[10:20] if doc_id(t) not in in_clusters)
    clustered = near_copies(600, seed=11)[300]  # in the big cluster
    more = near_copies(630, seed=11)[600:] + near_copies(9, seed=104, words=80)[-2:]
    cases = {
        "grown": (more, set(), "incremental"),
        "grown_and_shrunk": (more, {lonely}, "incremental"),
        "lost_a_member": (more[:5], {clustered}, "star_rounds"),
    }
    for name, (extra, drop, method) in cases.items():
        root = tmp_path / name
        v2, b2 = big_cluster_corpus(root, extra={"beta": extra})
        texts = [t for t in storage.read_parquet(v2["beta"][0]).column("text").to_pylist() + storage.read_parquet(v2["beta"][1]).column("text").to_pylist() if t not in drop]
        v2["beta"], b2["beta"] = write_source(root / "beta2", "beta", texts, 2)
        for source in ("alpha", "gamma"):
            v2[source], b2[source] = normalized[source], buckets[source]
        run_cache = str(root / "cache")
        shutil.copytree(cache, run_cache)
        inc, full = str(root / "incremental"), str(root / "full")
        inc_stats = find_fuzzy_duplicates(b2, v2, {"gamma"}, inc, scale=SMALL_TASKS, cache_uri=run_cache, previous_uri=first)
        full_stats = find_fuzzy_duplicates(b2, v2, {"gamma"}, full, scale=SMALL_TASKS)
        assert inc_stats["changed_sources"] == ["beta"] and inc_stats["cc_method"] == method, name
        for source in b2:
            assert storage.read_bytes(dedup.removed_uri(inc, source)) == storage.read_bytes(dedup.removed_uri(full, source)), (name, source)
        assert inc_stats["removed_ids_digest"] == full_stats["removed_ids_digest"]
        assert inc_stats["docs_in_clusters"] == full_stats["docs_in_clusters"] and inc_stats["cluster_size_histogram"] == full_stats["cluster_size_histogram"]
        if method == "incremental":
            # only the added documents' buckets give edges, and most clusters are carried over untouched
            assert inc_stats["candidate_edges"] < full_stats["candidate_edges"] / 10
            assert inc_stats["reused_clusters"] > inc_stats["verified_clusters"] + inc_stats["replayed_clusters"]
            assert inc_stats["removed_ids_digest"]["alpha"] == first_stats["removed_ids_digest"]["alpha"]
        else:
            assert doc_id(clustered) not in {r["id"] for r in read_removed(inc, "beta")}


def test_an_added_document_that_bridges_two_clusters_merges_them_like_a_full_rebuild(tmp_path: Path) -> None:
    """An added document whose buckets are half one cluster's and half another's: the previous
    clusters merge under the smaller label, as the full rebuild's components do."""
    one, two = near_copies(4, seed=401, max_edits=1), near_copies(4, seed=402, max_edits=1)
    normalized, buckets = {}, {}
    normalized["alpha"], buckets["alpha"] = write_source(tmp_path / "v1", "alpha", one + two, 1)
    normalized["beta"], buckets["beta"] = write_source(tmp_path / "v1", "beta", stdlib_documents(3, seed=403), 1)
    cache, first = str(tmp_path / "cache"), str(tmp_path / "first")
    first_stats = find_fuzzy_duplicates(buckets, normalized, set(), first, cache_uri=cache)
    assert first_stats["clusters"] == 2 and first_stats["largest_cluster"] == 4
    # beta gains a copy of the first cluster's text whose buckets are half of each cluster's
    bridge = one[0] + " bridge"
    v2, b2 = dict(normalized), dict(buckets)
    v2["beta"], b2["beta"] = write_source(tmp_path / "v2", "beta", stdlib_documents(3, seed=403) + [bridge], 1)
    alpha = storage.read_parquet(buckets["alpha"][0]).to_pylist()
    of = {r["id"]: r["buckets"] for r in alpha}
    a, b = of[doc_id(one[1])], of[doc_id(two[1])]
    rows = storage.read_parquet(b2["beta"][0]).to_pylist()
    for r in rows:
        if r["id"] == doc_id(bridge):
            r["buckets"] = a[: len(a) // 2] + b[len(b) // 2 :]
    storage.write_parquet(pa.Table.from_pylist(rows, schema=storage.read_parquet(b2["beta"][0]).schema), b2["beta"][0])
    inc, full = str(tmp_path / "incremental"), str(tmp_path / "full")
    inc_stats = find_fuzzy_duplicates(b2, v2, set(), inc, cache_uri=cache, previous_uri=first)
    full_stats = find_fuzzy_duplicates(b2, v2, set(), full)
    assert inc_stats["cc_method"] == "incremental" and inc_stats["clusters"] == full_stats["clusters"] == 1
    assert inc_stats["largest_cluster"] == full_stats["largest_cluster"] == 9
    for source in b2:
        assert storage.read_bytes(dedup.removed_uri(inc, source)) == storage.read_bytes(dedup.removed_uri(full, source))
    # the merged labels are the next run's labels: a further change still equals a full rebuild
    v3, b3 = dict(v2), dict(b2)
    v3["alpha"], b3["alpha"] = write_source(tmp_path / "v3", "alpha", one + two + [two[0] + " tail"], 1)
    again, full3 = str(tmp_path / "again"), str(tmp_path / "full3")
    again_stats = find_fuzzy_duplicates(b3, v3, set(), again, cache_uri=cache, previous_uri=inc)
    full3_stats = find_fuzzy_duplicates(b3, v3, set(), full3)
    assert again_stats["cc_method"] == "incremental" and again_stats["largest_cluster"] == full3_stats["largest_cluster"] == 10
    # the second run's fresh labels joined the first's small file: no label file per run
    label_files = [storage.read_json(str(Path(d) / "_fuzzy_state.json"))["label_files"] for d in (first, inc, again)]
    assert len(label_files[1]) == len(label_files[0]) + 1 and len(label_files[2]) == len(label_files[1])
    assert all(storage.exists(f) for f in label_files[2]) and not storage.exists(str(Path(again) / "_work" / "labels" / "fresh.parquet"))
    # and a further change, merging over the compacted labels, still equals a full rebuild
    v4, b4 = dict(v3), dict(b3)
    v4["alpha"], b4["alpha"] = write_source(tmp_path / "v4", "alpha", one + two + [two[0] + " tail", one[2] + " more"], 1)
    fourth, full4 = str(tmp_path / "fourth"), str(tmp_path / "full4")
    fourth_stats = find_fuzzy_duplicates(b4, v4, set(), fourth, cache_uri=cache, previous_uri=again)
    full4_stats = find_fuzzy_duplicates(b4, v4, set(), full4)
    assert fourth_stats["cc_method"] == "incremental" and fourth_stats["largest_cluster"] == full4_stats["largest_cluster"] == 11
    for source in b4:
        assert storage.read_bytes(dedup.removed_uri(fourth, source)) == storage.read_bytes(dedup.removed_uri(full4, source))
    for source in b3:
        assert storage.read_bytes(dedup.removed_uri(again, source)) == storage.read_bytes(dedup.removed_uri(full3, source))


def test_a_big_cluster_replays_from_its_record_reading_only_the_changed_sources_shards(tmp_path: Path) -> None:
    """A big cluster that retained few members keeps their texts in its record. When a source
    that holds none of them gains copies the head removes, the replay gathers only the added
    copies' text: no shard of the sources the head lives in is read. Label files whose labels did
    not move are carried as the same bytes."""
    normalized, buckets = big_cluster_corpus(tmp_path / "v1")
    cache, first = str(tmp_path / "cache"), str(tmp_path / "first")
    find_fuzzy_duplicates(buckets, normalized, set(), first, scale=SMALL_TASKS, cache_uri=cache)
    state = storage.read_json(str(Path(first) / "_fuzzy_state.json"))
    records = pa.concat_tables([storage.read_parquet(fuzzy_layout.clusters_uri(f)) for f in state["verify_files"]]).to_pylist()
    big = max(records, key=lambda r: r["size"])
    assert big["size"] >= 550 and len(big["texts"]) == len(big["retained"]) and 16 * len(big["retained"]) <= big["size"]
    assert [doc_id(t) for t in big["texts"]] == [k.split("\x00", 1)[1] for k in big["retained"]]  # each text is its member's
    for r in records:  # small clusters, or many retained members: no texts kept
        assert r["texts"] is None or all(t is None for t in r["texts"]) or 16 * len(r["retained"]) <= r["size"]
    sources = list(buckets)
    changed = next(s for k, s in enumerate(sources) if all(int(key.split("\x00")[0]) != k for key in big["retained"]))
    head = next(t for t in near_copies(600, seed=11) if doc_id(t) == big["retained"][0].split("\x00", 1)[1])
    more = [t for t in near_copies(640, seed=11)[600:] if len(t) < len(head)][:8]
    v2, b2 = big_cluster_corpus(tmp_path / "v2", extra={changed: more})
    for source in set(sources) - {changed}:
        v2[source], b2[source] = normalized[source], buckets[source]
    inc, full = str(tmp_path / "incremental"), str(tmp_path / "full")
    inc_stats = find_fuzzy_duplicates(b2, v2, set(), inc, scale=SMALL_TASKS, cache_uri=cache, previous_uri=first)
    find_fuzzy_duplicates(b2, v2, set(), full, scale=SMALL_TASKS)
    for source in b2:
        assert storage.read_bytes(dedup.removed_uri(inc, source)) == storage.read_bytes(dedup.removed_uri(full, source))
    assert inc_stats["cc_method"] == "incremental" and inc_stats["replayed_clusters"] == 1 and inc_stats["verify_passes"] == 1
    assert inc_stats["verified_clusters"] == 0 and 0 < inc_stats["shards_read_for_text"] <= len(v2[changed])
    labels = storage.read_json(str(Path(inc) / "_fuzzy_state.json"))["label_files"]
    assert [storage.read_bytes(f) for f in labels[: len(state["label_files"])]] == [storage.read_bytes(f) for f in state["label_files"]]


def test_a_cluster_whose_added_member_is_retained_is_verified_in_full(tmp_path: Path) -> None:
    normalized, buckets = big_cluster_corpus(tmp_path / "v1")
    cache, first = str(tmp_path / "cache"), str(tmp_path / "first")
    find_fuzzy_duplicates(buckets, normalized, {"gamma"}, first, scale=SMALL_TASKS, cache_uri=cache)
    survivors = {r["cluster_id"] for s in buckets for r in read_removed(first, s)}
    head = next(t for t in near_copies(600, seed=11) if doc_id(t) in survivors)  # the big cluster's first (kept) member
    shorter = next(t for t in near_copies(620, seed=11)[600:] if len(t) < len(head))
    cases = {
        # gamma (exempt) keeps a new shorter copy: the replay of the big cluster fails, a second pass verifies it
        "gamma": ([shorter], 2),
        # a longer copy of the head is retained and now represents the others: verified in full at once
        "beta": ([head + " appendix footer note", near_copies(620, seed=11)[610]], 1),
    }
    for changed, (more, passes) in cases.items():
        normalized2, buckets2 = big_cluster_corpus(tmp_path / changed, extra={changed: more})
        for source in set(buckets) - {changed}:
            normalized2[source], buckets2[source] = normalized[source], buckets[source]
        inc, full = str(tmp_path / changed / "incremental"), str(tmp_path / changed / "full")
        run_cache = str(tmp_path / changed / "cache")
        shutil.copytree(cache, run_cache)
        # the big cluster's texts are read batch by batch from the gathered groups' files
        streamed = dataclasses.replace(SMALL_TASKS, cluster_chars_in_memory=20_000, verify_batch_chars=8_000)
        inc_stats = find_fuzzy_duplicates(buckets2, normalized2, {"gamma"}, inc, scale=streamed, cache_uri=run_cache, previous_uri=first)
        find_fuzzy_duplicates(buckets2, normalized2, {"gamma"}, full, scale=SMALL_TASKS)
        for source in buckets2:
            assert storage.read_bytes(dedup.removed_uri(inc, source)) == storage.read_bytes(dedup.removed_uri(full, source))
        assert inc_stats["changed_sources"] == [changed] and inc_stats["verify_passes"] == passes
        assert inc_stats["verified_members"] >= 500 and inc_stats["streamed_clusters"] >= 1  # the big cluster, in full
        # the first pass's verdicts are gone once the second pass holds them all
        assert len(storage.read_json(str(Path(inc) / "_fuzzy_state.json"))["verify_files"]) == inc_stats["verify_partitions"]
        assert sorted(n for n in map(storage.basename, storage.listdir(str(Path(inc) / "_work" / "verify"))) if n.endswith((".parquet", ".blocks"))) == sorted(
            n for f in storage.read_json(str(Path(inc) / "_fuzzy_state.json"))["verify_files"] for n in (storage.basename(f), storage.basename(fuzzy_layout.clusters_uri(f)))
        )
    assert any(r["representative_id"] == doc_id(head + " appendix footer note") for s in buckets for r in read_removed(str(tmp_path / "beta" / "incremental"), s))


def test_a_small_cluster_whose_replay_fails_is_verified_in_full_in_the_same_pass(tmp_path: Path) -> None:
    """A replay that reads one in 16 of its cluster's members or more had every member's text
    gathered with it: when its added member is retained (here an exempt one, after the head), the
    verify task verifies the cluster in full at once, no second pass."""
    normalized, buckets = big_cluster_corpus(tmp_path / "v1")
    cache, first = str(tmp_path / "cache"), str(tmp_path / "first")
    find_fuzzy_duplicates(buckets, normalized, {"gamma"}, first, scale=SMALL_TASKS, cache_uri=cache)
    small = {doc_id(t): t for k in range(6) for t in near_copies(k + 2, seed=100 + k, words=80)}  # the small clusters' texts
    removed = next(r for s in ("alpha", "beta") for r in read_removed(first, s) if r["id"] in small)
    added = small[removed["id"]].rsplit(" ", 1)[0]  # shorter than a removed member: after its cluster's head
    normalized2, buckets2 = big_cluster_corpus(tmp_path / "v2", extra={"gamma": [added]})
    for source in ("alpha", "beta"):
        normalized2[source], buckets2[source] = normalized[source], buckets[source]
    inc, full = str(tmp_path / "incremental"), str(tmp_path / "full")
    inc_stats = find_fuzzy_duplicates(buckets2, normalized2, {"gamma"}, inc, scale=SMALL_TASKS, cache_uri=cache, previous_uri=first)
    find_fuzzy_duplicates(buckets2, normalized2, {"gamma"}, full, scale=SMALL_TASKS)
    for source in buckets2:
        assert storage.read_bytes(dedup.removed_uri(inc, source)) == storage.read_bytes(dedup.removed_uri(full, source))
    assert inc_stats["cc_method"] == "incremental" and inc_stats["changed_sources"] == ["gamma"]
    assert inc_stats["replays_verified_at_once"] == 1 and inc_stats["verify_passes"] == 1 and inc_stats["exempt_kept"] >= 1


def test_scratch_is_collected_after_publishing_but_the_stored_index_is_kept(tmp_path: Path) -> None:
    normalized, buckets = big_cluster_corpus(tmp_path / "v1")
    cache = str(tmp_path / "cache")
    first = str(tmp_path / "first")
    stats = find_fuzzy_duplicates(buckets, normalized, set(), first, scale=SMALL_TASKS, cache_uri=cache)
    assert stats["scratch_bytes"] > 0
    assert sorted(p.name for p in (Path(first) / "_work").iterdir()) == ["labels", "verify"]  # the labels and verdicts the next run reuses
    entries = {s: [p.name for p in (Path(cache) / s).iterdir()] for s in buckets}
    assert all(len(e) == 1 for e in entries.values())
    # beta changes: its old cached map output goes once the incremental run has published
    normalized2, buckets2 = big_cluster_corpus(tmp_path / "v2", extra={"beta": stdlib_documents(2, seed=78)})
    for source in ("alpha", "gamma"):
        normalized2[source], buckets2[source] = normalized[source], buckets[source]
    other_run = Path(cache) / "beta" / "0123456789abcdef-s9-g16"  # another run's entry: not ours to remove
    other_run.mkdir()
    inc = str(tmp_path / "inc")
    inc_stats = find_fuzzy_duplicates(buckets2, normalized2, set(), inc, scale=SMALL_TASKS, cache_uri=cache, previous_uri=first)
    assert inc_stats["reused_clusters"] > 0 and inc_stats["changed_sources"] == ["beta"]
    after = {s: [p.name for p in (Path(cache) / s).iterdir()] for s in buckets}
    assert after["alpha"] == entries["alpha"] and after["gamma"] == entries["gamma"]
    assert other_run.exists() and entries["beta"][0] not in after["beta"] and len(after["beta"]) == 2
    # an earlier run's verdicts that are gone only cost the reuse, never the answer
    shutil.rmtree(Path(inc) / "_work" / "verify")
    again = str(tmp_path / "again")
    again_stats = find_fuzzy_duplicates(buckets2, normalized2, set(), again, scale=SMALL_TASKS, cache_uri=cache, previous_uri=inc)
    assert again_stats["reused_clusters"] == 0 and again_stats["removed_ids_digest"] == inc_stats["removed_ids_digest"]
    exact = find_exact_duplicates(exact_corpus(tmp_path / "e"), str(tmp_path / "exact"))
    assert exact["scratch_bytes"] > 0
    assert not (tmp_path / "exact" / "_work" / "map").exists() and not (tmp_path / "exact" / "_work" / "reduce").exists()


def test_removed_characters_come_from_the_tasks_and_match_the_texts(tmp_path: Path) -> None:
    normalized, buckets = big_cluster_corpus(tmp_path)
    out = str(tmp_path / "out")
    stats = find_fuzzy_duplicates(buckets, normalized, set(), out)
    for source in buckets:
        removed = {r["id"] for r in read_removed(out, source)}
        texts = [t for uri in normalized[source] for i, t in zip(*storage.read_parquet(uri, ["id", "text"]).to_pydict().values()) if i in removed]
        assert stats["removed_chars_per_source"][source] == sum(len(t) for t in texts)
    exact = find_exact_duplicates(exact_corpus(tmp_path / "e"), str(tmp_path / "exact"))
    assert exact["removed_chars_per_source"] == {"a_src": 0, "b_src": len(doc_text(2)) + len(doc_text(3)), "c_src": len(doc_text(3)) + len(doc_text(4)), "d_src": 0}


def test_row_sums_follow_a_sources_rows_not_their_partitioning() -> None:
    """An incremental run keeps a source's removal file when the sums of its rows' hashes over
    every label range did not move: the sums must not depend on how rows are split into ranges
    or ordered, and a change in any published field of one row must move its source's sum only."""
    rng = random.Random(5)
    rows = [
        (0, rank, f"doc{i}", rng.randrange(50), f"c{i % 7}", f"r{i % 5}", f"source_{rank + 1}", rng.random(), rng.random(), rng.randrange(1000))
        for i in range(400)
        for rank in [rng.randrange(4)]
    ]

    def table(part: list[tuple]) -> pa.Table:
        return pa.table([pa.array(list(c), type=f.type) for c, f in zip(zip(*part), fuzzy_layout.VERDICT_SCHEMA)], schema=fuzzy_layout.VERDICT_SCHEMA)

    whole = fuzzy_clusters.row_sums(table(rows))
    assert sorted(whole) == [0, 1, 2, 3]
    shuffled = rows[:]
    rng.shuffle(shuffled)
    parts = [fuzzy_clusters.row_sums(table(shuffled[a : a + 90])) for a in range(0, len(shuffled), 90)]
    assert {r: sum(p.get(r, 0) for p in parts) % (1 << 128) for r in whole} == whole
    # the label and length are not published: a row that only moved cluster label keeps its sum
    relabelled = [(*r[:3], r[3] + 1000, *r[4:]) for r in rows]
    assert fuzzy_clusters.row_sums(table(relabelled)) == whole
    for field in range(4, 9):  # cluster id, representative id and source, containment, jaccard
        changed = rows[:]
        old = changed[17]
        changed[17] = (*old[:field], old[field] + (0.5 if isinstance(old[field], float) else "x"), *old[field + 1 :])
        moved = fuzzy_clusters.row_sums(table(changed))
        assert {r for r in whole if moved[r] != whole[r]} == {old[1]}, field


def test_keyed_block_files_read_like_sorted_files_and_scan_block_by_block(tmp_path: Path) -> None:
    """Map, edges and verify outputs are block files of equal key ranges whose count the writer
    picks from its own rows (its readers' count follows totals counted later): any key-range
    read of them gives exactly the rows of a sorted file, whatever the two counts are, and a scan
    reads only the blocks it wants, one at a time."""
    rng = np.random.default_rng(21)
    keys = rng.integers(0, dedup_shuffle.KEY_SPACE, 20_000, dtype=np.int64)
    keys[:3] = [0, dedup_shuffle.KEY_SPACE - 1, dedup_shuffle.KEY_SPACE // 2]
    table = pa.table([pa.array(keys), pa.array(np.arange(keys.size))], schema=fuzzy_layout.RECORD_SCHEMA)
    sorted_uri = str(tmp_path / "records.parquet")
    dedup_shuffle.write_sorted(table, sorted_uri)
    with pytest.raises(ValueError, match="ends in .blocks"):
        dedup_shuffle.write_keyed(table, str(tmp_path / "records.parquet"), 4)

    def rows(t: pa.Table) -> list[tuple]:
        return sorted(zip(t.column("key").to_pylist(), t.column("node").to_pylist()))

    for readers in (1, 3, 16, 10_000):
        uri = str(tmp_path / f"records-{readers}.blocks")
        assert dedup_shuffle.write_keyed(table, uri, readers) == table.num_rows
        blocks = dedup_shuffle.equal_blocks(table.num_rows, readers)
        assert blocks & (blocks - 1) == 0 and table.num_rows // blocks >= dedup_shuffle.MIN_BLOCK_ROWS // 2
        for parts in (1, 5, 16, 64):  # coarser and finer than the blocks, and not a power of two
            got = [dedup_shuffle.read_range([uri], lo, hi, ["node"], fuzzy_layout.RECORD_SCHEMA) for lo, hi in dedup_shuffle.partition_bounds(parts)]
            want = [dedup_shuffle.read_range([sorted_uri], lo, hi, ["node"], fuzzy_layout.RECORD_SCHEMA) for lo, hi in dedup_shuffle.partition_bounds(parts)]
            assert [rows(g) for g in got] == [rows(w) for w in want]
            assert sum(g.num_rows for g in got) == table.num_rows
        spans = [(10, 20), (keys[5], keys[5] + 1), (dedup_shuffle.KEY_SPACE - 5, dedup_shuffle.KEY_SPACE)]
        assert rows(dedup_shuffle.read_ranges([uri], spans, ["node"], fuzzy_layout.RECORD_SCHEMA)) == rows(dedup_shuffle.read_ranges([sorted_uri], spans, ["node"], fuzzy_layout.RECORD_SCHEMA))
        # a scan for some keys reads the blocks holding them, each once, in runs of at most max_bytes
        wanted_keys = np.sort(keys[:50])
        for max_bytes in (1, dedup_shuffle.SCAN_BYTES):
            seen = list(dedup_shuffle.scan_blocks(uri, wanted_keys, max_bytes))
            got = np.concatenate([t.column("key").to_numpy() for t in seen])
            cuts = dedup_shuffle.partition_cuts(blocks)
            hit_blocks = set((np.searchsorted(cuts, wanted_keys.astype(np.uint64), side="right") - 1).tolist())
            assert sorted(got.tolist()) == sorted(k for k in keys.tolist() if np.searchsorted(cuts, np.uint64(k), side="right") - 1 in hit_blocks)
            runs = len(hit_blocks) if max_bytes == 1 else sum(1 for b in hit_blocks if b - 1 not in hit_blocks)
            assert len(seen) == runs


def test_reads_of_many_files_in_threads_give_the_rows_of_serial_reads(tmp_path: Path, monkeypatch) -> None:
    """Remote stores are read 16 files at a time: the same rows, in the same order, as one at a time."""
    rng = np.random.default_rng(4)
    files = []
    for k in range(20):
        keys = rng.integers(0, 2**63 - 1, 3000, dtype=np.int64)
        files.append(str(tmp_path / f"f{k:02d}.blocks"))
        dedup_shuffle.write_keyed(pa.table([pa.array(keys), pa.array(np.arange(keys.size) + 1000 * k)], schema=fuzzy_layout.RECORD_SCHEMA), files[-1], 8)
    ranges = dedup_shuffle.partition_bounds(8)[2:5]
    serial = dedup_shuffle.read_ranges(files, ranges, ["node"], fuzzy_layout.RECORD_SCHEMA)
    blocks = dedup_shuffle.read_block_spans(files, [(2, 5)], fuzzy_layout.RECORD_SCHEMA)
    monkeypatch.setattr(dedup_shuffle, "read_threads", lambda uris: 8)
    assert dedup_shuffle.read_ranges(files, ranges, ["node"], fuzzy_layout.RECORD_SCHEMA).equals(serial) and serial.num_rows > 10_000
    assert dedup_shuffle.read_block_spans(files, [(2, 5)], fuzzy_layout.RECORD_SCHEMA).equals(blocks)


def test_pair_shards_takes_rows_from_the_map_counters_and_reads_footers_only_without_them(tmp_path, monkeypatch):
    from marin_assets.core.dedup.fuzzy import state as fuzzy_state
    from marin_assets.core.runtime import storage

    buckets, normalized = {}, {}
    for source, sizes in (("a", (3, 1)), ("b", (2,))):
        buckets[source], normalized[source] = [], []
        for i, n in enumerate(sizes):
            for folder, table in (("buckets", pa.table({"id": [f"{source}{i}-{k}" for k in range(n)]})), ("normalized", pa.table({"id": ["x"] * n}))):
                uri = str(tmp_path / folder / source / f"part-{i}-of-{len(sizes)}.parquet")
                storage.write_parquet(table, uri)
                (buckets if folder == "buckets" else normalized)[source].append(uri)
    footers = fuzzy_state.pair_shards(buckets, normalized)
    assert [rows for _, _, rows in footers["a"]] == [3, 1] and [rows for _, _, rows in footers["b"]] == [2]

    read = []
    real = storage.parquet_num_rows
    monkeypatch.setattr(storage, "parquet_num_rows", lambda uri: read.append(uri) or real(uri))
    counted = fuzzy_state.pair_shards(buckets, normalized, {"a": [3, 1], "b": [5, 6]})  # b's counters do not match its shards
    assert counted["a"] == footers["a"] and counted["b"] == footers["b"]
    assert read == buckets["b"]  # only the source without usable counters was read


def test_each_verify_partition_reads_the_streamed_files_of_the_gather_tasks_that_streamed_for_it(tmp_path: Path) -> None:
    """Per verify partition, the streamed files of exactly the gather tasks that streamed for it,
    in gather order; past the limit, merged into fewer files that keep every row, sorted by
    (key, pos) across the files merged."""
    import pyarrow.parquet as pq  # noqa: PLC0415

    from marin_assets.core.dedup.fuzzy import verify as fuzzy_verify  # noqa: PLC0415
    from marin_assets.core.runtime.runner import ShardResult  # noqa: PLC0415

    streamed = {0: [0, 2], 1: [2], 2: [], 3: [0, 2], 4: [2]}
    gathered = []
    for g, parts in streamed.items():
        output = str(tmp_path / "gather" / f"g{g:06d}.blocks")
        if parts:
            Path(fuzzy_layout.streamed_uri(output)).parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.table({"key": list(range(g + 1)), "pos": [10 - g] * (g + 1)}), fuzzy_layout.streamed_uri(output), row_group_size=1)
        gathered.append(ShardResult(output, {"streamed_parts": parts}, reused=False))
    run = fuzzy_state.FuzzyRun({}, {}, (), str(tmp_path / "out"), str(tmp_path / "cache"), FuzzyDedupParams(), FuzzyScale(), ShardRunner(), 5, 240, None)
    names = {g: fuzzy_layout.streamed_uri(gathered[g].output) for g in streamed}

    files = fuzzy_verify._bounded_streamed(run, gathered, 4, 8, "")
    assert files == [(names[0], names[3]), (), (names[0], names[1], names[3], names[4]), ()]

    merged = fuzzy_verify._bounded_streamed(run, gathered, 4, 2, "")
    assert merged[0] == (names[0], names[3]) and merged[1] == merged[3] == ()
    assert len(merged[2]) == 2 and not set(merged[2]) & set(names.values())
    assert sorted(k for f in merged[2] for k in pq.read_table(f).column("key").to_pylist()) == sorted([0, 0, 1, 0, 1, 2, 3, 0, 1, 2, 3, 4])
    for f in merged[2]:
        rows = list(zip(*(pq.read_table(f).column(c).to_pylist() for c in ("key", "pos"))))
        assert rows == sorted(rows) and len(rows) > len(set(k for k, _ in rows))  # runs of two files interleaved
