"""The eval registry: the eval sets the pool is decontaminated against, read from ``evals.toml``.

Each entry says where the eval set comes from (a Hugging Face repo at a revision, a web archive
with its hash, or a local file for air-gapped use), which record fields are indexed and whether
the set is mandatory. Mandatory sets are a hard contract: the n-gram index refuses to build
without every one of them at its expected row count, so a silently missing benchmark can never
produce a "clean" pool.

Branch pins ("main") are convenient to write but move, so they are resolved once into the lock
file beside the registry (``evals.lock.json``) by :func:`resolve_pins`; builds read revisions
through :meth:`EvalRegistry.revision`, which only ever returns a full commit.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import tempfile
import tomllib
from collections.abc import Callable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from marin_assets.catalog.sources import EntryError

PACKAGED_EVALS = "evals.toml"
LOCK_SUFFIX = ".lock.json"
LOCK_VERSION = 1
LOCK_COMMAND = "marin-assets evals lock"

PROVIDER_KINDS = ("huggingface", "web", "local")
FILE_FORMATS = ("parquet", "jsonl", "json", "csv", "zip")
GROUPS = ("aa-index-v4.1.1", "common", "lm-eval", "local")
ALL_STRING_FIELDS = "*"  # fields = ["*"]: every string field of a row, passage fields excepted

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")

Resolver = Callable[[str, str], str | None]  # (repo, branch) -> 40-hex commit (None: could not, skip it)


class EvalRegistryError(EntryError):
    """An eval registry or lock that cannot be used."""


# ----------------------------------------------------------------------------- model


@dataclasses.dataclass(frozen=True)
class HuggingFaceProvider:
    """A dataset repo on the Hub; ``revision`` is a commit or a branch resolved through the lock."""

    repo: str
    split: str
    revision: str
    config: str = ""
    files: tuple[str, ...] = ()  # globs of the data files to download; empty = the hub client's default
    kind: str = "huggingface"

    @property
    def is_branch(self) -> bool:
        return not _COMMIT.match(self.revision)

    @property
    def lock_key(self) -> str:
        return f"{self.repo}@{self.revision}"


@dataclasses.dataclass(frozen=True)
class WebArchiveProvider:
    """A file fetched over HTTP(S), pinned by its sha256 (recorded in the lock when left empty)."""

    url: str
    format: str
    sha256: str = ""
    member: str = ""  # the file inside a zip that holds the records
    records: str = ""  # dotted path of the record list inside a JSON document
    row_dirs: str = ""  # zip of one directory per row: glob of those directories
    kind: str = "web"


@dataclasses.dataclass(frozen=True)
class LocalFileProvider:
    """A Parquet/JSONL/JSON/CSV file already on disk (or any fsspec URI): air-gapped copies, the demo."""

    path: str  # absolute path or URI (relative paths are resolved against the registry file)
    format: str
    kind: str = "local"


Provider = HuggingFaceProvider | WebArchiveProvider | LocalFileProvider


@dataclasses.dataclass(frozen=True)
class EvalSet:
    name: str
    title: str
    group: str
    mandatory: bool
    provider: Provider
    fields: tuple[str, ...]
    rows: int | None = None
    id_field: str = ""
    explode: str = ""
    passage_fields: tuple[str, ...] = ()
    notes: str = ""

    def recipe(self) -> dict[str, Any]:
        """Everything that decides which text this set contributes to the index (not title/notes)."""
        return {
            "name": self.name,
            "mandatory": self.mandatory,
            "rows": self.rows,
            "fields": list(self.fields),
            "id_field": self.id_field,
            "explode": self.explode,
            "provider": dataclasses.asdict(self.provider),
        }


@dataclasses.dataclass(frozen=True)
class EvalLock:
    """Resolved pins: ``revisions["repo@branch"] = commit``, ``archives[url] = sha256`` and the row
    count each web file gave when it was hashed (``rows[url]``), written by ``marin-assets evals lock``."""

    revisions: Mapping[str, str] = dataclasses.field(default_factory=dict)
    archives: Mapping[str, str] = dataclasses.field(default_factory=dict)
    rows: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"version": LOCK_VERSION, "revisions": dict(sorted(self.revisions.items())),
                "archives": dict(sorted(self.archives.items())), "rows": dict(sorted(self.rows.items()))}

    def changes(self, new: "EvalLock") -> list[str]:
        """Human-readable differences from this lock to ``new`` (what ``evals lock`` prints for review)."""
        out = []
        for label, old_map, new_map in (("revision", self.revisions, new.revisions),
                                         ("sha256", self.archives, new.archives), ("rows", self.rows, new.rows)):
            for key in sorted(set(old_map) | set(new_map)):
                before, after = old_map.get(key), new_map.get(key)
                if before == after:
                    continue
                if before is None:
                    out.append(f"+ {label} {key}: {after}")
                elif after is None:
                    out.append(f"- {label} {key}: {before}")
                else:
                    out.append(f"~ {label} {key}: {before} -> {after}")
        return out


@dataclasses.dataclass(frozen=True)
class EvalRegistry:
    sets: tuple[EvalSet, ...]
    path: str = ""
    lock_path: str = ""
    lock: EvalLock = dataclasses.field(default_factory=EvalLock)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.sets)

    @property
    def mandatory(self) -> tuple[EvalSet, ...]:
        return tuple(s for s in self.sets if s.mandatory)

    def get(self, name: str) -> EvalSet:
        for eval_set in self.sets:
            if eval_set.name == name:
                return eval_set
        raise KeyError(f"no eval set {name!r} in the eval registry {self.path!r}; known: {', '.join(self.names)}")

    def expected_rows(self) -> dict[str, int]:
        """Mandatory set -> row count: the ``expected`` argument of the index build."""
        return {s.name: int(s.rows) for s in self.sets if s.mandatory and s.rows is not None}

    def revision(self, eval_set: EvalSet | str) -> str:
        """The full commit a Hub-hosted set is read at: the pin itself, or its lock entry."""
        eval_set = self.get(eval_set) if isinstance(eval_set, str) else eval_set
        provider = eval_set.provider
        if not isinstance(provider, HuggingFaceProvider):
            raise EvalRegistryError(
                f"eval registry entry {eval_set.name!r}: field 'provider.revision' does not apply to a "
                f"{provider.kind} provider (in {self.path})", entry=eval_set.name, field="provider.revision",
                path=self.path)
        if not provider.is_branch:
            return provider.revision
        commit = self.lock.revisions.get(provider.lock_key)
        if not commit:
            raise EvalRegistryError(
                f"eval registry entry {eval_set.name!r}: field 'provider.revision' is the branch "
                f"{provider.revision!r} of {provider.repo}, which is not resolved in the lock file "
                f"{self.lock_path!r}; run `{LOCK_COMMAND}` (or pin a 40-hex commit) "
                f"(in {self.path})", entry=eval_set.name, field="provider.revision", path=self.path)
        return commit

    def archive_sha256(self, eval_set: EvalSet | str) -> str:
        """The sha256 a web archive must have: the registry's, else the one recorded in the lock."""
        eval_set = self.get(eval_set) if isinstance(eval_set, str) else eval_set
        provider = eval_set.provider
        if not isinstance(provider, WebArchiveProvider):
            raise EvalRegistryError(
                f"eval registry entry {eval_set.name!r}: field 'provider.sha256' does not apply to a "
                f"{provider.kind} provider (in {self.path})", entry=eval_set.name, field="provider.sha256",
                path=self.path)
        sha = provider.sha256 or self.lock.archives.get(provider.url, "")
        if not sha:
            raise EvalRegistryError(
                f"eval registry entry {eval_set.name!r}: field 'provider.sha256' is empty and the lock file "
                f"{self.lock_path!r} records no hash for {provider.url}; run `{LOCK_COMMAND}` to fetch it once "
                f"and record its sha256, or write it into the registry (in {self.path})",
                entry=eval_set.name, field="provider.sha256", path=self.path)
        return sha

    def recipe(self) -> dict[str, Any]:
        """Fingerprint input of the eval index: every set's recipe plus the resolved pins it uses."""
        return {
            "sets": [s.recipe() for s in self.sets],
            "lock": {
                "revisions": {s.provider.lock_key: self.lock.revisions.get(s.provider.lock_key, "")
                              for s in self.sets
                              if isinstance(s.provider, HuggingFaceProvider) and s.provider.is_branch},
                "archives": {s.provider.url: self.lock.archives.get(s.provider.url, "")
                             for s in self.sets
                             if isinstance(s.provider, WebArchiveProvider) and not s.provider.sha256},
            },
        }


# ----------------------------------------------------------------------------- loading


def default_evals_path() -> Path:
    """The registry shipped inside the package (the ``MARIN_EVALS`` setting chooses another)."""
    return Path(str(resources.files(__package__).joinpath(PACKAGED_EVALS)))


def lock_path_for(registry_path: str | Path) -> Path:
    """``evals.toml`` -> ``evals.lock.json`` in the same directory."""
    path = Path(registry_path)
    return path.with_name(path.stem + LOCK_SUFFIX)


def load_evals(path: str | Path | None = None) -> EvalRegistry:
    """Read and validate the registry and its lock; read from disk on every call."""
    where = Path(path) if path is not None else default_evals_path()
    try:
        raw = tomllib.loads(where.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise EvalRegistryError(f"eval registry file {str(where)!r} does not exist", path=str(where)) from None
    except tomllib.TOMLDecodeError as exc:
        raise EvalRegistryError(f"eval registry file {str(where)!r} is not valid TOML: {exc}",
                                path=str(where)) from None
    includes = raw.pop("include", [])
    if not isinstance(includes, list) or not all(isinstance(i, str) for i in includes):
        raise EvalRegistryError(f"eval registry file {str(where)!r}: field 'include' must be a list of file names",
                                field="include", path=str(where))
    for name in includes:
        part = where.parent / name
        try:
            extra = tomllib.loads(part.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise EvalRegistryError(f"eval registry file {str(where)!r}: included file {str(part)!r} does not exist",
                                    field="include", path=str(where)) from None
        except tomllib.TOMLDecodeError as exc:
            raise EvalRegistryError(f"eval registry file {str(part)!r} (included) is not valid TOML: {exc}",
                                    path=str(part)) from None
        raw["eval"] = list(raw.get("eval", [])) + list(extra.get("eval", []))
    registry = parse_evals(raw, path=str(where))
    lock_file = lock_path_for(where)
    return dataclasses.replace(registry, lock_path=str(lock_file), lock=load_lock(lock_file))


def load_lock(path: str | Path) -> EvalLock:
    """The lock file's resolved pins; a missing file is an empty lock."""
    where = Path(path)
    if not where.exists():
        return EvalLock()
    try:
        raw = json.loads(where.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise EvalRegistryError(f"eval lock file {str(where)!r} is not valid JSON: {exc}; delete it and run "
                                f"resolve_pins() again", path=str(where)) from None
    if not isinstance(raw, dict) or raw.get("version") != LOCK_VERSION:
        raise EvalRegistryError(f"eval lock file {str(where)!r}: field 'version' must be {LOCK_VERSION}",
                                field="version", path=str(where))
    revisions, archives = raw.get("revisions", {}), raw.get("archives", {})
    for key, commit in dict(revisions).items():
        if not isinstance(commit, str) or not _COMMIT.match(commit):
            raise EvalRegistryError(f"eval lock file {str(where)!r}: field 'revisions.{key}' must be a 40-hex "
                                    f"commit, got {commit!r}", field=f"revisions.{key}", path=str(where))
    for url, sha in dict(archives).items():
        if not isinstance(sha, str) or not _SHA256.match(sha):
            raise EvalRegistryError(f"eval lock file {str(where)!r}: field 'archives.{url}' must be a 64-hex "
                                    f"sha256, got {sha!r}", field=f"archives.{url}", path=str(where))
    rows = raw.get("rows", {})
    for url, count in dict(rows).items():
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise EvalRegistryError(f"eval lock file {str(where)!r}: field 'rows.{url}' must be a row count, "
                                    f"got {count!r}", field=f"rows.{url}", path=str(where))
    return EvalLock(revisions=dict(revisions), archives=dict(archives), rows=dict(rows))


def write_lock(lock: EvalLock, path: str | Path) -> None:
    """Write the lock atomically (temporary file, then rename)."""
    where = Path(path)
    where.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=where.name + ".", dir=where.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(lock.to_json(), handle, indent=2)
            handle.write("\n")
        os.replace(tmp, where)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def resolve_pins(
    registry: EvalRegistry,
    resolver: Resolver,
    *,
    refresh: bool = False,
    archive_hasher: Callable[[str], str] | None = None,
) -> EvalLock:
    """Resolve every branch pin once: keep what the lock already records, ask ``resolver`` for the rest.

    ``resolver(repo, branch) -> commit`` is injected (the project's hub client in production, a
    dict in tests). ``refresh=True`` re-resolves every branch (a deliberate pin update).
    ``archive_hasher(url) -> sha256`` records the hash of web archives that the registry leaves
    empty. Entries for pins no longer in the registry are dropped. Nothing is written: pass the
    result to :func:`write_lock`.
    """
    revisions: dict[str, str] = {}
    archives: dict[str, str] = {}
    rows: dict[str, int] = {}
    for eval_set in registry.sets:
        provider = eval_set.provider
        if isinstance(provider, HuggingFaceProvider) and provider.is_branch:
            key = provider.lock_key
            if key in revisions:
                continue
            known = registry.lock.revisions.get(key)
            if known and not refresh:
                revisions[key] = known
                continue
            commit = resolver(provider.repo, provider.revision)
            if commit is None:  # the resolver reported it could not pin this one (best effort)
                continue
            if not isinstance(commit, str) or not _COMMIT.match(commit):
                raise EvalRegistryError(
                    f"eval registry entry {eval_set.name!r}: field 'provider.revision': resolving branch "
                    f"{provider.revision!r} of {provider.repo} gave {commit!r}, not a 40-hex commit "
                    f"(in {registry.path})", entry=eval_set.name, field="provider.revision", path=registry.path)
            revisions[key] = commit
        elif isinstance(provider, WebArchiveProvider) and not provider.sha256:
            known = registry.lock.archives.get(provider.url)
            if known and not refresh:
                archives[provider.url] = known
                if provider.url in registry.lock.rows:
                    rows[provider.url] = registry.lock.rows[provider.url]
            elif archive_hasher is not None:
                sha = archive_hasher(provider.url)
                if sha is None:
                    continue
                if not isinstance(sha, str) or not _SHA256.match(sha):
                    raise EvalRegistryError(
                        f"eval registry entry {eval_set.name!r}: field 'provider.sha256': hashing "
                        f"{provider.url} gave {sha!r}, not a 64-hex sha256 (in {registry.path})",
                        entry=eval_set.name, field="provider.sha256", path=registry.path)
                archives[provider.url] = sha
    return EvalLock(revisions=revisions, archives=archives, rows=rows)


# ----------------------------------------------------------------------------- validation

_EVAL_KEYS = {"name", "title", "group", "mandatory", "rows", "fields", "id_field", "explode", "passage_fields",
              "notes", "provider"}
_PROVIDER_KEYS = {
    "huggingface": {"kind", "repo", "split", "revision", "config", "files"},
    "web": {"kind", "url", "sha256", "format", "member", "records", "row_dirs"},
    "local": {"kind", "path", "format"},
}


class _Entry:
    """Typed field access for one raw table; every failure names the entry, the field and the file."""

    def __init__(self, table: Mapping[str, Any], label: str, path: str, prefix: str = ""):
        self.table, self.label, self.path, self.prefix = table, label, path, prefix

    def fail(self, field: str, problem: str) -> EvalRegistryError:
        qualified = self.prefix + field
        entry = None if self.label.startswith("#") else self.label
        shown = self.label if entry is None else repr(self.label)
        return EvalRegistryError(f"eval registry entry {shown}: field {qualified!r} {problem} (in {self.path})",
                                 entry=entry, field=qualified, path=self.path)

    def text(self, field: str, default: str | None = None) -> str:
        value = self.table.get(field, default)
        if value is None:
            raise self.fail(field, "is required")
        if not isinstance(value, str):
            raise self.fail(field, f"must be a string, got {type(value).__name__}")
        return value

    def flag(self, field: str) -> bool:
        value = self.table.get(field)
        if not isinstance(value, bool):
            raise self.fail(field, f"is required and must be true or false, got {value!r}")
        return value

    def strings(self, field: str, required: bool = False) -> tuple[str, ...]:
        value = self.table.get(field, [])
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            raise self.fail(field, "must be a list of non-empty strings")
        if required and not value:
            raise self.fail(field, "must name at least one field to index")
        return tuple(value)

    def unknown(self, allowed: set[str]) -> None:
        extra = sorted(set(self.table) - allowed)
        if extra:
            raise self.fail(extra[0], f"is not a known field (allowed: {', '.join(sorted(allowed))})")


def parse_evals(raw: Mapping[str, Any], path: str = "") -> EvalRegistry:
    """Validate an already-parsed registry document (``version`` and the ``[[eval]]`` array)."""
    unknown = set(raw) - {"version", "eval"}
    if unknown:
        raise EvalRegistryError(f"eval registry file {path!r}: unknown top-level key(s) {sorted(unknown)}; only "
                                f"'version' and [[eval]] tables are allowed", path=path)
    if raw.get("version", 1) != 1:
        raise EvalRegistryError(f"eval registry file {path!r}: field 'version' must be 1, got {raw.get('version')!r}",
                                field="version", path=path)
    entries = raw.get("eval")
    if not isinstance(entries, list) or not entries:
        raise EvalRegistryError(f"eval registry file {path!r} has no [[eval]] tables", path=path)
    base = Path(path).parent if path else Path.cwd()
    sets: list[EvalSet] = []
    seen: dict[str, int] = {}
    for position, table in enumerate(entries, start=1):
        eval_set = _parse_eval(table, position, path, base)
        if eval_set.name in seen:
            raise EvalRegistryError(
                f"eval registry entry {eval_set.name!r}: field 'name' is duplicated (entries #{seen[eval_set.name]} "
                f"and #{position}); names must be unique (in {path})", entry=eval_set.name, field="name", path=path)
        seen[eval_set.name] = position
        sets.append(eval_set)
    return EvalRegistry(sets=tuple(sets), path=path)


def _parse_eval(table: Any, position: int, path: str, base: Path) -> EvalSet:
    if not isinstance(table, Mapping):
        raise EvalRegistryError(f"eval registry entry #{position}: must be an [[eval]] table (in {path})", path=path)
    name = table.get("name")
    label = name if isinstance(name, str) and name else f"#{position}"
    e = _Entry(table, label, path)
    e.unknown(_EVAL_KEYS)
    name = e.text("name")
    if not _NAME.match(name):
        raise e.fail("name", f"must match [a-z][a-z0-9_]* (it prefixes attribution as '<name>:<row>'), got {name!r}")
    group = e.text("group", "common")
    if group not in GROUPS:
        raise e.fail("group", f"must be one of {', '.join(GROUPS)}, got {group!r}")
    mandatory = e.flag("mandatory")
    rows = table.get("rows")
    if rows is not None and (not isinstance(rows, int) or isinstance(rows, bool) or rows <= 0):
        raise e.fail("rows", f"must be a positive integer, got {rows!r}")
    if mandatory and rows is None:
        raise e.fail("rows", "is required for a mandatory eval set (the build checks the row count)")
    fields = e.strings("fields", required=True)
    passage_fields = e.strings("passage_fields")
    clash = sorted(set(fields) & set(passage_fields))
    if clash:
        raise e.fail("fields", f"lists passage field(s) {clash} that passage_fields excludes from the index")
    provider_table = table.get("provider")
    if not isinstance(provider_table, Mapping):
        raise e.fail("provider", "is required and must be a table ([eval.provider])")
    provider = _parse_provider(_Entry(provider_table, label, path, prefix="provider."), base)
    if isinstance(provider, WebArchiveProvider) and provider.row_dirs and e.text("id_field", ""):
        raise e.fail("id_field", "does not apply to a zip of row directories (the directory name is the row id)")
    return EvalSet(
        name=name,
        title=e.text("title", name),
        group=group,
        mandatory=mandatory,
        provider=provider,
        fields=fields,
        rows=rows,
        id_field=e.text("id_field", ""),
        explode=e.text("explode", ""),
        passage_fields=passage_fields,
        notes=e.text("notes", ""),
    )


def _infer_format(location: str) -> str:
    lowered = location.lower()
    for fmt in FILE_FORMATS:
        if lowered.endswith("." + fmt):
            return fmt
    return ""


def _parse_provider(e: _Entry, base: Path) -> Provider:
    kind = e.text("kind")
    if kind not in PROVIDER_KINDS:
        raise e.fail("kind", f"must be one of {', '.join(PROVIDER_KINDS)}, got {kind!r}")
    e.unknown(_PROVIDER_KEYS[kind])
    if kind == "huggingface":
        repo = e.text("repo")
        if not _REPO_ID.match(repo):
            raise e.fail("repo", f"must be a Hub dataset id 'owner/name', got {repo!r}")
        split = e.text("split")
        if not split.strip():
            raise e.fail("split", "must not be empty")
        revision = e.text("revision")
        if not revision.strip() or revision != revision.strip():
            raise e.fail("revision", f"must be a 40-hex commit or a branch name, got {revision!r}")
        return HuggingFaceProvider(repo=repo, split=split, revision=revision, config=e.text("config", ""),
                                   files=e.strings("files"))
    if kind == "web":
        url = e.text("url")
        if not url.startswith(("https://", "http://")):
            raise e.fail("url", f"must be an http(s) URL, got {url!r}")
        sha = e.text("sha256", "")
        if sha and not _SHA256.match(sha):
            raise e.fail("sha256", f"must be 64 lowercase hex characters or empty, got {sha!r}")
        fmt = e.text("format", "") or _infer_format(url)
        if fmt not in FILE_FORMATS:
            raise e.fail("format", f"must be one of {', '.join(FILE_FORMATS)} (not inferable from the url)")
        member, row_dirs = e.text("member", ""), e.text("row_dirs", "")
        if fmt == "zip" and bool(member) == bool(row_dirs):
            raise e.fail("member", "a zip needs exactly one of 'member' (the record file inside it) or 'row_dirs'")
        if fmt != "zip" and (member or row_dirs):
            raise e.fail("member" if member else "row_dirs", "applies only to format = \"zip\"")
        return WebArchiveProvider(url=url, format=fmt, sha256=sha, member=member, records=e.text("records", ""),
                                  row_dirs=row_dirs)
    location = e.text("path")
    if not location.strip():
        raise e.fail("path", "must not be empty")
    if "://" not in location:
        location = str((base / os.path.expanduser(location)).resolve())
    fmt = e.text("format", "") or _infer_format(location)
    if fmt not in FILE_FORMATS or fmt == "zip":
        raise e.fail("format", f"must be one of parquet, jsonl, json, csv (not inferable from {location!r})")
    return LocalFileProvider(path=location, format=fmt)
