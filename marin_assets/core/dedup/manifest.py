"""Task inputs named by a manifest in storage, not listed in every task's spec.

A step whose tasks read many files (up to the fan-in bound, 1,024) would otherwise send each
task every file's name (~100 bytes each: ~100 KiB per spec; before the bound, 25,000 names,
2.9-4.2 MiB). :func:`name_inputs` writes one manifest per step: the distinct input names of
its tasks, one per line, named by a hash of its contents (a rerun writes the same file). Each
task's inputs become one reference, ``manifest:<uri>#<count>:<start>-<end>,...``: how many names,
and the byte ranges of its runs of lines. The task (:func:`expand`, called by :func:`.shuffle.measured` before the
task's own code) reads only those ranges, in one ranged request per run, concurrently.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from marin_assets.core.runtime import storage
from marin_assets.core.runtime.runner import ShardTask

PREFIX = "manifest:"
MIN_INPUTS = 8  # a task with fewer inputs keeps them in its spec (a manifest would cost a request)


def _runs(indices: Sequence[int]) -> list[tuple[int, int]]:
    """Consecutive runs ``[start, stop)`` of ``indices``, in order."""
    runs: list[tuple[int, int]] = []
    for i in indices:
        if runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return runs


def name_inputs(tasks: Sequence[ShardTask], folder: str) -> list[ShardTask]:
    """``tasks`` with each list of at least ``MIN_INPUTS`` inputs replaced by a reference into the
    step's manifest under ``folder`` (written here; none when no task needs one)."""
    wide = [t for t in tasks if len(t.inputs) >= MIN_INPUTS]
    if not wide:
        return list(tasks)
    line: dict[str, int] = {}
    for task in wide:
        for uri in task.inputs:
            line.setdefault(uri, len(line))
    names = list(line)
    offsets = [0]
    for name in names:
        offsets.append(offsets[-1] + len(name.encode()) + 1)
    body = "".join(name + "\n" for name in names).encode()
    uri = storage.join(folder, hashlib.sha256(body).hexdigest()[:20] + ".txt")
    if not storage.exists(uri):
        storage.write_bytes(uri, body)

    def reference(task: ShardTask) -> tuple[str, ...]:
        if len(task.inputs) < MIN_INPUTS:
            return tuple(task.inputs)
        spans = ",".join(f"{offsets[a]}-{offsets[b]}" for a, b in _runs([line[u] for u in task.inputs]))
        return (f"{PREFIX}{uri}#{len(task.inputs)}:{spans}",)

    return [ShardTask(t.fn, reference(t), t.output, t.params, t.resources) for t in tasks]


def _parts(reference: str) -> tuple[str, int, list[tuple[int, int]]]:
    """A reference's manifest, its count of names and its byte ranges."""
    uri, _, tail = reference[len(PREFIX) :].rpartition("#")
    names, _, spans = tail.partition(":")
    return uri, int(names), [(int(a), int(b)) for a, b in (s.split("-") for s in spans.split(","))]


def expand(inputs: Sequence[str]) -> list[str]:
    """A task's input names: a manifest reference read (only its byte ranges), else ``inputs``."""
    if len(inputs) != 1 or not inputs[0].startswith(PREFIX):
        return list(inputs)
    uri, _, spans = _parts(inputs[0])
    fs, path = storage.filesystem(uri)
    parts = fs.cat_ranges([path] * len(spans), [a for a, _ in spans], [b for _, b in spans])
    return [name for part in parts for name in part.decode().split("\n") if name]


def count(inputs: Sequence[str]) -> int:
    """How many input names ``inputs`` stand for, without reading the manifest."""
    if len(inputs) != 1 or not inputs[0].startswith(PREFIX):
        return len(inputs)
    return _parts(inputs[0])[1]
