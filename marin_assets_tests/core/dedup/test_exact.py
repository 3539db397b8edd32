"""Global exact dedup: the keeper rule, identical files whatever the spilling, shard counts and
merges, and a clear error for a shard without ids."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from marin_assets.core.dedup import decisions as dedup
from marin_assets.core.dedup.decisions import ExactDedupParams
from marin_assets.core.dedup.exact import find_exact_duplicates
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.runner import ShardRunner
from marin_assets.testing.dedup_corpus import doc_id
from marin_assets_tests.core.dedup.corpora import exact_corpus, read_removed


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


def test_exact_names_the_source_and_file_when_id_is_missing(tmp_path: Path) -> None:
    uri = str(tmp_path / "bad" / storage.shard_name(0, 1))
    storage.write_parquet(pa.table({"text": ["no id here"]}), uri)
    with pytest.raises(dedup.DedupError, match="source 'bad_src'.*part-00000-of-00001"):
        find_exact_duplicates({"bad_src": [uri]}, str(tmp_path / "out"))

