"""Decompression bombs: a huge line or archive member is counted, never held, whatever the compression ratio.

Each bomb is read in a subprocess of its own that reports its peak resident size (VmHWM) grown
while reading, so the bound asserted is the reader's and not the test process's.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import polars as pl
import pytest
import zstandard

from marin_assets.core.ingest import formats
from marin_assets.core.ingest.providers import ghalogs
from marin_assets_tests.faults.test_reading import ROWS, account, jsonl, run

REPO_ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20
CHUNK, LIMIT = 1 * MIB, 4 * MIB  # the reader's text chunk and longest row, in the subprocess
# What reading may add to the process's peak: a chunk, a row at the limit, a block, their copies and
# the parsed batch, plus allocator slack. Holding the bomb's line would add hundreds of MiB.
BOUND = 48 * MIB

READ = """
import json, sys
from marin_assets.core.runtime.runner import peak_rss_bytes, reset_peak_rss
from marin_assets.core.ingest import formats
from marin_assets.core.ingest.providers import ghalogs
from marin_assets.core.ingest.providers import ghalogs, nsf_awards
fmt, path, chunk, limit = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if fmt == "evalzip":  # imported, and the set found, before the peak is measured
    from marin_assets.catalog.evals import load_evals
    from marin_assets.core.decon.eval_sources import read_eval_rows
    from marin_assets.core.decon.params import EvalIndexError
    eval_set = next(s for s in load_evals(None).mandatory if getattr(s.provider, "format", "") == "zip")
reset_peak_rss()
before = peak_rss_bytes()
counters = {}
if fmt == "zip":
    nsf_awards._check_zip(path, limit)
    with open(path + ".out", "wb") as out:
        counters = nsf_awards.store_awards(path, 2020, out, limit)
    rows = counters["awards"]
elif fmt == "evalzip":
    rows = 0
    try:
        for _ in read_eval_rows(eval_set, [path]):
            rows += 1
    except EvalIndexError as err:
        counters = {"refused": str(err)}
elif fmt == "ghalogs":
    import zipfile
    with zipfile.ZipFile(path) as archive:
        read = [ghalogs.read_member(archive, m, limit)[0] for m in archive.infolist()]
    rows = sum(r["text"] is not None for r in read)
    counters = {"too_large": sum(r["too_large"] is not None for r in read)}
else:
    rows = sum(f.height for f in formats.FORMATS[fmt].read(path, fmt, 1000, counters, batch_bytes=chunk, max_row_bytes=limit))
print(json.dumps({"rows": rows, "counters": {k: v for k, v in counters.items() if not k.startswith("_")},
                  "grown": peak_rss_bytes() - before}))
"""


def read_in_subprocess(fmt: str, path: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    done = subprocess.run([sys.executable, "-c", READ, fmt, str(path), str(CHUNK), str(LIMIT)], env=env,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def write_bomb(stream, before: list[dict], after: list[dict], line_bytes: int) -> None:
    """Rows, one JSON line of ``line_bytes`` with no newline inside, rows; written a MiB at a time."""
    stream.write(jsonl(before) + b'{"id": "bomb", "text": "')
    piece = b"a" * MIB
    for _ in range(line_bytes // MIB):
        stream.write(piece)
    stream.write(b'"}\n' + jsonl(after))


@pytest.mark.system  # a GiB of text decompressed in a subprocess
@pytest.mark.parametrize(("name", "line_bytes"), [("bomb.jsonl.zst", 1 << 30), ("bomb.jsonl.gz", 128 * MIB)])
def test_a_huge_line_in_a_compressed_file_is_counted_in_bounded_memory(world, name, line_bytes):
    path = world.root / name
    with open(path, "wb") as raw:
        if name.endswith(".zst"):
            with zstandard.ZstdCompressor(level=1).stream_writer(raw, closefd=False) as stream:
                write_bomb(stream, ROWS[:3], ROWS[3:5], line_bytes)
        else:
            with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1) as stream:
                write_bomb(stream, ROWS[:3], ROWS[3:5], line_bytes)
    assert path.stat().st_size < line_bytes // 100  # a bomb: a hundred times more text than bytes, at least
    world.inject()
    seen = read_in_subprocess(formats.format_of_name(name), path)
    assert seen["rows"] == 5 and seen["counters"]["too_long"] == 1
    world.peak(name, seen["grown"], BOUND)
    world.rows(6, seen["rows"], seen["counters"]["too_long"])


WRITE_CELL_BOMB = """
import sys, pyarrow as pa, pyarrow.parquet as pq
path, cell = sys.argv[1], int(sys.argv[2])
schema = pa.schema([("id", pa.string()), ("text", pa.large_string())])
rows = lambda first: pa.table({"id": [f"r{i}" for i in range(first, first + 50)], "text": [f"row {i} of the fault suite" for i in range(first, first + 50)]}, schema)
big = pa.LargeStringArray.from_buffers(1, pa.py_buffer(memoryview(pa.array([0, cell], pa.int64()).buffers()[1])), pa.py_buffer(b"a" * cell))
with pq.ParquetWriter(path, schema, compression="zstd") as writer:  # rows, the cell in a row group of its own, rows
    writer.write_table(rows(0))
    writer.write_table(pa.table({"id": ["bomb"], "text": big}, schema))
    writer.write_table(rows(50))
"""


def write_cell_bomb(path: Path, cell_bytes: int) -> None:
    """A Parquet file of 100 rows and one ``cell_bytes`` text cell, written in a child (it holds the cell)."""
    subprocess.run([sys.executable, "-c", WRITE_CELL_BOMB, str(path), str(cell_bytes)], check=True, timeout=300)


@pytest.mark.system  # a GiB compressed in a child, then read in another
def test_a_huge_parquet_cell_is_counted_in_bounded_memory(world):
    path = world.root / "cell.parquet"
    write_cell_bomb(path, 1 << 30)
    assert path.stat().st_size < MIB  # a GiB of text in well under a MiB
    world.inject()
    seen = read_in_subprocess("parquet", path)
    assert seen["rows"] == 100 and seen["counters"]["too_long"] == 1
    world.peak("parquet cell", seen["grown"], BOUND)
    world.rows(101, seen["rows"], seen["counters"]["too_long"])


def test_normalize_counts_a_parquet_cell_over_the_limit_with_its_file_and_row_group(world, monkeypatch, caplog):
    monkeypatch.setattr(formats, "MAX_ROW_BYTES", 64 << 10)
    path = world.scratch / "cell.parquet"
    write_cell_bomb(path, 1 << 20)
    world.inject()
    with caplog.at_level(logging.WARNING):
        manifest = run(world, {"cell.parquet": path.read_bytes()})
    assert manifest["rows"] == 100 and manifest["bad_rows"]["too_long"] == 1
    assert any("cell.parquet' line 1: row group 1 (1 rows): column text has a page of" in r.getMessage() for r in caplog.records)
    account(world, manifest, 101)


@pytest.mark.system  # 3 GiB deflated, then read in a subprocess
def test_an_eval_archive_with_a_huge_member_is_refused_in_bounded_memory(world):
    """The eval set's archive as the lock command and the index read it: member by member, each within its limit."""
    path = world.root / "bench.zip"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        archive.writestr("bench-2.1/task-0/instruction.md", "list the files and print the largest one")
        with archive.open("bench-2.1/task-1/instruction.md", "w", force_zip64=True) as member:
            piece = b" " * (8 * MIB)
            for _ in range(3 * 1024 // 8):
                member.write(piece)
    assert path.stat().st_size < 16 * MIB  # 200 times more text than bytes
    world.inject()
    seen = read_in_subprocess("evalzip", path)
    assert "member 'bench-2.1/task-1/instruction.md' inflates to 3221225472 bytes, over the" in seen["counters"]["refused"]
    assert str(path) in seen["counters"]["refused"]
    world.peak("eval archive", seen["grown"], BOUND)


@pytest.fixture(scope="module")
def zip_bomb(tmp_path_factory) -> Path:
    """Two award files and one member inflating to 512 MiB, in a zip of about half a MiB."""
    path = tmp_path_factory.mktemp("bombs") / "2020.zip"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        for i in range(2):
            archive.writestr(f"2020/{i}.json", json.dumps({"awd_id": str(i), "awd_titl_txt": "an award"}))
        with archive.open("2020/bomb.json", "w", force_zip64=True) as member:
            piece = b" " * MIB
            for _ in range(512):
                member.write(piece)
    assert path.stat().st_size < 8 * MIB
    return path


@pytest.mark.system  # half a GiB deflated, then read in a subprocess
def test_an_award_zip_with_a_huge_member_is_counted_in_bounded_memory(world, zip_bomb):
    path = zip_bomb
    world.inject()
    seen = read_in_subprocess("zip", path)
    assert seen["counters"] == {"awards": 2, "parse_errors": 1, "utf8_repaired": 0, "too_large": 1}
    world.peak("nsf_awards zip", seen["grown"], BOUND)
    with open(f"{path}.out", "rb") as out:
        rows = [json.loads(line) for line in zstandard.ZstdDecompressor().stream_reader(out).read().splitlines()]
    assert [r["awd_id"] for r in rows] == ["0", "1", None]
    assert "over the" in rows[2]["parse_error"] and str(512 * MIB) in rows[2]["parse_error"]
    os.remove(f"{path}.out")
    world.rows(3, seen["counters"]["awards"], seen["counters"]["too_large"])


@pytest.mark.system  # half a GiB deflated, then read in a subprocess
def test_a_log_archive_with_a_huge_member_is_counted_in_bounded_memory(world, zip_bomb):
    from marin_assets.core.ingest.transforms.ghalogs import ghalogs_sanitize

    world.inject()
    seen = read_in_subprocess("ghalogs", zip_bomb)
    assert seen["rows"] == 2 and seen["counters"] == {"too_large": 1}
    world.peak("ghalogs zip", seen["grown"], BOUND)
    with zipfile.ZipFile(zip_bomb) as archive:  # the row the bomb leaves is dropped by the transform, counted
        bomb = ghalogs.read_member(archive, archive.getinfo("2020/bomb.json"), LIMIT)[0]
    _, dropped = ghalogs_sanitize(pl.DataFrame([bomb]))
    assert dropped == {"too_large_member": 1} and str(512 * MIB) in bomb["too_large"]
    world.rows(3, seen["rows"], dropped["too_large_member"])


def test_normalize_counts_a_line_over_the_limit_with_its_file_line_and_offset(world, monkeypatch, caplog):
    monkeypatch.setattr(formats, "MAX_ROW_BYTES", 64 << 10)
    body = jsonl(ROWS[:10]) + b'{"text": "' + b"x" * (1 << 20) + b'"}\n' + jsonl(ROWS[10:20])
    world.inject()
    with caplog.at_level(logging.WARNING):
        manifest = run(world, {"long.jsonl.gz": gzip.compress(body)})
    assert manifest["rows"] == 20 and manifest["bad_rows"]["too_long"] == 1
    offset = len(jsonl(ROWS[:10]))
    assert any("long.jsonl.gz' line 11" in r.getMessage() and f"at byte {offset}" in r.getMessage() for r in caplog.records)
    account(world, manifest, 21)


def test_a_json_document_over_the_limit_fails_its_file_unread(world, monkeypatch):
    monkeypatch.setattr(formats, "MAX_ROW_BYTES", 64 << 10)
    world.inject()
    with pytest.raises(formats.FormatError, match=r"source 'src'.*big\.json.*over the 65536-byte limit.*JSON lines"):
        run(world, {"big.json": json.dumps([{"text": "y" * 1000}] * 100).encode()})
    world.rows(100, 0, 100)
