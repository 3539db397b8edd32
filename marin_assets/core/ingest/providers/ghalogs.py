"""GitHub Actions run logs from Zenodo (``web`` kind, transform ``ghalogs_sanitize``).

Nothing is downloaded: the archive (``github_run_logs.zip``, record 14796970, about 143.4 GB)
is staged by hand at ``$MARIN_PREFIX/<staged_path>/<subdir>/<archive name>``, for example::

    curl -L -C - -o "$MARIN_PREFIX/raw/diagnostic_logs/ghalogs/zenodo-14796970/zenodo.org/records/14796970/files/github_run_logs.zip" \\
        https://zenodo.org/records/14796970/files/github_run_logs.zip

(or ``gcloud storage cp`` onto a ``gs://`` prefix). The record page lists the archive's md5.

This provider reads the archive's members in order and stores them, unsanitized as the
archive itself, as zstd JSON-lines chunks of about ``CHUNK_BYTES`` of log text each
(``archive_path``, ``text``, ``utf8_repaired``, ``binary``, ``too_large``: a member over
``formats.MAX_ROW_BYTES`` is not read), chunk boundaries fixed by the
central directory so a rerun resumes chunk by chunk. Sanitizing, partitioning and the train
selection happen in the transform, where every dropped row is counted.
"""

from __future__ import annotations

import json
import os
import zipfile
from typing import Any

import zstandard

from marin_assets.core.ingest import formats
from marin_assets.core.ingest.providers import ProviderAccess, http, rawcopy
from marin_assets.core.ingest.providers.rawcopy import Progress, ProviderError
from marin_assets.core.runtime import storage

CHUNK_BYTES = 256 << 20
WORKERS = 2
_ZIP_MAGIC = b"PK\x03\x04"


def archive_uri(source: Any, layout: storage.Layout) -> str:
    p = source.provider
    name = http.display_url(p.url).rsplit("/", 1)[-1]
    return storage.join(layout.staged(p.staged_path), p.subdir, name)


def _missing_archive(source: Any, where: str) -> ProviderError:
    p = source.provider
    return ProviderError(
        f"source '{source.name}': the archive is not staged: {where} does not exist. It is not downloaded "
        f"automatically (about 143.4 GB): fetch {http.display_url(p.url)} (curl -L -C - -o <that path> <url>, "
        f"or gcloud storage cp for gs:// prefixes), check its md5 against the Zenodo record, then rerun. "
        f"See the docstring of marin_assets.core.ingest.providers.ghalogs"
    )


def plan_chunks(members: list[zipfile.ZipInfo], chunk_bytes: int) -> list[tuple[int, int]]:
    """Contiguous ``[start, end)`` member ranges of about ``chunk_bytes`` uncompressed each."""
    chunks, start, size = [], 0, 0
    for i, member in enumerate(members):
        if size and size + member.file_size > chunk_bytes:
            chunks.append((start, i))
            start, size = i, 0
        size += member.file_size
    if start < len(members):
        chunks.append((start, len(members)))
    return chunks


def member_row(name: str, content: bytes) -> dict[str, Any]:
    """One log file as a row: text decoded (bad bytes replaced and flagged), binaries flagged."""
    if content.startswith(_ZIP_MAGIC) or b"\x00" in content[:8192]:
        return {"archive_path": name, "text": None, "utf8_repaired": False, "binary": True, "too_large": None}
    try:
        text, repaired = content.decode("utf-8"), False
    except UnicodeDecodeError:
        text, repaired = content.decode("utf-8", errors="replace"), True
    return {"archive_path": name, "text": text, "utf8_repaired": repaired, "binary": False, "too_large": None}


def read_member(archive: zipfile.ZipFile, member: zipfile.ZipInfo, max_bytes: int | None = None) -> tuple[dict[str, Any], int]:
    """One member as a row, and the bytes read; at most ``max_bytes`` are inflated (a zip bomb costs no memory).

    A larger member is not kept: its row has no text and ``too_large`` names its size and offset in
    the archive, and the transform counts it as dropped.
    """
    limit = max_bytes or formats.MAX_ROW_BYTES
    with archive.open(member) as stream:  # zipfile serializes reads of the shared handle
        content = stream.read(limit + 1)  # CRC-checked by zipfile at the end of a member read whole
    if len(content) <= limit:
        return member_row(member.filename, content), len(content)
    note = f"{member.file_size} bytes at offset {member.header_offset} of the archive, over the {limit}-byte limit"
    return {"archive_path": member.filename, "text": None, "utf8_repaired": False, "binary": False, "too_large": note}, 0


def _open_zip(source: Any, uri: str) -> tuple[Any, zipfile.ZipFile]:
    fs, path = storage.filesystem(uri)
    handle = fs.open(path, "rb")
    try:
        return handle, zipfile.ZipFile(handle)
    except (zipfile.BadZipFile, OSError) as err:
        handle.close()
        raise ProviderError(
            f"source '{source.name}': the staged archive {uri} is not a readable zip ({err}); the copy is probably "
            f"incomplete: stage it again (see the docstring of marin_assets.core.ingest.providers.ghalogs)"
        ) from None


def fetch(source: Any, layout: storage.Layout, progress: Progress = None, *, access: ProviderAccess = ProviderAccess()) -> dict[str, Any]:
    del access  # nothing is fetched over the network
    p = source.provider
    archive = archive_uri(source, layout)
    if not storage.exists(archive):
        raise _missing_archive(source, archive)
    archive_size = storage.size(archive)
    fp = rawcopy.recipe_fingerprint("ghalogs", source, archive_size=archive_size, chunk_bytes=CHUNK_BYTES)
    uri = rawcopy.dest_uri(layout, rawcopy.url_key(p.url), p.revision, fp)
    if (stored := rawcopy.reused(uri)) is not None:
        return stored
    handle, archive_zip = _open_zip(source, archive)  # one central directory, shared by the chunk threads
    members = [m for m in archive_zip.infolist() if not m.is_dir()]
    if not members:
        handle.close()
        raise ProviderError(f"source '{source.name}': the staged archive {archive} holds no files; stage it again")
    chunks = plan_chunks(members, CHUNK_BYTES)
    stem = os.path.basename(archive).removesuffix(".zip")
    base = "/".join(x for x in (p.subdir.strip("/"), stem) if x)
    paths = [f"{base}/part-{i:05d}-of-{len(chunks):05d}.jsonl.zst" for i in range(len(chunks))]
    copy = rawcopy.RawCopy(uri)
    done = copy.finished()
    rawcopy.say(progress, f"{source.name}: {len(members)} log files in {len(chunks)} chunks, {len(done)} already stored")

    def task(index: int) -> dict[str, Any]:
        start, end = chunks[index]
        counts = {"members": 0, "binary": 0, "utf8_repaired": 0, "too_large": 0, "bytes": 0}
        with storage.open_atomic(storage.join(uri, paths[index])) as out:
            writer = zstandard.ZstdCompressor(level=3, write_checksum=True).stream_writer(out, closefd=False)
            for member in members[start:end]:
                row, size = read_member(archive_zip, member)
                counts["members"] += 1
                counts["binary"] += row["binary"]
                counts["utf8_repaired"] += row["utf8_repaired"]
                counts["too_large"] += row["too_large"] is not None
                counts["bytes"] += size
                writer.write(json.dumps(row, ensure_ascii=False).encode("utf-8") + b"\n")
            writer.flush(zstandard.FLUSH_FRAME)
        record = {"path": paths[index], "size": storage.size(storage.join(uri, paths[index])), "first_member": start, **counts}
        copy.mark(record)
        rawcopy.say(progress, f"{source.name}: stored {paths[index]} ({counts['members']} log files)")
        return record

    todo = [i for i, path in enumerate(paths) if path not in done]
    with handle, archive_zip:
        records, errors = rawcopy.run_tasks([lambda i=i: task(i) for i in todo], WORKERS)
    rawcopy.raise_first(errors, what=f"source '{source.name}'", done=len(done) + len(records), total=len(paths), uri=uri)
    by_path = done | {r["path"]: r for r in records}
    files = [by_path[path] for path in paths]
    return copy.complete({
        "kind": "staged_archive_chunks",
        "source": source.name,
        "url": http.display_url(p.url),
        "archive": {"uri": archive, "size": archive_size},
        "revision": p.revision,
        "fingerprint": fp,
        "files": files,
        "counters": {
            "files": len(files),
            "log_files": sum(f["members"] for f in files),
            "binary_members": sum(f["binary"] for f in files),
            "too_large_members": sum(f.get("too_large", 0) for f in files),
            "utf8_repaired": sum(f["utf8_repaired"] for f in files),
            "bytes": sum(f["bytes"] for f in files),
            "fetched": len(records),
            "reused": len(done),
        },
    })  # fmt: skip
