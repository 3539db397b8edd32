"""The shard runner on a real local Ray cluster (127.0.0.1, two worker processes).

One cluster serves the module: starting Ray costs ~10 s on a small machine.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import polars as pl
import pytest

ray = pytest.importorskip("ray")

from marin_assets.core.embed import embeddings as embed  # noqa: E402
from marin_assets.core.ingest import normalize
from marin_assets.core.runtime import integrity, storage
from marin_assets.core.runtime.runner import LOCAL, ShardFailed, ShardRunner, ShardTask, TaskResources  # noqa: E402

pytestmark = pytest.mark.system  # end to end: a real local Ray cluster with two worker processes


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray with 2 CPUs (so 2 worker processes run tasks) and one logical GPU."""
    if ray.is_initialized():
        ray.shutdown()
    context = ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False)
    previous = os.environ.get("RAY_ADDRESS")
    os.environ["RAY_ADDRESS"] = context.address_info["gcs_address"]  # child processes join this one
    try:
        yield context
    finally:
        if previous is None:
            os.environ.pop("RAY_ADDRESS", None)
        else:
            os.environ["RAY_ADDRESS"] = previous
        ray.shutdown()


def _corpus(tmp_path: Path, files: int = 4, rows: int = 60) -> list[str]:
    uris = []
    for f in range(files):
        path = tmp_path / "in" / f"part{f}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = [json.dumps({"id": f"{f}-{i}", "text": f"document {i % 45} of the corpus, words {i * 7 % 13}"}) for i in range(rows)]
        path.write_text("\n".join(lines) + "\n")
        uris.append(str(path))
    return uris


def _files(root: str, fingerprints: bool = True) -> dict[str, bytes]:
    """Every data file under ``root`` by relative path (records with timings left out).

    ``fingerprints=False`` writes fingerprint folders as ``<fp>``: two demo runs talk to two demo
    Hubs on different ports, which global inputs record, so their fingerprints may differ.
    """
    out = {}
    for path in sorted(Path(root).rglob("*")):
        if path.is_file() and path.suffix != ".json":
            name = str(path.relative_to(root))
            out[name if fingerprints else re.sub(r"(^|/)[0-9a-f]{16}(?=/)", r"\1<fp>", name)] = path.read_bytes()
    return out


def _pid_probe(inputs: list[str], output: str, params: object) -> dict:
    storage.write_bytes(output, b"x")
    return {"pid": os.getpid(), "gpus": [str(g) for g in ray.get_gpu_ids()]}


def test_tasks_run_on_two_workers_and_report_each_as_it_finishes(ray_cluster, tmp_path: Path) -> None:
    tasks = [ShardTask(_pid_probe, (), str(tmp_path / f"out{i}")) for i in range(8)]
    seen = []
    runner = ShardRunner(ray_address=LOCAL, max_in_flight=3)
    results = runner.map(tasks, on_done=lambda r: seen.append(r.output))
    assert [r.output for r in results] == [t.output for t in tasks]  # task order
    assert sorted(seen) == sorted(t.output for t in tasks)  # one report per task
    assert len({r.stats["pid"] for r in results}) >= 2  # two worker processes, not the driver
    assert os.getpid() not in {r.stats["pid"] for r in results}
    assert all(r.peak_rss_bytes > 0 for r in results)
    again = runner.map(tasks)
    assert all(r.reused for r in again)


def test_normalize_on_ray_is_byte_identical_to_in_process(ray_cluster, tmp_path: Path) -> None:
    files = _corpus(tmp_path)
    params = normalize.NormalizeParams(target_shard_bytes=2_000, scatter_buffer_bytes=3_000)
    local = normalize.normalize_source("s", files, str(tmp_path / "local"), params)
    remote = normalize.normalize_source("s", files, str(tmp_path / "ray"), params, runner=ShardRunner(ray_address=LOCAL))
    assert len(local["shards"]) > 2 and local["rows"] == remote["rows"]
    assert _files(str(tmp_path / "local")) == _files(str(tmp_path / "ray"))


_KILLS = "MARIN_TEST_KILL_DIR"


def _gather_killed_once(inputs: list[str], output: str, params: normalize.GatherParams) -> dict:
    """Kills its worker process the first time shard 1 runs (a lost node or OOM kill)."""
    flag = Path(params_dir(output)) / f"killed-{params.shard}"
    if params.shard == 1 and not flag.exists():
        flag.parent.mkdir(parents=True, exist_ok=True)
        flag.write_text("")
        os._exit(1)
    return normalize.gather_shard(inputs, output, params)


def params_dir(output: str) -> str:
    return str(Path(output).parent.parent / "kills")


def test_killed_worker_is_retried_with_identical_output(ray_cluster, tmp_path: Path, monkeypatch) -> None:
    files = _corpus(tmp_path)
    params = normalize.NormalizeParams(target_shard_bytes=2_000)
    expected = normalize.normalize_source("s", files, str(tmp_path / "local"), params)
    monkeypatch.setattr(normalize, "gather_shard", _gather_killed_once)
    got = normalize.normalize_source("s", files, str(tmp_path / "ray" / "out"), params, runner=ShardRunner(ray_address=LOCAL, retries=1))
    assert (tmp_path / "ray" / "kills" / "killed-1").exists()  # the worker really died once
    assert got["rows"] == expected["rows"]
    assert _files(str(tmp_path / "local")) == _files(str(tmp_path / "ray" / "out"))


def test_without_retries_the_rerun_resumes_from_finished_shards(ray_cluster, tmp_path: Path, monkeypatch) -> None:
    files = _corpus(tmp_path)
    params = normalize.NormalizeParams(target_shard_bytes=2_000)
    expected = normalize.normalize_source("s", files, str(tmp_path / "local"), params)
    monkeypatch.setattr(normalize, "gather_shard", _gather_killed_once)
    out = str(tmp_path / "ray" / "out")
    with pytest.raises(ShardFailed) as failed:
        normalize.normalize_source("s", files, out, params, runner=ShardRunner(ray_address=LOCAL, retries=0, max_in_flight=1))
    message = str(failed.value)
    assert "part-00001-of-" in message and "file-00000" in message and "1 attempt" in message
    resumed = normalize.normalize_source("s", files, out, params, runner=ShardRunner(ray_address=LOCAL))
    assert resumed["resumed_tasks"] >= len(files) + 1  # every scatter and shard 0 were kept
    assert _files(str(tmp_path / "local")) == _files(out)


def test_an_error_names_the_shard_its_inputs_and_the_error(ray_cluster, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"body": "no text field"}\n')
    task = ShardTask(normalize.single_shard, (str(bad),), str(tmp_path / "out" / "part-00000-of-00001.parquet"),
                     normalize.ScatterParams(normalize.NormalizeParams(), 1, "src", None))
    with pytest.raises(normalize.NormalizeError) as failed:
        ShardRunner(ray_address=LOCAL, retries=0).map([task])
    text = str(failed.value) + "\n".join(getattr(failed.value, "__notes__", []))
    assert "no text field 'text'" in text and "part-00000-of-00001.parquet" in text and str(bad) in text


def test_an_embedding_task_asks_ray_for_a_gpu_when_configured(ray_cluster, tmp_path: Path) -> None:
    on_gpu = embed.EmbedParams(encoder=embed.offline_encoder_params(device="cuda"))
    on_cpu = embed.EmbedParams(encoder=embed.offline_encoder_params())
    runner = ShardRunner(ray_address=LOCAL, task_resources=TaskResources(cpus=1))
    assert runner.resources_for(ShardTask(embed.embed_shard, (), "x", on_gpu)).gpus == 1
    got = runner.map([ShardTask(_pid_probe, (), str(tmp_path / "gpu"), on_gpu), ShardTask(_pid_probe, (), str(tmp_path / "cpu"), on_cpu)])
    assert len(got[0].stats["gpus"]) == 1 and got[1].stats["gpus"] == []


def test_a_gpu_deployment_without_a_gpu_fails_loudly(ray_cluster, tmp_path: Path) -> None:
    shard = tmp_path / "part-00000-of-00001.parquet"
    pl.DataFrame({"id": integrity.text_ids(["hello"]), "text": ["hello"]}).write_parquet(shard)
    params = embed.EmbedParams(encoder=embed.offline_encoder_params(device="cuda"))
    with pytest.raises(embed.GPUUnavailable, match="no CUDA device"):
        ShardRunner(ray_address=LOCAL, retries=0).map([ShardTask(embed.embed_shard, (str(shard),), str(tmp_path / "out.parquet"), params)])


DEMO_SUBSET = None  # every demo source: the demo study's token budget needs the whole demo pool


@pytest.mark.system
def test_demo_pipeline_on_ray_is_byte_identical_to_in_process(ray_cluster, tmp_path: Path, monkeypatch) -> None:
    from marin_assets.demo.run import run_demo

    for key in ("HF_ENDPOINT", "MARIN_EVALS", "MARIN_QUALITY_ANNOTATIONS", "MARIN_CATALOG", "MARIN_RAY_ADDRESS"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MARIN_TARGET_SHARD_BYTES", "16384")  # several shards per source: tasks run side by side
    roots = {}
    for mode in ("local", "ray"):
        root = tmp_path / mode
        for key, sub in {"DAGSTER_HOME": "home", "MARIN_PREFIX": "data", "MARIN_DEMO_HUB": "hub"}.items():
            monkeypatch.setenv(key, str(root / sub))
        if mode == "ray":
            monkeypatch.setenv("MARIN_RAY_ADDRESS", LOCAL)
        assert run_demo(DEMO_SUBSET) == 0
        roots[mode] = str(root / "data")
    # The stages' outputs (raw/ holds the provider copies, fetched in the step, not by shard tasks).
    # Dedup's reuse cache and work folders are scratch named by source fingerprints, not outputs.
    scratch = ("/_cache/", "/_work/")
    local, remote = ({p: b for p, b in _files(roots[m], fingerprints=False).items()
                      if not p.startswith("raw/") and not any(s in p for s in scratch)} for m in ("local", "ray"))
    listings = {m: sorted(Path(roots[m]).glob("global/sampling_groups/*/pool_files.parquet")) for m in roots}
    assert all(listings.values()), listings  # both runs list their pool files
    local = {p: b for p, b in local.items() if not p.endswith("pool_files.parquet")}  # paths under each root
    remote = {p: b for p, b in remote.items() if not p.endswith("pool_files.parquet")}
    # The mixture's trainer configs name pool files by their path under each root (fingerprint
    # folders included, written as <fp> like the file names).
    def portable(blob: bytes, root: str) -> bytes:
        return re.sub(rb"/[0-9a-f]{16}/", b"/<fp>/", blob.replace(root.encode(), b"<root>"))

    local = {p: portable(b, roots["local"]) for p, b in local.items()}
    remote = {p: portable(b, roots["ray"]) for p, b in remote.items()}
    assert sorted(set(local) ^ set(remote)) == []
    assert [p for p in local if local[p] != remote[p]] == []
    assert any(p.startswith("pool/") for p in local)


def _failing(inputs: list[str], output: str, params: type[BaseException]) -> dict:
    """Records each attempt beside the output; raises ``params`` on the first one only."""
    attempts = Path(output).with_suffix(".attempts")
    with open(attempts, "a") as handle:
        handle.write("x")
    if attempts.stat().st_size == 1:
        raise params("first attempt fails")
    storage.write_bytes(output, b"x")
    return {}


@pytest.mark.parametrize(("error", "attempts"), [(ValueError, 1), (normalize.NormalizeError, 1), (ConnectionError, 2), (TimeoutError, 2)])
def test_only_transient_errors_are_retried(ray_cluster, tmp_path: Path, error, attempts) -> None:
    output = tmp_path / "out.bin"
    runner = ShardRunner(ray_address=LOCAL, retries=2)
    if attempts == 1:
        with pytest.raises(error) as failed:
            runner.map([ShardTask(_failing, (), str(output), error)])
        assert "1 attempt(s)" in "\n".join(failed.value.__notes__)
    else:
        runner.map([ShardTask(_failing, (), str(output), error)])
        assert output.read_bytes() == b"x"
    assert output.with_suffix(".attempts").read_text() == "x" * attempts
