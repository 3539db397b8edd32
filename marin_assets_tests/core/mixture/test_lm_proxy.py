"""The language-model proxy: deterministic per seed, resumable from its checkpoints, its data
plan following the mixture, and its settings checked with errors naming the field.

The tests that train use a one-layer model of 16 dimensions on a generated two-group pool."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import signal
import subprocess
import sys
import textwrap

import polars as pl
import pytest

from marin_assets.core.mixture import jobs
from marin_assets.core.mixture import lm_proxy as lp
from marin_assets.core.mixture import proxy_trainer as pt
from marin_assets.core.mixture import results as results_core
from marin_assets.core.mixture import swarm as ms
from marin_assets.core.mixture.lm_params import LMProxyParams, ModelSize, lm_params_to_mapping

CODE = "def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(add(i, i))\n"
PROSE = "The river runs quietly past the old mill, where the miller keeps his grain and his stories.\n"
TINY = LMProxyParams(size="tiny", ladder=(ModelSize("tiny", 1, 16, 2), ModelSize("wide", 1, 32, 2)), context=16, batch_size=4, checkpoint_every=5,
                     eval_bytes_per_domain=256, device="cpu")
PROXY = ms.ProxyTrainerParams(holdout_mod=4)


def _pool(tmp_path) -> dict[str, list[str]]:
    files = {}
    for group, source, text in (("c00q0", "code", CODE), ("c01q0", "prose", PROSE)):
        ids = [f"{i * 7919 % 4096:08x}" + "0" * 24 for i in range(40)]
        frame = pl.DataFrame({"id": ids, "text": [f"{i} {text * 3}" for i in range(40)], "source": [source] * 40, "tokens": [len(text) * 3] * 40})
        path = tmp_path / f"{group}.parquet"
        frame.write_parquet(path)
        files[group] = [str(path)]
    return files


def _config(files, seed: int = 0, budget: float = 16 * 4 * 12) -> dict:
    return {
        "run_id": "r0001", "mixture_id": "m1", "seed": seed, "experiment_budget": budget,
        "phases": [{"share": 1.0, "weights": {"c00q0": 0.75, "c01q0": 0.25}}],
        "components": {g: {"pool_files": f, "proxy_tokens": 600} for g, f in files.items()},
    }


@pytest.mark.system  # trains language models (importing transformers alone takes seconds)
def test_a_run_is_deterministic_per_seed(tmp_path) -> None:
    files = _pool(tmp_path)
    evals = pt.evaluation_texts(files, PROXY)
    first = lp.train_lm_proxy(_config(files), evals, PROXY, TINY, str(tmp_path / "a"))
    again = lp.train_lm_proxy(_config(files), evals, PROXY, TINY, str(tmp_path / "b"))
    other = lp.train_lm_proxy(_config(files, seed=1), evals, PROXY, TINY, str(tmp_path / "c"))
    assert first["weights_sha256"] == again["weights_sha256"] and first["metrics"] == again["metrics"]
    assert other["weights_sha256"] != first["weights_sha256"] and other["metrics"] != first["metrics"]
    assert set(first["metrics"]) == {"bpb/code", "bpb/prose", "macro_bpb"} and 0 < first["metrics"]["macro_bpb"] < 9
    assert first["steps"] == 12 and first["tokens"] == 12 * 4 * 16 and first["rows"][0]["step"] == 12
    wide = lp.train_lm_proxy({**_config(files), "size": "wide"}, evals, PROXY, TINY, str(tmp_path / "d"))  # a validation rung
    assert wide["model_size"] == "wide" and wide["parameters"] > first["parameters"]


@pytest.mark.system  # trains language models (importing transformers alone takes seconds)
def test_each_seed_starts_from_its_own_weights_unless_the_study_shares_one(tmp_path) -> None:
    files = _pool(tmp_path)
    evals = pt.evaluation_texts(files, PROXY)
    still = dataclasses.replace(TINY, learning_rate=1e-9)  # the weights stay where they started: the score is the start's

    def start(lm: LMProxyParams, seed: int) -> float:
        return lp.train_lm_proxy(_config(files, seed=seed), evals, PROXY, lm, str(tmp_path / f"{lm.init_seed}-{seed}"))["metrics"]["macro_bpb"]

    assert abs(start(still, 0) - start(still, 1)) > 1e-4  # by default each seed its own start
    shared = dataclasses.replace(still, init_seed=5)
    assert abs(start(shared, 0) - start(shared, 1)) < 1e-6  # one start, different data


@pytest.mark.system  # trains language models (importing transformers alone takes seconds)
def test_a_stopped_run_resumes_from_its_checkpoint(tmp_path) -> None:
    import torch

    files = _pool(tmp_path)
    evals = pt.evaluation_texts(files, PROXY)
    whole = lp.train_lm_proxy(_config(files), evals, PROXY, TINY, str(tmp_path / "whole"))

    def stop(step: int, steps: int) -> None:
        if step == 7:  # two steps past the checkpoint at step 5
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        lp.train_lm_proxy(_config(files), evals, PROXY, TINY, str(tmp_path / "cut"), progress=stop)
    saved = torch.load(io.BytesIO((tmp_path / "cut" / lp.CHECKPOINT).read_bytes()), weights_only=False)
    assert saved["step"] == 5 and saved["sequences_done"] == 20 and {"model", "optimizer", "scheduler", "torch_rng"} <= set(saved)
    resumed = lp.train_lm_proxy(_config(files), evals, PROXY, TINY, str(tmp_path / "cut"))
    assert resumed["resumed_from_step"] == 5
    assert resumed["weights_sha256"] == whole["weights_sha256"] and resumed["metrics"] == whole["metrics"]
    other = lp.train_lm_proxy(_config(files, seed=3), evals, PROXY, TINY, str(tmp_path / "cut"))  # another run's checkpoint is not reused
    assert other["resumed_from_step"] == 0


def test_the_plan_follows_weights_phases_and_repeats() -> None:
    config = {"seed": 0, "phases": [{"share": 0.5, "weights": {"a": 1.0}}, {"share": 0.5, "weights": {"a": 0.25, "b": 0.75}}]}
    names, groups, windows = lp.training_plan(config, {"a": 3, "b": 100}, steps=8, batch=4)
    plan = [(names[g], int(w)) for g, w in zip(groups, windows)]
    first, second = plan[:16], plan[16:]
    assert {g for g, _ in first} == {"a"} and [g for g, _ in second].count("a") == 4
    a_windows = [w for g, w in plan if g == "a"]  # 20 sequences of a 3-window group: epochs see every window once
    assert sorted(a_windows.count(w) for w in range(3)) == [6, 7, 7]
    assert len({w for g, w in second if g == "b"}) == 12  # 12 of b's 100 windows, none repeated
    again = lp.training_plan(config, {"a": 3, "b": 100}, 8, 4)
    assert (again[1] == groups).all() and (again[2] == windows).all()
    assert (lp.training_plan({**config, "seed": 1}, {"a": 3, "b": 100}, 8, 4)[2] != windows).any()


def test_windows_of_short_text_fill_one_window() -> None:
    assert lp.windows_of(b"abc", 8).tobytes() == b"abcabcab"
    assert lp.windows_of(b"x" * 20, 8).shape == (2, 8)


def test_device_follows_availability() -> None:
    assert lp.choose_device("auto", cuda_available=True) == "cuda"
    assert lp.choose_device("auto", cuda_available=False) == "cpu"
    assert lp.choose_device("cpu", cuda_available=True) == "cpu"
    with pytest.raises(ValueError, match="lm.device"):
        lp.choose_device("cuda", cuda_available=False)


@pytest.mark.system  # trains language models (importing transformers alone takes seconds)
def test_the_default_trainer_is_the_language_model_through_the_job_interface(tmp_path) -> None:
    files = _pool(tmp_path)
    pt.write_evaluation_texts(pt.evaluation_texts(files, PROXY), str(tmp_path / "swarm"))
    assert ms.StudyParams(name="s").train_run == ms.LM_TRAINER != ms.NGRAM_TRAINER
    trainer = jobs.load_trainer(ms.LM_TRAINER)
    config = {**_config(files), "proxy": dataclasses.asdict(PROXY), "lm": lm_params_to_mapping(TINY), "evaluation_dir": str(tmp_path / "swarm")}
    results = tmp_path / "results"
    metrics = trainer(config, str(results), size="wide", seed=1)
    assert (results / "_checkpoints" / "r0001-wide-s1" / lp.CHECKPOINT).exists()
    assert results_core.results_files(str(results)) == []  # checkpoints are not results
    assert metrics == trainer(config, str(tmp_path / "again"), size="wide", seed=1) != trainer(config, str(results), size="tiny", seed=1)


@pytest.mark.parametrize(
    ("lm", "message"),
    [
        ({"size": "v9"}, "lm.size 'v9' is not on lm.ladder"),
        ({"layers": 2}, "unknown lm keys ['layers']"),
        ({"ladder": [{"name": "proxy", "n_layer": 1, "n_embd": 10, "n_head": 3}]}, "n_embd divisible by n_head"),
        ({"ladder": [{"name": "proxy", "n_layer": 1}]}, "lm.ladder entry"),
        ({"learning_rate": "fast"}, "lm.learning_rate 'fast' must be a number"),
        ({"device": "tpu"}, "lm.device 'tpu'"),
        ({"init_seed": -2}, "lm.init_seed must be >= 0"),
    ],
)
def test_bad_lm_settings_name_the_file_and_field(tmp_path, lm, message) -> None:
    import yaml

    folder = tmp_path / "mixture" / "s"
    folder.mkdir(parents=True)
    (folder / ms.STUDY_FILE).write_text(yaml.safe_dump({"name": "s", "lm": lm}))
    with pytest.raises(ms.StudyError) as raised:
        ms.load_study(str(tmp_path), "s")
    assert message in str(raised.value) and str(folder / ms.STUDY_FILE) in str(raised.value)


def test_lm_settings_round_trip_through_the_spec(tmp_path) -> None:
    study = ms.StudyParams(name="s", lm=dataclasses.replace(TINY, learning_rate=5e-4))
    ms.write_study(str(tmp_path), study)
    assert ms.load_study(str(tmp_path), "s") == study


CHILD = textwrap.dedent(
    """
    import json, sys
    from marin_assets.core.mixture import lm_proxy as lp
    from marin_assets.core.mixture.lm_params import lm_params_from_mapping
    from marin_assets.core.mixture.swarm import ProxyTrainerParams
    args = json.loads(sys.argv[1])
    evals = {d: t.encode() for d, t in args["evals"].items()}

    def progress(step, steps):
        if step == args["hold_at"]:  # past the first checkpoint, with unsaved steps: tell the parent, wait to be killed
            print("HOLDING", flush=True)
            sys.stdin.read()

    lp.train_lm_proxy(args["config"], evals, ProxyTrainerParams(**args["proxy"]), lm_params_from_mapping(args["lm"]), args["work"], progress=progress)
    print("FINISHED", flush=True)
    """
)


@pytest.mark.system  # a child process trains until it is killed
def test_a_killed_worker_resumes_and_ends_as_an_uninterrupted_run(tmp_path) -> None:
    import torch

    files = _pool(tmp_path)
    evals = pt.evaluation_texts(files, PROXY)
    config = _config(files, seed=2, budget=16 * 4 * 30)
    lm = dataclasses.replace(TINY, checkpoint_every=10)
    work = tmp_path / "killed"
    args = {"config": config, "evals": {d: t.decode() for d, t in evals.items()}, "proxy": dataclasses.asdict(PROXY),
            "lm": lm_params_to_mapping(lm), "work": str(work), "hold_at": 14}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH", "")]))}
    child = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(args)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "HOLDING"
        checkpoint = work / lp.CHECKPOINT
        assert checkpoint.exists() and torch.load(io.BytesIO(checkpoint.read_bytes()), weights_only=False)["step"] == 10
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=60) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
    resumed = lp.train_lm_proxy(config, evals, PROXY, lm, str(work))
    whole = lp.train_lm_proxy(config, evals, PROXY, lm, str(tmp_path / "whole"))
    assert resumed["resumed_from_step"] == 10 and whole["resumed_from_step"] == 0
    assert resumed["weights_sha256"] == whole["weights_sha256"]
    assert resumed["metrics"] == whole["metrics"] and resumed["rows"] == whole["rows"]
