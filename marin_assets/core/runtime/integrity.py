"""What is published is what was computed: digests of published files, checked where it matters.

* ``file_records``: each file of an output folder, its size and xxh3-128 digest, streamed; the
  runner records them in the output's manifest (``files``) when it writes it.
* ``damaged``: the recorded files whose size or digest differ now (``marin-assets verify``, and
  the runner before it reuses an output).
* ``check_text_ids``: a document's ``id`` is the xxh3-128 of its text; a stage that reads the
  text anyway checks it, so a changed text is caught by its first reader.
A mismatch names the file, what differed and the fix (``errors.CorruptOutput``): rematerializing
rebuilds what fails its check.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from marin_assets.core.runtime import kernels, storage
from marin_assets.errors import CorruptOutput

DIGEST = "xxh3_128"
BLOCK_BYTES = 8 << 20
UNRECORDED = (storage.MANIFEST, storage.PARTIAL_DIR, storage.WRITING)  # written after the records, or dropped once it is written


def file_digest(uri: str) -> str:
    """xxh3-128 of a file's bytes, read ``BLOCK_BYTES`` at a time (about 0.1 ms of CPU per MiB)."""
    digest = xxhash.xxh3_128()
    fs, path = storage.filesystem(uri)
    with fs.open(path, "rb") as handle:
        while block := handle.read(BLOCK_BYTES):
            digest.update(block)
    return digest.hexdigest()


def _listing(dir_uri: str) -> dict[str, dict[str, Any]]:
    """Each file under ``dir_uri`` (recursively): relative name -> its listing entry; one listing."""
    fs, path = storage.filesystem(dir_uri)
    if not fs.exists(path):
        return {}
    base = path.rstrip("/") + "/"
    return {
        name[len(base):]: info
        for name, info in fs.find(path, detail=True).items()
        if name.startswith(base) and name[len(base):].split("/", 1)[0] not in UNRECORDED and storage.TMP_MARK not in name
    }


def _digest(dir_uri: str, name: str, info: Mapping[str, Any]) -> str:
    """The file's xxh3-128; on an object store that lists each object's CRC32C (computed by the
    store from the bytes it received, and checked by it), that CRC, with no read of the bytes."""
    if info.get("crc32c"):
        return f"crc32c:{info['crc32c']}"
    return file_digest(storage.join(dir_uri, name))


def _digests(dir_uri: str, listing: Mapping[str, Mapping[str, Any]], names: Sequence[str]) -> list[str]:
    return storage.concurrently(lambda n: _digest(dir_uri, n, listing[n]), names, storage.read_threads([dir_uri]))


def file_records(dir_uri: str) -> dict[str, list[Any]]:
    """``{relative name: [size, digest]}`` of every file under ``dir_uri`` (not its manifest)."""
    if not dir_uri:
        return {}
    listing = _listing(dir_uri)
    names = sorted(listing)
    return {n: [int(listing[n]["size"]), h] for n, h in zip(names, _digests(dir_uri, listing, names))}


def damaged(dir_uri: str, recorded: Mapping[str, Sequence[Any]], digests: bool = True) -> dict[str, str]:
    """The recorded files under ``dir_uri`` that are gone or differ now: ``{name: what differs}``.

    Sizes come from one listing; ``digests`` also reads every file (sizes alone catch truncation
    and missing files, not a flipped bit).
    """
    listing = _listing(dir_uri)
    found: dict[str, str] = {}
    for name, (size, _digest) in recorded.items():
        if name not in listing:
            found[name] = "the file is missing"
        elif int(listing[name]["size"]) != size:
            found[name] = f"its size is {listing[name]['size']} bytes, {size} were written"
    if digests:
        names = sorted(n for n in recorded if n not in found)
        for name, now in zip(names, _digests(dir_uri, listing, names)):
            if now != recorded[name][1]:
                found[name] = f"its digest is {now}, {recorded[name][1]} was written"
    return found


# --------------------------------------------------------------------------- document ids


def text_ids(texts: Sequence[str] | pa.Array | pa.ChunkedArray) -> list[str]:
    """xxh3-128 of each UTF-8 text as 32 lowercase hex characters (hashed from Arrow's bytes:
    no Python string per row): a document's ``id``."""
    if not isinstance(texts, (pa.Array, pa.ChunkedArray)):
        texts = pa.array(list(texts), pa.large_string())
    data, offsets, _ = kernels.string_buffers(texts)
    view, bounds, digest = memoryview(data), offsets.tolist(), xxhash.xxh3_128_hexdigest
    return [digest(view[a:b]) for a, b in zip(bounds, bounds[1:])]


def check_text_ids(uri: str, ids: pa.Array | pa.ChunkedArray, texts: pa.Array | pa.ChunkedArray) -> None:
    """``CorruptOutput`` naming ``uri`` and the first row whose ``id`` is not the hash of its text
    (rows without text are skipped: their id was given, not computed)."""
    if len(texts) == 0:
        return
    valid = pc.is_valid(texts)
    if not pc.all(valid).as_py():
        ids, texts = pc.filter(ids, valid), pc.filter(texts, valid)
    computed = pa.array(text_ids(texts), pa.string())
    same = pc.equal(pc.cast(ids, pa.string()), computed)
    if pc.all(same).as_py():
        return
    row = pc.index(same, False).as_py()
    raise CorruptOutput(
        f"{uri}: row {row} has id {pc.cast(ids, pa.string())[row].as_py()} but its text hashes to {computed[row].as_py()} "
        f"({DIGEST}): the file changed after it was written; {storage.repair_hint(uri)}"
    )
