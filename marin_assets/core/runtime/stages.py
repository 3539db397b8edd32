"""The stage protocol: one spec per stage and the one runner that records every output.

A ``StageSpec`` names a stage (the Dagster asset of the same name), the stages it reads, its
parameters' type and its code version. The functions here are the only code that computes
output fingerprints, writes ``_manifest.json`` files and ``_current.json`` pointers (and the
pin records of raw copies): stage code computes files and returns its summary; the runner
decides where the output goes, whether a finished one can be reused, and records it.

An output folder is named by a fingerprint of the stage, what decides its output (parameters
and extras), its code version and its inputs' fingerprints; a complete folder (manifest
present, written last) is reused as is, an incomplete one is finished shard by shard.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from marin_assets.core.runtime import integrity, storage
from marin_assets.core.runtime.runner import ShardFn, ShardResult, ShardRunner, ShardTask
from marin_assets.errors import BadInput, ConfigurationError


log = logging.getLogger(__name__)


class MissingInput(BadInput, RuntimeError):
    """An upstream stage has no current output for this source."""


class UndeclaredInput(ConfigurationError, RuntimeError):
    """A stage read the output of a stage its spec does not list among its inputs."""


@dataclasses.dataclass(frozen=True)
class StepSize:
    """What one step of the stage needs beyond the default pod (1 CPU, 2 GiB) when steps run as
    pods: most per-shard work runs as Ray tasks and the step only plans and reports."""

    cpu: str
    memory: str
    gpu: int = 0
    scratch: str = ""


@dataclasses.dataclass(frozen=True)
class Bench:
    """Which bench (``bench/bench_<module>.py``) holds the stage to a goal, and how; ``row`` names
    its row in ``bench_stages`` (``BENCH_STAGES=row``) when that bench is ``stages``."""

    module: str
    how: str
    row: str = ""


@dataclasses.dataclass(frozen=True)
class StageSpec:
    """What the runner and the asset wiring need to know about a stage.

    ``folder`` is where its outputs live under the root (``{stage}``/``{source}`` are filled
    in; default: ``attributes/{stage}/{source}`` per source, ``global/{stage}`` otherwise);
    ``data_folder`` names a second tree the stage writes its data to, next to its index.
    ``study_stage`` marks a stage of a mixture study (partitioned by study, ``{source}`` is the
    study): its name inside the study folder, which its fingerprints and manifests carry too;
    ``by_run`` marks a study stage with one partition per proxy run.
    ``phase`` names the job that builds it (``specs.PHASES``), ``step`` its step's size beyond the
    default pod, ``bench`` the bench that holds it to a goal.
    ``shard_fn`` (per source): its asset is generated, each input shard mapped by it with the
    reference ``params``; ``rows_counter`` names the shards' counter of rows, ``description``
    what the UI says of it.
    """

    name: str
    inputs: tuple[StageSpec, ...] = ()
    partitioned: bool = True
    params: type | None = None
    code_version: str = "1"
    group: str = ""
    folder: str = ""
    data_folder: str = ""
    study_stage: str = ""
    by_run: bool = False
    phase: str = ""
    step: StepSize | None = None
    bench: Bench | None = None
    shard_fn: ShardFn | None = None
    rows_counter: str = "rows"
    description: str = ""

    @property
    def co_partitioned(self) -> bool:
        """Written per source under ``attributes/``: same shard basenames and row order as its input."""
        return self.partitioned and bool(self.inputs) and not (self.folder or self.data_folder or self.study_stage)

    def group_uri(self, layout: storage.Layout, source: str | None = None) -> str:
        """The folder holding every fingerprinted output of the stage (for one source) and ``_current.json``."""
        template = self.folder or ("attributes/{stage}/{source}" if self.partitioned else "global/{stage}")
        return storage.inside(layout.root, storage.join(layout.root, template.format(stage=self.name, source=source or "")))

    def output_uri(self, layout: storage.Layout, source: str | None, fingerprint: str) -> str:
        return storage.inside(layout.root, storage.join(self.group_uri(layout, source), fingerprint))

    def data_uri(self, layout: storage.Layout, source: str | None, fingerprint: str) -> str:
        """The stage's data tree for this output ('' when it writes only under its output folder)."""
        if not self.data_folder:
            return ""
        return storage.inside(layout.root, storage.join(layout.root, self.data_folder.format(stage=self.name, source=source or ""), fingerprint))

    def reads(self, stage: StageSpec) -> bool:
        return any(i.name == stage.name for i in self.inputs)


@dataclasses.dataclass(frozen=True)
class StageInput:
    """An input: the upstream output folder, its fingerprint, and the stage it came from
    (empty for inputs from outside the pipeline, e.g. the eval registry)."""

    uri: str
    fingerprint: str
    stage: str = ""
    data_uri: str = ""


def key(params: Any, extra: Any = None) -> dict[str, Any]:
    """What besides the inputs decides an output: parameters plus extras (digests, choices)."""
    return {"params": params, "extra": extra}


def fingerprint_of(spec: StageSpec, decided_by: Any, inputs: Sequence[StageInput] | Mapping[str, StageInput]) -> str:
    """The fingerprint the runner gives an output (the Dagster data version too)."""
    if isinstance(inputs, Mapping):
        upstream = [f"{name}={inp.fingerprint}" for name, inp in sorted(inputs.items())]
    else:
        upstream = [i.fingerprint for i in inputs]
    return storage.fingerprint(spec.name, decided_by, spec.code_version, upstream)


# --------------------------------------------------------------------------- reading inputs


def current_input(layout: storage.Layout, stage: StageSpec, source: str | None = None) -> StageInput:
    """The current output of ``stage`` (for ``source``), or a clear error naming what to run."""
    record = storage.read_current(stage.group_uri(layout, source if stage.partitioned else None))
    if record is None or not storage.is_complete(record["uri"]):
        where = f" for partition '{source}'" if source and stage.partitioned else ""
        raise MissingInput(f"no complete '{stage.name}' output{where} under {layout.root}; materialize {stage.name}{where} first")
    part = source if stage.partitioned else None
    data_uri = record.get("data_uri") or stage.data_uri(layout, part, record["fingerprint"])
    return StageInput(record["uri"], record["fingerprint"], stage.name, data_uri)


def external_input(kind: str, uri: str, described_by: Any) -> StageInput:
    """An input from outside the pipeline (an annotation set, a registry), fingerprinted by what describes it."""
    return StageInput(uri, storage.fingerprint(kind, described_by))


def stats_of(inp: StageInput) -> dict[str, Any]:
    """The ``stats`` a global stage recorded in its manifest (e.g. per-source digests of its decisions)."""
    return dict((storage.read_manifest(inp.uri) or {}).get("stats") or {})


def shards_of(inp: StageInput) -> tuple[list[str], list[dict[str, Any]]]:
    """A per-shard output's shards and each shard's counters, as its manifest names them: one
    read, where a listing of the folder costs a request per 1,000 shards."""
    manifest = storage.read_manifest(inp.uri) or {}
    return [storage.join(inp.uri, name) for name in manifest.get("shards", [])], list(manifest.get("per_shard", []))


def current_inputs(layout: storage.Layout, stage: StageSpec, sources: Sequence[str]) -> tuple[dict[str, StageInput], list[str]]:
    """Current outputs of ``stage`` for each source that has one, and the sources that have none."""
    found: dict[str, StageInput] = {}
    missing: list[str] = []
    for source in sources:
        try:
            found[source] = current_input(layout, stage, source)
        except MissingInput:
            missing.append(source)
    return found, missing


def _check_declared(spec: StageSpec, inputs: Sequence[StageInput]) -> None:
    declared = {i.name for i in spec.inputs}
    stray = sorted({i.stage for i in inputs if i.stage and i.stage not in declared})
    if stray:
        raise UndeclaredInput(f"stage '{spec.name}' reads {', '.join(stray)} but its spec declares only {sorted(declared)}")


def summed(stats: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Numeric counters of all shards, added up (booleans and non-numbers are skipped)."""
    totals: dict[str, float] = {}
    for shard in stats:
        for k, value in shard.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                totals[k] = totals.get(k, 0) + value
    return totals


# --------------------------------------------------------------------------- the runner


@dataclasses.dataclass(frozen=True)
class Output:
    """Where the runner puts an output: its folder, fingerprint and data tree (if any)."""

    uri: str
    fingerprint: str
    data_uri: str = ""


def run_stage(
    spec: StageSpec,
    layout: storage.Layout,
    *,
    inputs: Sequence[StageInput] | Mapping[str, StageInput],
    decided_by: Any,
    build: Callable[[Output], Mapping[str, Any]],
    source: str | None = None,
) -> dict[str, Any]:
    """Reuse the complete output for these inputs and ``decided_by``, or ``build`` it, then record it.

    ``build(output)`` writes the output's files and returns the body of its manifest (its
    summary rows); the runner adds stage, source, fingerprint, code version and inputs, writes
    the manifest last and points ``_current.json`` at it. Returns the manifest plus ``uri``,
    ``fingerprint``, ``reused`` (and ``data_uri`` for stages with a data tree).
    """
    listed = list(inputs.values()) if isinstance(inputs, Mapping) else list(inputs)
    _check_declared(spec, listed)
    part = source if spec.partitioned else None
    fp = fingerprint_of(spec, decided_by, inputs)
    out = Output(spec.output_uri(layout, part, fp), fp, spec.data_uri(layout, part, fp))
    header: dict[str, Any] = {"stage": spec.name}
    if part is not None:
        header["source"] = part
    header |= {"fingerprint": fp, "code_version": spec.code_version}
    if isinstance(inputs, Mapping):
        header["inputs"] = {k: dataclasses.asdict(v) for k, v in sorted(inputs.items())}
    else:
        header["inputs"] = [dataclasses.asdict(i) for i in inputs]
    if out.data_uri:
        header["data_uri"] = out.data_uri
    return _record(spec.group_uri(layout, part), out, header, build)


def _record(group_uri: str, out: Output, header: Mapping[str, Any], build: Callable[[Output], Mapping[str, Any]]) -> dict[str, Any]:
    """The one writer of manifests and pointers: reuse the complete ``out`` when its files are
    what was written, or ``build`` it and write its manifest (``header``, the body ``build``
    returns and each file's size and digest) last; then point the group's ``_current.json`` at it.
    One run at a time does this for one output folder (``storage.one_writer``)."""
    with storage.one_writer(out.uri):
        manifest = reusable(out)
        reused = manifest is not None
        if manifest is None:
            manifest = dict(header) | dict(build(out)) | {"fingerprint": out.fingerprint}
            manifest["files"] = integrity.file_records(out.uri)
            if out.data_uri:
                manifest["data_files"] = integrity.file_records(out.data_uri)
            storage.write_manifest(out.uri, manifest)
    pointer = {"data_uri": out.data_uri} if out.data_uri else {}
    storage.publish_current(group_uri, out.fingerprint, out.uri, **pointer)
    return manifest | {"uri": out.uri, "fingerprint": out.fingerprint, "reused": reused} | pointer


# Outputs up to this size have every file's digest checked before reuse (a full read of the output:
# under 1 ms of CPU per MiB from local disk); larger ones their sizes only, one listing, and their readers
# check what they read (Parquet page checksums, document ids); ``marin-assets verify`` reads all.
REUSE_DIGEST_BYTES = 16 << 30


def damaged_files(out: Output, manifest: Mapping[str, Any], digests: bool | None = None) -> dict[str, str]:
    """The files of a complete output that differ from what its manifest records ({uri: what}).

    ``digests=None``: digests checked when the output holds at most :data:`REUSE_DIGEST_BYTES`.
    """
    trees = [(out.uri, manifest.get("files") or {}), (out.data_uri, manifest.get("data_files") or {})]
    if digests is None:
        digests = sum(size for _, files in trees for size, _ in files.values()) <= REUSE_DIGEST_BYTES
    found: dict[str, str] = {}
    for uri, files in trees:
        if uri and files:
            found |= {storage.join(uri, name): why for name, why in integrity.damaged(uri, files, digests).items()}
    return found


def reusable(out: Output) -> dict[str, Any] | None:
    """The manifest of the complete ``out`` when its files are as recorded; else None, after
    removing what failed (so the build makes it again): the damaged files and the shard records
    naming them, or the whole output where a damaged file has no shard record."""
    manifest = storage.read_manifest(out.uri)
    if manifest is None:
        return None
    found = damaged_files(out, manifest)
    if not found:
        return manifest
    log.warning("%s fails its check and is rebuilt: %s", out.uri, "; ".join(f"{u}: {why}" for u, why in found.items()))
    storage.remove(storage.manifest_uri(out.uri))
    records = {u: storage.shard_stats_uri(u) for u in found}
    if all(storage.exists(r) for r in records.values()):
        for uri, record in records.items():
            storage.remove(record)
            storage.remove(uri)
    else:
        for entry in storage.listdir(out.uri):
            if storage.basename(entry) != storage.WRITING:  # this run's hold on the folder stays
                storage.remove(entry, recursive=True)
        if out.data_uri:
            storage.remove(out.data_uri, recursive=True)
    return None


def verify_outputs(layout: storage.Layout, specs: Sequence[StageSpec], sources: Sequence[str]) -> Iterator[tuple[str, dict[str, str]]]:
    """Each current output of ``specs`` (per source of ``sources`` for partitioned stages) and
    its files that differ from its manifest's records, every file's bytes read (empty: intact)."""
    for spec in specs:
        if spec.study_stage:
            continue
        for part in sources if spec.partitioned else [None]:
            record = storage.read_current(spec.group_uri(layout, part))
            if record is None:
                continue
            manifest = storage.read_manifest(record["uri"])
            if manifest is None:
                yield record["uri"], {storage.manifest_uri(record["uri"]): "the output is incomplete (no manifest)"}
                continue
            out = Output(record["uri"], record["fingerprint"], record.get("data_uri") or spec.data_uri(layout, part, record["fingerprint"]))
            if not manifest.get("files"):
                yield out.uri, {storage.manifest_uri(out.uri): "records no file digests (written before outputs carried them): rematerialize to record them"}
                continue
            yield out.uri, damaged_files(out, manifest, digests=True)


def run_shards(
    spec: StageSpec,
    layout: storage.Layout,
    *,
    source: str,
    inputs: Sequence[StageInput],
    shard_fn: ShardFn,
    params: Any,
    runner: ShardRunner | None = None,
    extra_fingerprint: Any = None,
    fingerprint_params: Any = None,
    bind_params: Callable[[Output], Any] | None = None,
    progress: Callable[[str], None] | None = None,
    finish: Callable[[Output, list[ShardResult]], Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """Map ``shard_fn`` over the shards of ``inputs[0]``; each task gets the same-named shard of every input.

    ``finish(output, results)`` runs after the map, before the manifest (a step over all the
    shards' outputs, e.g. merging small files); what it returns joins the manifest body.

    ``fingerprint_params`` replaces ``params`` in the fingerprint when the parameters carry
    storage paths (which must not be hashed: a moved root keeps its fingerprints);
    ``bind_params(output)`` builds the parameters once the output's place is known (a stage
    that writes a data tree of its own). The manifest body: shard names, ``totals``,
    ``per_shard`` counters and ``resumed_shards``.
    """
    say = progress or (lambda _m: None)

    def build(out: Output) -> dict[str, Any]:
        shard_params = bind_params(out) if bind_params is not None else params
        shards = storage.list_shards(inputs[0].uri)
        tasks = [
            ShardTask(shard_fn, tuple(storage.join(i.uri, storage.basename(s)) for i in inputs), storage.join(out.uri, storage.basename(s)), shard_params)
            for s in shards
        ]
        results = (runner or ShardRunner()).map(
            tasks, on_done=lambda r: say(f"{spec.name} {source}: {storage.basename(r.output)} {'reused' if r.reused else 'done'}")
        )
        per_shard = [r.stats for r in results]
        body = {
            "shards": [storage.basename(r.output) for r in results],
            "totals": summed(per_shard),
            "per_shard": per_shard,
            "resumed_shards": sum(r.reused for r in results),
        }
        if finish is not None:
            body.update(finish(out, results))
        return body

    decided = key(params if fingerprint_params is None else fingerprint_params, extra_fingerprint)
    return run_stage(spec, layout, source=source, inputs=inputs, decided_by=decided, build=build)


def run_global(
    spec: StageSpec,
    layout: storage.Layout,
    *,
    inputs: Mapping[str, StageInput],
    params: Any,
    build: Callable[[str], Mapping[str, Any]],
    extra_fingerprint: Any = None,
) -> dict[str, Any]:
    """Run ``build(out_dir)`` once per distinct set of inputs and parameters; its result is the manifest's ``stats``.

    ``inputs`` maps a name (a source, or an upstream global asset) to its current output; the
    fingerprint covers every input's fingerprint, so a changed source gives a new output while
    an unchanged set reuses the finished one.
    """
    return run_stage(
        spec, layout, inputs=inputs, decided_by=key(params, extra_fingerprint), build=lambda out: {"stats": dict(build(out.uri))}
    )


# --------------------------------------------------------------------------- mixture studies


def _study_group(spec: StageSpec, layout: storage.Layout, study: str, run: str | None) -> str:
    if not spec.study_stage:
        raise ConfigurationError(f"stage '{spec.name}' is not a stage of a mixture study (its spec has no study_stage)")
    return storage.inside(layout.root, storage.join(spec.group_uri(layout, study), run or ""))


def run_study(
    spec: StageSpec,
    layout: storage.Layout,
    *,
    study: str,
    inputs: Mapping[str, str],
    decided_by: Any,
    build: Callable[[str], Mapping[str, Any]],
    run: str | None = None,
) -> dict[str, Any]:
    """A stage of a mixture study (per study, or per study and ``run``): ``build(out_dir)`` once
    per distinct (``decided_by``, ``inputs``), its result the manifest's ``stats``.

    ``inputs`` maps a name to a fingerprint: upstream study outputs, and digests of what comes
    from outside (an external trainer's results). The output lives under
    ``<study folder>/<study_stage>[/<run>]/<fingerprint>``; the study and run are part of the
    fingerprint. Same contract as every stage: manifest last, a complete output reused,
    ``_current.json`` pointing at the output made or reused last.
    """
    group = _study_group(spec, layout, study, run)
    fp = storage.fingerprint(
        f"{spec.study_stage}:{study}:{run or ''}", decided_by, spec.code_version, [f"{k}={v}" for k, v in sorted(inputs.items())]
    )
    header = {"stage": spec.study_stage, "study": study, "part": run, "fingerprint": fp, "code_version": spec.code_version, "inputs": dict(inputs)}
    return _record(group, Output(storage.join(group, fp), fp), header, lambda out: {"stats": dict(build(out.uri))})


def current_study_output(layout: storage.Layout, spec: StageSpec, study: str, run: str | None = None) -> StageInput | None:
    """The current complete output of a study stage (for ``run``), or None."""
    record = storage.read_current(_study_group(spec, layout, study, run))
    if record is None or not storage.is_complete(record["uri"]):
        return None
    return StageInput(record["uri"], record["fingerprint"], spec.name)


# --------------------------------------------------------------------------- provider copies


def commit_copy(uri: str, fetch: Callable[[], Mapping[str, Any]]) -> dict[str, Any]:
    """Record a provider copy complete: ``fetch()`` stores the files under ``uri`` (resumable,
    with per-file markers under ``_partial/``) and returns its manifest, flagged ``reused`` when
    the copy was already complete; the runner writes the manifest last, then drops the markers.
    """
    manifest = dict(fetch())
    if manifest.get("reused"):
        return manifest
    payload = {k: v for k, v in manifest.items() if k != "reused"}
    storage.write_manifest(uri, payload)
    storage.remove(storage.join(uri, storage.PARTIAL_DIR), recursive=True)
    return payload | {"reused": False}


def recorded_copy(record_uri: str) -> dict[str, Any] | None:
    """The complete copy a pin record points at (manifest plus record, ``reused``), or None."""
    if not storage.exists(record_uri):
        return None
    record = storage.read_json(record_uri)
    manifest = storage.read_manifest(record["uri"])
    if manifest is None:
        return None
    return manifest | record | {"reused": True}


def run_copy(*, record_uri: str, fetch: Callable[[], tuple[Mapping[str, Any], Mapping[str, Any]]]) -> dict[str, Any]:
    """A stage whose output is a provider copy (``raw_files``): reuse the copy the pin record
    names, else ``fetch()`` -> (copy manifest, pin record) and record both.

    The pin record (``uri``, ``revision``, ``fingerprint``, ``pin``) plays the part of the
    ``_current.json`` pointer: copies are addressed by content, so one record per recipe.
    """
    found = recorded_copy(record_uri)
    if found is not None:
        return found
    manifest, record = fetch()
    copy = commit_copy(record["uri"], lambda: manifest)
    storage.write_json(record_uri, dict(record))
    return copy | dict(record) | {"reused": bool(copy.get("reused", False))}


# --------------------------------------------------------------------------- metadata helpers

CHARS_PER_TOKEN = 4.0  # rough estimate until the pool counts tokens with the pinned tokenizer
