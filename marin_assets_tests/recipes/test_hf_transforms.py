"""Family transforms and their readers, directly (no Dagster): edge cases the fixtures cannot show."""

from __future__ import annotations

import io
import json
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import xxhash

from marin_assets.core.ingest import normalize
from marin_assets.core.ingest.transforms import get_transform, sec_edgar
from marin_assets.core.ingest.transforms.documents import english_first
from marin_assets.core.ingest.transforms.rendering import whole_file
from marin_assets.core.ingest.transforms.repositories import directory_dfs_key
from marin_assets.core.ingest.transforms.trajectories import agenttrove_outcome, proprietary_teacher
from marin_assets.core.runtime import storage
from marin_assets_tests.recipes.hf_transform_fixtures import oversized_page_header_parquet

HF_TRANSFORMS = [
    "agenttrove_transcript", "biocollection_stream", "biodiversity_pages", "coderforge_trajectory", "davinci_env_trajectory",
    "davinci_pr_markdown", "finetranslations_fold", "gpt_oss_chat", "institutional_books_pages", "kernelgym_trajectory",
    "molmo2_captions", "nemotron_terminal_conversations", "numinamath_chat", "numinamath_tir_chat", "sec_edgar_reencode",
    "stack_v3_repository", "superior_reasoning_chat", "svg_prompt", "swe_rebench_openhands_trajectory",
    "swe_zero_trajectory", "synthetic1_scored_response",
]  # fmt: skip
PROVIDER_COLUMNS = [
    "conversations", "messages", "trajectory", "turns", "files", "text", "content", "id", "item_id", "page_num", "result",
    "reward", "resolved", "success", "max_tokens", "problem", "solution", "problem_is_valid", "solution_is_valid",
    "user_content", "assistant_content", "input", "output", "prompt", "llm_response", "score", "merged_caption",
    "frame_timestamps", "frame_captions", "title", "svg_content", "tags", "og_full_text", "translated_text",
    "text_by_page_gen", "text_by_page_src", "repo_path", "repo_name", "related_issue", "commits", "original_teacher",
]  # fmt: skip


@pytest.mark.parametrize("name", HF_TRANSFORMS)
@pytest.mark.parametrize(
    "junk",
    [pl.Int64, pl.Utf8, pl.List(pl.Int64), pl.Struct({"role": pl.Int64})],
    ids=["ints", "strings", "int-lists", "structs"],
)
def test_rows_of_the_wrong_shape_are_counted_never_fatal(name: str, junk: pl.DataType) -> None:
    values = {pl.Int64: [7, None, -1], pl.Utf8: ["???", "", None], pl.List(pl.Int64): [[1], [], None], pl.Struct({"role": pl.Int64}): [{"role": 1}, None, {"role": None}]}
    frame = pl.DataFrame({c: pl.Series(c, values[junk], dtype=junk) for c in PROVIDER_COLUMNS})
    out, counts = get_transform(name)(frame)
    assert {"text", "source_id"} <= set(out.columns)
    assert out["text"].dtype == pl.Utf8 and out.schema["source_id"] in (pl.Utf8, pl.Null)
    assert all(isinstance(n, int) and n > 0 for n in counts.values())
    if name != "biodiversity_pages":  # counts items, not rows
        assert out.height + sum(counts.values()) == frame.height, (out, counts)


@pytest.mark.parametrize("name", HF_TRANSFORMS)
def test_empty_batches_and_missing_columns(name: str) -> None:
    out, counts = get_transform(name)(pl.DataFrame({"unrelated": ["x", "y"]}))
    assert out.height == 0 and "text" in out.columns
    assert sum(counts.values()) == 2
    out, counts = get_transform(name)(pl.DataFrame())
    assert out.height == 0 and "text" in out.columns and not counts


def test_teacher_filter_keeps_open_models_and_drops_any_proprietary_field() -> None:
    assert proprietary_teacher({"original_teacher": "Claude-3.7-Sonnet"})
    assert proprietary_teacher({"model_provider": "OpenAI", "original_teacher": "GLM-4.6"})
    assert proprietary_teacher({"model": "gemini-2.5-pro"})
    assert proprietary_teacher({"model": "gpt-4o-mini"})
    assert not proprietary_teacher({"model": "openai/gpt-oss-120b", "model_provider": "openai", "original_teacher": "GPT-OSS-120B"})
    assert not proprietary_teacher({"model": None, "model_provider": None, "original_teacher": "Qwen3-Coder-480B"})
    assert [agenttrove_outcome(v) for v in ("success", "timeout", "1.0", "0.5", 1, "AgentTimeoutError", None, "")] == [
        "solved", "failed", "solved", "failed", "solved", "unverified", None, None,
    ]  # fmt: skip


def test_finetranslations_order_is_a_stable_fair_coin() -> None:
    ids = [f"doc-{i}" for i in range(2000)]
    flips = [english_first(i) for i in ids]
    assert flips == [bool(xxhash.xxh3_128_intdigest(i.encode()) & 1) for i in ids]
    assert 0.45 < sum(flips) / len(flips) < 0.55


def test_directory_blocks_keep_a_folders_files_together() -> None:
    paths = ["src/z.py", "b/x.py", "a.txt", "src/sub/y.py", "src/a.py", "Z.md", "b/c/d/e.py"]
    assert sorted(paths, key=directory_dfs_key) == ["Z.md", "a.txt", "b/x.py", "b/c/d/e.py", "src/a.py", "src/z.py", "src/sub/y.py"]


def test_book_pages_spanning_batches_are_stitched_when_the_file_is_read_whole(tmp_path: Path) -> None:
    pages = [{"item_id": "7", "page_num": f"{n:04d}", "text": f"page {n}"} for n in (3, 1, 2)]
    pages += [{"item_id": "8", "page_num": "0001", "text": "other item"}]
    path = tmp_path / "pages.parquet"
    pq.write_table(pa.Table.from_pylist(pages), path, row_group_size=2)
    transform = get_transform("biodiversity_pages")
    assert transform.read_file is whole_file  # type: ignore[attr-defined]
    batchwise = [transform(b)[0] for b in normalize.read_batches(str(path), "parquet", 2, {})]
    assert pl.concat(batchwise)["source_id"].to_list().count("7") == 2  # why the recipe reads whole files
    (frame,) = list(transform.read_file(str(path), "parquet", 2, {}))  # type: ignore[attr-defined]
    out, counts = transform(frame)
    assert dict(zip(out["source_id"], out["text"], strict=True)) == {"7": "page 1\n\npage 2\n\npage 3", "8": "other item"}
    assert not counts


# --------------------------------------------------------------------------- Parquet repair


def _table() -> pa.Table:
    return pa.table({
        "id": [f"f-{i}" for i in range(300)],
        "cik": list(range(300)),
        "form": ["10-K", "8-K", "S-1"] * 100,
        "content": [f"filing {i} " + "x" * (i % 17) for i in range(300)],
        "items": [[i, i + 1] for i in range(300)],
    })  # fmt: skip


@pytest.mark.parametrize("page_version", ["1.0", "2.0"])
def test_rewrite_keeps_every_value_across_row_groups_dictionaries_and_page_indexes(page_version: str) -> None:
    plain = io.BytesIO()
    pq.write_table(_table(), plain, row_group_size=70, data_page_size=512, write_page_index=True,
                   data_page_version=page_version, use_dictionary=["form"])  # fmt: skip
    plain.seek(0)
    footer = sec_edgar.read_footer(plain)
    assert sec_edgar.decode_struct(sec_edgar.encode_struct(footer)) == footer
    plain.seek(0)
    out = io.BytesIO()
    counters = sec_edgar.rewrite_page_headers(plain, out, sec_edgar.strip_page_statistics)
    assert counters["pages_rewritten"] > 20
    repaired = pq.ParquetFile(io.BytesIO(out.getvalue()))
    assert repaired.metadata.num_row_groups == 5
    assert repaired.read().equals(_table())


def test_thrift_structures_round_trip_byte_for_byte() -> None:
    buf = io.BytesIO()
    pq.write_table(_table(), buf, row_group_size=100, write_page_index=True)
    data = buf.getvalue()
    length = int.from_bytes(data[-8:-4], "little")
    raw = data[-8 - length : -8]
    assert sec_edgar.encode_struct(sec_edgar.decode_struct(raw)) == raw


def test_tolerant_reader_reads_oversized_page_headers_locally(tmp_path: Path) -> None:
    rows = [{"id": "a", "content": "first filing"}, {"id": "b", "content": "second filing"}]
    broken = tmp_path / "8-K.parquet"
    broken.write_bytes(oversized_page_header_parquet(rows, "content"))
    with pytest.raises(OSError, match="thrift"):
        pq.read_table(broken)
    reader = get_transform("sec_edgar_reencode").read_file  # type: ignore[attr-defined]
    assert pl.concat(list(reader(str(broken), "parquet", 100, {}))).to_dicts() == rows
    fine = tmp_path / "10-K.parquet"
    pq.write_table(pa.Table.from_pylist(rows), fine, row_group_size=1)
    assert pl.concat(list(reader(str(fine), "parquet", 1, {}))).to_dicts() == rows
    jsonl = tmp_path / "x.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert pl.concat(list(reader(str(jsonl), "jsonl", 100, {}))).to_dicts() == rows


@pytest.mark.system
def test_tolerant_reader_repairs_oversized_page_headers_on_gcs(gcs_prefix: str) -> None:
    """Remote files go through Arrow, which refuses the header: the reader repairs a copy."""
    rows = [{"id": "a", "content": "first filing"}, {"id": "b", "content": "second filing"}]
    uri = storage.join(gcs_prefix, "raw", "8-K.parquet")
    with storage.open_atomic(uri) as handle:
        handle.write(oversized_page_header_parquet(rows, "content"))
    with pytest.raises(OSError, match="thrift"):
        list(normalize.read_batches(uri, "parquet", 100, {}))
    reader = get_transform("sec_edgar_reencode").read_file  # type: ignore[attr-defined]
    assert pl.concat(list(reader(uri, "parquet", 100, {}))).to_dicts() == rows


def test_rewrite_refuses_files_it_cannot_rewrite_safely() -> None:
    with pytest.raises(sec_edgar.ThriftError):
        sec_edgar.rewrite_page_headers(io.BytesIO(b"PAR1not a parquet file"), io.BytesIO(), sec_edgar.strip_page_statistics)
