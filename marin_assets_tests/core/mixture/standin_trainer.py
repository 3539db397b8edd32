"""A stand-in trainer and cluster for the tests of followed runs (no model: a metric from the config).

``train_run`` follows the ``mixture.jobs`` interface. A config may carry ``fail_attempts``: the
first that many attempts of the run fail (counted in a file beside the results, so attempts in
other processes count too). As a script it is a tiny cluster for the launcher's templates:

* ``submit CONFIG RUN_ID RESULTS``: records the run as running, starts ``train`` detached, returns;
* ``status RUN_ID RESULTS``: prints the run's JSON state;
* ``train CONFIG RUN_ID RESULTS``: trains, writes ``RESULTS/<run_id>.jsonl`` and the final state.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def _attempt(results_dir: str, run_id: str) -> int:
    counter = Path(results_dir) / f".attempts-{run_id}"
    n = int(counter.read_text()) + 1 if counter.exists() else 1
    counter.write_text(str(n))
    return n


def train_run(config: dict, results_dir: str, size: str = "", seed: int = 0) -> dict[str, float]:
    attempt = _attempt(results_dir, config["run_id"])
    if attempt <= int(config.get("fail_attempts", 0)):
        raise RuntimeError(f"worker lost its device on attempt {attempt}")
    return {"macro_bpb": 2.0 + 0.01 * seed + (0.5 if size == "big" else 0.0), "bpb/web": 2.1}


def _state(results: str, run_id: str) -> Path:
    return Path(results) / f".state-{run_id}.json"


def main(argv: list[str]) -> None:
    command, rest = argv[0], argv[1:]
    if command == "submit":
        config, run_id, results = rest
        _state(results, run_id).write_text(json.dumps({"state": "running"}))
        subprocess.Popen([sys.executable, __file__, "train", config, run_id, results], start_new_session=True,  # noqa: S603
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy())
        print(f"submitted {run_id}")
    elif command == "status":
        run_id, results = rest
        print(_state(results, run_id).read_text())
    elif command == "train":
        config_path, run_id, results = rest
        config = json.loads(Path(config_path).read_text())
        try:
            metrics = train_run(config, results, seed=int(config.get("seed", 0)))
        except RuntimeError as exc:
            _state(results, run_id).write_text(json.dumps({"state": "failed", "detail": str(exc)}))
            return
        rows = [{"run_id": run_id, "mixture_id": config["mixture_id"], "step": 1, "tokens": 1.0, "metric": m, "value": v} for m, v in metrics.items()]
        (Path(results) / f"{run_id}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        _state(results, run_id).write_text(json.dumps({"state": "succeeded"}))


if __name__ == "__main__":
    main(sys.argv[1:])


def c00_run(config: dict, results_dir: str, size: str = "", seed: int = 0) -> dict[str, float]:
    """A target that falls with the share of the ``c00`` groups at the proxy's size, and rises
    with it at size ``big``: a finding that does not transfer to the larger model. The seed
    moves it by +-0.002."""
    share = sum(ph["share"] * w for ph in config["phases"] for g, w in ph["weights"].items() if g.startswith("c00"))
    return {"macro_bpb": 3.0 + (share if size == "big" else -share) + 0.002 * (seed % 3 - 1)}


def flaky_c00_run(config: dict, results_dir: str, size: str = "", seed: int = 0) -> dict[str, float]:
    """``c00_run`` whose first attempt of every run fails (as a lost worker would)."""
    if _attempt(results_dir, config["run_id"]) == 1:
        raise RuntimeError(f"worker lost on the first attempt of {config['run_id']}")
    return c00_run(config, results_dir, size, seed)
