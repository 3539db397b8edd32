"""Fixtures for the Hugging Face sources with a page, document, code or SEC-EDGAR transform, in each
provider's schema (agent trajectories and chat: ``hf_conversation_fixtures``).

Every fixture mixes well-formed rows (whose rendered text is written out in full below) with
awkward ones the recipe must count and drop or repair: missing fields, empty turns, wrong
types, invalid UTF-8 and broken lines in JSON, whitespace runs past the cap.
"""

from __future__ import annotations

import hashlib
import io
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from marin_assets.core.ingest.transforms import sec_edgar
from marin_assets_tests.recipes import FixtureCase, register_fixture
from marin_assets_tests.recipes.formats import RUN, encode, parquet


# --------------------------------------------------------------------------- pages


@register_fixture("cp/biodiversity")
def biodiversity(source: Any) -> FixtureCase:
    def page(pid: str, text: str, item: str | None, num: str) -> dict[str, Any]:
        row: dict[str, Any] = {"id": pid, "text": text, "page_num": num, "source": "biodiversity-heritage-library",
                               "added": "2024-06-01", "metadata": {"license": "Public Domain"}}  # fmt: skip
        return row if item is None else row | {"item_id": item}

    lines: list[Any] = [
        page("p-100-2", "Second page of item 100.", "100", "0002"),
        page("p-100-10", "Tenth page.", "100", "0010"),
        page("p-100-1", "First page of item 100.", "100", "0001"),
        page("p-100-3", "  ", "100", "0003"),
        page("p-200-1", "", "200", "0001"),
        page("p-x", "Orphan page.", None, "0001"),
        b'{"id": "p-300-1", "text": "Caf\xe9 page of item 300.", "item_id": "300", "page_num": "0001"}',
        page("p-300-2", "Last page of item 300.", "300", "0002"),
        b'{"id": "p-broken", "text": ',
    ]
    texts = {
        "100": "First page of item 100.\n\nSecond page of item 100.\n\nTenth page.",
        "300": "Caf\ufffd page of item 300.\n\nLast page of item 300.",
    }

    def check(frame: Any) -> None:
        assert dict(zip(frame["source_id"], frame["pages"], strict=True)) == {"100": 3, "300": 2}

    return FixtureCase(
        files={"biodiversity_heritage_library/part-00000.json.gz": encode("json.gz", lines)},
        rows=2, texts=texts, all_texts=list(texts.values()),
        bad_rows={"item_without_text": 1, "missing_item_id": 1, "invalid_utf8_repaired": 1, "bad_json": 1},
        columns=("pages",), check=check,
    )  # fmt: skip


@register_fixture("institutional_books")
def institutional_books(source: Any) -> FixtureCase:
    def book(barcode: str, gen: Any, src: Any) -> dict[str, Any]:
        return {"barcode_src": barcode, "title_src": f"Title {barcode}", "author_src": "Doe, J.", "date1_src": "1887",
                "language_gen": "eng", "text_by_page_gen": gen, "text_by_page_src": src}  # fmt: skip

    rows = [
        book("HN1", ["Clean page one.", "", "Clean page three."], ["raw p1", "raw p2"]),
        book("HN2", [], ["Raw only page.", "  "]),
        book("HN3", None, None),
        book("HN4", ["   "], []),
    ]
    texts = {"HN1": "Clean page one.\n\nClean page three.", "HN2": "Raw only page."}

    def check(frame: Any) -> None:
        first = frame.filter(frame["source_id"] == "HN1").to_dicts()[0]
        assert (first["title"], first["author"], first["date"], first["language"]) == ("Title HN1", "Doe, J.", "1887", "eng")

    return FixtureCase(
        files={"data/train-00000-of-00001.parquet": parquet(rows), "metadata/books.parquet": parquet([book("DECOY", ["DECOY"], None)])},
        rows=2, texts=texts, all_texts=list(texts.values()), bad_rows={"no_pages": 2},
        columns=("title", "author", "date", "language"), check=check,
    )  # fmt: skip


# --------------------------------------------------------------------------- documents


def _finetranslations_ids() -> tuple[str, str]:
    """Two ids whose coin flips differ (low bit of xxh3-128 set: English first)."""
    english = next(f"ft-{i}" for i in range(100) if xxhash.xxh3_128_intdigest(f"ft-{i}".encode()) & 1)
    original = next(f"ft-{i}" for i in range(100) if not xxhash.xxh3_128_intdigest(f"ft-{i}".encode()) & 1)
    return english, original


@register_fixture("finetranslations")
def finetranslations(source: Any) -> FixtureCase:
    en_first, og_first = _finetranslations_ids()
    no_id_original, no_id_english = "Sans identifiant.", "Without an id."
    rows = [
        {"id": en_first, "og_full_text": "Bonjour le monde.", "translated_text": "Hello world.", "og_language": "fra_Latn", "chunks": ["a"]},
        {"id": og_first, "og_full_text": "Guten Tag.", "translated_text": "Good day.", "og_language": "deu_Latn", "chunks": ["b"]},
        {"id": "ft-only-og", "og_full_text": "Solo original.", "translated_text": None, "og_language": "ita_Latn", "chunks": []},
        {"id": "ft-only-en", "og_full_text": "   ", "translated_text": "Only English.", "og_language": "spa_Latn", "chunks": []},
        {"id": "ft-none", "og_full_text": None, "translated_text": "", "og_language": "fra_Latn", "chunks": []},
        {"id": None, "og_full_text": no_id_original, "translated_text": no_id_english, "og_language": "fra_Latn", "chunks": []},
    ]
    no_id_flip = xxhash.xxh3_128_intdigest(no_id_original.encode()) & 1
    texts = {
        en_first: "Hello world.\n\nBonjour le monde.",
        og_first: "Guten Tag.\n\nGood day.",
        "ft-only-og": "Solo original.",
        "ft-only-en": "Only English.",
        None: f"{no_id_english}\n\n{no_id_original}" if no_id_flip else f"{no_id_original}\n\n{no_id_english}",
    }
    return FixtureCase(
        files={"data/fra_Latn/train-00000.parquet": parquet(rows), "README.md": b"# FineTranslations\n"},
        rows=5, texts=texts, all_texts=list(texts.values()), bad_rows={"empty_pair": 1},
        absent_columns=("og_full_text", "translated_text", "chunks"),
    )  # fmt: skip


@register_fixture("molmo2-cap")
def molmo2(source: Any) -> FixtureCase:
    rows = [
        {"id": "v-1", "video_id": "vid1", "merged_caption": "A cat jumps onto a table.", "frame_timestamps": [0.0, 2.5, 5.25],
         "frame_captions": ["The cat crouches.", "", "The cat lands."]},
        {"id": "v-2", "video_id": "vid2", "merged_caption": "An empty street.", "frame_timestamps": [], "frame_captions": []},
        {"id": "v-3", "video_id": "vid3", "merged_caption": "  ", "frame_timestamps": [1.0], "frame_captions": ["x"]},
        {"id": "v-4", "video_id": "vid4", "merged_caption": None, "frame_timestamps": None, "frame_captions": None},
    ]  # fmt: skip
    texts = {
        "v-1": "A cat jumps onto a table.\n\n[Frame at 0.00s] The cat crouches.\n[Frame at 5.25s] The cat lands.",
        "v-2": "An empty street.",
    }
    return FixtureCase(
        files={"data/train-00000-of-00001.parquet": parquet(rows)},
        rows=2, texts=texts, all_texts=list(texts.values()), bad_rows={"missing_caption": 2}, columns=("video_id",),
    )  # fmt: skip


@register_fixture("svg")
def svg(source: Any) -> FixtureCase:
    markup = '<svg xmlns="http://www.w3.org/2000/svg"><path d="M0 0h1"/></svg>'
    lines: list[Any] = [
        {"id": "10000206", "title": "messaging", "data_pack": "ui-outlines", "tags": ["messaging", "chat app", "messaging"],
         "license": "CREATIVECOMMONS", "license_owner": "Ann", "download_url": "https://example.org/10000206.svg", "svg_content": markup},
        {"id": "2", "title": "empty tags", "data_pack": None, "tags": [], "license": "CREATIVECOMMONS", "svg_content": "<svg/>"},
        {"id": "3", "title": "", "svg_content": "<svg/>"},
        {"id": "4", "title": "no svg"},
        b'{"id": "5", "title": "caf\xe9", "tags": ["x"], "data_pack": "p", "svg_content": "<svg/>"}',
    ]  # fmt: skip
    head = "Create an SVG which matches the following description."
    texts = {
        "10000206": f"{head}\nTitle: messaging\nData Pack: ui-outlines\nTags: messaging, chat app, messaging\n\n{markup}",
        "2": f"{head}\nTitle: empty tags\nData Pack: \nTags: \n\n<svg/>",
        "5": f"{head}\nTitle: caf\ufffd\nData Pack: p\nTags: x\n\n<svg/>",
    }
    return FixtureCase(
        files={"svgfind-CREATIVECOMMONS_0.jsonl.zst": encode("jsonl.zst", lines),
               "svgfind-PUBLICDOMAIN_0.jsonl.zst": encode("jsonl.zst", [{"id": "pd", "title": "DECOY", "svg_content": "<svg/>"}])},  # fmt: skip
        rows=3, texts=texts, all_texts=list(texts.values()),
        bad_rows={"missing_title_or_svg": 2, "invalid_utf8_repaired": 1}, columns=("license", "license_owner", "download_url"),
    )  # fmt: skip


@register_fixture("biocollection/free_text_stream", "biocollection/instruction_stream")
def biocollection(source: Any) -> FixtureCase:
    stream = source.provider.subdir.rsplit("/", 1)[-1]
    lines: list[Any] = [
        {"text": f"[{stream}] CCO is ethanol. Molecular weight 46.07.", "record_type": "molecule"},
        {"text": "   ", "record_type": "molecule"},
        {"record_type": "molecule"},
        {"text": None, "record_type": "reaction"},
        f'{{"text": "[{stream}] Na'.encode() + b"\xef" + b've chemistry note", "record_type": "note"}',
        b'{"text": "unterminated',
        {"text": f"[{stream}] Benzene: C6H6" + "\n" * 200 + "aromatic.", "record_type": "molecule"},
        {"id": f"{stream}-7", "text": f"[{stream}] Instruction: predict the product.\nResponse: water.", "record_type": "reaction"},
    ]
    texts = [
        f"[{stream}] CCO is ethanol. Molecular weight 46.07.",
        f"[{stream}] Na\ufffdve chemistry note",
        f"[{stream}] Benzene: C6H6" + "\n" * RUN + "aromatic.",
        f"[{stream}] Instruction: predict the product.\nResponse: water.",
    ]
    return FixtureCase(
        files={f"data/{stream}/part-00000.jsonl.zst": encode("jsonl.zst", lines),
               "data/other_stream/part-00000.jsonl.zst": encode("jsonl.zst", [{"text": "DECOY", "record_type": "x"}])},  # fmt: skip
        rows=4, texts={f"{stream}-7": texts[3]}, all_texts=texts,
        bad_rows={"missing_text": 3, "invalid_utf8_repaired": 1, "bad_json": 1},
        counters={"whitespace_compacted": 1}, absent_columns=("record_type",),
    )  # fmt: skip


# --------------------------------------------------------------------------- code and pull requests


def _file(path: str, content: str | None, licenses: list[str], license_type: str) -> dict[str, Any]:
    return {"content_id": hashlib.sha1(path.encode()).hexdigest(), "content": content, "detected_licenses": licenses,
            "file_path": path, "file_timestamp": 1700000000, "is_vendor": False, "language": "Python",
            "license_type": license_type, "size_bytes": len(content or "")}  # fmt: skip


@register_fixture("stack-v3")
def stack_v3(source: Any) -> FixtureCase:
    files = [
        _file("src/util/helpers.py", "def helper():\n    return 1\n", ["MIT"], "permissive"),
        _file("README.md", "# Tiny\n", ["MIT"], "permissive"),
        _file("src/main.py", "print('hi')\n", [], "no_license"),
        _file("LICENSE", None, ["MIT"], "permissive"),
        _file("docs/index.md", "Docs\n", ["CC-BY-4.0"], "permissive"),
    ]
    meta = {"branch": "main", "commit_count": 3, "forked_from": None, "forks": 1, "is_fork": False, "is_org_owned": True,
            "issues": 0, "pull_requests": 0, "repo_created_at": "2020-01-01", "stars": 5}  # fmt: skip
    rows = [
        {"repo_path": "acme/tiny", "repo_id": 42, "commit_id": "abc123", "github_metadata": meta, "num_files": 5, "files": files},
        {"repo_path": "acme/empty", "repo_id": 43, "commit_id": "def", "github_metadata": meta, "num_files": 0, "files": []},
        {"repo_path": None, "repo_id": 44, "commit_id": "ghi", "github_metadata": meta, "num_files": 1, "files": files[:1]},
        {"repo_path": "acme/blank", "repo_id": 45, "commit_id": "jkl", "github_metadata": meta, "num_files": 1, "files": [files[3]]},
    ]
    text = (
        "Repository: acme/tiny\n\nFile: README.md\n# Tiny\n\n\nFile: docs/index.md\nDocs\n\n\n"
        "File: src/main.py\nprint('hi')\n\n\nFile: src/util/helpers.py\ndef helper():\n    return 1\n"
    )

    def check(frame: Any) -> None:
        (repo,) = frame.to_dicts()
        assert [f["file_path"] for f in repo["file_metadata"]] == ["LICENSE", "README.md", "docs/index.md", "src/main.py", "src/util/helpers.py"]
        assert [f["detected_licenses"] for f in repo["file_metadata"]] == [["MIT"], ["MIT"], ["CC-BY-4.0"], [], ["MIT"]]
        assert [f["license_type"] for f in repo["file_metadata"]][3] == "no_license"
        assert all("content" not in f for f in repo["file_metadata"])
        assert (repo["repo_path"], repo["commit_id"], repo["num_files"]) == ("acme/tiny", "abc123", 5)
        assert repo["github_metadata"]["stars"] == 5

    return FixtureCase(
        files={"data/train-00000.parquet": parquet(rows)},
        rows=1, texts={"42": text}, bad_rows={"no_files": 2, "missing_repo_path": 1},
        columns=("repo_path", "commit_id", "file_metadata", "github_metadata", "serialization_format"), absent_columns=("files",), check=check,
    )  # fmt: skip


@register_fixture("davinci-dev/ctx-native")
def davinci_ctx(source: Any) -> FixtureCase:
    full = {
        "id": "pr-1", "repo_name": "acme/widgets", "repo_description": "Widgets for everyone.", "title": "Fix widget overflow",
        "body": "Widgets overflowed on narrow screens.",
        "related_issue": {"title": "Overflow on mobile", "body": "The widget spills over.",
                          "comments": [{"author": "ann", "body": "Confirmed on iOS."}, {"author": None, "body": "Me too."}, {"author": "bob", "body": ""}]},
        "pr_summary": "Clamps the widget width.",
        "relevant_files": [{"path": "src/widget.py", "content": "WIDTH = 100\n"}],
        "commits": [{"message": "fix", "refined_message": "Clamp widget width to the viewport",
                     "diffs": [{"path": "src/widget.py", "patch": "-WIDTH = 100\n+WIDTH = min(100, viewport)"}]}],
    }  # fmt: skip
    bare = {"id": "pr-2", "repo_name": "acme/tools", "repo_description": None, "title": "Bump version", "body": None,
            "related_issue": None, "pr_summary": None, "relevant_files": [], "commits": []}  # fmt: skip
    rows = [full, bare, bare | {"id": "pr-3", "title": None}, bare | {"id": "pr-4", "repo_name": ""}]
    texts = {
        "pr-1": (
            "# Repository\nName: acme/widgets\nDescription: Widgets for everyone.\n\n"
            "# Related issue: Overflow on mobile\n\nThe widget spills over.\n\n## Comment by ann\nConfirmed on iOS.\n\n"
            "## Comment by unknown\nMe too.\n\n"
            "# Pull request: Fix widget overflow\n\nWidgets overflowed on narrow screens.\n\n"
            "# Summary\nClamps the widget width.\n\n"
            "# Relevant files\n\n## src/widget.py\n```\nWIDTH = 100\n\n```\n\n"
            "# Commits\n\n## Commit\nClamp widget width to the viewport\n\n"
            "### src/widget.py\n```diff\n-WIDTH = 100\n+WIDTH = min(100, viewport)\n```"
        ),
        "pr-2": "# Repository\nName: acme/tools\n\n# Pull request: Bump version",
    }
    return FixtureCase(
        files={"ctx-native/llm_enhanced_prs/part-00000.parquet": parquet(rows),
               "ctx-native/raw_prs/part-00000.parquet": parquet([full | {"id": "decoy", "title": "DECOY"}])},  # fmt: skip
        rows=2, texts=texts, all_texts=list(texts.values()), bad_rows={"missing_repo_or_title": 2}, columns=("repo_name",),
    )  # fmt: skip


# --------------------------------------------------------------------------- SEC-EDGAR

OVERSIZED_STATISTICS = 17 << 20  # past the 16 MiB page-header limit of the Arrow reader


def oversized_page_header_parquet(rows: list[dict[str, Any]], column: str) -> bytes:
    """A Parquet file whose ``column`` data page header carries multi-megabyte statistics.

    This is how the provider's shards look to Arrow (it refuses the header); the bytes of
    every value are unchanged.
    """
    plain = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), plain, use_dictionary=False, write_statistics=False)
    plain.seek(0)
    schema_names = pq.ParquetFile(io.BytesIO(plain.getvalue())).schema_arrow.names
    target, seen = schema_names.index(column), [0]
    big = b"\x7f" * OVERSIZED_STATISTICS

    def inflate(header: list[Any]) -> list[Any]:
        page = sec_edgar.get_field(header, sec_edgar.PAGE_DATA_V1)
        if page is not None:
            if seen[0] == target:
                sec_edgar.set_field(page, sec_edgar.V1_STATISTICS, sec_edgar.STRUCT, [[5, sec_edgar.BINARY, big], [6, sec_edgar.BINARY, b""]])
            seen[0] += 1
        return header

    out = io.BytesIO()
    sec_edgar.rewrite_page_headers(plain, out, inflate)
    return out.getvalue()


@register_fixture("sec-edgar")
def sec_edgar_filings(source: Any) -> FixtureCase:
    tenk = [
        {"id": "0000320193-24-000123", "filing_type": "10-K", "cik": 320193, "content": "ANNUAL REPORT\nApple Inc."},
        {"id": "0000320193-24-000124", "filing_type": "10-K", "cik": 320193, "content": None},
        {"id": "0000320193-24-000125", "filing_type": "10-K", "cik": 320193, "content": "   "},
    ]
    eightk = [{"id": "0000001750-24-000001", "filing_type": "8-K", "cik": 1750, "content": "CURRENT REPORT\nItem 5.02"}]
    oversized = oversized_page_header_parquet(eightk, "content")
    try:
        pq.read_table(io.BytesIO(oversized))
    except OSError:
        pass
    else:  # the fixture must reproduce what the provider ships
        raise AssertionError("the oversized-header fixture is readable by Arrow; raise OVERSIZED_STATISTICS")
    texts = {"0000320193-24-000123": "ANNUAL REPORT\nApple Inc.", "0000001750-24-000001": "CURRENT REPORT\nItem 5.02"}

    def check(frame: Any) -> None:
        assert dict(zip(frame["source_id"], frame["cik"], strict=True)) == {"0000320193-24-000123": 320193, "0000001750-24-000001": 1750}

    return FixtureCase(
        files={"10-K/part-00000.parquet": parquet(tenk), "8-K/part-00000.parquet": oversized,
               "DEF-14A/part-00000.parquet": parquet([{"id": "decoy", "content": "DECOY"}])},  # fmt: skip
        rows=2, texts=texts, all_texts=list(texts.values()), bad_rows={"missing_content": 1},
        counters={"empty_dropped": 1}, columns=("filing_type", "cik"), absent_columns=("content",), check=check,
    )  # fmt: skip

