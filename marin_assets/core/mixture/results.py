"""Proxy results: the schema an external trainer writes, its validation, and per-run metrics.

An external trainer writes JSON Lines (``*.jsonl``) or Parquet (``*.parquet``) files into
``<root>/mixture/<study>/results/``, any number of files, one row per (run, step, metric):

=============  ========  ====================================================
``run_id``     string    the run id of the trainer config (``r0003``)
``mixture_id`` string    the config's ``mixture_id`` (guards against mix-ups)
``step``       integer   training step, >= 0 (the last step of a run is final)
``tokens``     number    tokens trained so far, >= 0
``metric``     string    e.g. ``macro_bpb`` or ``bpb/arxiv``
``value``      number    finite
=============  ========  ====================================================

A file that cannot be read or lacks a column is an error naming the file and the fix; it fails
only the runs it names (the ``run_id`` values it still shows), and a run it may hold but does
not name fails only when no other file has results for it. A bad row (wrong type, empty id,
non-finite value, a mixture id that disagrees with the swarm) is counted and reported with its
line, never used and never fatal. Two files reporting one run at one step (the same metric)
are an error of that run naming both files: which value is true is not ours to guess.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

import polars as pl

from marin_assets.core.mixture.swarm import RESULT_COLUMNS
from marin_assets.core.runtime import storage
from marin_assets.errors import BadInput

RESULT_SCHEMA = {"run_id": pl.Utf8, "mixture_id": pl.Utf8, "step": pl.Int64, "tokens": pl.Float64, "metric": pl.Utf8, "value": pl.Float64}
RESULT_SUFFIXES = (".jsonl", ".parquet")
MAX_REPORTED_BAD_ROWS = 10


class ResultsError(BadInput, ValueError):
    """A results file cannot be used at all; the message names the file and the fix."""


@dataclasses.dataclass
class ResultRows:
    rows: pl.DataFrame  # RESULT_SCHEMA plus ``file``
    bad_rows: int
    bad_examples: list[str]
    unreadable: dict[str, tuple[str, frozenset[str] | None]] = dataclasses.field(default_factory=dict)  # file -> (error, runs it names; None: unknown)
    conflicts: dict[str, str] = dataclasses.field(default_factory=dict)  # run -> the files that report one of its steps twice

    def errors_for(self, rid: str, has_rows: bool) -> list[str]:
        """Errors of unreadable files that name the run, or that may hold it when it has no rows,
        and the run's duplicate results."""
        errors = [err for err, runs in self.unreadable.values() if (runs is not None and rid in runs) or (runs is None and not has_rows)]
        return errors + ([self.conflicts[rid]] if rid in self.conflicts else [])


def results_files(dir_uri: str) -> list[str]:
    return [u for u in storage.listdir(dir_uri) if u.endswith(RESULT_SUFFIXES) and not storage.basename(u).startswith((".", "_"))]


def file_signature(uri: str) -> str:
    """Size and modification stamp of a file: a changed signature means new results."""
    fs, path = storage.filesystem(uri)
    info = fs.info(path)
    stamp = info.get("mtime") or info.get("updated") or info.get("generation") or info.get("ETag") or ""
    return f"{info.get('size', 0)}:{stamp}"


def _check_row(raw: Mapping[str, Any]) -> tuple[tuple | None, str]:
    try:
        run, mix, metric = raw["run_id"], raw["mixture_id"], raw["metric"]
        if not all(isinstance(v, str) and v for v in (run, mix, metric)):
            return None, "run_id, mixture_id and metric must be non-empty strings"
        step_raw, tokens_raw, value_raw = raw["step"], raw["tokens"], raw["value"]
        if isinstance(step_raw, bool) or isinstance(value_raw, bool) or isinstance(tokens_raw, bool):
            return None, "step, tokens and value must be numbers"
        step = int(step_raw)
        if step != float(step_raw) or step < 0:
            return None, f"step {step_raw!r} must be a non-negative integer"
        tokens, value = float(tokens_raw), float(value_raw)
        if not math.isfinite(tokens) or tokens < 0:
            return None, f"tokens {tokens_raw!r} must be a finite number >= 0"
        if not math.isfinite(value):
            return None, f"value {value_raw!r} must be finite"
    except KeyError as exc:
        return None, f"missing {exc.args[0]!r}"
    except (TypeError, ValueError) as exc:
        return None, str(exc)
    return (run, mix, step, tokens, metric, value), ""


def read_results_file(uri: str) -> ResultRows:
    """The valid rows of one results file, with the count and first examples of bad rows."""
    name = storage.basename(uri)
    if uri.endswith(".parquet"):
        try:
            frame = pl.from_arrow(storage.read_parquet(uri))
        except Exception as exc:  # noqa: BLE001 -- any reader failure is the same user error
            raise ResultsError(f"{uri}: not a readable Parquet file ({exc}); rewrite it with the columns {list(RESULT_COLUMNS)}") from exc
        missing = [c for c in RESULT_COLUMNS if c not in frame.columns]  # type: ignore[union-attr]
        if missing:
            raise ResultsError(f"{uri}: missing columns {missing}; results need {list(RESULT_COLUMNS)} (README 'Choosing the mixture')")
        records: Iterable[tuple[int, Mapping[str, Any] | None]] = enumerate(frame.select(RESULT_COLUMNS).iter_rows(named=True), start=1)  # type: ignore[union-attr]
        where = "row"
    elif uri.endswith(".jsonl"):
        text = storage.read_bytes(uri).decode("utf-8", errors="replace")
        parsed: list[tuple[int, Mapping[str, Any] | None]] = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                value = None
            parsed.append((number, value if isinstance(value, dict) else None))
        if parsed and all(v is None for _, v in parsed):
            raise ResultsError(f"{uri}: no line is a JSON object; write one object per line with {list(RESULT_COLUMNS)}")
        records = parsed
        where = "line"
    else:
        raise ResultsError(f"{uri}: results files end in .jsonl or .parquet")
    good: list[tuple] = []
    bad = 0
    examples: list[str] = []
    for number, raw in records:
        row, why = _check_row(raw) if raw is not None else (None, "not a JSON object")
        if row is None:
            bad += 1
            if len(examples) < MAX_REPORTED_BAD_ROWS:
                examples.append(f"{name} {where} {number}: {why}")
            continue
        good.append(row)
    rows = pl.DataFrame(good, schema=RESULT_SCHEMA, orient="row").with_columns(pl.lit(name).alias("file"))
    return ResultRows(rows, bad, examples)


def runs_named(uri: str) -> frozenset[str] | None:
    """The ``run_id`` values an unusable file still shows (a column, or JSON lines), None if none can be read."""
    try:
        if uri.endswith(".parquet"):
            frame = pl.from_arrow(storage.read_parquet(uri, ["run_id"]))
            return frozenset(str(r) for r in frame["run_id"].drop_nulls().to_list())  # type: ignore[index]
        ids = set()
        for line in storage.read_bytes(uri).decode("utf-8", errors="replace").splitlines():
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict) and isinstance(value.get("run_id"), str):
                ids.add(value["run_id"])
        return frozenset(ids) or None
    except Exception:  # noqa: BLE001 -- an unreadable file names no run
        return None


def read_results(dir_uri: str) -> ResultRows:
    """Every usable results file in a study's results folder, concatenated; unusable ones are
    kept with their error and the runs they name."""
    parts: list[ResultRows] = []
    unreadable: dict[str, tuple[str, frozenset[str] | None]] = {}
    for uri in results_files(dir_uri):
        try:
            parts.append(read_results_file(uri))
        except ResultsError as exc:
            unreadable[uri] = (str(exc), runs_named(uri))
    if not parts:
        return ResultRows(pl.DataFrame(schema={**RESULT_SCHEMA, "file": pl.Utf8}), 0, [], unreadable)
    examples = [e for p in parts for e in p.bad_examples][:MAX_REPORTED_BAD_ROWS]
    rows = pl.concat([p.rows for p in parts])
    return ResultRows(rows, sum(p.bad_rows for p in parts), examples, unreadable, duplicate_results(rows))


def duplicate_results(rows: pl.DataFrame) -> dict[str, str]:
    """Per run, an error naming the files that report the same step and metric of it."""
    twice = (rows.group_by("run_id", "step", "metric").agg(pl.col("file").unique().sort(), pl.col("value"))
             .filter(pl.col("file").list.len() > 1).sort("run_id", "step", "metric"))
    out: dict[str, str] = {}
    for rid, step, metric, files, values in twice.iter_rows():
        if rid not in out:
            out[rid] = (f"run {rid} step {step} ({metric}) is reported by {' and '.join(files)} (values {', '.join(f'{v:g}' for v in values)}); "
                        "keep one file's results for the run and delete or correct the other")
    return out


def rows_for_run(results: ResultRows, rid: str, expected_mixture: str) -> ResultRows:
    """The rows of one run; rows naming another mixture id than the swarm's are bad rows."""
    mine = results.rows.filter(pl.col("run_id") == rid)
    wrong = mine.filter(pl.col("mixture_id") != expected_mixture)
    examples = [f"{f}: run {rid} reports mixture {m}, the swarm says {expected_mixture}" for f, m in wrong.select("file", "mixture_id").unique().iter_rows()]
    return ResultRows(mine.filter(pl.col("mixture_id") == expected_mixture), wrong.height, examples[:MAX_REPORTED_BAD_ROWS])


def final_metrics(rows: pl.DataFrame) -> dict[str, float]:
    """Each metric's value at the run's last reported step (later rows win ties)."""
    if rows.height == 0:
        return {}
    last = rows.with_row_index("_order").sort("step", "_order").group_by("metric", maintain_order=True).last()
    return {m: float(v) for m, v in last.select("metric", "value").iter_rows()}


def run_ids_in(dir_uri: str, files: Iterable[str] | None = None) -> tuple[set[str], list[str]]:
    """Run ids named in the given results files (all by default, unusable ones too), and the errors of unusable files."""
    ids: set[str] = set()
    errors: list[str] = []
    for uri in files if files is not None else results_files(dir_uri):
        try:
            ids |= set(read_results_file(uri).rows["run_id"].unique().to_list())
        except ResultsError as exc:
            errors.append(str(exc))
            ids |= runs_named(uri) or set()  # requested, so those runs fail with the file's error
    return ids, errors
