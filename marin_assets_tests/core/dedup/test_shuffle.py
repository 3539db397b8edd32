"""Shuffles through storage: block files read by key range, merges at stored cuts, and reads that
fetch each file in one request."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from marin_assets.core.dedup import shuffle as dedup_shuffle
from marin_assets.core.dedup.fuzzy import layout as fuzzy_layout
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.runner import ShardRunner


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


@pytest.mark.system
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

