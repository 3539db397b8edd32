"""The offsets index of a merge level's block files: a reader of many files fetches each one's
blocks in one request, without a size lookup or a read of its tail first.

A block file (:func:`.shuffle.write_blocks`) ends with its blocks' byte offsets. A task that
reads one block range from each of F files would, from the files alone, make per file a size
lookup, a read of that tail and a read of its blocks: about 3F requests, and 2F where a file
is small enough that the tail read holds it all (so the count would grow with the corpus).
The final level of a merge (:func:`.fanin.bounded`) ends with one task that reads every merged
file's tail once and writes, beside them, ``offsets.index``: a header (magic, F, B) and the
``(B + 1) x F`` offsets, block-major, so the offsets of block ``b`` of all F files lie in one
row. A reader of such files reads the rows of its blocks (one request: F and B are in the files'
names, so the header is not read), then each file's bytes in one ranged request per run of
nearby spans: F + 1 requests at any file size.

Merged files are found by name (``merged-<level>-b<B>/part-<i>-of-<F>.blocks``, :func:`index_of`):
every final merge level writes its index before any reader runs.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from marin_assets.core.runtime import storage

INDEX_NAME = "offsets.index"
MERGED_PREFIX = "merged-"
_MAGIC = b"MRNBIX01"
_HEADER = len(_MAGIC) + 16  # magic, files, blocks
_PART = re.compile(r"part-(\d+)-of-(\d+)\.blocks")
_MERGED = re.compile(MERGED_PREFIX + r"\d+-b(\d+)")
TAIL_BYTES = 64 << 10  # a tail read at least: a small file's offsets in one request
ROW_CHUNK_BYTES = 8 << 20  # rows of the index read at once, at most (more: one read per span edge)


def merged_folder(level: int, blocks: int) -> str:
    """The folder name of a final merge level whose files hold ``blocks`` blocks each."""
    return f"{MERGED_PREFIX}{level}-b{blocks}"


def index_of(uri: str) -> tuple[str, int, int, int] | None:
    """``(index uri, column, files, blocks)`` of a file a final merge level wrote (file ``column``
    of ``files``, each of ``blocks`` blocks), else None."""
    folder, _, name = uri.rpartition("/")
    match, level = _PART.fullmatch(name), _MERGED.fullmatch(folder.rpartition("/")[2])
    if not match or not level:
        return None
    return f"{folder}/{INDEX_NAME}", int(match[1]), int(match[2]), int(level[1])


def read_tail(uri: str, blocks: int | None = None) -> tuple[np.ndarray, bytes, int]:
    """A block file's ``count + 1`` block offsets, from one ranged read of its end (no size
    lookup): the last ``TAIL_BYTES``, or exactly its offsets where ``blocks`` says they are longer.
    Also the bytes read and where they start in the file: a block inside them needs no other read
    (a file this small was read whole)."""
    fs, path = storage.filesystem(uri)
    tail = max(TAIL_BYTES, 8 * (blocks + 2) if blocks is not None else 0)
    data = fs.cat_file(path, start=-tail)
    count = int(np.frombuffer(data[-8:], "<u8")[0]) if len(data) >= 8 else -1
    need = 8 * (count + 2)
    if count < 0 or (need > len(data) and len(data) < tail):  # the whole file was read
        raise ValueError(f"{uri} is no block file: its last 8 bytes count {count} blocks, more than its {len(data)} bytes hold; remove the run's _work folder and rerun")
    if need > len(data):
        data = fs.cat_file(path, start=-need)
    offsets = np.frombuffer(data[len(data) - need : len(data) - 8], "<u8").astype(np.int64)
    return offsets, data, int(offsets[-1]) + need - len(data)


def write_index(files: Sequence[str], uri: str) -> int:
    """Read every file's offsets (concurrently) and write the index of ``files`` to ``uri``; its blocks per file."""
    offsets = storage.concurrently(lambda uri: read_tail(uri)[0], list(files), storage.read_threads(list(files)))
    blocks = {o.size - 1 for o in offsets}
    if len(blocks) != 1:
        raise ValueError(f"{uri}: the files of one merge level hold {sorted(blocks)} blocks; they must be cut alike. Remove the run's _work folder and rerun")
    (count,) = blocks
    named = index_of(files[0]) if files else None
    if named is not None and named[3] != count:
        raise ValueError(f"{uri}: its files hold {count} blocks where their folder's name says {named[3]}; remove the run's _work folder and rerun")
    matrix = np.stack(offsets, axis=1).astype("<u8")  # row b: block b's start in every file
    storage.write_bytes(uri, _MAGIC + np.asarray([len(files), count], "<u8").tobytes() + matrix.tobytes())
    return count


def _rows(fs: Any, path: str, files: int, wanted: Sequence[int]) -> dict[int, np.ndarray]:
    """The index rows ``wanted`` (sorted, distinct): consecutive ones read at once, up to ``ROW_CHUNK_BYTES``."""
    row_bytes = 8 * files
    chunks: list[list[int]] = []
    for row in wanted:
        if chunks and (row - chunks[-1][0] + 1) * row_bytes <= ROW_CHUNK_BYTES and row - chunks[-1][1] <= 64:
            chunks[-1][1] = row
        else:
            chunks.append([row, row])
    out: dict[int, np.ndarray] = {}
    for a, b in chunks:
        data = fs.cat_file(path, _HEADER + a * row_bytes, _HEADER + (b + 1) * row_bytes)
        if len(data) != (b - a + 1) * row_bytes:
            raise ValueError(f"{path} holds no rows {a}..{b} of {files} files: it is cut short or of another merge; remove the run's _work folder and rerun")
        matrix = np.frombuffer(data, "<u8").reshape(b - a + 1, files).astype(np.int64)
        out.update({row: matrix[row - a] for row in range(a, b + 1)})
    return out


def _streams(data: bytes) -> list[pa.Table]:
    """The blocks in ``data``: Arrow IPC streams one after another."""
    buffer = pa.py_buffer(data)
    reader = pa.BufferReader(buffer)
    pieces = []
    while reader.tell() < buffer.size:
        pieces.append(pa.ipc.open_stream(reader).read_all())
    return pieces


def read_indexed(index: str, members: Sequence[tuple[int, str]], files: int, count: int, spans_of: Callable[[int], Sequence[tuple[int, int]]], blocks: int | None = None) -> dict[str, list[pa.Table]]:
    """The blocks of ``spans_of(count)`` of the files ``members`` (column, uri) of one index (of
    ``files`` files of ``count`` blocks, as their names say): per file, its non-empty blocks in
    span order. ``blocks``: how many blocks the reader expects each file to hold (another count
    is an error)."""
    fs, path = storage.filesystem(index)
    if blocks is not None and count != blocks:
        raise ValueError(f"{index}: its files hold {count} blocks where their readers expect {blocks}: they were written at other cuts; remove the run's _work folder and rerun")
    spans = [(int(a), int(b)) for a, b in spans_of(count) if b > a]
    for b0, b1 in spans:
        if not 0 <= b0 < b1 <= count:
            raise ValueError(f"{index}: its files hold {count} blocks, not blocks {b0}..{b1 - 1}")
    rows = _rows(fs, path, files, sorted({b for span in spans for b in span})) if spans else {}
    def fetch(member: tuple[int, str]) -> list[pa.Table]:
        col, uri = member
        fs_, path_ = storage.filesystem(uri)
        ranges = [(int(rows[b0][col]), int(rows[b1][col])) for b0, b1 in spans]
        return [piece for data in storage.fetch_ranges(fs_, path_, ranges) for piece in _streams(data)]

    out = dict(zip([uri for _, uri in members], storage.concurrently(fetch, list(members), storage.read_threads([uri for _, uri in members]))))
    return out


def group_indexed(uris: Sequence[str]) -> tuple[dict[tuple[str, int, int], list[tuple[int, str]]], list[str]]:
    """``uris`` split into those of merged folders, by (index, files, blocks), and the rest."""
    groups: dict[tuple[str, int, int], list[tuple[int, str]]] = {}
    rest = []
    for uri in uris:
        found = index_of(uri)
        if found is None:
            rest.append(uri)
        else:
            groups.setdefault((found[0], found[2], found[3]), []).append((found[1], uri))
    return groups, rest
