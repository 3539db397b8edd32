"""Items 5-7: files read by what they are, deep rows counted, every reader error names its file."""

from __future__ import annotations

import gzip
import io
import json
import logging
from pathlib import Path

import polars as pl
import pytest
import zstandard

from marin_assets.core.ingest import formats, normalize
from marin_assets import errors
from marin_assets.defs.checks.normalized import bad_row_share


def jsonl(rows) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def parquet(rows) -> bytes:
    buf = io.BytesIO()
    pl.DataFrame(rows).write_parquet(buf, row_group_size=50)
    return buf.getvalue()


ROWS = [{"id": f"r{i}", "text": f"row number {i} of the fault suite"} for i in range(200)]


def run(world, files: dict[str, bytes], fmt: str | None = None, **params):
    raw = world.root / "raw" / "src"
    raw.mkdir(parents=True, exist_ok=True)
    uris = []
    for name, data in files.items():
        (raw / name).write_bytes(data)
        uris.append(str(raw / name))
    out = str(world.root / "normalized" / "src" / "fp")
    return normalize.normalize_source("src", uris, out, normalize.NormalizeParams(**params), fmt=fmt)


def account(world, manifest, lines: int) -> None:
    """rows in = rows out + counted drops, over the lines the files held."""
    c = manifest["counters"]
    drops = c["empty_dropped"] + c["duplicates"] + sum(manifest["bad_rows"].get(r, 0) for r in formats.UNREADABLE)
    world.rows(lines, manifest["rows"], drops)


# --------------------------------------------------------------------------- item 5


def test_parquet_read_under_a_forced_jsonl_format_fails_naming_the_file(world):
    world.inject()
    with pytest.raises(formats.FormatError, match=r"file '.*part-0\.parquet' is read as 'jsonl'.*bytes are Parquet") as caught:
        run(world, {"good.jsonl": jsonl(ROWS), "part-0.parquet": parquet(ROWS)}, fmt="jsonl")
    assert "input_format to 'parquet'" in str(caught.value)
    assert isinstance(caught.value, errors.BadInput)
    world.rows(2 * len(ROWS), 0, 2 * len(ROWS))  # nothing is published: the source fails, no row is lost unseen


@pytest.mark.parametrize(("name", "data", "fmt", "found"), [
    ("a.jsonl", gzip.compress(jsonl(ROWS)), None, "gzip"),
    ("a.jsonl.gz", zstandard.ZstdCompressor().compress(jsonl(ROWS)), None, "zstd"),
    ("a.parquet", jsonl(ROWS), None, "JSON"),
    ("a.jsonl.zst", parquet(ROWS), None, "Parquet"),
])  # fmt: skip
def test_a_file_whose_bytes_contradict_its_name_is_refused(world, name, data, fmt, found):
    world.inject()
    with pytest.raises(formats.FormatError, match=rf"file '.*{name}'.*bytes are .*{found}"):
        run(world, {name: data}, fmt=fmt)
    world.rows(len(ROWS), 0, len(ROWS))


def test_every_format_is_read_and_sniffed_from_one_table(world):
    assert formats.format_of_name("x/y.JSONL.ZST") == "jsonl.zst" and formats.format_of_name("y.json.zst") == "jsonl.zst"
    assert formats.format_of_name("y.txt") is None
    assert formats.sniff_bytes(parquet(ROWS[:1])[:4]) == "parquet" and formats.sniff_bytes(b"\xef\xbb\xbf {") == "json"
    files = {"a.parquet": parquet(ROWS[:50]), "b.jsonl": jsonl(ROWS[50:100]), "c.jsonl.gz": gzip.compress(jsonl(ROWS[100:150])),
             "d.jsonl.zst": zstandard.ZstdCompressor().compress(jsonl(ROWS[150:]))}  # fmt: skip
    manifest = run(world, files)
    assert manifest["rows"] == len(ROWS)
    account(world, manifest, len(ROWS))


def test_bad_row_share_over_one_percent_fails_the_blocking_check(world):
    lines = [json.dumps(r) for r in ROWS[:100]] + ["{not json"] * 2  # 2 of 102 lines: 1.96%
    world.inject(2)
    manifest = run(world, {"a.jsonl": ("\n".join(lines) + "\n").encode()})
    bad, rows_in, share = bad_row_share(manifest)
    assert (bad, rows_in) == (2, 100) and share > formats.MAX_BAD_ROW_SHARE
    account(world, manifest, 102)


def test_bad_rows_check_fails_the_materialization_on_a_real_instance(world, pipeline, hub_store):
    """cp/peps through raw_files and normalized on a real instance: 3 of 13 lines are broken JSON."""
    from marin_assets.catalog.sources import load_catalog

    world.root = Path(pipeline.prefix)
    peps = load_catalog().by_name("cp/peps")
    body = gzip.compress(jsonl(ROWS[:10]) + b"{broken\n" * 3)
    hub_store.publish(peps.provider.repo_id, {"peps/part-0.json.gz": body}, commit=peps.provider.revision)
    world.inject(3)
    import dagster as dg

    from marin_assets_tests.automation.sources import run_with_checks

    result = run_with_checks(pipeline, dg.AssetSelection.assets("raw_files", "normalized"), "cp/peps")
    checks = {e.asset_check_evaluation_data.check_name: e.asset_check_evaluation_data for e in result.all_events
              if e.event_type_value == "ASSET_CHECK_EVALUATION"}  # fmt: skip
    assert checks["bad_rows"].passed is False and checks["bad_rows"].blocking
    assert "3 of 13 rows" in checks["bad_rows"].description
    assert checks["rows"].passed is True
    manifest = pipeline.metadata(result, "normalized")
    world.rows(13, manifest["dagster/row_count"], 3)


# --------------------------------------------------------------------------- item 6


def test_one_deeply_nested_row_is_counted_with_its_file_and_line(world, caplog):
    deep = '{"text": "deep", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    lines = [json.dumps(r) for r in ROWS[:20]] + [deep] + [json.dumps(r) for r in ROWS[20:40]]
    world.inject()
    with caplog.at_level(logging.WARNING):
        manifest = run(world, {"deep.jsonl": ("\n".join(lines) + "\n").encode()})
    assert manifest["rows"] == 40
    assert manifest["bad_rows"]["too_deep"] == 1
    assert any("deep.jsonl' line 21" in r.getMessage() for r in caplog.records)
    account(world, manifest, 41)


# --------------------------------------------------------------------------- item 7


def _truncated(data: bytes) -> bytes:
    return data[: len(data) * 2 // 3]


@pytest.mark.parametrize(("name", "data", "where"), [
    ("corrupt.parquet", parquet(ROWS)[:40] + b"\xff" * 600 + parquet(ROWS)[640:], "footer|row group"),
    ("cut.jsonl.gz", _truncated(gzip.compress(jsonl(ROWS * 20))), "line"),
    ("cut.jsonl.zst", _truncated(zstandard.ZstdCompressor().compress(jsonl(ROWS * 20))), "line"),
])  # fmt: skip
def test_reader_errors_name_source_file_place_and_fix(world, name, data, where):
    world.inject()
    with pytest.raises(formats.FormatError) as caught:
        run(world, {name: data})
    message = str(caught.value)
    assert "source 'src'" in message and name in message
    assert any(w in message for w in where.split("|")), message
    assert "fetch" in message or "exclude" in message
    world.rows(1, 0, 1)


def test_conflicting_column_types_name_the_files(world):
    world.inject()
    files = {"a.jsonl": jsonl([{"text": "one", "meta": {"k": 1}}]), "b.jsonl": jsonl([{"text": "two", "meta": [1, 2]}])}
    with pytest.raises(errors.BadInput) as caught:
        run(world, files)
    assert "a.jsonl" in str(caught.value) and "b.jsonl" in str(caught.value) and "meta" in str(caught.value)
    world.rows(2, 0, 2)


def test_invalid_utf8_in_a_parquet_binary_text_column_names_source_file_column_and_fix(world):
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    texts = [f"row {i}".encode() for i in range(10)] + [b"broken \xff\xfe bytes"]
    pq.write_table(pa.table({"id": [str(i) for i in range(11)], "text": pa.array(texts, pa.binary())}), buf)
    world.inject()
    with pytest.raises(errors.BadInput) as caught:
        run(world, {"part-0.parquet": parquet(ROWS[:5]), "part-1.parquet": buf.getvalue()})
    message = str(caught.value)
    assert "source 'src'" in message and "part-1.parquet" in message and "column 'text' (Binary)" in message
    assert "not valid UTF-8 (1 of 11 rows" in message and "transform" in message and "exclude the file" in message
    world.rows(16, 0, 16)  # the source fails: nothing is published, no row is lost unseen
