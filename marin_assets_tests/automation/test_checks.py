"""Stage checks run with their assets on real fixture sources; damaged outputs make them fail."""

from __future__ import annotations

import dagster as dg
import numpy as np
import pyarrow as pa
import pytest

from marin_assets.core.runtime import integrity, storage
from marin_assets_tests.automation.sources import LIBRE, PEPS, publish_source
from marin_assets_tests.automation.sources import run_with_checks as run


def verdicts(result: dg.ExecuteInProcessResult) -> dict[str, dg.AssetCheckEvaluation]:
    return {f"{e.asset_key.to_user_string()}:{e.check_name}": e for e in result.get_asset_check_evaluations()}


def checks_of(*assets: str) -> dg.AssetSelection:
    return dg.AssetSelection.checks_for_assets(*assets)


def output(pipeline, result, asset: str) -> str:
    return pipeline.metadata(result, asset)["uri"]


def test_normalized_and_minhash_checks_pass_then_catch_damage(pipeline, hub_store) -> None:
    publish_source(hub_store, PEPS)
    result = run(pipeline, ["raw_files", "normalized", "minhash_buckets"], PEPS, raise_on_error=True)
    found = verdicts(result)
    assert {k for k, v in found.items() if v.passed} == {"normalized:rows", "normalized:schema", "normalized:bad_rows", "minhash_buckets:co_partitioned"}
    assert found["normalized:rows"].metadata["rows"].value == 6

    shard = storage.list_shards(output(pipeline, result, "normalized"))[0]
    table = storage.read_parquet(shard)
    storage.write_parquet(table.take(list(reversed(range(table.num_rows)))), shard)  # same rows, wrong order
    minhash = storage.list_shards(output(pipeline, result, "minhash_buckets"))[0]
    storage.write_parquet(storage.read_parquet(minhash).slice(1), minhash)  # a row short
    damaged = verdicts(run(pipeline, checks_of("normalized", "minhash_buckets"), PEPS))
    assert not damaged["normalized:schema"].passed and "not sorted by id" in damaged["normalized:schema"].description
    rows = damaged["normalized:rows"]  # the rows are all there; the file is not the one published
    assert not rows.passed and f"{shard}: its size is" in rows.description and "rematerialize" in rows.description
    assert not damaged["minhash_buckets:co_partitioned"].passed and "input has 6" in damaged["minhash_buckets:co_partitioned"].description


def test_a_cut_off_shard_fails_the_checks_by_name_and_rematerializing_repairs_it(pipeline, hub_store) -> None:
    publish_source(hub_store, PEPS)
    first = run(pipeline, ["raw_files", "normalized"], PEPS, raise_on_error=True)
    shard = storage.list_shards(output(pipeline, first, "normalized"))[0]
    whole = storage.read_bytes(shard)
    storage.write_bytes(shard, whole[: len(whole) // 2])
    damaged = verdicts(run(pipeline, checks_of("normalized"), PEPS))
    for check in ("rows", "schema"):  # each fails naming the file, none crashes
        assert not damaged[f"normalized:{check}"].passed and shard in damaged[f"normalized:{check}"].description
    again = run(pipeline, ["normalized"], PEPS, raise_on_error=True)
    assert pipeline.metadata(again, "normalized")["reused"] is False and storage.read_bytes(shard) == whole
    assert all(v.passed for v in verdicts(again).values())


def record(shard: str) -> None:
    """Record ``shard``'s bytes in its output's manifest, as if its stage had written them."""
    folder = shard.rsplit("/", 1)[0]
    manifest = storage.read_manifest(folder)
    manifest["files"][storage.basename(shard)] = [storage.size(shard), integrity.file_digest(shard)]
    storage.write_manifest(folder, manifest)


def test_a_failed_blocking_check_stops_the_rest_of_the_chain(pipeline, hub_store) -> None:
    publish_source(hub_store, LIBRE)
    first = run(pipeline, ["raw_files", "normalized"], LIBRE, raise_on_error=True)
    shard = storage.list_shards(output(pipeline, first, "normalized"))[0]
    table = storage.read_parquet(shard)
    storage.write_parquet(table.select(["text", "id", "source_id"]), shard)  # written wrong by the stage itself:
    record(shard)  # its manifest records these bytes
    result = run(pipeline, ["normalized", "minhash_buckets"], LIBRE)
    assert pipeline.metadata(result, "normalized")["reused"] is True, "the stored output is reused as it is..."
    schema = verdicts(result)["normalized:schema"]
    assert not schema.passed and "columns start with ['text', 'id', 'source_id']" in schema.description
    built = {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}
    assert built == {"normalized"}, "...and the blocking check keeps minhash_buckets from running on it"


@pytest.mark.system  # end to end: embeds the demo sources with the real model
def test_embedding_checks_know_the_model_dimension_and_unit_length(pipeline, hub_store) -> None:
    publish_source(hub_store, PEPS)
    result = run(pipeline, ["raw_files", "normalized", "embeddings"], PEPS, raise_on_error=True)
    found = verdicts(result)
    assert all(found[f"embeddings:{c}"].passed for c in ("dimension", "unit_norm", "co_partitioned"))
    assert found["embeddings:dimension"].metadata["dim"].value == 384

    shard = storage.list_shards(output(pipeline, result, "embeddings"))[0]
    table = storage.read_parquet(shard)
    vectors = np.asarray(table.column("embedding").to_pylist(), dtype=np.float32)
    doubled = pa.FixedSizeListArray.from_arrays(pa.array((vectors * 2).reshape(-1).clip(-127, 127).astype(np.int8)), vectors.shape[1])
    storage.write_parquet(table.set_column(1, pa.field("embedding", doubled.type), doubled).replace_schema_metadata(table.schema.metadata), shard)
    damaged = verdicts(run(pipeline, checks_of("embeddings"), PEPS))
    assert not damaged["embeddings:unit_norm"].passed
    assert damaged["embeddings:dimension"].passed

    short = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(table.num_rows * 16, dtype=np.int8) + 8), 16)
    storage.write_parquet(table.set_column(1, pa.field("embedding", short.type), short).replace_schema_metadata(table.schema.metadata), shard)
    damaged = verdicts(run(pipeline, checks_of("embeddings"), PEPS))
    assert not damaged["embeddings:dimension"].passed and "384" in damaged["embeddings:dimension"].description


@pytest.mark.parametrize("asset", ["normalized", "embeddings"])
def test_a_check_without_an_output_says_what_to_run(pipeline, asset) -> None:
    found = verdicts(run(pipeline, checks_of(asset), PEPS))
    assert found and all(not v.passed and "materialize it first" in v.description for v in found.values())


def _recorded_output(pipeline, asset: str, manifest: dict, partition: str | None = None) -> None:
    """An output folder with ``manifest`` and a materialization that names it (no run needed)."""
    uri = storage.join(pipeline.prefix, "checks-fixture", asset, partition or "global")
    storage.write_manifest(uri, manifest)
    pipeline.instance.report_runless_asset_event(dg.AssetMaterialization(asset, partition=partition, metadata={"uri": dg.MetadataValue.path(uri)}))


@pytest.mark.parametrize(("flagged", "passed"), [(4, True), (50, False)])
def test_contamination_rate_warns_above_one_percent(pipeline, flagged, passed) -> None:
    shards = [{"documents": 500, "contaminated": flagged // 2, "flagged_by_eval": {"gpqa_diamond": flagged // 2}}] * 2
    _recorded_output(pipeline, "contamination", {"per_shard": shards}, PEPS)
    verdict = verdicts(run(pipeline, checks_of("contamination"), PEPS))["contamination:contamination_rate"]
    assert verdict.passed is passed and verdict.severity == dg.AssetCheckSeverity.WARN
    assert verdict.metadata["contaminated"].value == flagged


def test_band_sizes_flag_a_band_that_holds_most_documents(pipeline) -> None:
    from marin_assets.defs.automation import CHECKS

    even = [[20, 20, 20, 20, 20], [10, 10, 10, 10, 10]]
    skewed = [[0, 5, 85, 8, 2], [0, 5, 80, 10, 5]]  # an empty bottom band, 82% in the middle
    results = {}
    for name, per_topic in (("even", even), ("skewed", skewed)):
        _recorded_output(pipeline, "quality_bands", {"stats": {"band_summary": {"documents_per_band": per_topic}}})
        job = dg.define_asset_job("bands", selection=checks_of("quality_bands"))
        from marin_assets.definitions import defs

        assets = [a for a in defs.assets or [] if isinstance(a, dg.AssetsDefinition) and a.is_executable]
        result = dg.Definitions(assets=assets, asset_checks=CHECKS, jobs=[job], resources=defs.resources).resolve_job_def("bands").execute_in_process(instance=pipeline.instance)
        results[name] = verdicts(result)["quality_bands:band_sizes"]
    assert results["even"].passed
    assert not results["skewed"].passed and "q0: 0.0%, q2: 82.5%" in results["skewed"].description
