"""Eval sets of the registry: fetching (Hub repos at their locked commits, web files by hash,
local files) and reading their files into ``EvalRow`` rows (whole text and each field's text).

Kept apart from ``decon`` so that the n-gram rules stay pure functions of rows; this module
decides where each set's files come from, puts them under ``raw/evals/`` and reads them.
"""

from __future__ import annotations

import concurrent.futures
import csv
import dataclasses
import fnmatch
import hashlib
import io
import json
import os
import tempfile
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow.parquet as pq

from marin_assets.catalog.evals import (
    ALL_STRING_FIELDS,
    EvalLock,
    EvalRegistry,
    EvalSet,
    HuggingFaceProvider,
    LocalFileProvider,
    WebArchiveProvider,
    resolve_pins,
)
from marin_assets.core.decon.params import EvalIndexError, EvalRow
from marin_assets.core.ingest import hub
from marin_assets.core.ingest.providers import ProviderAccess
from marin_assets.core.runtime import stages, storage


def lock_registry(
    registry: EvalRegistry,
    resolve: Callable[[str, str], str] | None = None,
    download: Callable[[str, str], None] | None = None,
    *,
    access: ProviderAccess = ProviderAccess(),
    refresh: bool = False,
    workers: int = 8,
) -> tuple[EvalLock, list[str]]:
    """What ``marin-assets evals lock`` records: (the new lock, the changes to review).

    Every Hub branch pin is resolved to a commit (``resolve(repo, branch)``, the Hub client by
    default); every web file the registry does not pin by sha256 is downloaded once
    (``download(url, local_path)``), hashed, read and its row count recorded. Entries the lock
    already holds are kept unless ``refresh``. Nothing is written: pass the lock to ``write_lock``.
    """
    resolver = resolve or (lambda repo, branch: hub.resolve_revision(
        repo, branch, "dataset", policy=access.policy, endpoint=access.hf_endpoint, token=access.hf_token))
    fetch = download or (lambda url, local: _download(url, local, access))
    counted: dict[str, int] = {}
    failed: list[str] = []
    mandatory = {s.provider.lock_key if isinstance(s.provider, HuggingFaceProvider) else s.provider.url
                 for s in registry.mandatory if isinstance(s.provider, (HuggingFaceProvider, WebArchiveProvider))}

    def tolerant(key: str, attempt: Callable[[], str]) -> str | None:
        """A mandatory pin that cannot be made stops the command; a best-effort one is reported."""
        try:
            return attempt()
        except Exception as exc:
            if key in mandatory:
                raise
            failed.append(f"! not pinned (best effort) {key}: {str(exc).splitlines()[0][:200]}")
            return None

    # Resolve the branches up front, several at a time: a registry holds thousands of best-effort sets.
    wanted = sorted({(s.provider.repo, s.provider.revision) for s in registry.sets
                     if isinstance(s.provider, HuggingFaceProvider) and s.provider.is_branch
                     and (refresh or s.provider.lock_key not in registry.lock.revisions)})
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        answers = dict(zip(wanted, pool.map(
            lambda pin: tolerant(f"{pin[0]}@{pin[1]}", lambda: resolver(*pin)), wanted)))

    with tempfile.TemporaryDirectory(prefix="marin-eval-lock-") as tmp:

        def hash_file(url: str) -> str:
            local = os.path.join(tmp, hashlib.sha256(url.encode()).hexdigest()[:16])
            fetch(url, local)
            sha = _sha256_of(local)
            for eval_set in registry.sets:
                if isinstance(eval_set.provider, WebArchiveProvider) and eval_set.provider.url == url:
                    counted[url] = sum(1 for _ in read_eval_rows(eval_set, [local], sha256=sha))
            return sha

        lock = resolve_pins(
            registry,
            lambda repo, branch: answers[(repo, branch)],
            refresh=refresh,
            archive_hasher=lambda url: tolerant(url, lambda: hash_file(url)),
        )
    lock = dataclasses.replace(lock, rows={**lock.rows, **counted})
    changes = registry.lock.changes(lock) + sorted(failed)
    for eval_set in registry.sets:
        provider = eval_set.provider
        if isinstance(provider, WebArchiveProvider) and provider.url in counted and eval_set.rows is not None \
                and counted[provider.url] != eval_set.rows:
            changes.append(f"! {eval_set.name}: {provider.url} gives {counted[provider.url]} rows, the registry "
                           f"expects {eval_set.rows}" + (" (mandatory: the build will refuse)" if eval_set.mandatory
                                                         else ""))
    return lock, changes


def _download(url: str, local: str, access: ProviderAccess) -> None:
    from marin_assets.core.ingest.providers import http  # noqa: PLC0415

    with open(local, "wb") as out:
        http.fetch_into(url, out, what=f"eval file {url}", policy=access.policy, mirrors=access.mirrors)


def fetch_eval_set(eval_set: EvalSet, registry: EvalRegistry, layout: storage.Layout, access: ProviderAccess = ProviderAccess()) -> list[str]:
    """Local URIs of the set's files, downloading them under ``raw/evals/`` when needed.

    ``access`` (retry policy, mirrors, Hub endpoint and token, staging folder) comes from the settings.
    """
    provider = eval_set.provider
    if isinstance(provider, LocalFileProvider):
        return [provider.path]
    if isinstance(provider, HuggingFaceProvider):
        revision = registry.revision(eval_set)
        dest = layout.raw("evals__" + provider.repo.replace("/", "__"), revision)
        manifest = stages.commit_copy(dest, lambda: hub.download_snapshot(
            provider.repo, revision, list(provider.files) or None, None, dest, access.policy,
            endpoint=access.hf_endpoint, token=access.hf_token, staging_dir=access.staging_dir))
        paths = [f["path"] for f in manifest["files"]]
        return [storage.join(dest, p) for p in sorted(paths) if not p.endswith((".md", ".gitattributes", ".py"))]
    if isinstance(provider, WebArchiveProvider):
        return [_fetch_archive(provider, registry.archive_sha256(eval_set), layout, access)]
    raise TypeError(f"eval set {eval_set.name!r}: unknown provider {type(provider).__name__}")


def _fetch_archive(provider: WebArchiveProvider, sha256: str, layout: storage.Layout, access: ProviderAccess) -> str:
    from marin_assets.core.ingest.providers import http  # noqa: PLC0415

    name = provider.url.rstrip("/").rsplit("/", 1)[-1] or "archive"
    dest = storage.join(layout.root, "raw", "evals__web", sha256[:16], name)
    if storage.exists(dest):
        return dest
    with tempfile.TemporaryDirectory(prefix="marin-eval-", dir=access.staging_dir) as tmp:
        local = os.path.join(tmp, name)
        with open(local, "wb") as out:
            http.fetch_into(provider.url, out, what=f"eval archive {name}", policy=access.policy,
                            mirrors=access.mirrors, expected_sha256=sha256)
        storage.put_file(local, dest)
    return dest


def registry_digest(registry: EvalRegistry) -> str:
    """Fingerprint input: the registry's recipe and the commits its branch pins are locked to.

    A local eval file counts by its bytes, not its path: the same registry in another checkout
    (or a copy of the file elsewhere) gives the same index and must not rebuild everything after it.
    """
    recipe = registry.recipe()
    for entry, eval_set in zip(recipe["sets"], registry.sets, strict=True):
        if isinstance(eval_set.provider, LocalFileProvider) and storage.exists(eval_set.provider.path):
            entry["provider"] = {**entry["provider"], "path": storage.content_sha256(eval_set.provider.path)}
    payload: dict[str, Any] = {"recipe": recipe, "lock": registry.lock.to_json()}
    return hashlib.sha256(storage.canonical_json(payload).encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------- reading eval rows


def _field_values(record: Any, path: str) -> tuple[bool, list[Any]]:
    """(present, values) of a dotted path; lists of structs are mapped over."""
    current = [record]
    for part in path.split("."):
        found, nxt = False, []
        for value in current:
            items = value if isinstance(value, list) else [value]
            for item in items:
                if isinstance(item, dict) and part in item:
                    found = True
                    nxt.append(item[part])
        if not found:
            return False, []
        current = nxt
    return True, current


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value] if value.strip() else []
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    return []  # numbers, booleans, bytes (images), None carry no eval text


def record_fields(record: Mapping[str, Any], fields: Sequence[str], parent: Mapping[str, Any] | None = None,
                  passage_fields: Sequence[str] = ()) -> list[tuple[str, str]]:
    """``(field, text)`` of every field under ``fields`` holding text; a field's strings are its paragraphs.

    ``fields = ["*"]`` reads every field in key order but the ``passage_fields`` (when a row has
    a passage, only its question and answers are indexed, as in Marin's best-effort corpus).
    """
    out: list[tuple[str, str]] = []
    if list(fields) == [ALL_STRING_FIELDS]:
        fields = [k for k in sorted(record) if k not in set(passage_fields)]
    for field in fields:
        present, values = _field_values(record, field)
        if not present and parent is not None:
            present, values = _field_values(parent, field)
        parts = [s for value in values for s in _strings(value)]
        if parts:
            out.append((field, "\n\n".join(parts)))
    return out


def record_text(record: Mapping[str, Any], fields: Sequence[str], parent: Mapping[str, Any] | None = None,
                passage_fields: Sequence[str] = ()) -> str:
    """The indexed text of a record: every string under ``fields``, each its own paragraph."""
    return "\n\n".join(text for _, text in record_fields(record, fields, parent, passage_fields))


def eval_row(eval_set: str, row_id: str, fields: Sequence[tuple[str, str]]) -> EvalRow:
    """The row of its fields' texts: the whole text, and each field as well when there are several."""
    return EvalRow(eval_set, row_id, "\n\n".join(t for _, t in fields), tuple(fields) if len(fields) > 1 else ())


def _read_records(uri: str, fmt: str, columns: set[str] | None) -> list[dict[str, Any]]:
    if fmt == "parquet":
        fs, path = storage.filesystem(uri)
        with fs.open(path, "rb") as handle:
            pfile = pq.ParquetFile(handle)
            names = pfile.schema_arrow.names
            wanted = [c for c in names if columns is None or c in columns]
            return pfile.read(columns=wanted).to_pylist()
    raw = storage.read_bytes(uri)
    if fmt == "jsonl":
        return [json.loads(line) for line in raw.decode("utf-8").splitlines() if line.strip()]
    if fmt == "csv":
        return list(csv.DictReader(io.StringIO(raw.decode("utf-8-sig"), newline="")))
    document = json.loads(raw)
    return document if isinstance(document, list) else [document]


def _records_at(document: Any, path: str, label: str) -> list[dict[str, Any]]:
    current = document
    for part in [p for p in path.split(".") if p]:
        if not isinstance(current, dict) or part not in current:
            raise EvalIndexError(f"{label}: 'records' path {path!r} not found in the JSON document")
        current = current[part]
    if isinstance(current, dict):
        current = list(current.values())
    if not isinstance(current, list):
        raise EvalIndexError(f"{label}: 'records' path {path!r} does not hold a list of records")
    return current


def _sha256_of(uri: str) -> str:
    digest = hashlib.sha256()
    fs, path = storage.filesystem(uri)
    with fs.open(path, "rb") as handle:
        while chunk := handle.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def read_eval_rows(eval_set: EvalSet, file_uris: Sequence[str], sha256: str = "") -> Iterator[EvalRow]:
    """``EvalRow`` rows (whole text, and each field's text) from the downloaded (or local) files of one eval set.

    Hub sets: the Parquet/JSONL/JSON/CSV files the hub client fetched, in the given order. Web
    archives: the single fetched file, checked against ``sha256`` (from the registry or its
    lock) first. A field the registry names that no record has is an error naming the set,
    the field, the file and the columns found.
    """
    provider = eval_set.provider
    label = f"eval set {eval_set.name!r}"
    if not file_uris:
        raise EvalIndexError(f"{label}: no files given; download {getattr(provider, 'repo', '') or 'its data'} first")
    if isinstance(provider, WebArchiveProvider):
        if len(file_uris) != 1:
            raise EvalIndexError(f"{label}: a web archive is one file, got {len(file_uris)}")
        if sha256:
            actual = _sha256_of(file_uris[0])
            if actual != sha256:
                raise EvalIndexError(
                    f"{label}: file {file_uris[0]} has sha256 {actual}, the registry pins {sha256}; the archive at "
                    f"{provider.url} changed: review it and update 'provider.sha256' (or the lock)")
        yield from _web_rows(eval_set, provider, file_uris[0], label)
        return
    fmt_of = (lambda u: provider.format) if not isinstance(provider, HuggingFaceProvider) else _format_of
    top = None if ALL_STRING_FIELDS in eval_set.fields else (
        {f.split(".")[0] for f in eval_set.fields} | {eval_set.id_field, eval_set.explode} - {""})
    position = 0
    for uri in file_uris:
        fmt = fmt_of(uri)
        if not fmt:
            continue  # README, dataset card, other non-data files of the repo
        records = _read_records(uri, fmt, top)
        yield from _rows_of_records(eval_set, records, uri, label, position)
        position += len(records)


def _format_of(uri: str) -> str:
    lowered = uri.lower()
    for fmt in ("parquet", "jsonl", "json", "csv"):
        if lowered.endswith("." + fmt):
            return fmt
    return ""


def _rows_of_records(eval_set: EvalSet, records: list[dict[str, Any]], uri: str, label: str,
                     position: int) -> Iterator[EvalRow]:
    if records:
        _check_fields(eval_set, records, uri, label)
    for offset, record in enumerate(records):
        row_id = str(record.get(eval_set.id_field)) if eval_set.id_field else str(position + offset)
        if eval_set.explode:
            for step, element in enumerate(record.get(eval_set.explode) or []):
                element = element if isinstance(element, dict) else {"value": element}
                yield eval_row(eval_set.name, f"{row_id}.{step}", record_fields(
                    element, eval_set.fields, parent=record, passage_fields=eval_set.passage_fields))
        else:
            yield eval_row(eval_set.name, row_id, record_fields(record, eval_set.fields,
                                                                passage_fields=eval_set.passage_fields))


def _check_fields(eval_set: EvalSet, records: list[dict[str, Any]], uri: str, label: str) -> None:
    columns = sorted({key for r in records[:1000] for key in r})
    names = [f for f in eval_set.fields if f != ALL_STRING_FIELDS] + ([eval_set.id_field] if eval_set.id_field else [])
    for field in names + ([eval_set.explode] if eval_set.explode else []):
        sample = records[:1000]
        present = any(_field_values(r, field)[0] for r in sample)
        if not present and eval_set.explode and field in eval_set.fields:
            elements = [e for r in sample for e in (r.get(eval_set.explode) or []) if isinstance(e, dict)]
            present = any(_field_values(e, field)[0] for e in elements)
        if not present:
            raise EvalIndexError(f"{label}: field {field!r} is in no record of {uri} (columns: {', '.join(columns)}); "
                                 f"fix 'fields'/'id_field'/'explode' of {eval_set.name!r} in the eval registry")


def _web_rows(eval_set: EvalSet, provider: WebArchiveProvider, uri: str, label: str) -> Iterator[EvalRow]:
    if provider.format != "zip":
        if provider.format == "json":
            records = _records_at(json.loads(storage.read_bytes(uri)), provider.records, label)
        else:
            records = _read_records(uri, provider.format, None)
        yield from _rows_of_records(eval_set, records, uri, label, 0)
        return
    fs, path = storage.filesystem(uri)
    with fs.open(path, "rb") as handle, zipfile.ZipFile(handle) as archive:
        names = [n for n in archive.namelist() if not n.endswith("/")]
        if provider.member:
            if provider.member not in names:
                raise EvalIndexError(f"{label}: member {provider.member!r} is not in {uri}; fix 'provider.member'")
            inner_fmt = _format_of(provider.member) or "json"
            payload = read_member(archive, provider.member, f"{label}: {uri}")
            if inner_fmt == "json":
                records = _records_at(json.loads(payload), provider.records, label)
            elif inner_fmt == "jsonl":
                records = [json.loads(x) for x in payload.decode("utf-8").splitlines() if x.strip()]
            elif inner_fmt == "csv":
                records = list(csv.DictReader(io.StringIO(payload.decode("utf-8-sig"), newline="")))
            else:
                records = pq.read_table(io.BytesIO(payload)).to_pylist()
            yield from _rows_of_records(eval_set, records, f"{uri}!{provider.member}", label, 0)
            return
        dirs = sorted({d for n in names for d in _parents(n) if _match_segments(d, provider.row_dirs)})
        if not dirs:
            raise EvalIndexError(f"{label}: no directory of {uri} matches row_dirs {provider.row_dirs!r}")
        seen_fields: set[str] = set()
        for d in dirs:  # a matching directory is a row when it holds at least one indexed file
            files = [(field, n) for field in eval_set.fields
                     for n in sorted(n for n in names if fnmatch.fnmatchcase(n, f"{d}/{field}"))]
            if not files:
                continue
            seen_fields.update(field for field, _ in files)
            texts: dict[str, list[str]] = {}
            for field, n in files:
                text = read_member(archive, n, f"{label}: {uri}").decode("utf-8", errors="replace")
                if text.strip():
                    texts.setdefault(field, []).append(text)
            yield eval_row(eval_set.name, d.rsplit("/", 1)[-1], [(f, "\n\n".join(t)) for f, t in texts.items()])
        missing = [f for f in eval_set.fields if f not in seen_fields]
        if missing:
            raise EvalIndexError(f"{label}: file(s) {missing} exist in no row directory of {uri}; fix 'fields'")


# The most one archive member of an eval set may inflate to: members are read one at a time, each
# in full (they are parsed whole), so a reader holds at most this much of an archive.
MAX_MEMBER_BYTES = 128 << 20


def read_member(archive: zipfile.ZipFile, name: str, what: str, limit: int | None = None) -> bytes:
    """One member's bytes, refused (``EvalIndexError`` naming it) when it is larger than ``limit``
    (a member is never inflated past the size it states; one that inflates to another size fails its check)."""
    limit = limit or MAX_MEMBER_BYTES
    info = archive.getinfo(name)
    if info.file_size > limit:
        raise EvalIndexError(f"{what}: member {name!r} inflates to {info.file_size} bytes, over the {limit}-byte limit of an "
                             "eval archive member; the archive is corrupt or not an eval set: check the registry entry's url and sha256")
    out = bytearray()
    try:
        with archive.open(info) as member:  # never more than its stated size
            while block := member.read(1 << 20):
                out += block
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        raise EvalIndexError(f"{what}: member {name!r} cannot be read ({err}); check the registry entry's url and sha256") from err
    return bytes(out)


def _match_segments(path: str, pattern: str) -> bool:
    """Glob match segment by segment, so ``*/*`` means exactly two levels."""
    parts, globs = path.split("/"), pattern.strip("/").split("/")
    return len(parts) == len(globs) and all(fnmatch.fnmatchcase(p, g) for p, g in zip(parts, globs))


def _parents(name: str) -> Iterator[str]:
    parts = name.split("/")[:-1]
    for i in range(1, len(parts) + 1):
        yield "/".join(parts[:i])


def registry_rows(
    registry: EvalRegistry,
    fetch: Callable[[EvalSet], Sequence[str]],
    on_skip: Callable[[EvalSet, Exception], None] | None = None,
) -> Iterator[EvalRow]:
    """Rows of every registry set; ``fetch(eval_set) -> local file URIs`` does the download.

    A best-effort set that cannot be fetched or read is reported through ``on_skip`` and left
    out; a mandatory one raises, naming the set.
    """
    for eval_set in registry.sets:
        try:
            sha = registry.archive_sha256(eval_set) if isinstance(eval_set.provider, WebArchiveProvider) else ""
            rows = list(read_eval_rows(eval_set, list(fetch(eval_set)), sha256=sha))
        except Exception as exc:
            if eval_set.mandatory:
                raise EvalIndexError(f"mandatory eval set {eval_set.name!r} could not be read: {exc}") from exc
            if on_skip is not None:
                on_skip(eval_set, exc)
            continue
        yield from rows

