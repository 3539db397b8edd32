"""Submitting proxy and validation runs to a training cluster: a command template per config.

A study's ``launcher`` is a command line with placeholders, e.g.
``sbatch --job-name={study}-{run_id} train_proxy.sh {config} {results}``; ``{config}`` is the
run's JSON trainer config, ``{run_id}``, ``{study}`` and ``{results}`` (the folder the trainer
writes its results to) are filled in too. The template is split like a shell line first and
each word filled in after, so a value never becomes more than one argument and no shell runs.
The command is expected to submit and return; its exit status and the tail of its output are
the run's launch state, kept in the run's metadata. Results arrive as for any external trainer.

A ``status`` template (the same placeholders) asks the cluster about one run and prints a JSON
object as its last line of output: ``{"state": "running" | "succeeded" | "failed", "detail":
"..."}``. With it, :func:`follow` submits every run, asks each run's state every ``poll_s``
seconds until it ends, submits a failed run again until it has had ``1 + retries`` attempts,
and names every run that failed for good with the cause of each attempt.
"""

from __future__ import annotations

import json
import shlex
import string
import subprocess
import time
from collections.abc import Callable, Mapping
from typing import Any

from marin_assets.core.mixture.jobs import Event, FollowReport
from marin_assets.errors import ConfigurationError

PLACEHOLDERS = ("config", "run_id", "study", "results")
OUTPUT_TAIL = 2_000
STATES = ("running", "succeeded", "failed")


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


def _run(template: str, values: Mapping[str, str], timeout_s: float) -> tuple[list[str], int, str, str]:
    """(command, exit status, stdout, stdout and stderr's tail) of the filled-in template."""
    command = [word.format(**values) for word in check_template(template)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)  # noqa: S603 -- no shell, one argument per word
        return command, done.returncode, done.stdout or "", ((done.stdout or "") + (done.stderr or ""))[-OUTPUT_TAIL:]
    except (OSError, subprocess.TimeoutExpired) as exc:
        return command, -1, "", str(exc)


def launch(template: str, *, config: str, run_id: str, study: str, results: str, timeout_s: float = 600.0) -> dict[str, Any]:
    """Run the filled-in command once; its launch state (``submitted`` or ``failed``)."""
    started = time.time()
    command, code, _, output = _run(template, {"config": config, "run_id": run_id, "study": study, "results": results}, timeout_s)
    return {"state": "submitted" if code == 0 else "failed", "command": command, "returncode": code, "output": output, "launched_at": started}


def status(template: str, *, config: str, run_id: str, study: str, results: str, timeout_s: float = 120.0) -> dict[str, Any]:
    """Ask once for a run's state: ``running``, ``succeeded``, ``failed``, or ``unknown`` when the
    command fails or prints no JSON state (its output tail says why)."""
    command, code, stdout, output = _run(template, {"config": config, "run_id": run_id, "study": study, "results": results}, timeout_s)
    lines = [line for line in stdout.splitlines() if line.strip()]
    try:
        found = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        found = None
    if code != 0 or not isinstance(found, dict) or found.get("state") not in STATES:
        return {"state": "unknown", "detail": f"status command {command} exited {code} without a JSON state {list(STATES)}: {output[-500:]}"}
    return {"state": found["state"], "detail": str(found.get("detail", ""))[-OUTPUT_TAIL:]}


def follow(template: str, status_template: str, configs: Mapping[str, str], *, study: str, results: str, retries: int = 2, poll_s: float = 30.0,
           max_unknown: int = 10, on_event: Event | None = None, sleep: Callable[[float], None] = time.sleep) -> FollowReport:
    """Submit every run (``configs``: run id -> config path) and follow each to its end.

    A run whose submission fails, whose status says ``failed``, or whose status is ``unknown``
    ``max_unknown`` times in a row, has failed an attempt; it is submitted again while it has
    attempts left, else named in the report with the cause of each attempt."""
    emit = on_event or (lambda *_: None)
    report = FollowReport({}, {}, {})
    causes: dict[str, list[str]] = {rid: [] for rid in configs}
    unknown: dict[str, int] = {}
    active: set[str] = set()

    def values(rid: str) -> dict[str, str]:
        return {"config": configs[rid], "run_id": rid, "study": study, "results": results}

    def attempt_failed(rid: str, cause: str) -> None:
        causes[rid].append(cause)
        emit("failed", rid, report.attempts[rid], cause)
        active.discard(rid)
        if report.attempts[rid] <= retries:
            submit(rid)
        else:
            report.failed[rid] = causes[rid]
            emit("gave_up", rid, report.attempts[rid], cause)

    def submit(rid: str) -> None:
        report.attempts[rid] = report.attempts.get(rid, 0) + 1
        unknown[rid] = 0
        state = launch(template, **values(rid))
        emit("started", rid, report.attempts[rid], f"submitted: {' '.join(state['command'])}")
        if state["state"] == "submitted":
            active.add(rid)
        else:
            attempt_failed(rid, f"submission exited {state['returncode']}: {state['output'][-500:]}")

    for rid in configs:
        submit(rid)
    while active:
        sleep(poll_s)
        for rid in sorted(active):
            state = status(status_template, **values(rid))
            if state["state"] == "succeeded":
                active.discard(rid)
                report.finished[rid] = {}
                emit("finished", rid, report.attempts[rid], state["detail"])
            elif state["state"] == "failed":
                attempt_failed(rid, state["detail"] or "the status command reported failed")
            elif state["state"] == "unknown":
                unknown[rid] += 1
                if unknown[rid] >= max_unknown:
                    attempt_failed(rid, state["detail"])
    return report
