"""The stage runner: fingerprints, reuse, manifests written last, pointers, declared inputs."""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pytest

from marin_assets.core import specs
from marin_assets.core.runtime import integrity, stages, storage
from marin_assets.core.runtime.runner import ShardRunner

SOURCE = stages.StageSpec("source_rows", folder="normalized/{source}")
DOUBLED = stages.StageSpec("doubled", (SOURCE,), data_folder="doubled_data/{source}")
TOTAL = stages.StageSpec("total", (DOUBLED,), partitioned=False)


@dataclasses.dataclass(frozen=True)
class Factor:
    factor: int = 2


def _double(inputs: list[str], output: str, params: Factor) -> dict:
    values = storage.read_parquet(inputs[0]).column("x").to_pylist()
    storage.write_parquet(pa.table({"x": [v * params.factor for v in values]}), output)
    return {"rows": len(values), "sum": sum(values) * params.factor}


def _source(layout: storage.Layout, values: list[list[int]]) -> stages.StageInput:
    def build(out: stages.Output) -> dict:
        for i, chunk in enumerate(values):
            storage.write_parquet(pa.table({"x": chunk}), storage.join(out.uri, storage.shard_name(i, len(values))))
        return {"rows": sum(map(len, values))}

    stages.run_stage(SOURCE, layout, source="s", inputs=[], decided_by={"values": values}, build=build)
    return stages.current_input(layout, SOURCE, "s")


def _run_double(layout: storage.Layout, source: stages.StageInput, calls: list[str], factor: int = 2) -> dict:
    def counting(inputs, output, params):
        calls.append(storage.basename(output))
        return _double(inputs, output, params)

    return stages.run_shards(DOUBLED, layout, source="s", inputs=[source], shard_fn=counting, params=Factor(factor), runner=ShardRunner())


def test_runner_records_output_reuses_it_and_points_at_it(tmp_path) -> None:
    layout = storage.Layout(str(tmp_path))
    source = _source(layout, [[1, 2], [3]])
    calls: list[str] = []
    first = _run_double(layout, source, calls)
    assert first["reused"] is False and sorted(calls) == ["part-00000-of-00002.parquet", "part-00001-of-00002.parquet"]
    assert first["uri"] == DOUBLED.output_uri(layout, "s", first["fingerprint"]) == storage.join(str(tmp_path), "attributes/doubled/s", first["fingerprint"])
    stored = storage.read_manifest(first["uri"])
    assert stored["stage"] == "doubled" and stored["source"] == "s" and stored["totals"] == {"rows": 3, "sum": 12}
    assert stored["inputs"] == [dataclasses.asdict(source)]  # the co-partitioned input first, as the checks read it
    assert storage.read_current(DOUBLED.group_uri(layout, "s"))["uri"] == first["uri"]

    calls.clear()
    again = _run_double(layout, source, calls)
    assert again["reused"] is True and calls == [] and again["fingerprint"] == first["fingerprint"]
    changed = _run_double(layout, source, calls, factor=3)
    assert changed["fingerprint"] != first["fingerprint"] and changed["totals"]["sum"] == 18
    assert stages.current_input(layout, DOUBLED, "s").uri == changed["uri"]  # the pointer follows the last run


def _flip_bit(path: str, bit: int) -> None:
    with open(path, "r+b") as handle:
        handle.seek(bit // 8)
        byte = handle.read(1)[0]
        handle.seek(bit // 8)
        handle.write(bytes([byte ^ (1 << (bit % 8))]))


def test_a_damaged_shard_is_rebuilt_not_reused_and_its_readers_name_it(tmp_path) -> None:
    layout = storage.Layout(str(tmp_path))
    source = _source(layout, [[1, 2], [3], [4, 5, 6]])
    first = _run_double(layout, source, [])
    recorded = storage.read_manifest(first["uri"])["files"]
    shard = storage.join(first["uri"], "part-00001-of-00003.parquet")
    assert recorded["part-00001-of-00003.parquet"] == [storage.size(shard), integrity.file_digest(shard)]
    assert "_shards/part-00001-of-00003.json" in recorded

    _flip_bit(shard, 8 * 40)  # inside the first data page: its checksum fails
    with pytest.raises(integrity.CorruptOutput, match="part-00001-of-00003.parquet.*rematerialize"):
        storage.read_parquet(shard)
    assert stages.damaged_files(stages.Output(first["uri"], first["fingerprint"]), storage.read_manifest(first["uri"])) == {
        shard: f"its digest is {integrity.file_digest(shard)}, {recorded['part-00001-of-00003.parquet'][1]} was written"
    }
    calls: list[str] = []
    again = _run_double(layout, source, calls)
    assert again["reused"] is False and calls == ["part-00001-of-00003.parquet"]  # only the damaged shard is made again
    assert storage.read_manifest(first["uri"])["files"] == recorded
    assert again["totals"] == first["totals"]

    with open(shard, "r+b") as handle:  # cut off: its size differs, the footer is gone
        handle.truncate(storage.size(shard) // 2)
    with pytest.raises(integrity.CorruptOutput, match="part-00001-of-00003.parquet"):
        storage.read_parquet(shard)
    calls.clear()
    assert _run_double(layout, source, calls)["reused"] is False and calls == ["part-00001-of-00003.parquet"]
    assert _run_double(layout, source, calls)["reused"] is True


def test_a_damaged_global_output_is_rebuilt_whole(tmp_path) -> None:
    layout = storage.Layout(str(tmp_path))
    calls: list[str] = []

    def build(out: str) -> dict:
        calls.append(out)
        storage.write_parquet(pa.table({"x": list(range(100))}), storage.join(out, "values.parquet"))
        return {"rows": 100}

    first = stages.run_global(TOTAL, layout, inputs={}, params={}, build=build)
    _flip_bit(storage.join(first["uri"], "values.parquet"), 8 * 4 + 3)
    again = stages.run_global(TOTAL, layout, inputs={}, params={}, build=build)
    assert not again["reused"] and len(calls) == 2 and again["files"] == first["files"]
    assert storage.read_parquet(storage.join(first["uri"], "values.parquet")).column("x").to_pylist() == list(range(100))


def test_a_per_shard_outputs_shards_and_counters_come_from_its_manifest_without_a_listing(tmp_path, monkeypatch) -> None:
    layout = storage.Layout(str(tmp_path))
    _run_double(layout, _source(layout, [[1, 2], [3], [4, 5, 6]]), [])
    doubled = stages.current_input(layout, DOUBLED, "s")
    listed = storage.list_shards(doubled.uri)
    monkeypatch.setattr(storage, "list_shards", lambda uri: pytest.fail(f"listed {uri}"))
    shards, per_shard = stages.shards_of(doubled)
    assert shards == listed and [s["rows"] for s in per_shard] == [2, 1, 3]


def test_a_changed_input_changes_every_fingerprint_downstream(tmp_path) -> None:
    layout = storage.Layout(str(tmp_path))
    one = _run_double(layout, _source(layout, [[1]]), [])
    two = _run_double(layout, _source(layout, [[2]]), [])
    assert one["fingerprint"] != two["fingerprint"]
    totals = [
        stages.run_global(TOTAL, layout, inputs={"s": stages.current_input(layout, DOUBLED, "s")}, params={}, build=lambda out: {"n": 1})
        for _ in range(2)
    ]
    assert [t["reused"] for t in totals] == [False, True]
    assert totals[0]["uri"] == storage.join(str(tmp_path), "global/total", totals[0]["fingerprint"])


def test_data_tree_is_placed_by_the_runner_and_found_by_readers(tmp_path) -> None:
    layout = storage.Layout(str(tmp_path))
    source = _source(layout, [[5]])
    placed: list[str] = []

    def write(inputs, output, params):
        placed.append(params)
        return {"rows": 1}

    result = stages.run_shards(
        DOUBLED, layout, source="s", inputs=[source], shard_fn=write, params=None, fingerprint_params={},
        bind_params=lambda out: out.data_uri,
    )  # fmt: skip
    assert placed == [storage.join(str(tmp_path), "doubled_data/s", result["fingerprint"])] == [result["data_uri"]]
    assert stages.current_input(layout, DOUBLED, "s").data_uri == result["data_uri"]


def test_a_stage_reads_only_its_declared_inputs(tmp_path) -> None:
    layout = storage.Layout(str(tmp_path))
    _run_double(layout, _source(layout, [[1]]), [])
    undeclared = stages.current_input(layout, DOUBLED, "s")
    with pytest.raises(stages.UndeclaredInput, match="'total' reads doubled"):
        stages.run_global(dataclasses.replace(TOTAL, inputs=()), layout, inputs={"s": undeclared}, params={}, build=lambda out: {})
    with pytest.raises(stages.MissingInput, match="materialize doubled for partition 'other' first"):
        stages.current_input(layout, DOUBLED, "other")


def test_a_copy_is_complete_only_once_the_runner_records_it(tmp_path) -> None:
    uri = str(tmp_path / "raw/copy")
    record_uri = str(tmp_path / "raw/_pins/s/recipe.json")
    calls: list[int] = []

    def fetch() -> tuple[dict, dict]:
        calls.append(1)
        storage.write_bytes(storage.join(uri, "a.txt"), b"a")
        storage.write_json(storage.join(uri, storage.PARTIAL_DIR, "a.json"), {"path": "a.txt"})
        assert not storage.is_complete(uri)  # nothing marks it complete before the runner does
        return {"files": ["a.txt"], "reused": False}, {"uri": uri, "revision": "r", "fingerprint": "f", "pin": "p"}

    first = stages.run_copy(record_uri=record_uri, fetch=fetch)
    assert first["reused"] is False and storage.read_manifest(uri) == {"files": ["a.txt"]}
    assert not storage.exists(storage.join(uri, storage.PARTIAL_DIR))
    assert storage.read_json(record_uri) == {"uri": uri, "revision": "r", "fingerprint": "f", "pin": "p"}
    again = stages.run_copy(record_uri=record_uri, fetch=fetch)
    assert again["reused"] is True and calls == [1] and again["revision"] == "r"


def test_specs_name_their_assets_and_only_declared_stages() -> None:
    names = [s.name for s in specs.ALL]
    assert len(names) == len(set(names))
    for spec in specs.ALL:
        assert all(i in specs.ALL for i in spec.inputs), spec.name
        assert spec.params is None or spec.params.__dataclass_params__.frozen, spec.name  # type: ignore[attr-defined]
    assert specs.MINHASH_BUCKETS.name == "minhash_buckets"
    assert specs.FUZZY_DUPLICATES.reads(specs.MINHASH_BUCKETS)


def test_study_stages_are_recorded_per_study_and_run_by_the_same_runner(tmp_path) -> None:
    layout = storage.Layout(str(tmp_path))
    calls: list[str] = []

    def build(out: str) -> dict:
        calls.append(out)
        storage.write_bytes(storage.join(out, "results.parquet"), b"rows")
        return {"rows": 2}

    def run(study: str, run_id: str, results: str) -> dict:
        return stages.run_study(specs.PROXY_RESULTS, layout, study=study, run=run_id, decided_by={"trainer": "external"},
                                inputs={"swarm": "aa", "results": results}, build=build)

    first = run("ext", "r0001", "d1")
    assert first["uri"] == storage.join(str(tmp_path), "mixture", "ext", "proxy_results", "r0001", first["fingerprint"])
    manifest = storage.read_manifest(first["uri"])
    assert manifest.pop("files") == {"results.parquet": [4, integrity.file_digest(storage.join(first["uri"], "results.parquet"))]}
    assert manifest == {"stage": "proxy_results", "study": "ext", "part": "r0001", "fingerprint": first["fingerprint"],
                        "code_version": specs.PROXY_RESULTS.code_version, "inputs": {"swarm": "aa", "results": "d1"}, "stats": {"rows": 2}}
    again = run("ext", "r0001", "d1")
    assert again["reused"] and not first["reused"] and len(calls) == 1
    found = stages.current_study_output(layout, specs.PROXY_RESULTS, "ext", "r0001")
    assert (found.uri, found.fingerprint) == (first["uri"], first["fingerprint"])
    # the study, the run and every input decide the fingerprint; the pointer follows the latest
    others = {run("ext", "r0002", "d1")["fingerprint"], run("other", "r0001", "d1")["fingerprint"], run("ext", "r0001", "d2")["fingerprint"]}
    assert first["fingerprint"] not in others and len(others) == 3
    assert stages.current_study_output(layout, specs.PROXY_RESULTS, "ext", "r0001").fingerprint != first["fingerprint"]
    assert stages.current_study_output(layout, specs.MIXTURE_MODEL, "ext") is None
    with pytest.raises(stages.ConfigurationError, match="not a stage of a mixture study"):
        stages.run_study(specs.POOL, layout, study="ext", decided_by={}, inputs={}, build=build)
