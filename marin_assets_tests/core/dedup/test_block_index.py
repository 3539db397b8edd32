"""The offsets index of a merge level's block files, on local disk and the GCS emulator."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from marin_assets.core.dedup import shuffle as dedup_shuffle
from marin_assets.core.runtime import storage


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

