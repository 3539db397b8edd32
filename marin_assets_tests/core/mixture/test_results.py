"""External proxy results: the documented schema, clear errors, counted bad rows."""

from __future__ import annotations

import json

import polars as pl
import pytest

from marin_assets.core.mixture import results as mr


def _write_jsonl(path, rows) -> None:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")


def _row(run="r0001", mix="mabc", step=100, tokens=1e6, metric="macro_bpb", value=1.5) -> dict:
    return {"run_id": run, "mixture_id": mix, "step": step, "tokens": tokens, "metric": metric, "value": value}


def test_jsonl_rows_are_validated_and_bad_rows_counted_with_their_line(tmp_path) -> None:
    f = tmp_path / "trainer.jsonl"
    _write_jsonl(
        f,
        [_row(), _row(step=200, value=1.2), "not json", _row(value=float("nan")), _row(step=-1), {"run_id": "r0001"}, _row(run=""), "", _row(metric="bpb/x", value=2.0)],
    )
    got = mr.read_results_file(str(f))
    assert got.rows.height == 3
    assert got.bad_rows == 5
    assert got.bad_examples[0] == "trainer.jsonl line 3: not a JSON object"
    assert any("line 6: missing 'mixture_id'" in e for e in got.bad_examples)
    assert any("line 5: step -1" in e for e in got.bad_examples)
    assert mr.final_metrics(got.rows) == {"macro_bpb": 1.2, "bpb/x": 2.0}


def test_parquet_results_and_missing_columns(tmp_path) -> None:
    good = tmp_path / "a.parquet"
    pl.DataFrame([_row(run="r0002"), _row(run="r0003", value=1.1)]).write_parquet(good)
    assert mr.read_results_file(str(good)).rows["run_id"].to_list() == ["r0002", "r0003"]
    bad = tmp_path / "b.parquet"
    pl.DataFrame({"run_id": ["r0001"], "metric": ["m"], "value": [1.0]}).write_parquet(bad)
    with pytest.raises(mr.ResultsError, match=r"b.parquet: missing columns \['mixture_id', 'step', 'tokens'\]"):
        mr.read_results_file(str(bad))
    (tmp_path / "c.parquet").write_bytes(b"garbage")
    with pytest.raises(mr.ResultsError, match="c.parquet: not a readable Parquet file"):
        mr.read_results_file(str(tmp_path / "c.parquet"))
    (tmp_path / "d.jsonl").write_text("[1, 2]\n")
    with pytest.raises(mr.ResultsError, match="d.jsonl: no line is a JSON object"):
        mr.read_results_file(str(tmp_path / "d.jsonl"))
    ids, errors = mr.run_ids_in(str(tmp_path))
    assert ids == {"r0001", "r0002", "r0003"} and len(errors) == 3  # b.parquet still names r0001: it is requested and fails


def test_a_malformed_file_fails_only_the_runs_it_names(tmp_path) -> None:
    _write_jsonl(tmp_path / "good.jsonl", [_row(run="r0001"), _row(run="r0002")])
    pl.DataFrame({"run_id": ["r0002", "r0003"], "value": [1.0, 2.0]}).write_parquet(tmp_path / "half.parquet")  # no mixture_id, step, ...
    (tmp_path / "garbage.parquet").write_bytes(b"not parquet")
    found = mr.read_results(str(tmp_path))
    assert found.rows["run_id"].to_list() == ["r0001", "r0002"]
    assert found.errors_for("r0001", has_rows=True) == []  # named by no broken file: fine
    assert [e.split(":")[0].rsplit("/", 1)[-1] for e in found.errors_for("r0002", has_rows=True)] == ["half.parquet"]
    # r0004 has no rows anywhere: the file that names nothing might have held it, so it is named too
    assert sorted(e.split(":")[0].rsplit("/", 1)[-1] for e in found.errors_for("r0004", has_rows=False)) == ["garbage.parquet"]
    assert any("missing columns" in e for e in found.errors_for("r0003", has_rows=False))


def test_rows_of_a_run_must_name_its_mixture(tmp_path) -> None:
    _write_jsonl(tmp_path / "x.jsonl", [_row(mix="mgood", value=1.0), _row(mix="mwrong", value=9.0), _row(run="r0002", mix="mgood")])
    everything = mr.read_results(str(tmp_path))
    mine = mr.rows_for_run(everything, "r0001", "mgood")
    assert mine.rows.height == 1 and mine.bad_rows == 1
    assert "reports mixture mwrong, the swarm says mgood" in mine.bad_examples[0]
    assert mr.file_signature(str(tmp_path / "x.jsonl")) != ""
    assert mr.results_files(str(tmp_path / "absent")) == []


def test_one_run_and_step_in_two_files_is_an_error_naming_both(tmp_path) -> None:
    _write_jsonl(tmp_path / "a.jsonl", [_row(value=2.03), _row(run="r0002", value=1.0)])
    _write_jsonl(tmp_path / "b.jsonl", [_row(value=9.99), _row(run="r0002", step=200, value=1.1)])
    found = mr.read_results(str(tmp_path))
    errors = found.errors_for("r0001", has_rows=True)
    assert len(errors) == 1 and "run r0001 step 100 (macro_bpb) is reported by a.jsonl and b.jsonl (values 2.03, 9.99)" in errors[0]
    assert found.errors_for("r0002", has_rows=True) == []  # other steps in other files: no conflict
