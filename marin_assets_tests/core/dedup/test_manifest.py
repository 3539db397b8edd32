"""Task inputs named by a manifest: specs stay small at production counts."""

from __future__ import annotations

from pathlib import Path

import pytest

from marin_assets.core.dedup import manifest
from marin_assets.core.dedup import shuffle as dedup_shuffle
from marin_assets.core.dedup.decisions import FuzzyDedupParams
from marin_assets.core.dedup.fuzzy import clusters as fuzzy_clusters
from marin_assets.core.runtime.runner import ShardTask


@pytest.mark.system
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

