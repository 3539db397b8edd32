"""Task inputs named by a manifest in storage, not listed in every task's spec.

A step whose tasks read many files (up to the fan-in bound, 1,024) would otherwise send each
task every file's name (~100 bytes each: ~100 KiB per spec; before the bound, 25,000 names,
2.9-4.2 MiB). :func:`name_inputs` writes one manifest per step: the input names its tasks
share (and those of a task that alone reads many), one per line, named by a hash of its
contents (a rerun writes the same file). A task's run of such inputs becomes one reference,
``manifest:<uri>#<count>:<start>-<end>,...``: how many names, and the byte ranges of its runs of
lines; its own few inputs stay listed. The task (:func:`expand`, called by
:func:`.shuffle.measured` before the task's own code) reads only those ranges, in one ranged
request per run, concurrently.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from marin_assets.core.runtime import storage
from marin_assets.core.runtime.runner import ShardTask

PREFIX = "manifest:"
MIN_INPUTS = 8  # a task with fewer inputs keeps them in its spec (a manifest would cost a request)
OWN_LISTED = 64  # a task's inputs no other task of its step reads stay listed, up to this many


def _runs(indices: Sequence[int]) -> list[tuple[int, int]]:
    """Consecutive runs ``[start, stop)`` of ``indices``, in order."""
    runs: list[tuple[int, int]] = []
    for i in indices:
        if runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return runs


NONE, SHARED, ALL = 0, 1, 2  # which of a task's inputs go by the manifest


def _named(tasks: Sequence[ShardTask]) -> tuple[dict[str, int], list[int]]:
    """How many tasks read each input, and per task which of its inputs go by the manifest:
    ``SHARED``, those other tasks of the step read too, ``ALL`` where it reads more than
    ``OWN_LISTED`` that no other task reads, ``NONE`` below ``MIN_INPUTS``. A rule per task,
    not a set of its names (23,000 members tasks x 400 label files: ~0.5 GB of sets)."""
    readers: dict[str, int] = {}
    for task in tasks:
        for uri in set(task.inputs):
            readers[uri] = readers.get(uri, 0) + 1
    modes = []
    for task in tasks:
        if len(task.inputs) < MIN_INPUTS:
            modes.append(NONE)
            continue
        own = sum(1 for uri in task.inputs if readers[uri] == 1)
        modes.append(ALL if own > OWN_LISTED else SHARED)
    return readers, modes


def name_inputs(tasks: Sequence[ShardTask], folder: str) -> list[ShardTask]:
    """``tasks`` with their inputs that go by manifest (:func:`_named`) replaced, each run of
    them in place, by a reference into the step's one manifest under ``folder`` (written here;
    none when no input goes by it). A task's own few inputs (a map or gather task's shards)
    stay listed, so the manifest holds what tasks share plus the inputs of the widest ones."""
    readers, modes = _named(tasks)

    def goes(uri: str, mode: int) -> bool:
        return not uri.startswith(PREFIX) and (mode == ALL or (mode == SHARED and readers[uri] > 1))

    line: dict[str, int] = {}
    for task, mode in zip(tasks, modes):
        for uri in task.inputs if mode else ():
            if goes(uri, mode):
                line.setdefault(uri, len(line))
    if not line:
        return list(tasks)
    offsets = [0]
    for name in line:
        offsets.append(offsets[-1] + len(name.encode()) + 1)
    body = "".join(name + "\n" for name in line).encode()
    uri = storage.join(folder, hashlib.sha256(body).hexdigest()[:20] + ".txt")
    if not storage.exists(uri):
        storage.write_bytes(uri, body)

    def reference(run: Sequence[str]) -> str:
        spans = ",".join(f"{offsets[a]}-{offsets[b]}" for a, b in _runs([line[u] for u in run]))
        return f"{PREFIX}{uri}#{len(run)}:{spans}"

    def inputs(task: ShardTask, mode: int) -> tuple[str, ...]:
        out: list[str] = []
        pending: list[str] = []
        for item in task.inputs:
            if goes(item, mode):
                pending.append(item)
                continue
            if pending:
                out.append(reference(pending))
                pending = []
            out.append(item)
        return (*out, reference(pending)) if pending else tuple(out)

    named = lambda t, mode: mode and any(goes(u, mode) for u in t.inputs)
    return [ShardTask(t.fn, inputs(t, mode), t.output, t.params, t.resources) if named(t, mode) else t for t, mode in zip(tasks, modes)]


def reference_to(names: Sequence[str], folder: str) -> str:
    """One reference to all of ``names``, in a manifest of their own under ``folder`` (written
    here): what every task of a step reads, given to each as one input, so the driver does not
    hold the names once per task (46,000 members tasks x 750 label files: ~0.3 GB of tuples)."""
    body = "".join(name + "\n" for name in names).encode()
    uri = storage.join(folder, hashlib.sha256(body).hexdigest()[:20] + ".txt")
    if not storage.exists(uri):
        storage.write_bytes(uri, body)
    return f"{PREFIX}{uri}#{len(names)}:0-{len(body)}"


def _parts(reference: str) -> tuple[str, int, list[tuple[int, int]]]:
    """A reference's manifest, its count of names and its byte ranges."""
    uri, _, tail = reference[len(PREFIX) :].rpartition("#")
    names, _, spans = tail.partition(":")
    return uri, int(names), [(int(a), int(b)) for a, b in (s.split("-") for s in spans.split(","))]


def _read(reference: str) -> list[str]:
    uri, _, spans = _parts(reference)
    fs, path = storage.filesystem(uri)
    parts = fs.cat_ranges([path] * len(spans), [a for a, _ in spans], [b for _, b in spans])
    return [name for part in parts for name in part.decode().split("\n") if name]


def expand(inputs: Sequence[str]) -> list[str]:
    """A task's input names, in order: each manifest reference read (only its byte ranges)."""
    if not any(item.startswith(PREFIX) for item in inputs):
        return list(inputs)
    return [name for item in inputs for name in (_read(item) if item.startswith(PREFIX) else [item])]


def count(inputs: Sequence[str]) -> int:
    """How many input names ``inputs`` stand for, without reading a manifest."""
    return sum(_parts(item)[1] if item.startswith(PREFIX) else 1 for item in inputs)
