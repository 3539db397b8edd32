"""Mixture studies on a real Dagster instance: the sensor picks up external results and refits;
the built-in trainer runs a study end to end with metadata and pictures.

The pool is a small real one (Parquet group files and a ``sampling_groups`` output written by
the core functions the pipeline uses), so these tests do not run the whole pipeline.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import dagster as dg
import numpy as np
import polars as pl
import pytest

from marin_assets.core.mixture import swarm as ms
from marin_assets.core.mixture.lm_params import LMProxyParams
from marin_assets.core.pool.groups import sampling_groups, write_sampling_groups
from marin_assets.core.runtime import stages, storage
from marin_assets.core.specs import MIXTURE_SWARM, SAMPLING_GROUPS
from marin_assets.defs.mixture.assets import _gain_text
from marin_assets.defs.partitions import RUNS, STUDIES, proxy_run_key
from marin_assets.defs.mixture.sensors import mixture_studies
from marin_assets.defs.resources import MarinResource

WORDS = {
    0: "kernel thread mutex lock scheduler queue process signal".split(),
    1: "river mill grain harvest valley farmer season rain".split(),
    2: "theorem lemma proof integral matrix vector prime field".split(),
}


def _write_pool(root: str) -> None:
    """Three topics x five bands of small documents, and the sampling_groups output over them."""
    rng = np.random.default_rng(0)
    files: dict[str, list[str]] = {}
    rows = []
    for topic, words in WORDS.items():
        for band in range(5):
            group = f"c{topic:02d}q{band}"
            n_docs = 6 + 3 * band
            texts = [" ".join(rng.choice(words, size=int(rng.integers(20, 60)))) for _ in range(n_docs)]
            ids = [hashlib.sha256(f"{group}-{i}".encode()).hexdigest()[:32] for i in range(n_docs)]
            frame = pl.DataFrame({"id": ids, "text": texts, "source": [f"src{topic}"] * n_docs, "tokens": [len(t.split()) for t in texts]})
            uri = storage.join(root, "pool", f"src{topic}", "fp", group, "part-0.parquet")
            storage.write_parquet(frame, uri)
            files[group] = [uri]
            rows.append((group, f"src{topic}", n_docs, int(frame["tokens"].sum())))
    counts = pl.DataFrame(rows, schema={"group": pl.Utf8, "source": pl.Utf8, "documents": pl.Int64, "tokens": pl.Int64}, orient="row")
    result = sampling_groups(counts, {t: " ".join(w[:3]) for t, w in WORDS.items()})
    layout = storage.Layout(root)
    out = SAMPLING_GROUPS.output_uri(layout, None, "testfp")
    write_sampling_groups(result, out)
    import pyarrow as pa

    storage.write_parquet(
        pa.table({"group": list(files), "source": [f.split("/pool/", 1)[1].split("/")[0] for fs in files.values() for f in fs], "file": [f for fs in files.values() for f in fs]}),
        storage.join(out, "pool_files.parquet"),
    )
    storage.write_manifest(out, {"stage": "sampling_groups", "fingerprint": "testfp", "stats": result.summary})
    storage.publish_current(SAMPLING_GROUPS.group_uri(layout), "testfp", out)


@pytest.fixture()
def env(tmp_path, monkeypatch):
    root = str(tmp_path / "data")
    monkeypatch.setenv("MARIN_PREFIX", root)
    _write_pool(root)
    from marin_assets.definitions import defs

    (tmp_path / "home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "home")) as instance:
        yield root, defs, instance


def _tick(instance, cursor):
    context = dg.build_sensor_context(instance=instance, cursor=cursor, resources={"marin": MarinResource()})
    result = mixture_studies(context)
    for request in result.dynamic_partitions_requests or []:
        instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
    return result.run_requests or [], result.cursor


def _execute(defs, instance, request) -> dict:
    job = defs.resolve_job_def(request.job_name)
    result = job.execute_in_process(partition_key=request.partition_key, instance=instance, tags=request.tags)
    assert result.success
    return {
        e.event_specific_data.materialization.asset_key.to_user_string(): {k: getattr(v, "value", v) for k, v in e.event_specific_data.materialization.metadata.items()}
        for e in result.all_events
        if e.event_type_value == "ASSET_MATERIALIZATION"
    }


def _results_rows(root: str, study: str, runs: list[str]) -> list[str]:
    """Results as an external trainer writes them: two steps per run, the last one final."""
    swarm_uri = stages.current_study_output(storage.Layout(root), MIXTURE_SWARM, study).uri
    lines = []
    for rid in runs:
        config = ms.read_config(swarm_uri, rid)
        share = sum(w for g, w in config["phases"][0]["weights"].items() if g.startswith("c00"))
        for step, value in ((50, 3.0 - share), (100, 2.0 - share)):
            lines.append(json.dumps({"run_id": rid, "mixture_id": config["mixture_id"], "step": step, "tokens": step * 1000, "metric": "macro_bpb", "value": value}))
    return lines


@pytest.mark.system  # eleven job runs and six sensor ticks end to end: `make test` runs it, `make test-fast` does not
def test_sensor_picks_up_external_results_and_refits(env) -> None:
    root, defs, instance = env
    study = ms.StudyParams(name="ext", target_budget=20_000.0, proxy_budget=2_000.0, n_runs=8, seq_len=16, trainer="external",
                           phases=(ms.TrainingPhase("main", 1.0),), search_candidates=500, search_rounds=2)
    ms.write_study(root, study)

    requests, cursor = _tick(instance, None)  # a new study: registered and proposed
    assert instance.get_dynamic_partitions(STUDIES) == ["ext"]
    assert [(r.job_name, r.partition_key) for r in requests] == [("mixture_proposal", "ext")]
    meta = _execute(defs, instance, requests[0])["mixture_swarm"]
    assert meta["runs"] == 12 and "data:image/png;base64" in meta["proposals"]  # 8 mixtures + 2 x 2 replicates
    assert instance.get_dynamic_partitions(RUNS) == [f"r{i:04d}" for i in range(12)]

    requests, cursor = _tick(instance, cursor)
    assert requests == []  # no results yet, nothing to refit

    folder = ms.results_dir(root, "ext")
    storage.write_bytes(storage.join(folder, "batch1.jsonl"), ("\n".join(_results_rows(root, "ext", [f"r{i:04d}" for i in range(6)])) + "\n{broken\n").encode())
    requests, cursor = _tick(instance, cursor)
    assert sorted(str(r.partition_key) for r in requests) == sorted(str(proxy_run_key("ext", f"r{i:04d}")) for i in range(6))
    for request in requests:
        proxy = _execute(defs, instance, request)["proxy_results"]
        assert proxy["source"] == "external" and proxy["bad_result_rows"] == 1
    requests, cursor = _tick(instance, cursor)
    assert [(r.job_name, r.partition_key) for r in requests] == [("mixture_fit", "ext")]
    first = _execute(defs, instance, requests[0])
    assert first["mixture_model"]["dagster/row_count"] == 6
    assert "data:image/png;base64" in first["mixture_model"]["predicted_vs_actual"]
    assert first["mixture_weights"]["constraints_met"] is True
    # 6 runs without replicates: the study publishes token-proportional, and the check says why
    assert first["mixture_weights"]["published"] == "token-proportional"
    check = _check(instance, "mixture_weights", "mixture_gate")
    assert not check.passed and "runs: 6 runs" in check.description and "no replicate runs" in check.description

    requests, cursor = _tick(instance, cursor)
    assert requests == []  # the model is newer than every result

    # more results arrive, a file without the schema's columns (logged, never fatal), and a
    # Parquet file missing columns that names r0005: it fails r0005 only
    storage.write_bytes(storage.join(folder, "batch2.jsonl"), ("\n".join(_results_rows(root, "ext", ["r0006", "r0007"])) + "\n").encode())
    storage.write_bytes(storage.join(folder, "notes.jsonl"), b'{"run": "r0001", "loss": 2.0}\n')
    storage.write_parquet(pl.DataFrame({"run_id": ["r0005"], "value": [1.0]}), storage.join(folder, "partial.parquet"))
    requests, cursor = _tick(instance, cursor)
    assert sorted(r.partition_key.keys_by_dimension["run"] for r in requests) == ["r0005", "r0006", "r0007"]
    for request in requests:
        run = request.partition_key.keys_by_dimension["run"]
        result = defs.resolve_job_def(request.job_name).execute_in_process(partition_key=request.partition_key, instance=instance, tags=request.tags, raise_on_error=False)
        assert result.success == (run != "r0005")
        if run == "r0005":
            assert "partial.parquet: missing columns" in result.failure_data_for_node("proxy_results").error.message
    storage.remove(storage.join(folder, "partial.parquet"))
    requests, cursor = _tick(instance, cursor)
    assert [(r.job_name, r.partition_key) for r in requests] == [("mixture_fit", "ext")]
    second = _execute(defs, instance, requests[0])
    assert second["mixture_model"]["dagster/row_count"] == 8
    assert second["mixture_model"]["fingerprint"] != first["mixture_model"]["fingerprint"]

    # validation with an external trainer: its configs first, then their results via the sensor
    waiting = _execute(defs, instance, dg.RunRequest(job_name="mixture_validate", partition_key="ext"))["mixture_validation"]
    assert waiting["verdict"].startswith("waiting: 6 validation runs have no results yet")
    configs = storage.read_current(storage.join(ms.study_dir(root, "ext"), "validation"))["uri"] + "/configs"
    lines = []
    for uri in sorted(storage.listdir(configs)):
        config = storage.read_json(uri)
        value = 2.0 + 0.01 * config["seed"] - (0.1 if "optimized" in config["run_id"] else 0.0)
        lines.append(json.dumps({"run_id": config["run_id"], "mixture_id": config["mixture_id"], "step": 1, "tokens": 1.0, "metric": "macro_bpb", "value": value}))
    storage.write_bytes(storage.join(folder, "validation.jsonl"), ("\n".join(lines) + "\n").encode())
    requests, cursor = _tick(instance, cursor)
    assert [(r.job_name, r.partition_key) for r in requests] == [("mixture_validate", "ext")]
    measured = _execute(defs, instance, requests[0])["mixture_validation"]
    assert measured["validated"] is False  # the gates refused this study: a measured gain is reported, never claimed
    assert "the optimizer's candidate measured a gain of 0.1000" in measured["verdict"]


@pytest.mark.system  # a whole study (ten job runs) end to end: `make test` runs it, `make test-fast` does not
def test_builtin_trainer_runs_a_study_with_metadata_and_pictures(env) -> None:
    root, defs, instance = env
    study = ms.StudyParams(name="builtin", target_budget=20_000.0, proxy_budget=4_000.0, n_runs=4, seq_len=16,
                           search_candidates=500, search_rounds=2, proxy=ms.ProxyTrainerParams(holdout_mod=4),
                           lm=LMProxyParams(context=16, batch_size=4))  # the language-model proxy: 62 steps of 4 x 16 bytes
    ms.write_study(root, study)
    instance.add_dynamic_partitions(STUDIES, ["builtin"])
    swarm = defs.resolve_job_def("mixture_proposal").execute_in_process(partition_key="builtin", instance=instance)
    assert swarm.success
    proxies = defs.resolve_job_def("mixture_proxies")
    for rid in study.run_ids():
        result = proxies.execute_in_process(partition_key=proxy_run_key("builtin", rid), instance=instance)
        meta = result.asset_materializations_for_node("proxy_results")[0].metadata
        assert meta["source"].value == "builtin" and 0 < meta["target_value"].value < 8
        assert "bpb/src0" in _table_text(meta["metrics"])
    assert storage.glob(f"{ms.results_dir(root, 'builtin')}/*.jsonl")  # the runs wrote their own results
    requests, _ = _tick(instance, None)
    assert [r for r in requests if r.job_name == "mixture_proxies"] == []  # which are not new external results
    fitted = defs.resolve_job_def("mixture_fit").execute_in_process(partition_key="builtin", instance=instance)
    model = fitted.asset_materializations_for_node("mixture_model")[0].metadata
    weights = fitted.asset_materializations_for_node("mixture_weights")[0].metadata
    assert model["target_components"].value == 3  # one bits-per-byte law per source domain
    assert -1 <= model["cv_spearman"].value <= 1
    assert "data:image/png;base64" in weights["weights_grid"].value
    assert "c0" in _table_text(weights["largest_changes"]) and "measured" in _table_text(weights["side_by_side"])
    assert weights["published"].value == "token-proportional"  # 8 runs over 15 groups: the gates refuse
    assert not _check(instance, "mixture_weights", "mixture_gate").passed
    validation = defs.resolve_job_def("mixture_validate").execute_in_process(partition_key="builtin", instance=instance)
    verdict = validation.asset_materializations_for_node("mixture_validation")[0].metadata
    assert verdict["validated"].value is False and verdict["verdict"].value.startswith("not validated: the gate published token-proportional")
    table = _table_text(verdict["measured_vs_predicted"])
    assert "token-proportional" in table and "optimized (candidate, not published)" in table
    assert not _check(instance, "mixture_validation", "validated").passed
    out = storage.read_current(storage.join(ms.study_dir(root, "builtin"), "weights"))["uri"]
    trainer = storage.read_json(storage.join(out, "mixture.json"))
    assert sum(trainer["phases"][0]["weights"].values()) == pytest.approx(1.0)
    assert all(c["pool_files"] for c in trainer["components"].values())
    assert storage.exists(storage.join(out, "mixture.yaml")) and storage.exists(storage.join(out, "weights.parquet"))
    # an unchanged study reuses every output
    again = defs.resolve_job_def("mixture_fit").execute_in_process(partition_key="builtin", instance=instance)
    assert again.asset_materializations_for_node("mixture_weights")[0].metadata["reused"].value is True
    # a new swarm (another seed) strands the earlier proxies: they are not fitted on
    ms.write_study(root, dataclasses.replace(study, seed=1))
    assert defs.resolve_job_def("mixture_proposal").execute_in_process(partition_key="builtin", instance=instance).success
    stale = defs.resolve_job_def("mixture_fit").execute_in_process(partition_key="builtin", instance=instance, raise_on_error=False)
    assert "0 runs have 'macro_bpb' results for the current swarm (0 have none, 8 only for an earlier swarm)" in stale.failure_data_for_node("mixture_model").error.message
    # a run outside the study fails with a clear message
    instance.add_dynamic_partitions(RUNS, ["r0019"])
    bad = proxies.execute_in_process(partition_key=proxy_run_key("builtin", "r0019"), instance=instance, raise_on_error=False)
    assert not bad.success
    assert "has 8 runs" in bad.failure_data_for_node("proxy_results").error.message


def _check(instance, asset: str, name: str):
    """The latest evaluation of an asset check."""
    records = instance.event_log_storage.get_asset_check_execution_history(dg.AssetCheckKey(dg.AssetKey(asset), name), limit=1)
    return records[0].event.dagster_event.event_specific_data


def _table_text(value) -> str:
    """A table's column names and cells as one string (tables are Dagster tables in the UI)."""
    return " ".join([c.name for c in value.schema.columns] + [str(x) for r in value.records for x in r.data.values()])


@pytest.mark.system  # three job runs: a launcher submits a run once and its state is in the run's metadata
def test_launcher_submits_each_run_once_with_its_state_in_metadata(env, tmp_path) -> None:
    import sys

    root, defs, instance = env
    log = tmp_path / "submitted.log"
    script = f"import sys; open({str(log)!r}, 'a').write(sys.argv[1] + ' ' + sys.argv[2] + '\\n'); print('queued')"
    study = ms.StudyParams(name="cluster", target_budget=20_000.0, proxy_budget=2_000.0, n_runs=4, seq_len=16, trainer="external",
                           phases=(ms.TrainingPhase("main", 1.0),), launcher=f"{sys.executable} -c \"{script}\" {{run_id}} {{config}}")
    ms.write_study(root, study)
    instance.add_dynamic_partitions(STUDIES, ["cluster"])
    assert defs.resolve_job_def("mixture_proposal").execute_in_process(partition_key="cluster", instance=instance).success
    proxies = defs.resolve_job_def("mixture_proxies")
    for _ in range(2):  # the second materialization reuses the launch: nothing is submitted twice
        meta = proxies.execute_in_process(partition_key=proxy_run_key("cluster", "r0002"), instance=instance).asset_materializations_for_node("proxy_results")[0].metadata
        assert meta["launch_state"].value == "submitted" and "queued" in meta["launch_output"].value and meta["source"].value == "launched"
    lines = log.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith("r0002 ") and lines[0].endswith("configs/r0002.json")


@pytest.mark.system  # five job runs: two runs are too few to fit, the study publishes token-proportional and says why
def test_too_few_runs_publish_token_proportional_with_a_failing_check(env) -> None:
    root, defs, instance = env
    study = ms.StudyParams(name="few", target_budget=20_000.0, proxy_budget=2_000.0, n_runs=4, seq_len=16, trainer="external",
                           phases=(ms.TrainingPhase("main", 1.0),), search_candidates=500, search_rounds=2)
    ms.write_study(root, study)
    instance.add_dynamic_partitions(STUDIES, ["few"])
    assert defs.resolve_job_def("mixture_proposal").execute_in_process(partition_key="few", instance=instance).success
    storage.write_bytes(storage.join(ms.results_dir(root, "few"), "two.jsonl"), ("\n".join(_results_rows(root, "few", ["r0000", "r0001"])) + "\n").encode())
    for rid in ("r0000", "r0001"):
        _execute(defs, instance, dg.RunRequest(job_name="mixture_proxies", partition_key=proxy_run_key("few", rid)))
    fitted = _execute(defs, instance, dg.RunRequest(job_name="mixture_fit", partition_key="few"))
    assert fitted["mixture_model"]["gate_passed"] is False and "cv_spearman" not in fitted["mixture_model"]  # nothing fitted on 2 runs
    weights = fitted["mixture_weights"]
    assert weights["published"] == "token-proportional" and weights.get("predicted_optimized") is None
    check = _check(instance, "mixture_weights", "mixture_gate")
    assert not check.passed and "runs: 2 runs for" in check.description and "train 6 more proxy runs" in check.description
    out = storage.read_current(storage.join(ms.study_dir(root, "few"), "weights"))["uri"]
    published = storage.read_json(storage.join(out, "mixture.json"))
    table = pl.from_arrow(storage.read_parquet(storage.join(out, "weights.parquet")))
    assert published["published"] == "proportional"
    assert published["phases"][0]["weights"] == pytest.approx({g: w for g, w in table.select("group", "proportional_weight").iter_rows() if w > 0}, abs=1 / study.block_size)


@pytest.mark.system  # ~30 proxy job runs, a fit and a validation at two sizes
def test_a_mixture_validation_measures_worse_leaves_consumers_on_token_proportional(env) -> None:
    root, defs, instance = env
    study = ms.StudyParams(name="transfer", target_budget=20_000.0, proxy_budget=4_000.0, n_runs=24, seq_len=16, phases=(ms.TrainingPhase("main", 1.0),),
                           search_candidates=500, search_rounds=2, validation_sizes=("small", "big"),
                           train_run="marin_assets_tests.core.mixture.standin_trainer:c00_run", proxy=ms.ProxyTrainerParams(order=2, holdout_mod=4))
    ms.write_study(root, study)
    instance.add_dynamic_partitions(STUDIES, ["transfer"])
    assert defs.resolve_job_def("mixture_proposal").execute_in_process(partition_key="transfer", instance=instance).success
    for rid in study.run_ids():
        _execute(defs, instance, dg.RunRequest(job_name="mixture_proxies", partition_key=proxy_run_key("transfer", rid)))
    assert storage.exists(storage.join(ms.results_dir(root, "transfer"), "r0000.jsonl"))  # results where the study reads them
    weights = _execute(defs, instance, dg.RunRequest(job_name="mixture_fit", partition_key="transfer"))["mixture_weights"]
    assert weights["published"] == "optimized", weights["gate"]
    consumer_uri = storage.join(ms.study_dir(root, "transfer"), "mixture.json")
    assert storage.read_json(consumer_uri)["validation"].startswith("not measured yet")
    validation = _execute(defs, instance, dg.RunRequest(job_name="mixture_validate", partition_key="transfer"))["mixture_validation"]
    assert validation["verdict"].startswith("measured worse") and "at big" in validation["verdict"] and validation["published"] == "proportional"
    per_size = _table_text(validation["measured_gain_per_size"])
    assert "small" in per_size and "big" in per_size
    check = _check(instance, "mixture_validation", "validated")
    assert not check.passed and check.severity == dg.AssetCheckSeverity.ERROR
    consumed = storage.read_json(consumer_uri)
    table = pl.from_arrow(storage.read_parquet(storage.join(storage.read_current(storage.join(ms.study_dir(root, "transfer"), "weights"))["uri"], "weights.parquet")))
    assert consumed["published"] == "proportional" and "measured the optimized mixture worse" in consumed["why"]
    assert consumed["phases"][0]["weights"] == pytest.approx({g: w for g, w in table.select("group", "proportional_weight").iter_rows() if w > 0}, abs=1 / study.block_size)


@pytest.mark.system  # starts a local Ray cluster
def test_builtin_runs_are_ray_tasks_followed_and_retried_from_the_step(env, monkeypatch) -> None:
    ray = pytest.importorskip("ray")
    root, defs, instance = env
    monkeypatch.setenv("MARIN_RAY_ADDRESS", "local")
    study = ms.StudyParams(name="onray", target_budget=20_000.0, proxy_budget=4_000.0, n_runs=2, seq_len=16, phases=(ms.TrainingPhase("main", 1.0),),
                           train_run="marin_assets_tests.core.mixture.standin_trainer:flaky_c00_run", job_retries=1, proxy=ms.ProxyTrainerParams(order=2, holdout_mod=4))
    ms.write_study(root, study)
    instance.add_dynamic_partitions(STUDIES, ["onray"])
    assert defs.resolve_job_def("mixture_proposal").execute_in_process(partition_key="onray", instance=instance).success
    try:
        result = defs.resolve_job_def("mixture_proxies").execute_in_process(partition_key=proxy_run_key("onray", "r0001"), instance=instance)
        assert ray.is_initialized()  # the run went to the Ray cluster
    finally:
        ray.shutdown()
    meta = result.asset_materializations_for_node("proxy_results")[0].metadata
    assert meta["source"].value == "builtin" and meta["target_value"].value < 3.0
    logs = " ".join(e.message for e in instance.all_logs(result.run_id) if e.message)
    assert "run r0001 attempt 1 failed: RuntimeError: worker lost on the first attempt of r0001" in logs and "run r0001 finished (attempt 2)" in logs
    assert storage.exists(storage.join(ms.results_dir(root, "onray"), "r0001.jsonl"))


@pytest.mark.system  # starts a local Ray cluster and trains 26 tiny language models (too small to learn much: the wiring, not the verdict; bench_proxy_study holds the verdicts)
def test_a_study_trains_the_language_model_proxy_as_ray_tasks_and_validates_at_the_larger_sizes(env, monkeypatch) -> None:
    ray = pytest.importorskip("ray")
    from marin_assets.core.mixture.lm_params import ModelSize
    from marin_assets.demo.mixture import run_mixture_demo

    root, defs, instance = env
    monkeypatch.setenv("MARIN_RAY_ADDRESS", "local")
    rng = np.random.default_rng(1)  # held-out text of topic 0's kind, which no study step sees as such
    evals = [json.dumps({"domain": "kernel", "text": " ".join(rng.choice(WORDS[0], size=60))}) for _ in range(12)]
    storage.write_bytes(storage.join(ms.study_dir(root, "lm"), "eval.jsonl"), ("\n".join(evals) + "\n").encode())
    ladder = (ModelSize("proxy", 1, 16, 2), ModelSize("v1", 1, 32, 2), ModelSize("v2", 2, 32, 2))
    study = ms.StudyParams(name="lm", target_budget=20_000.0, proxy_budget=4_000.0, n_runs=10, seq_len=16, phases=(ms.TrainingPhase("main", 1.0),),
                           search_candidates=500, search_rounds=2, proxy=ms.ProxyTrainerParams(holdout_mod=4, eval_set="eval.jsonl"),
                           lm=LMProxyParams(ladder=ladder, context=16, batch_size=4, device="cpu"))
    ms.write_study(root, study)
    try:
        found = run_mixture_demo(defs, instance, study)
        assert ray.is_initialized()  # the runs went to the Ray cluster
    finally:
        ray.shutdown()
    checkpoints = {storage.basename(u) for u in storage.listdir(storage.join(ms.results_dir(root, "lm"), "_checkpoints"))}
    assert {f"{rid}-proxy-s{seed}" for rid, _, seed in study.run_plan()} <= checkpoints  # the language model trained every proxy ...
    assert {f"v-{size}-{which}-s{seed}-{size}-s{seed}" for size in ("v1", "v2") for which in ("optimized", "proportional") for seed in range(3)} <= checkpoints  # ... and validated at both larger sizes
    per_size = _table_text(found["validation"]["measured_gain_per_size"])
    assert "v1" in per_size and "v2" in per_size and "at v1, v2" in found["validation"]["summary"]
    assert found["validation"]["verdict"].count("v1: ") == 1 and found["validation"]["verdict"].count("v2: ") == 1  # a gain and interval per size, read back


@pytest.mark.parametrize(("point", "says_outside"), [(0.0491, True), (0.02, False)])
def test_the_summary_says_when_the_predicted_gain_lies_outside_its_refits_interval(point: float, says_outside: bool) -> None:
    text = _gain_text({"point": point, "low": 0.0127, "high": 0.0377, "refits": 16})
    assert f"predicted gain {point:.4f}" in text and "0.0127 .. 0.0377" in text
    assert ("lies above it" in text) is says_outside
