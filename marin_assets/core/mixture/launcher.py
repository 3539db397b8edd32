"""Submitting proxy and validation runs to a training cluster: a command template per config.

A study's ``launcher`` is a command line with placeholders, e.g.
``sbatch --job-name={study}-{run_id} train_proxy.sh {config} {results}``; ``{config}`` is the
run's JSON trainer config, ``{run_id}``, ``{study}`` and ``{results}`` (the folder the trainer
writes its results to) are filled in too. The template is split like a shell line first and
each word filled in after, so a value never becomes more than one argument and no shell runs.
The command is expected to submit and return; its exit status and the tail of its output are
the run's launch state, kept in the run's metadata. Results arrive as for any external trainer.
"""

from __future__ import annotations

import shlex
import string
import subprocess
import time
from typing import Any

from marin_assets.errors import ConfigurationError

PLACEHOLDERS = ("config", "run_id", "study", "results")
OUTPUT_TAIL = 2_000


class LauncherError(ConfigurationError, ValueError):
    """A launcher template that cannot be used; the message names the fix."""


def check_template(template: str) -> list[str]:
    """The template's words; unknown placeholders or bad quoting are errors."""
    try:
        words = shlex.split(template)
    except ValueError as exc:
        raise LauncherError(f"launcher {template!r} is not a valid command line ({exc})") from exc
    if not words:
        raise LauncherError("launcher is empty; give a command line, or leave it out")
    for word in words:
        try:
            names = {name for _, name, _, _ in string.Formatter().parse(word) if name is not None}
        except ValueError as exc:
            raise LauncherError(f"launcher word {word!r}: {exc}; write literal braces as {{{{ and }}}}") from exc
        unknown = sorted(names - set(PLACEHOLDERS))
        if unknown:
            raise LauncherError(f"launcher names {unknown}; the placeholders are {list(PLACEHOLDERS)}")
    return words


def launch(template: str, *, config: str, run_id: str, study: str, results: str, timeout_s: float = 600.0) -> dict[str, Any]:
    """Run the filled-in command once; its launch state (``submitted`` or ``failed``)."""
    values = {"config": config, "run_id": run_id, "study": study, "results": results}
    command = [word.format(**values) for word in check_template(template)]
    started = time.time()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)  # noqa: S603 -- no shell, one argument per word
        code, output = done.returncode, (done.stdout or "") + (done.stderr or "")
    except (OSError, subprocess.TimeoutExpired) as exc:
        code, output = -1, str(exc)
    return {"state": "submitted" if code == 0 else "failed", "command": command, "returncode": code, "output": output[-OUTPUT_TAIL:], "launched_at": started}
