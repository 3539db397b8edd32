"""Transforms of the pre-staged sources.

The rebuilt Nemotron code shards store each file's ``content`` as raw bytes (``sha1_git`` may be
bytes too): source files are not all valid UTF-8, and a single bad file must not stop a
585 GB source. ``code_content_decode`` decodes the bytes (invalid sequences replaced and
counted), renders ``sha1_git`` as hex, and drops rows whose content was never found
(``present`` false or no content).
"""

from __future__ import annotations

from collections.abc import Mapping

import polars as pl

from marin_assets.core.ingest.transforms import register


def _decoded(frame: pl.DataFrame, name: str) -> tuple[pl.Series, int]:
    """A text column from a string or bytes column, and how many values needed repair."""
    column = frame[name]
    if column.dtype != pl.Binary:
        return column.cast(pl.Utf8), 0
    try:
        return column.cast(pl.Utf8), 0
    except pl.exceptions.ComputeError:  # some value is not UTF-8: decode one by one
        pass
    values, repaired = [], 0
    for raw in column.to_list():
        if raw is None:
            values.append(None)
            continue
        try:
            values.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            values.append(raw.decode("utf-8", errors="replace"))
            repaired += 1
    return pl.Series(name, values, dtype=pl.Utf8), repaired


@register("code_content_decode")
def code_content_decode(frame: pl.DataFrame) -> tuple[pl.DataFrame, Mapping[str, int]]:
    counts: dict[str, int] = {}
    present = pl.col("present").fill_null(True) if "present" in frame.columns else pl.lit(True)
    content = pl.col("content") if "content" in frame.columns else pl.lit(None)
    missing = ~present | content.is_null()
    dropped = int(frame.select(missing.sum()).item() or 0) if frame.height else 0
    if dropped:
        counts["content_missing"] = dropped
    kept = frame.filter(~missing) if frame.height else frame
    if not kept.height:
        return pl.DataFrame(schema={"text": pl.Utf8, "source_id": pl.Utf8}), counts
    text, repaired = _decoded(kept, "content")
    if repaired:
        counts["invalid_utf8_repaired"] = repaired
    if "sha1_git" in kept.columns:
        ids = kept["sha1_git"]
        source_id = ids.bin.encode("hex") if ids.dtype == pl.Binary else ids.cast(pl.Utf8)
    else:
        source_id = pl.Series("source_id", [None] * kept.height, dtype=pl.Utf8)
    return pl.DataFrame({"text": text, "source_id": source_id}), counts
