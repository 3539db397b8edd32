"""One provider row, one document: parallel-text folds, captions, SVG prompts, text streams."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import polars as pl
import xxhash

from marin_assets.core.ingest.transforms import register
from marin_assets.core.ingest.transforms.rendering import Skip, empty_output, first_id, nonblank, per_row, string_column, text_or_none


def _text_column(frame: pl.DataFrame, name: str) -> pl.Series:
    """A text column with blanks and non-strings as null (absent: all null)."""
    column = frame[name] if name in frame.columns else pl.Series(name, [None] * frame.height, dtype=pl.Utf8)
    if column.dtype != pl.Utf8:
        column = column.cast(pl.Utf8, strict=False) if column.dtype in (pl.Binary, pl.Null) else pl.Series(name, [None] * frame.height, dtype=pl.Utf8)
    has_text = column.str.contains(r"\S").fill_null(False)
    return column.zip_with(has_text, pl.Series(name, [None] * frame.height, dtype=pl.Utf8)).alias(name)


# --------------------------------------------------------------------------- FineTranslations

SEPARATOR = "\n\n"


def english_first(key: str) -> bool:
    """The per-document coin flip: the low bit of xxh3-128 of the key (the row id)."""
    return bool(xxhash.xxh3_128_intdigest(key.encode("utf-8")) & 1)


@register("finetranslations_fold")
def finetranslations_fold(frame: pl.DataFrame) -> tuple[pl.DataFrame, dict[str, int]]:
    """Fold each parallel pair into one document: original and English joined by a blank line.

    The order is a deterministic coin flip per document (``english_first`` of the row id, or
    of the original text when the id is missing), so about half the documents read
    original->English. A row with one side only keeps that side; a row with neither is dropped
    as ``empty_pair``. The row id is kept as ``source_id``; the heavy provider columns are not.
    """
    original = _text_column(frame, "og_full_text")
    english = _text_column(frame, "translated_text")
    ids = string_column(frame, "id")
    keys = [i if i is not None else (o or e or "") for i, o, e in zip(ids.to_list(), original.to_list(), english.to_list(), strict=True)]
    flips = pl.Series("english_first", [english_first(k) for k in keys], dtype=pl.Boolean)
    parts = pl.DataFrame({"o": original, "e": english, "flip": flips, "source_id": ids})
    folded = parts.select(
        pl.when(pl.col("flip"))
        .then(pl.concat_str([pl.col("e"), pl.col("o")], separator=SEPARATOR, ignore_nulls=True))
        .otherwise(pl.concat_str([pl.col("o"), pl.col("e")], separator=SEPARATOR, ignore_nulls=True))
        .alias("text"),
        pl.col("source_id"),
        (pl.col("o").is_null() & pl.col("e").is_null()).alias("_empty"),
    )
    empty = int(folded["_empty"].sum())
    out = folded.filter(~pl.col("_empty")).drop("_empty")
    return out, ({"empty_pair": empty} if empty else {})


# --------------------------------------------------------------------------- Molmo2-Cap


@register("molmo2_captions")
@per_row(("merged_caption", "frame_timestamps", "frame_captions", "id", "video_id"))
def molmo2_captions(row: Mapping[str, Any]) -> dict[str, Any]:
    """The merged video caption, a blank line, then one ``[Frame at 12.50s] caption`` line per frame.

    Frames with a blank caption are left out; a row without a merged caption is dropped
    (``missing_caption``). Timestamps and captions pair up by position.
    """
    merged = nonblank(row.get("merged_caption"))
    if merged is None:
        raise Skip("missing_caption")
    lines = []
    for stamp, caption in zip(row.get("frame_timestamps") or [], row.get("frame_captions") or [], strict=False):
        caption = nonblank(caption)
        if caption is None:
            continue
        lines.append(f"[Frame at {float(stamp):.2f}s] {caption}")
    text = merged + ("\n\n" + "\n".join(lines) if lines else "")
    video = row.get("video_id")
    return {"text": text, "source_id": first_id(row, ("id", "video_id")), "video_id": video if isinstance(video, str) else None}


# --------------------------------------------------------------------------- svgfind

SVG_PROMPT = "Create an SVG which matches the following description."


@register("svg_prompt")
@per_row(("id", "title", "data_pack", "tags", "svg_content", "license", "license_owner", "download_url"))
def svg_prompt(row: Mapping[str, Any]) -> dict[str, Any]:
    """A description prompt (title, data pack, tags) followed by the raw SVG markup.

    Text: the prompt line, ``Title: ...``, ``Data Pack: ...``, ``Tags: a, b`` (in the
    provider's order), a blank line, then ``svg_content`` verbatim. Drops
    ``missing_title_or_svg``. Keeps the licence columns.
    """
    title, svg = nonblank(row.get("title")), text_or_none(row.get("svg_content"))
    if title is None or svg is None or not svg.strip():
        raise Skip("missing_title_or_svg")
    tags = row.get("tags") or []
    if isinstance(tags, str):
        tags = [tags]
    tag_line = ", ".join(str(t) for t in tags if t is not None)
    pack = text_or_none(row.get("data_pack")) or ""
    text = f"{SVG_PROMPT}\nTitle: {title}\nData Pack: {pack}\nTags: {tag_line}\n\n{svg}"
    return {
        "text": text,
        "source_id": first_id(row, ("id",)),
        "license": text_or_none(row.get("license")),
        "license_owner": text_or_none(row.get("license_owner")),
        "download_url": text_or_none(row.get("download_url")),
    }


# --------------------------------------------------------------------------- TheBioCollection


@register("biocollection_stream")
def biocollection_stream(frame: pl.DataFrame) -> tuple[pl.DataFrame, dict[str, int]]:
    """Synthetic biology/chemistry streams: ``text`` as published, ``record_type`` dropped.

    Rows whose ``text`` is missing, blank or not a string are dropped as ``missing_text``; the
    provider ``id`` (when there is one) becomes ``source_id``.
    """
    if "text" not in frame.columns:
        return empty_output(), ({"missing_text": frame.height} if frame.height else {})
    text = _text_column(frame, "text")
    ids = string_column(frame, "id")
    keep = [c for c in frame.columns if c not in ("text", "id", "source_id", "record_type")]
    out = pl.DataFrame([text.alias("text"), ids.alias("source_id")]).hstack(frame.select(keep))
    missing = int(out["text"].is_null().sum())
    out = out.filter(pl.col("text").is_not_null())
    return out, ({"missing_text": missing} if missing else {})
