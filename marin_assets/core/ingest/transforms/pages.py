"""Scanned books: pages stitched into one document per book, joined by a blank line."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import polars as pl

from marin_assets.core.ingest.transforms import register
from marin_assets.core.ingest.transforms.rendering import (
    Skip,
    bounded_batches,
    empty_output,
    first_id,
    per_row,
    reads_with,
    string_column,
    text_or_none,
    whole_file,
)

PAGE_SEPARATOR = "\n\n"


# --------------------------------------------------------------------------- Biodiversity Heritage Library


def _page_field(frame: pl.DataFrame, name: str) -> pl.Series:
    """A page attribute from the top level, else from the Dolma ``metadata`` struct (else null)."""
    if name in frame.columns:
        return frame[name]
    meta = frame.schema.get("metadata")
    if isinstance(meta, pl.Struct) and name in {f.name for f in meta.fields}:
        return frame["metadata"].struct.field(name)
    return pl.Series(name, [None] * frame.height, dtype=pl.Utf8)


@register("biodiversity_pages")
@reads_with(whole_file)
def biodiversity_pages(frame: pl.DataFrame) -> tuple[pl.DataFrame, dict[str, int]]:
    """One document per BHL item: its non-empty pages ordered by ``page_num``.

    Upstream has one row per scanned page. ``page_num`` is a zero-padded string ("0001"), so
    the order is that of the numbers; numbers of other widths are padded to 12 digits first so
    they sort the same way. ``item_id`` becomes ``source_id``; ``pages`` counts the pages
    joined. Drops: rows without ``item_id`` (``missing_item_id``, counted per page) and items
    whose pages are all blank (``item_without_text``, counted per item).

    Assumption: all pages of an item are in one provider file. The recipe reads each file
    whole (``read_file = whole_file``), so pages are never split across batches; an item
    spread over several files would come out as one document per file.
    """
    if not frame.height:
        return empty_output(), {}
    fields = pl.DataFrame([_page_field(frame, name).alias(name) for name in ("item_id", "page_num", "text")])
    text = fields["text"] if fields["text"].dtype == pl.Utf8 else pl.Series("text", [None] * frame.height, dtype=pl.Utf8)
    pages = pl.DataFrame({
        "item_id": string_column(fields, "item_id"),
        "page": string_column(fields, "page_num").str.zfill(12),
        "text": text,
    })  # fmt: skip
    counts: dict[str, int] = {}
    missing = int(pages["item_id"].is_null().sum())
    if missing:
        counts["missing_item_id"] = missing
    pages = pages.filter(pl.col("item_id").is_not_null()).with_columns(
        pl.when(pl.col("text").str.contains(r"\S")).then(pl.col("text")).otherwise(None).alias("text")
    )
    items = (
        pages.sort(["item_id", "page"], nulls_last=True, maintain_order=True)
        .group_by("item_id", maintain_order=True)
        .agg(
            pl.col("text").drop_nulls().str.join(PAGE_SEPARATOR).alias("text"),
            pl.col("text").drop_nulls().len().cast(pl.Int64).alias("pages"),
        )
    )
    empty = int((items["pages"] == 0).sum())
    if empty:
        counts["item_without_text"] = empty
    out = items.filter(pl.col("pages") > 0).select(pl.col("text"), pl.col("item_id").alias("source_id"), pl.col("pages"))
    return out, counts


# --------------------------------------------------------------------------- Institutional Books


def _pages(value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise TypeError("page list expected")
    return [p for p in value if isinstance(p, str) and p.strip()]


@register("institutional_books_pages")
@reads_with(bounded_batches(64))
@per_row(("text_by_page_gen", "text_by_page_src", "barcode_src", "title_src", "author_src", "date1_src", "language_gen"))
def institutional_books_pages(row: Mapping[str, Any]) -> dict[str, Any]:
    """A book's pages joined by a blank line: OCR-corrected pages, else the source OCR.

    ``text_by_page_gen`` is used when it has any non-blank page, else ``text_by_page_src``;
    blank pages are left out. Drops ``no_pages``. The ``barcode_src`` becomes ``source_id``;
    title, author, date and detected language are kept.
    """
    pages = _pages(row.get("text_by_page_gen")) or _pages(row.get("text_by_page_src"))
    if not pages:
        raise Skip("no_pages")
    return {
        "text": PAGE_SEPARATOR.join(pages),
        "source_id": first_id(row, ("barcode_src",)),
        "title": text_or_none(row.get("title_src")),
        "author": text_or_none(row.get("author_src")),
        "date": first_id(row, ("date1_src",)),
        "language": text_or_none(row.get("language_gen")),
    }
