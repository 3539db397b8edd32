"""The source catalog: one typed, validated entry per Marin source, read from ``sources.toml``.

The catalog is data, not code: pins are edited in the TOML and picked up by the next
``load_catalog()`` call (sensors re-read it, so nothing here is cached). Everything that
decides how a source is built goes into ``Source.recipe_fingerprint()``; descriptive
fields (tokens, licence, notes) do not, so editing them never triggers a rebuild.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import re
import tomllib
from collections.abc import Collection, Iterator, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from marin_assets.errors import ConfigurationError

PACKAGED_CATALOG = "sources.toml"

PROVIDER_KINDS = ("hf", "prestaged", "web", "api")
REPO_TYPES = ("dataset", "bucket")

# Dagster partition keys may not contain these (plus control characters); whitespace is
# refused too, so names survive shells, URLs and paths unquoted.
_FORBIDDEN_KEY_SUBSTRINGS = ("...", "|", ",", "[", "]")
_HEX_REVISION = re.compile(r"^(?:[0-9a-f]{7}|[0-9a-f]{40})$")
_VERSION_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_RECIPE_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
# A source name is a partition key and a folder under MARIN_PREFIX: '/'-separated segments of
# letters, digits, '.', '_' and '-', each starting with a letter or digit (so no '..', no
# leading '/', nothing special to shells, URLs or object stores).
_SOURCE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(?:/[A-Za-z0-9][A-Za-z0-9._-]*)*$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class EntryError(ConfigurationError, ValueError):
    """A data file entry that cannot be used; the message names the entry, the field and the file."""

    def __init__(self, message: str, *, entry: str | None = None, field: str | None = None, path: str = ""):
        super().__init__(message)
        self.entry = entry
        self.field = field
        self.path = path


class CatalogError(EntryError):
    """A source catalog that cannot be used."""


# ----------------------------------------------------------------------------- model


@dataclasses.dataclass(frozen=True)
class Provider:
    """Where a source's files come from and the pin that fixes them."""

    kind: str  # hf | prestaged | web | api
    repo_id: str = ""  # hf: "owner/name" (a bucket's id without the "buckets/" prefix)
    revision: str = ""  # hf dataset: 7/40-hex sha; hf bucket: YYYY-MM-DD; others: version label or ""
    repo_type: str = ""  # hf: "dataset" | "bucket"; "" for other kinds
    allow: tuple[str, ...] = ()  # file globs to fetch; empty = every file
    exclude: tuple[str, ...] = ()  # file globs never fetched
    subdir: str = ""  # directory of the download this source reads ("" = its root)
    staged_path: str = ""  # MARIN_PREFIX-relative directory of an already-present copy
    expected_shards: int | None = None  # input files that must be present (prestaged)
    url: str = ""  # web/api entry point (may be a {placeholder} template)
    sha256: str = ""  # web/api content pin; for an hf bucket the snapshot's xet fingerprint
    share_key: str = ""  # sources with equal keys share one download

    @property
    def pin(self) -> str:
        """Short human form of the pin: ``repo@revision``, the staged path or the url."""
        if self.kind == "hf":
            prefix = "buckets/" if self.repo_type == "bucket" else ""
            return f"{prefix}{self.repo_id}@{self.revision}"
        where = self.staged_path if self.kind == "prestaged" else self.url
        return f"{where}@{self.revision}" if self.revision else where


DEFAULT_MAX_DUP_REMOVAL = 0.5


@dataclasses.dataclass(frozen=True)
class Source:
    """One catalog entry: the recipe that turns a provider's files into normalized documents."""

    name: str
    family: str
    rough_tokens_b: float
    license: str
    notes: str
    gated: bool
    fuzzy_exempt: bool
    input_format: str
    text_field: str
    id_field: str | None  # None: the provider has no id column, source_id stays empty
    transform: str | None  # None: the generic recipe (read text_field/id_field as they are)
    bare: bool
    exact_dedup: bool
    provider: Provider
    # The share of its documents a dedup step may remove before its removal_ratio check fails:
    # raise it for a source that is legitimately mostly copies (vendored files, mirrors).
    max_dup_removal: float = DEFAULT_MAX_DUP_REMOVAL

    def recipe_fingerprint(self) -> dict[str, Any]:
        """Everything that defines how this source is built, as plain JSON-ready values.

        This is what the ``source_pins`` data version hashes: a changed pin, file
        selection, schema field, transform or flag changes it; token counts, licence,
        notes, family, fuzzy exemption, the removal limit and download sharing do not.
        """
        p = self.provider
        return {
            "provider": {
                "kind": p.kind,
                "repo_id": p.repo_id,
                "revision": p.revision,
                "repo_type": p.repo_type,
                "allow": list(p.allow),
                "exclude": list(p.exclude),
                "subdir": p.subdir,
                "staged_path": p.staged_path,
                "expected_shards": p.expected_shards,
                "url": p.url,
                "sha256": p.sha256,
            },
            "input_format": self.input_format,
            "text_field": self.text_field,
            "id_field": self.id_field,
            "transform": self.transform,
            "bare": self.bare,
            "exact_dedup": self.exact_dedup,
        }


@dataclasses.dataclass(frozen=True, repr=False)
class Catalog:
    """All sources, ordered by name."""

    sources: tuple[Source, ...]
    path: str = ""
    # Entries that failed validation when loaded leniently: (partition key, error message).
    broken: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.sources, key=lambda s: s.name))
        object.__setattr__(self, "sources", ordered)
        object.__setattr__(self, "_index", {s.name: s for s in ordered})

    def __repr__(self) -> str:
        return f"Catalog({len(self.sources)} sources from {self.path or 'memory'!r})"

    def __iter__(self) -> Iterator[Source]:
        return iter(self.sources)

    def __len__(self) -> int:
        return len(self.sources)

    def __contains__(self, name: object) -> bool:
        return name in self._index  # type: ignore[attr-defined]

    def by_name(self, name: str) -> Source:
        try:
            return self._index[name]  # type: ignore[attr-defined]
        except KeyError:
            close = [n for n in self.names if name.split("/")[0] in n][:5]
            hint = f"; similar: {', '.join(close)}" if close else ""
            raise KeyError(f"no source {name!r} in the catalog ({self.path or 'in memory'}){hint}") from None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.sources)

    @property
    def partition_names(self) -> tuple[str, ...]:
        """Valid sources and the keys of broken entries: one partition each, so a bad entry shows up failing."""
        return tuple(sorted({*self.names, *(key for key, _ in self.broken)}))

    def broken_error(self, name: str) -> str | None:
        return dict(self.broken).get(name)

    @property
    def total_tokens_b(self) -> float:
        return math.fsum(s.rough_tokens_b for s in self.sources)

    def families(self) -> dict[str, tuple[Source, ...]]:
        """Sources grouped by family, families in name order."""
        groups: dict[str, list[Source]] = {}
        for source in self.sources:
            groups.setdefault(source.family, []).append(source)
        return {family: tuple(groups[family]) for family in sorted(groups)}

    def share_groups(self) -> dict[str, tuple[Source, ...]]:
        """Sources grouped by ``provider.share_key``: each group is one download."""
        groups: dict[str, list[Source]] = {}
        for source in self.sources:
            groups.setdefault(source.provider.share_key, []).append(source)
        return {key: tuple(groups[key]) for key in sorted(groups)}


# ----------------------------------------------------------------------------- loading


def default_catalog_path() -> Path:
    """The catalog shipped inside the package (the ``MARIN_CATALOG`` setting chooses another)."""
    return Path(str(resources.files(__package__).joinpath(PACKAGED_CATALOG)))


def load_catalog(path: str | Path | None = None, *, strict: bool = True,
                 known_formats: Collection[str] | None = None, known_transforms: Collection[str] | None = None) -> Catalog:  # fmt: skip
    """Read and validate the catalog; read from disk on every call so edited pins are seen.

    ``strict=False`` keeps going past invalid entries: the valid ones load and each invalid one
    is listed in ``Catalog.broken`` with its error (so one bad entry does not take down the
    code location). ``known_formats`` and ``known_transforms`` are what the caller can build
    (``core.ingest.recipes.checked_catalog`` hands in the project's format table and family
    transforms): an entry naming another is refused; left out, that field is not checked (a
    report listing what is not implemented yet, or a reader of pins).
    """
    where = Path(path) if path is not None else default_catalog_path()
    return parse_catalog(read_catalog_file(where), path=str(where), strict=strict, known_formats=known_formats,
                         known_transforms=known_transforms)  # fmt: skip


# A catalog file is read whole: the packaged one is about 90 kB; this leaves room for 700 times more.
MAX_CATALOG_BYTES = 64 << 20


def read_catalog_file(where: Path) -> dict[str, Any]:
    """The catalog file's TOML, or ``CatalogError`` naming it: missing, over ``MAX_CATALOG_BYTES``,
    not TOML, or nested too deeply to read."""
    try:
        size = where.stat().st_size
        if size > MAX_CATALOG_BYTES:
            raise CatalogError(f"catalog file {str(where)!r} is {size} bytes, over the {MAX_CATALOG_BYTES}-byte limit; "
                               "is it the catalog? split it or point MARIN_CATALOG at the right file", path=str(where))  # fmt: skip
        return tomllib.loads(where.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CatalogError(f"catalog file {str(where)!r} does not exist", path=str(where)) from None
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(f"catalog file {str(where)!r} is not valid TOML: {exc}", path=str(where)) from None
    except RecursionError:
        raise CatalogError(f"catalog file {str(where)!r} nests arrays or tables too deeply to read; fix the file", path=str(where)) from None


def parse_catalog(raw: Mapping[str, Any], path: str = "", *, strict: bool = True,
                  known_formats: Collection[str] | None = None, known_transforms: Collection[str] | None = None) -> Catalog:  # fmt: skip
    """Validate an already-parsed catalog document (the ``[[source]]`` array)."""
    known = _Known(
        tuple(known_formats) if known_formats is not None else None,
        frozenset(known_transforms) if known_transforms is not None else None,
    )
    unknown = set(raw) - {"source"}
    if unknown:
        raise CatalogError(
            f"catalog file {path!r}: unknown top-level key(s) {sorted(unknown)}; only [[source]] tables are allowed",
            path=path,
        )
    entries = raw.get("source")
    if not isinstance(entries, list) or not entries:
        raise CatalogError(f"catalog file {path!r} has no [[source]] tables", path=path)
    sources: list[Source] = []
    broken: list[tuple[str, str]] = []
    seen: dict[str, int] = {}
    for position, entry in enumerate(entries, start=1):
        try:
            source = _parse_source(entry, position, path, known)
            if source.name in seen:
                raise CatalogError(
                    f"catalog entry {source.name!r}: field 'name' is duplicated (entries #{seen[source.name]} "
                    f"and #{position}); names must be unique (in {path})",
                    entry=source.name, field="name", path=path,
                )
        except CatalogError as err:
            if strict:
                raise
            broken.append((_broken_key(entry, position, seen), str(err)))
            continue
        seen[source.name] = position
        sources.append(source)
    return Catalog(tuple(sources), path=path, broken=tuple(broken))


def _broken_key(entry: Any, position: int, seen: Mapping[str, int]) -> str:
    """The partition key a broken entry shows under: its name when usable, else its position."""
    name = entry.get("name") if isinstance(entry, Mapping) else None
    if isinstance(name, str) and name not in seen and _check_key(name) is None and _SOURCE_NAME.match(name):
        return name
    return f"invalid-entry-{position}"


# ----------------------------------------------------------------------------- validation

_SOURCE_KEYS = {
    "name", "family", "rough_tokens_b", "license", "notes", "gated", "fuzzy_exempt", "input_format",
    "text_field", "id_field", "transform", "bare", "exact_dedup", "provider", "max_dup_removal",
}
_PROVIDER_KEYS = {f.name for f in dataclasses.fields(Provider)}


class _Entry:
    """Typed field access for one raw entry; every failure names entry, field and file."""

    def __init__(self, table: Mapping[str, Any], label: str, path: str, prefix: str = ""):
        self.table, self.label, self.path, self.prefix = table, label, path, prefix

    def fail(self, field: str, problem: str) -> CatalogError:
        qualified = self.prefix + field
        entry = self.label if not self.label.startswith("#") else None
        shown = repr(self.label) if entry is not None else self.label
        return CatalogError(
            f"catalog entry {shown}: field {qualified!r} {problem} (in {self.path})",
            entry=entry, field=qualified, path=self.path,
        )

    def text(self, field: str, default: str | None = None) -> str:
        value = self.table.get(field, default)
        if value is None:
            raise self.fail(field, "is required")
        if not isinstance(value, str):
            raise self.fail(field, f"must be a string, got {type(value).__name__}")
        return value

    def flag(self, field: str, default: bool) -> bool:
        value = self.table.get(field, default)
        if not isinstance(value, bool):
            raise self.fail(field, f"must be true or false, got {value!r}")
        return value

    def globs(self, field: str) -> tuple[str, ...]:
        value = self.table.get(field, [])
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise self.fail(field, "must be a list of non-empty glob strings")
        return tuple(value)


def _check_key(name: str) -> str | None:
    """Why ``name`` cannot be a partition key (or share key), or None when it can."""
    if not name or name != name.strip():
        return "must be non-empty without surrounding spaces"
    for bad in _FORBIDDEN_KEY_SUBSTRINGS:
        if bad in name:
            return f"must not contain {bad!r} (not allowed in a Dagster partition key)"
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in name):
        return "must not contain whitespace or control characters"
    return None


def _check_relative(entry: _Entry, field: str, value: str) -> None:
    if value and (value.startswith("/") or "://" in value or ".." in value.split("/") or "\\" in value
                  or any(ord(ch) < 32 or ord(ch) == 127 for ch in value)):
        raise entry.fail(field, f"must be a relative path without '..', got {value!r}")


@dataclasses.dataclass(frozen=True)
class _Known:
    """What the caller can build (``None``: not checked)."""

    formats: tuple[str, ...] | None = None
    transforms: frozenset[str] | None = None


def _parse_source(table: Any, position: int, path: str, known: _Known = _Known()) -> Source:
    if not isinstance(table, Mapping):
        raise CatalogError(f"catalog entry #{position}: must be a [[source]] table (in {path})", path=path)
    raw_name = table.get("name")
    label = raw_name if isinstance(raw_name, str) and raw_name else f"#{position}"
    e = _Entry(table, label, path)

    name = e.text("name")
    problem = _check_key(name)
    if problem is None and not _SOURCE_NAME.match(name):
        problem = ("must be '/'-separated segments of letters, digits, '.', '_' and '-', each starting with a "
                   "letter or digit (no '..', no leading '/', no characters special to paths or object stores)")  # fmt: skip
    if problem:
        raise e.fail("name", problem)
    unknown = sorted(set(table) - _SOURCE_KEYS)
    if unknown:
        raise e.fail(unknown[0], f"is unknown (allowed: {', '.join(sorted(_SOURCE_KEYS))})")

    tokens = table.get("rough_tokens_b")
    if tokens is None:
        raise e.fail("rough_tokens_b", "is required")
    if isinstance(tokens, bool) or not isinstance(tokens, (int, float)) or not math.isfinite(tokens) or tokens <= 0:
        raise e.fail("rough_tokens_b", f"must be a positive number of billions of tokens, got {tokens!r}")

    input_format = e.text("input_format")
    if known.formats is not None and input_format not in known.formats:
        raise e.fail("input_format", f"has unknown format {input_format!r} (known: {', '.join(known.formats)})")
    text_field = e.text("text_field", "text")
    if not text_field:
        raise e.fail("text_field", "must name a column")
    transform = table.get("transform")
    if transform is not None and (not isinstance(transform, str) or not _RECIPE_NAME.match(transform)):
        raise e.fail("transform", f"must be a snake_case recipe name, got {transform!r}")
    if transform is not None and known.transforms is not None and transform not in known.transforms:
        raise e.fail("transform", f"names no known family transform {transform!r} (known: {', '.join(sorted(known.transforms))})")

    family = e.text("family")
    if not family:
        raise e.fail("family", "must not be empty")
    provider_table = table.get("provider")
    if not isinstance(provider_table, Mapping):
        raise e.fail("provider", "is required ([source.provider] table)")
    return Source(
        name=name,
        family=family,
        rough_tokens_b=float(tokens),
        license=e.text("license", ""),
        notes=e.text("notes", ""),
        gated=e.flag("gated", False),
        fuzzy_exempt=e.flag("fuzzy_exempt", False),
        input_format=input_format,
        text_field=text_field,
        id_field=e.text("id_field", "id") or None,
        transform=transform,
        bare=e.flag("bare", False),
        exact_dedup=e.flag("exact_dedup", True),
        provider=_parse_provider(_Entry(provider_table, label, path, prefix="provider."), name),
        max_dup_removal=_share(e, "max_dup_removal", DEFAULT_MAX_DUP_REMOVAL),
    )


def _share(e: _Entry, field: str, default: float) -> float:
    value = e.table.get(field, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise e.fail(field, f"must be a share of the source's documents from 0 to 1, got {value!r}")
    return float(value)


def _parse_provider(e: _Entry, name: str) -> Provider:
    unknown = sorted(set(e.table) - _PROVIDER_KEYS)
    if unknown:
        raise e.fail(unknown[0], f"is unknown (allowed: {', '.join(sorted(_PROVIDER_KEYS))})")
    kind = e.text("kind")
    if kind not in PROVIDER_KINDS:
        raise e.fail("kind", f"must be one of {', '.join(PROVIDER_KINDS)}, got {kind!r}")

    repo_id = e.text("repo_id", "")
    revision = e.text("revision", "")
    repo_type = e.text("repo_type", "dataset" if kind == "hf" else "")
    url = e.text("url", "")
    sha256 = e.text("sha256", "")
    staged_path = e.text("staged_path", "")
    subdir = e.text("subdir", "")
    expected_shards = e.table.get("expected_shards")

    if kind == "hf":
        if not repo_id:
            raise e.fail("repo_id", "is required for kind 'hf'")
        if not _REPO_ID.match(repo_id):
            raise e.fail("repo_id", f"must look like 'owner/name', got {repo_id!r}")
        if repo_type not in REPO_TYPES:
            raise e.fail("repo_type", f"must be one of {', '.join(REPO_TYPES)}, got {repo_type!r}")
        if not revision:
            raise e.fail("revision", "is required for kind 'hf'")
        if repo_type == "bucket":
            try:
                datetime.date.fromisoformat(revision)
            except ValueError:
                raise e.fail("revision", f"must be a snapshot date YYYY-MM-DD for a bucket, got {revision!r}") from None
        elif not _HEX_REVISION.match(revision):
            raise e.fail("revision", f"must be a 7- or 40-character lowercase hex commit, got {revision!r}")
    else:
        if repo_type:
            raise e.fail("repo_type", f"applies only to kind 'hf', not {kind!r}")
        if revision and not _VERSION_LABEL.match(revision):
            raise e.fail("revision", f"must be a version label without spaces, got {revision!r}")
    if kind == "prestaged":
        if not staged_path:
            raise e.fail("staged_path", "is required for kind 'prestaged'")
        if expected_shards is None:
            raise e.fail("expected_shards", "is required for kind 'prestaged'")
    if kind in ("web", "api"):
        if not url:
            raise e.fail("url", f"is required for kind {kind!r}")
        if not url.startswith(("https://", "http://")):
            raise e.fail("url", f"must be an http(s) URL, got {url!r}")
    if expected_shards is not None and (
        isinstance(expected_shards, bool) or not isinstance(expected_shards, int) or expected_shards <= 0
    ):
        raise e.fail("expected_shards", f"must be a positive integer, got {expected_shards!r}")
    if sha256 and not _SHA256.match(sha256):
        raise e.fail("sha256", f"must be 64 lowercase hex characters, got {sha256!r}")
    _check_relative(e, "staged_path", staged_path)
    _check_relative(e, "subdir", subdir)

    share_key = e.text("share_key", name)
    problem = _check_key(share_key)
    if problem:
        raise e.fail("share_key", problem)
    return Provider(
        kind=kind,
        repo_id=repo_id,
        revision=revision,
        repo_type=repo_type,
        allow=e.globs("allow"),
        exclude=e.globs("exclude"),
        subdir=subdir,
        staged_path=staged_path,
        expected_shards=expected_shards,
        url=url,
        sha256=sha256,
        share_key=share_key,
    )


# ----------------------------------------------------------------------------- reporting


def format_sources_table(catalog: Catalog) -> str:
    """One line per source (name, kind, pin, tokens), then totals overall and per kind."""
    width = max((len(s.name) for s in catalog), default=4)
    lines = [f"{'source':<{width}}  {'kind':<9}  {'tokens_b':>12}  pin"]
    for source in catalog:
        lines.append(
            f"{source.name:<{width}}  {source.provider.kind:<9}  {source.rough_tokens_b:>12,.3f}  {source.provider.pin}"
        )
    per_kind: dict[str, list[float]] = {}
    for source in catalog:
        per_kind.setdefault(source.provider.kind, []).append(source.rough_tokens_b)
    kinds = ", ".join(
        f"{kind} {len(per_kind[kind])} / {math.fsum(per_kind[kind]):,.2f} B"
        for kind in PROVIDER_KINDS
        if kind in per_kind
    )
    lines.append(f"total: {len(catalog)} sources, {catalog.total_tokens_b:,.2f} B tokens ({kinds})")
    return "\n".join(lines)
