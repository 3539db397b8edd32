"""Storage under one root URI (``MARIN_PREFIX``): layout, atomic writes, manifests, fingerprints.

Every path is a URI handled by fsspec, so a local directory and ``gs://bucket/prefix`` go
through the same code. Two rules keep killed runs harmless:

* a data file is written to a temporary name and renamed into place (local), or uploaded whole
  in one request (object stores, where an object appears atomically when its upload commits);
* an output directory counts as complete only once its ``_manifest.json`` exists, and the
  manifest is always written last.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import hashlib
import io
import json
import os
import re
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import fsspec
import fsspec.asyn
import pyarrow as pa
import pyarrow.parquet as pq

from marin_assets.core.runtime import retry
from marin_assets.errors import ConfigurationError, CorruptOutput
from marin_assets.core.runtime.trust import inside, pid_alive, pid_tag

MANIFEST = "_manifest.json"
PARTIAL_DIR = "_partial"  # per-file completion markers of a provider copy, dropped once its manifest is written
SHARD_STATS_DIR = "_shards"
DEFAULT_PREFIX = ".marin_data"

# Object stores on which a single-request upload is atomic (no rename needed).
_OBJECT_STORE_PROTOCOLS = {"gs", "gcs", "s3", "s3a", "az", "abfs", "memory"}


# --------------------------------------------------------------------------- URIs


def join(root: str, *parts: str) -> str:
    """Join URI parts with ``/`` (never ``os.path``: URIs are not local paths)."""
    out = root.rstrip("/")
    for part in parts:
        part = str(part).strip("/")
        if part:
            out = f"{out}/{part}"
    return out


def filesystem(uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The fsspec filesystem and the protocol-less path for ``uri``."""
    fs, path = fsspec.core.url_to_fs(uri)
    return fs, path


def _is_object_store(fs: fsspec.AbstractFileSystem) -> bool:
    return any(p in _OBJECT_STORE_PROTOCOLS for p in _protocols(fs))


def resolve_prefix(prefix: str | None = None) -> str:
    """The storage root: the argument (the ``MARIN_PREFIX`` setting), else ``./.marin_data``.

    Local roots are made absolute so that subprocesses and Dagster runs agree on them.
    """
    value = prefix or DEFAULT_PREFIX
    if "://" not in value:
        value = os.path.abspath(os.path.expanduser(value))
    return value.rstrip("/")


def exists(uri: str) -> bool:
    fs, path = filesystem(uri)
    return fs.exists(path)


def listdir(uri: str) -> list[str]:
    """Full URIs of the entries directly under ``uri`` (empty when it does not exist)."""
    fs, path = filesystem(uri)
    if not fs.exists(path):
        return []
    protocol = uri.split("://", 1)[0] + "://" if "://" in uri else ""
    return sorted(protocol + p if protocol and not p.startswith(protocol) else p for p in fs.ls(path, detail=False))


def glob(uri_pattern: str) -> list[str]:
    fs, path = filesystem(uri_pattern)
    protocol = uri_pattern.split("://", 1)[0] + "://" if "://" in uri_pattern else ""
    return sorted(protocol + p if protocol else p for p in fs.glob(path))


def size(uri: str) -> int:
    fs, path = filesystem(uri)
    return int(fs.size(path))


def remove(uri: str, recursive: bool = False) -> None:
    fs, path = filesystem(uri)
    if fs.exists(path):
        with contextlib.suppress(FileNotFoundError):  # a concurrent run removed it (or part of it) first
            fs.rm(path, recursive=recursive)


# --------------------------------------------------------------------------- atomic writes


@contextlib.contextmanager
def open_atomic(uri: str) -> Iterator[io.BufferedWriter]:
    """Open ``uri`` for binary writing so that it appears complete or not at all.

    Local and other POSIX-like filesystems: write ``<name>.tmp-<uuid>`` then rename. Object
    stores: write a local spool file, uploaded when the block closes (an object appears whole
    when its upload ends), so a writer of a 256 MiB shard or flush does not also hold its bytes.
    """
    fs, path = filesystem(uri)
    parent = path.rsplit("/", 1)[0] if "/" in path else ""
    if _is_object_store(fs):
        with tempfile.TemporaryDirectory(prefix="marin-upload-") as spool:
            local = os.path.join(spool, "object")
            with open(local, "wb") as handle:
                yield handle
            fs.put_file(local, path)
        return
    if parent:
        fs.makedirs(parent, exist_ok=True)
    tmp = f"{path}{_tmp_suffix()}"
    try:
        with fs.open(tmp, "wb") as handle:
            yield handle
        fs.mv(tmp, path)
    except BaseException:
        with contextlib.suppress(Exception):
            fs.rm(tmp)
        raise


TMP_MARK = ".tmp-"
_TMP_NAME = re.compile(r"\.tmp-(?:p(\d+)-)?[0-9a-f]{12}$")  # ours, with or without the writer's pid


def _tmp_suffix() -> str:
    """``.tmp-p<pid>-<random>``: the pid lets a later run tell a killed writer's leftover from a live one's."""
    return f"{TMP_MARK}{pid_tag()}-{uuid.uuid4().hex[:12]}"


def sweep_tmp(dir_uri: str) -> list[str]:
    """Remove temporary files that killed writers left under a local ``dir_uri`` (recursively).

    Files of a live process are kept; object stores never hold temporary files.
    """
    root = local_path(dir_uri)
    removed: list[str] = []
    if root is None or not os.path.isdir(root):
        return removed
    for folder, _dirs, names in os.walk(root):
        for name in names:
            match = _TMP_NAME.search(name)
            if match is None:
                continue
            pid = int(match.group(1)) if match.group(1) else None
            if pid is not None and pid_alive(pid):
                continue
            with contextlib.suppress(OSError):
                os.remove(os.path.join(folder, name))
                removed.append(os.path.join(folder, name))
    return removed


def write_bytes(uri: str, data: bytes) -> None:
    fs, path = filesystem(uri)
    if _is_object_store(fs):  # already in memory: one upload
        fs.pipe_file(path, data)
        return
    with open_atomic(uri) as handle:
        handle.write(data)


def content_sha256(uri: str, block_bytes: int = 8 << 20) -> str:
    """The sha256 of a file's bytes, streamed (what a file outside the pipeline is fingerprinted by)."""
    digest = hashlib.sha256()
    fs, path = filesystem(uri)
    with fs.open(path, "rb") as handle:
        while block := handle.read(block_bytes):
            digest.update(block)
    return digest.hexdigest()


def read_bytes(uri: str) -> bytes:
    fs, path = filesystem(uri)
    return fs.cat_file(path)


def write_json(uri: str, payload: Any) -> None:
    write_bytes(uri, json.dumps(payload, indent=2, sort_keys=True, default=_json_default).encode())


def read_json(uri: str) -> Any:
    return json.loads(read_bytes(uri))


def put_file(local_path: str, uri: str) -> None:
    """Copy a finished local file to ``uri`` atomically."""
    fs, path = filesystem(uri)
    if _is_object_store(fs):
        fs.put_file(local_path, path)
        return
    with open(local_path, "rb") as src, open_atomic(uri) as dst:
        while chunk := src.read(8 << 20):
            dst.write(chunk)


def move_file(source: str, uri: str) -> None:
    """Move a finished local file to ``uri`` atomically: a rename when ``uri`` is on the same
    local filesystem (no second pass over the bytes), else a copy (``put_file``) and a delete."""
    path = local_path(uri)
    if path is not None:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        try:
            os.replace(source, path)
            return
        except OSError:  # another filesystem: copy
            pass
    put_file(source, uri)
    os.remove(source)



@contextlib.contextmanager
def atomic_local_path(path: str) -> Iterator[str]:
    """A temporary path next to the local file ``path`` for a native writer; renamed to ``path``
    when the block ends, removed if it fails (the file appears complete or not at all)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}{_tmp_suffix()}"
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise

# --------------------------------------------------------------------------- parquet

PARQUET_COMPRESSION = "zstd"


def local_path(uri: str) -> str | None:
    """The plain filesystem path of a local URI (native writers are faster than file objects)."""
    if uri.startswith("/") and os.path.normpath(uri) == uri:
        return uri  # an absolute plain path already (no filesystem lookup: called once per file piece)
    fs, path = filesystem(uri)
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return path if "file" in protocols or "local" in protocols else None


# Every Parquet file the pipeline writes carries a CRC of each page, and every read through this
# module checks them: a flipped bit in a data page fails the read, naming the file.
PARQUET_WRITE_OPTIONS = {"compression": PARQUET_COMPRESSION, "write_page_checksum": True}
# How polars wrote the frames it hands over: plain pages, no dictionary (pyarrow's default starts
# one for unique texts and ids and drops it part-way, leaving every reader a part to decode).
POLARS_WRITE = {"compression_level": 3, "row_group_size": 512 * 512, "use_dictionary": False}


def repair_hint(uri: str) -> str:
    """The fix for a published file that is damaged: its partition rebuilt, not reused."""
    return f"rematerialize the partition whose output holds {uri}: an output that fails its check is rebuilt, not reused"


@contextlib.contextmanager
def reading_parquet(uri: str) -> Iterator[None]:
    """Errors of a Parquet reader (a page whose checksum fails, a cut-off file, a broken footer)
    as ``CorruptOutput`` naming the file and the fix; a missing file, a dropped connection or a
    timeout stay what they are (a retry may help those)."""
    try:
        yield
    except (FileNotFoundError, ConnectionError, TimeoutError):
        raise
    except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:  # the last: footer statistics no longer UTF-8
        raise CorruptOutput(f"{uri} cannot be read as Parquet ({exc}); {repair_hint(uri)}") from exc


def parquet_file(source: Any, **options: Any) -> pq.ParquetFile:
    """A Parquet reader that checks every page's checksum."""
    return pq.ParquetFile(source, page_checksum_verification=True, **options)


def write_parquet(table: Any, uri: str, row_group_size: int | None = None) -> None:
    """Write a zstd Parquet file with page checksums atomically from a pyarrow Table or a
    polars DataFrame (whose strings are written as Arrow's large strings, as polars writes them)."""
    options: dict[str, Any] = dict(PARQUET_WRITE_OPTIONS, row_group_size=row_group_size)
    if hasattr(table, "to_arrow"):
        import polars as pl  # noqa: PLC0415 - only for frames polars hands over

        table = table.to_arrow(compat_level=pl.CompatLevel.oldest())
        options.update({k: options.get(k) or v for k, v in POLARS_WRITE.items()})
    path = local_path(uri)
    if path is not None:
        with atomic_local_path(path) as tmp:
            pq.write_table(table, tmp, **options)
        return
    with open_atomic(uri) as handle:
        pq.write_table(table, handle, **options)


def read_parquet(uri: str, columns: Sequence[str] | None = None) -> pa.Table:
    fs, path = filesystem(uri)
    with reading_parquet(uri), fs.open(path, "rb") as handle:  # ParquetFile, not read_table: no dataset layer (a 0.2 s import per process)
        return parquet_file(handle).read(columns=list(columns) if columns is not None else None)


def read_parquet_object(uri: str, columns: Sequence[str] | None = None) -> pa.Table:
    """:func:`read_parquet` of a file read for most of its bytes, in one request: from an object
    store the whole object in one GET (then decoded from memory), not a size lookup, its footer
    and its column chunks in reads that grow with its size."""
    fs, path = filesystem(uri)
    if "file" in _protocols(fs):
        return read_parquet(uri, columns)
    with reading_parquet(uri):
        return parquet_file(pa.BufferReader(fs.cat_file(path))).read(columns=list(columns) if columns is not None else None)


PARQUET_TAIL = 64 << 10  # a footer read at least: most files' metadata in one request
COALESCE_GAP = 1 << 20  # column chunks this close are fetched in one ranged read


def _parquet_footer(fs: fsspec.AbstractFileSystem, path: str, uri: str) -> bytes:
    """A Parquet file's footer (metadata, its length, the magic), from one ranged read of the
    object's end (a second only where the metadata is longer than that read)."""
    tail = fs.cat_file(path, start=-PARQUET_TAIL)
    if len(tail) < 12 or tail[-4:] != b"PAR1":
        raise CorruptOutput(f"{uri} is no Parquet file (it does not end in PAR1); {repair_hint(uri)}")
    need = int.from_bytes(tail[-8:-4], "little") + 8
    if need > len(tail):
        tail = fs.cat_file(path, start=-need)
    return tail[len(tail) - need :]


def _footer_metadata(footer: bytes) -> pq.FileMetaData:
    # the footer behind a leading magic: all that the metadata reader looks at
    return pq.ParquetFile(pa.BufferReader(b"PAR1" + footer)).metadata


def parquet_num_rows(uri: str) -> int:
    """A Parquet file's rows, from its footer: from an object store one ranged read of its end,
    not a size lookup and then reads."""
    fs, path = filesystem(uri)
    with reading_parquet(uri):
        if "file" in _protocols(fs):
            return pq.ParquetFile(path).metadata.num_rows
        return _footer_metadata(_parquet_footer(fs, path, uri)).num_rows


class _KnownParts(io.RawIOBase):
    """A file of which only some byte ranges were fetched, for a Parquet reader given the
    metadata: a read outside them is a bug, not a silent zero."""

    def __init__(self, uri: str, size: int, parts: dict[int, bytes]) -> None:
        self.uri, self.size, self.parts, self.position = uri, size, sorted(parts.items()), 0

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self.position = offset if whence == 0 else self.position + offset if whence == 1 else self.size + offset
        return self.position

    def tell(self) -> int:
        return self.position

    def read(self, n: int = -1) -> bytes:
        """``n`` bytes from the parts that hold them (a read may span adjacent parts)."""
        n = self.size - self.position if n is None or n < 0 else n
        out, at, end = [], self.position, self.position + n
        for start, data in self.parts:
            if start <= at < start + len(data):
                out.append(data[at - start : min(len(data), end - start)])
                at = min(start + len(data), end)
                if at == end:
                    self.position = end
                    return b"".join(out)
        raise ValueError(f"{self.uri}: bytes {self.position}..{end} were not fetched")


def fetch_ranges(fs: Any, path: str, ranges: Sequence[tuple[int, int]], tail: bytes = b"", tail_at: int | None = None) -> list[bytes]:
    """The bytes of each ``(start, end)`` of ``ranges`` (sorted, disjoint) of one file: from
    ``tail`` (its bytes from ``tail_at`` on, already read) where they lie there, else in ranged
    reads of runs of ranges less than :data:`COALESCE_GAP` apart (a block reader's spans with
    few bytes between them, a Parquet row group's column chunks: one request, not one each)."""
    out = [b""] * len(ranges)
    runs: list[list[int]] = []  # [start, end, first range, last range]
    for k, (a, b) in enumerate(ranges):
        if b <= a:
            continue
        if tail_at is not None and a >= tail_at:
            out[k] = tail[a - tail_at : b - tail_at]
        elif runs and a - runs[-1][1] <= COALESCE_GAP:
            runs[-1][1], runs[-1][3] = b, k
        else:
            runs.append([a, b, k, k])
    for start, end, first, last in runs:
        data = fs.cat_file(path, start, end)
        for k in range(first, last + 1):
            a, b = ranges[k]
            if b > a and not (tail_at is not None and a >= tail_at):
                out[k] = data[a - start : b - start]
    return out


def read_parquet_columns(uri: str, columns: Sequence[str]) -> pa.Table:
    """Some columns of a Parquet file: from an object store its footer (one ranged read of its
    end), then those columns' chunks (:func:`fetch_ranges`: one ranged read per run of nearby
    chunks, one for a file of one row group), not a size lookup and reads that grow with the
    file's size."""
    fs, path = filesystem(uri)
    if "file" in _protocols(fs):
        return read_parquet(uri, columns)
    footer = _parquet_footer(fs, path, uri)
    with reading_parquet(uri):
        meta = _footer_metadata(footer)
    wanted = set(columns)
    spans: list[tuple[int, int]] = []
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            chunk = group.column(c)
            if chunk.path_in_schema.split(".")[0] in wanted:
                start = chunk.dictionary_page_offset if chunk.has_dictionary_page and chunk.dictionary_page_offset else chunk.data_page_offset
                spans.append((start, start + chunk.total_compressed_size))
    spans.sort()
    parts = dict(zip([start for start, _ in spans], fetch_ranges(fs, path, spans)))
    size = max([end for _, end in spans], default=4) + len(footer)
    with reading_parquet(uri):
        return parquet_file(_KnownParts(uri, size, parts), metadata=meta, pre_buffer=False).read(columns=list(columns), use_threads=False)


def shard_name(index: int, total: int) -> str:
    """``part-00003-of-00008.parquet``: the basename shared by co-partitioned datasets."""
    return f"part-{index:05d}-of-{total:05d}.parquet"


def list_shards(dir_uri: str) -> list[str]:
    """The ``part-*.parquet`` files directly under ``dir_uri``, in shard order."""
    return [u for u in listdir(dir_uri) if u.rsplit("/", 1)[-1].startswith("part-") and u.endswith(".parquet")]


def basename(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1]


# --------------------------------------------------------------------------- manifests


def manifest_uri(dir_uri: str) -> str:
    return join(dir_uri, MANIFEST)


def is_complete(dir_uri: str) -> bool:
    """An output directory is complete when its manifest exists (it is written last)."""
    return exists(manifest_uri(dir_uri))


def write_manifest(dir_uri: str, payload: Mapping[str, Any]) -> None:
    """Mark ``dir_uri`` complete; leftovers of killed writers in it are removed first."""
    sweep_tmp(dir_uri)
    write_json(manifest_uri(dir_uri), dict(payload))


def read_manifest(dir_uri: str) -> dict[str, Any] | None:
    uri = manifest_uri(dir_uri)
    return read_json(uri) if exists(uri) else None


def shard_stats_uri(output_shard_uri: str) -> str:
    """Per-shard completion record: written after the shard itself, read on resume."""
    parent, name = output_shard_uri.rsplit("/", 1)
    return join(parent, SHARD_STATS_DIR, name.removesuffix(".parquet") + ".json")


CURRENT = "_current.json"


def publish_current(group_uri: str, fingerprint: str, uri: str, **extra: Any) -> None:
    """Point ``<group>/_current.json`` at the output a stage produced last for this group.

    A group is one stage's outputs for one source (or one global asset); later stages read the
    pointer to find their inputs without asking the orchestrator.
    """
    write_json(join(group_uri, CURRENT), {"fingerprint": fingerprint, "uri": uri, **extra})


def read_current(group_uri: str) -> dict[str, Any] | None:
    uri = join(group_uri, CURRENT)
    return read_json(uri) if exists(uri) else None


# --------------------------------------------------------------------------- one writer per output

WRITING = "_writing.json"  # an output folder's writer: who, since when, last heartbeat
STALE_AFTER_S = 300.0  # a writer whose heartbeat is older is gone (a lost machine); on this host a dead pid is gone at once
HEARTBEAT_S = 30.0
WRITER: contextvars.ContextVar[str] = contextvars.ContextVar("marin_writer", default="")  # the run, as the orchestrator names it


class OutputBusy(ConfigurationError):
    """Another live run writes this output folder now."""


def _writer_record() -> dict[str, Any]:
    return {"run": WRITER.get() or f"process {os.getpid()}", "host": socket.gethostname(), "pid": os.getpid(),
            "token": uuid.uuid4().hex, "since": time.time(), "heartbeat": time.time()}  # fmt: skip


def _create_exclusive(uri: str, payload: Mapping[str, Any]) -> bool:
    """Create ``uri`` holding ``payload`` unless it exists (False): a hard link of a finished
    temporary file on local disk, an upload on condition that no generation exists on Cloud Storage."""
    data = json.dumps(dict(payload)).encode()
    path = local_path(uri)
    if path is not None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}{_tmp_suffix()}"
        with open(tmp, "wb") as handle:
            handle.write(data)
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        finally:
            os.remove(tmp)
    fs, fspath = filesystem(uri)
    if fs.exists(fspath):
        return False
    try:
        fs.pipe_file(fspath, data, mode="create")
    except FileExistsError:
        return False
    return read_json(uri).get("token") == payload["token"]  # a store without the condition: the last writer holds it


def _gone(holder: Mapping[str, Any]) -> bool:
    if holder.get("host") == socket.gethostname() and not pid_alive(int(holder.get("pid", 0))):
        return True
    return time.time() - float(holder.get("heartbeat", 0)) > STALE_AFTER_S


@contextlib.contextmanager
def one_writer(dir_uri: str) -> Iterator[None]:
    """Hold ``dir_uri`` for this run while the block runs: a second run that wants to write it
    stops at once with ``OutputBusy`` naming the first (its run, host and process); a holder
    whose process is gone (or whose heartbeat stopped) is replaced."""
    uri, mine = join(dir_uri, WRITING), _writer_record()
    while not _create_exclusive(uri, mine):
        try:
            holder = read_json(uri)
        except (FileNotFoundError, ValueError):  # released meanwhile, or written this instant
            continue
        if not _gone(holder):
            raise OutputBusy(
                f"{dir_uri} is being written by {holder.get('run')} (process {holder.get('pid')} on {holder.get('host')}, "
                f"since {time.strftime('%H:%M:%S', time.localtime(float(holder.get('since', 0))))}); wait for it to finish, "
                f"then materialize again: its output is reused"
            )
        if read_json(uri).get("token") == holder.get("token"):
            remove(uri)
    beating = threading.Event()

    def heartbeat() -> None:
        while not beating.wait(HEARTBEAT_S):
            write_json(uri, dict(mine, heartbeat=time.time()))

    thread = threading.Thread(target=heartbeat, daemon=True, name="marin-writer-heartbeat")
    thread.start()
    try:
        yield
    finally:
        beating.set()
        thread.join()
        with contextlib.suppress(FileNotFoundError, ValueError):
            if read_json(uri).get("token") == mine["token"]:
                remove(uri)


# --------------------------------------------------------------------------- fingerprints


def _json_default(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=_json_default)


def fingerprint(stage: str, params: Any = None, code_version: str = "1", inputs: Sequence[str] = ()) -> str:
    """16 hex chars of sha256 over the stage name, its parameters, code version and input fingerprints.

    Merkle-like: a changed input fingerprint changes every fingerprint downstream of it.
    Paths are deliberately not hashed, so re-rooting a prefix keeps fingerprints stable.
    """
    payload = {"stage": stage, "params": params, "code_version": code_version, "inputs": list(inputs)}
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- layout


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where each kind of output lives under the root; a stage's own folders
    come from its spec (``core.runtime.stages.StageSpec``)."""

    root: str

    def _under(self, *parts: str) -> str:
        """``root/parts...``, refused unless it lies under the root (names come from the catalog)."""
        return inside(self.root, join(self.root, *parts))

    def raw(self, key: str, revision: str) -> str:
        return self._under("raw", key, revision)

    def staged(self, relative_path: str) -> str:
        return self._under(relative_path)


# --------------------------------------------------------------------------- reading many objects

READ_THREADS = 16  # files read at once by one task from an object store (requests wait on latency, not CPU)


def read_threads(uris: Sequence[str]) -> int:
    """Threads for reading ``uris``: READ_THREADS from a remote store, one from local disk (where
    a read waits on nothing and threads only cost CPU)."""
    remote = bool(uris) and "://" in uris[0] and not uris[0].startswith("file://")
    return READ_THREADS if remote else 1


def concurrently(fn: Any, items: Sequence[Any], threads: int = READ_THREADS) -> list[Any]:
    """``[fn(x) for x in items]``, up to ``threads`` at a time, results in order: a task that
    reads many files waits for one round trip per ``threads`` files, not per file."""
    if len(items) <= 1 or threads <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=min(threads, len(items))) as pool:
        return list(pool.map(fn, items))


# --------------------------------------------------------------------------- one object, one request

STREAM_BUFFER = 1 << 20  # bytes of a streamed object held at once by its reader


def open_stream(uri: str, buffer_bytes: int = STREAM_BUFFER) -> Any:
    """``uri`` read front to back through one GET of the whole object, its body taken as it
    arrives (``buffer_bytes`` at a time): one request whatever its size, where a ranged reader
    makes one per read-ahead. For a reader that reads every byte in order (a merge); a store may
    offer its own (``fs.open_stream``), local files are opened as they are."""
    fs, path = filesystem(uri)
    own = getattr(fs, "open_stream", None)
    if own is not None:
        return own(path, buffer_bytes)
    if "file" in _protocols(fs):
        return open(path, "rb", buffering=buffer_bytes)
    if "gs" in _protocols(fs):
        return io.BufferedReader(_GcsObjectStream(fs, path), buffer_bytes)
    return fs.open(path, "rb", block_size=buffer_bytes, cache_type="readahead")


def _protocols(fs: fsspec.AbstractFileSystem) -> tuple[str, ...]:
    return tuple(fs.protocol) if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)


class _GcsObjectStream(io.RawIOBase):
    """The body of one Cloud Storage GET (the object's media download), read as it arrives with
    the filesystem's credentials. Each stream has a connection of its own (a merge holds up to
    1,024 open at once, past any shared pool's limit, and a stream waits while the others are
    read); a connection that breaks mid-body is resumed from the byte reached, at the same
    object generation, a few times before the read fails. Each GET (the first, and each resume) is
    tried again after a 429, a 5xx or a refused connection, waiting per ``POLICY``."""

    RESUMES = 3
    POLICY = retry.RetryPolicy(attempts=8, base_wait_s=1.0, min_wait_s=1.0, max_wait_s=60.0, max_jitter_s=5.0)

    def __init__(self, fs: Any, path: str) -> None:
        self._fs, self._path = fs, path
        self._session: Any = None
        self._response: Any = None
        self._position, self._generation = 0, None
        try:
            fsspec.asyn.sync(fs.loop, self._open)
        except BaseException:
            self.close()
            raise

    async def _open(self) -> None:
        import aiohttp  # noqa: PLC0415
        from gcsfs.retry import validate_response  # noqa: PLC0415

        if self._session is None:  # no overall timeout: a merge reads its inputs for as long as it runs
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=60))
        url = self._fs.url(self._path, generation=self._generation) if self._generation else self._fs.url(self._path)
        headers = self._fs._get_headers({"Range": f"bytes={self._position}-"} if self._position else None)
        last = self.POLICY.attempts - 1
        for attempt in range(self.POLICY.attempts):  # a 5xx, 429 or refused connection, at open and on resume
            try:
                response = await self._session.get(url=url, params=self._fs._get_params({}), headers=headers)
            except (aiohttp.ClientConnectionError, asyncio.TimeoutError):
                if attempt == last:
                    raise
                await asyncio.sleep(self.POLICY.wait_s(attempt))
                continue
            if response.status in retry.RETRY_STATUS and attempt < last:
                reset = retry.rate_limit_reset(response.headers)
                response.release()
                await asyncio.sleep(self.POLICY.wait_s(attempt, reset))
                continue
            if response.status >= 400:
                body = await response.read()
                response.release()
                validate_response(response.status, body, url)
            break
        self._generation = self._generation or response.headers.get("x-goog-generation")
        self._response = response

    async def _read(self, n: int) -> bytes:
        import aiohttp  # noqa: PLC0415

        for attempt in range(self.RESUMES + 1):
            try:
                data = await self._response.content.read(n)
                self._position += len(data)
                return data
            except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, asyncio.TimeoutError):
                if attempt == self.RESUMES:
                    raise
                self._response.release()
                await self._open()
        return b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = fsspec.asyn.sync(self._fs.loop, self._read, len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            if self._response is not None:
                self._response.release()
            if self._session is not None:
                fsspec.asyn.sync(self._fs.loop, self._session.close)
        super().close()
