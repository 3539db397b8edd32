"""The launcher: a command template per run config, filled in word by word, its state recorded."""

from __future__ import annotations

import sys

import pytest

from marin_assets.core.mixture import launcher
from marin_assets.core.mixture import swarm as ms

SUBMIT = "import sys, pathlib; pathlib.Path(sys.argv[3]).joinpath(sys.argv[2] + '.submitted').write_text(sys.argv[1]); print('job 42')"


def test_launch_fills_each_word_and_records_the_state(tmp_path) -> None:
    template = f"{sys.executable} -c \"{SUBMIT}\" {{config}} {{run_id}} {{results}}"
    odd_run = "r0001; touch pwned"  # a value stays one argument: no shell ever runs
    state = launcher.launch(template, config="/study/configs/r0001.json", run_id=odd_run, study="s", results=str(tmp_path))
    assert state["state"] == "submitted" and state["returncode"] == 0 and "job 42" in state["output"]
    assert (tmp_path / f"{odd_run}.submitted").read_text() == "/study/configs/r0001.json"
    assert not (tmp_path / "pwned").exists()
    failed = launcher.launch(f"{sys.executable} -c \"raise SystemExit(3)\"", config="c", run_id="r", study="s", results="x")
    assert failed["state"] == "failed" and failed["returncode"] == 3


def test_bad_templates_are_refused_naming_the_fix() -> None:
    with pytest.raises(launcher.LauncherError, match=r"names \['cluster'\]; the placeholders are"):
        launcher.check_template("sbatch {cluster} {config}")
    with pytest.raises(launcher.LauncherError, match="not a valid command line"):
        launcher.check_template("sbatch 'unclosed {config}")
    with pytest.raises(ms.StudyError, match="a launcher submits runs to an external trainer"):
        ms.validate_study(ms.StudyParams(name="s", launcher="sbatch {config}"))
