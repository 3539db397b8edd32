"""The run's state: shard pairing from the map counters, and the streamed files each verify
partition reads."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from marin_assets.core.dedup.decisions import FuzzyDedupParams
from marin_assets.core.dedup.fuzzy import FuzzyScale
from marin_assets.core.dedup.fuzzy import layout as fuzzy_layout
from marin_assets.core.dedup.fuzzy import state as fuzzy_state
from marin_assets.core.runtime.runner import ShardRunner


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

