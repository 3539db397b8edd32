"""Shared pieces of the family transforms: per-row rendering, chat blocks, reader hints.

A family transform that renders rows one at a time is written as ``render(row) -> record``
and wrapped with ``per_row``: the wrapper turns a batch into Python rows (only the columns the
recipe reads), calls ``render`` on each, and counts every row it could not render instead of
failing the source. ``render`` signals a deliberate drop by raising ``Skip(reason)``; any
``KeyError``/``TypeError``/``ValueError``/``AttributeError``/``IndexError`` from a row of
unexpected shape is counted as ``malformed_row``.

Transcript conventions used by every chat or agent recipe (one place, so they stay alike):

* a message renders as ``<role>\\ncontent\\n</role>``; messages are joined by a blank line;
  role aliases ``human``->``user``, ``gpt``/``model``/``bot``->``assistant``;
* content may be a string or a list of ``{"type": "text", "text": ...}`` parts (other parts
  are left out); messages with no text and no tool call are left out;
* an assistant's ``reasoning_content`` renders first, as ``<think>\\n...\\n</think>``;
* OpenAI-style ``tool_calls`` render after the content, one per block:
  ``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`` (arguments given as a JSON
  string are decoded; invalid JSON is kept verbatim as a string);
* an outcome tag, when the provider records one, is the first line: ``Outcome: solved``,
  ``Outcome: failed``, ``Outcome: unverified`` (ended before any verdict) or
  ``Outcome: unknown``.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import polars as pl

from marin_assets.core.ingest import formats, normalize

Record = dict[str, Any]
Reader = Callable[[str, str, int, dict[str, int]], Iterator[pl.DataFrame]]

ROLE_ALIASES = {"human": "user", "gpt": "assistant", "model": "assistant", "bot": "assistant"}
MALFORMED = "malformed_row"
EMPTY_TEXT = "empty_text"


class Skip(Exception):
    """Raised by a row renderer to drop the row under ``reason`` (counted, never fatal)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def empty_output() -> pl.DataFrame:
    return pl.DataFrame(schema={"text": pl.Utf8, "source_id": pl.Utf8})


def frame_of(records: list[Record]) -> pl.DataFrame:
    """Rendered records as a frame whose ``text`` and ``source_id`` are strings."""
    if not records:
        return empty_output()
    frame = pl.from_dicts(records, infer_schema_length=None)
    return frame.with_columns(pl.col("text").cast(pl.Utf8), pl.col("source_id").cast(pl.Utf8))


def per_row(columns: Sequence[str] | None = None) -> Callable[[Callable[[Mapping[str, Any]], Record]], Callable[..., Any]]:
    """Wrap ``render(row) -> {"text", "source_id", ...}`` into a batch transform.

    ``columns`` limits the provider columns turned into Python values (absent ones read as
    None). Rendered texts that are blank are dropped as ``empty_text``.
    """

    def wrap(render: Callable[[Mapping[str, Any]], Record]) -> Callable[..., Any]:
        @functools.wraps(render)
        def transform(frame: pl.DataFrame) -> tuple[pl.DataFrame, dict[str, int]]:
            counts: dict[str, int] = {}
            wanted = [c for c in columns if c in frame.columns] if columns is not None else frame.columns
            records: list[Record] = []
            rows: Any = frame.select(wanted).iter_rows(named=True) if wanted else ({} for _ in range(frame.height))
            for row in rows:
                try:
                    record = render(row)
                except Skip as skip:
                    counts[skip.reason] = counts.get(skip.reason, 0) + 1
                    continue
                except (KeyError, TypeError, ValueError, AttributeError, IndexError):
                    counts[MALFORMED] = counts.get(MALFORMED, 0) + 1
                    continue
                text = record.get("text")
                if not isinstance(text, str) or not text.strip():
                    counts[EMPTY_TEXT] = counts.get(EMPTY_TEXT, 0) + 1
                    continue
                records.append(record)
            return frame_of(records), counts

        return transform

    return wrap


def reads_with(reader: Reader) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Attach a file reader to a transform (``transform.read_file``).

    ``read_file(uri, fmt, batch_rows, counters)`` yields the provider batches of one file in
    place of ``normalize.read_batches``; the scatter phase uses it when present.
    """

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn.read_file = reader  # type: ignore[attr-defined]
        return fn

    return wrap


def bounded_batches(max_rows: int) -> Reader:
    """A reader that caps Parquet batches at ``max_rows`` rows (long trajectories, repositories)."""

    def read(uri: str, fmt: str, batch_rows: int, counters: dict[str, int], batch_bytes: int = formats.BATCH_BYTES) -> Iterator[pl.DataFrame]:
        yield from normalize.read_batches(uri, fmt, min(batch_rows, max_rows), counters, batch_bytes)

    read.__name__ = f"read_at_most_{max_rows}_rows"
    return read


def whole_file(uri: str, fmt: str, batch_rows: int, counters: dict[str, int], batch_bytes: int = formats.BATCH_BYTES) -> Iterator[pl.DataFrame]:
    """One batch holding the whole file (for recipes that group rows across a file)."""
    frames = [f for f in normalize.read_batches(uri, fmt, batch_rows, counters, batch_bytes) if f.height]
    if frames:
        yield pl.concat(frames, how="diagonal_relaxed")


# --------------------------------------------------------------------------- values


def string_column(frame: pl.DataFrame, name: str) -> pl.Series:
    """A column as strings: scalars are cast, nested or absent columns read as null."""
    if name not in frame.columns:
        return pl.Series(name, [None] * frame.height, dtype=pl.Utf8)
    column = frame[name]
    if column.dtype == pl.Utf8:
        return column
    if column.dtype.is_numeric() or column.dtype in (pl.Boolean, pl.Binary, pl.Null, pl.Date, pl.Datetime):
        return column.cast(pl.Utf8, strict=False)
    return pl.Series(name, [None] * frame.height, dtype=pl.Utf8)


def text_or_none(value: Any) -> str | None:
    """A string value, or None for anything else (missing fields, wrong types)."""
    return value if isinstance(value, str) else None


def nonblank(value: Any) -> str | None:
    """A string with non-whitespace content, stripped; None otherwise."""
    return value.strip() if isinstance(value, str) and value.strip() else None


def first_id(row: Mapping[str, Any], names: Sequence[str]) -> str | None:
    """The first present, non-null id among ``names``, as a string."""
    for name in names:
        value = row.get(name)
        if value is not None and value != "":
            return str(value)
    return None


def as_list(value: Any, missing: str, malformed: str) -> list[Any]:
    """A list value; JSON-encoded lists (as some providers and mixed-type batches give) decode.

    Raises ``Skip(missing)`` for absent/empty values and ``Skip(malformed)`` for anything else.
    """
    if value is None:
        raise Skip(missing)
    if isinstance(value, str):
        stripped = value.strip()
        if not stripped:
            raise Skip(missing)
        if not stripped.startswith("["):
            raise Skip(malformed)
        try:
            value = json.loads(stripped)
        except json.JSONDecodeError:
            raise Skip(malformed) from None
    if isinstance(value, tuple):
        value = list(value)
    if not isinstance(value, list):
        raise Skip(malformed)
    if not value:
        raise Skip(missing)
    return value


THINK_TAG = re.compile(r"</?think>", re.IGNORECASE)


def strip_think_tags(text: str) -> str:
    """Remove ``<think>``/``</think>`` markers, keeping the reasoning they enclosed."""
    return THINK_TAG.sub("", text).strip()


# --------------------------------------------------------------------------- chat blocks


def role_block(role: str, body: str) -> str:
    return f"<{role}>\n{body}\n</{role}>"


def content_text(content: Any) -> str:
    """The text of a message's content (string, list of text parts, or null)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "\n".join(parts)
    if isinstance(content, Mapping) and isinstance(content.get("text"), str):
        return content["text"]
    raise TypeError(f"message content of type {type(content).__name__}")


def tool_call_block(call: Any) -> str:
    if isinstance(call, str):
        call = json.loads(call)
    function = call.get("function") if isinstance(call.get("function"), Mapping) else call
    name = function.get("name")
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    payload = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{payload}\n</tool_call>"


def message_role(message: Any) -> str:
    if not isinstance(message, Mapping):
        raise Skip("malformed_message")
    role = message.get("role", message.get("from"))
    if not isinstance(role, str) or not role.strip():
        raise Skip("malformed_message")
    role = role.strip().lower()
    return ROLE_ALIASES.get(role, role)


def message_block(message: Mapping[str, Any], *, content: str | None = None) -> str | None:
    """One message as a role block, or None when it has nothing to show."""
    role = message_role(message)
    text = content if content is not None else content_text(message.get("content", message.get("value")))
    parts = []
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning.strip():
        parts.append(role_block("think", reasoning.strip()))
    if text.strip():
        parts.append(text.strip())
    calls = message.get("tool_calls")
    if isinstance(calls, str) and calls.strip().startswith("["):
        calls = json.loads(calls)
    if isinstance(calls, list):
        parts.extend(tool_call_block(call) for call in calls if call)
    if not parts:
        return None
    return role_block(role, "\n\n".join(parts))


def render_messages(messages: Sequence[Any]) -> str:
    """Role blocks of the messages that have content; ``Skip("empty_conversation")`` if none."""
    blocks = [block for message in messages if (block := message_block(message)) is not None]
    if not blocks:
        raise Skip("empty_conversation")
    return "\n\n".join(blocks)


def outcome_line(outcome: str | None) -> str | None:
    return f"Outcome: {outcome}" if outcome else None


def with_outcome(outcome: str | None, body: str) -> str:
    line = outcome_line(outcome)
    return f"{line}\n\n{body}" if line else body
