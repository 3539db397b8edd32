"""Nothing a provider sends is trusted: paths stay inside their destination, credentials at home.

* ``safe_relpath`` / ``child_uri``: a path named by a provider (a tree or bucket listing, an
  archive member, a manifest entry) must be a plain relative path that resolves inside the
  folder it is written to; otherwise the copy fails naming the entry.
* ``inside``: every computed storage path is checked to lie under the data root.
* ``same_origin`` / ``credentials_for``: a token is sent only to the scheme, host and port it
  belongs to; a link or redirect elsewhere is followed without it.
* ``sweep_stale``: partial files a killed process left behind (staging folders, ``.tmp-*``
  files) are removed by the next run, never those of a live process.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from urllib.parse import urlsplit

from marin_assets.errors import ConfigurationError, IntegrityFailure


class UnsafePathError(IntegrityFailure):
    """A provider named a path that would be written outside its destination."""


class OutsidePrefixError(ConfigurationError):
    """A computed storage path does not lie under the data root."""


def path_problem(rel: str) -> str | None:
    """Why ``rel`` is not a plain relative path inside its folder, or None when it is."""
    if not isinstance(rel, str) or not rel:
        return "is empty"
    if rel.startswith(("/", "\\")) or "://" in rel or re.match(r"^[A-Za-z]:", rel):
        return "is absolute"
    parts = rel.replace("\\", "/").split("/")
    if any(p in ("..", ".") for p in parts):
        return "climbs out of its folder ('..' or '.')"
    if any(not p for p in parts):
        return "has an empty segment"
    if "\\" in rel:
        return "contains a backslash"
    if re.search(r"[\x00-\x1f\x7f]", rel):
        return "contains control characters"
    return None


def safe_relpath(rel: str, what: str) -> str:
    """``rel`` unchanged when it is a plain relative path; else ``UnsafePathError`` naming it."""
    problem = path_problem(rel)
    if problem:
        raise UnsafePathError(
            f"{what}: the provider named the entry {rel!r}, which {problem}; refusing to write it. "
            f"The provider or mirror serves a hostile or broken listing: check HF_ENDPOINT / the mirror"
        )
    return rel


def child_uri(dest: str, rel: str, what: str) -> str:
    """``dest/rel`` after checking that ``rel`` stays inside ``dest``."""
    safe_relpath(rel, what)
    return dest.rstrip("/") + "/" + rel


def _first_link(folder: str, path: str) -> str:
    """The first link on the way from ``folder`` down to ``path`` (``path`` itself when none is found)."""
    here = folder
    for part in os.path.relpath(path, folder).split(os.sep):
        here = os.path.join(here, part)
        if os.path.islink(here):
            return here
    return path


def real_path_inside(folder: str, path: str, what: str) -> str:
    """``path`` (a local file under ``folder``) when its real path, links resolved, stays inside ``folder``.

    A link that leads out of the folder (a file or folder linked from elsewhere) is refused with
    ``UnsafePathError`` naming the link and its target: what lies outside was never checked.
    """
    root, real = os.path.realpath(folder), os.path.realpath(path)
    if real == root or real.startswith(root + os.sep):
        return path
    link = _first_link(folder, path)
    target = os.readlink(link) if os.path.islink(link) else real
    raise UnsafePathError(
        f"{what}: '{link}' is a link to '{target}', so '{path}' is really '{real}', outside '{folder}'; refusing to "
        f"read it. Copy the file into the folder in place of the link, or remove the link"
    )


def links_inside(folder: str, what: str) -> None:
    """Refuse (``real_path_inside``) any link under the local ``folder`` that leads out of it, file or folder."""
    for here, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(here, name)
            if os.path.islink(path):
                real_path_inside(folder, path, what)


def _normal(uri: str) -> str:
    if "://" in uri:
        scheme, rest = uri.split("://", 1)
        parts: list[str] = []
        for part in rest.split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                if parts:
                    parts.pop()
                continue
            parts.append(part)
        return f"{scheme}://" + "/".join(parts)
    return os.path.normpath(os.path.abspath(uri))


def inside(root: str, uri: str) -> str:
    """``uri`` when it lies under ``root`` (after resolving ``..``); else ``OutsidePrefixError``."""
    base, target = _normal(root).rstrip("/"), _normal(uri)
    if target != base and not target.startswith(base + "/"):
        raise OutsidePrefixError(
            f"storage path {uri!r} is not under the data root {root!r}: a catalog name, subdir or key "
            f"leaves the prefix; fix the catalog entry"
        )
    return uri


def origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) with the scheme's default port filled in."""
    parts = urlsplit(url)
    scheme = (parts.scheme or "").lower()
    port = parts.port or {"http": 80, "https": 443}.get(scheme)
    return scheme, (parts.hostname or "").lower(), port


def same_origin(url: str, home: str) -> bool:
    """Whether ``url`` has the same scheme, host and port as ``home``."""
    return origin(url) == origin(home)


def credentials_for(url: str, home: str, headers: Mapping[str, str]) -> dict[str, str]:
    """``headers`` for a request to ``url``: ``Authorization`` kept only when ``url`` is ``home``'s origin."""
    if same_origin(url, home):
        return dict(headers)
    return {k: v for k, v in headers.items() if k.lower() not in ("authorization", "cookie", "proxy-authorization")}


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (a zombie, killed but not yet reaped, does not)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            state = handle.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (OSError, IndexError):
        return True


_PID_TAG = re.compile(r"-p(\d+)-")


def owner_pid(name: str) -> int | None:
    """The process id a staging or temporary name was tagged with (``...-p<pid>-...``)."""
    match = _PID_TAG.search(name)
    return int(match.group(1)) if match else None


def pid_tag() -> str:
    return f"p{os.getpid()}"


def sweep_stale(folder: str, prefixes: tuple[str, ...]) -> list[str]:
    """Remove entries of ``folder`` named ``<prefix>...-p<pid>-...`` whose process is gone.

    Entries without a pid tag are left alone (they may belong to another tool).
    """
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(prefixes):
            continue
        pid = owner_pid(name)
        if pid is None or pid_alive(pid):
            continue
        path = os.path.join(folder, name)
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.remove(path)
            except OSError:
                continue
        removed.append(path)
    return removed


STAGING_PREFIXES = ("marin-",)


@contextlib.contextmanager
def staging_area(base: str | None, prefix: str) -> Iterator[str]:
    """A local scratch folder under ``base`` (the staging dir, else the system temp), removed after.

    Its name carries this process's id; leftovers of killed processes under ``base`` are
    removed first, so a crash never leaves partial downloads behind for good.
    """
    root = base or tempfile.gettempdir()
    os.makedirs(root, exist_ok=True)
    sweep_stale(root, STAGING_PREFIXES)
    path = tempfile.mkdtemp(prefix=f"{prefix}{pid_tag()}-", dir=root)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
