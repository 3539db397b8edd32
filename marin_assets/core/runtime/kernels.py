"""What every compiled (numba) kernel needs: compilation, read-only array views, and the UTF-8
bytes of an Arrow string column as flat arrays the kernels can walk.

Kernels read text straight from Arrow's buffers: no Python string per row, no copy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def jit(fn: Any) -> Any:
    """Compile ``fn`` with numba (cached on disk, releases the GIL). numba is imported here, by
    the modules that define kernels: a process that only reads string buffers does not load it."""
    import numba  # noqa: PLC0415

    try:
        return numba.njit(cache=True, nogil=True)(fn)
    except RuntimeError:  # no writable cache location (read-only install): compile per process
        return numba.njit(nogil=True)(fn)


def readonly(x: Any, dtype: Any) -> np.ndarray:
    """A read-only contiguous view: the kernels see one array type, so each compiles once."""
    view = np.ascontiguousarray(x, dtype=dtype).view()
    view.setflags(write=False)
    return view


def string_buffers(texts: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(UTF-8 bytes, offsets [n+1] into them, null mask) without copying the text (a null is empty)."""
    if isinstance(texts, pa.ChunkedArray):
        if texts.num_chunks == 0:
            texts = pa.array([], pa.large_string())
        else:
            texts = texts.combine_chunks() if texts.num_chunks != 1 else texts.chunk(0)
    if not (pa.types.is_string(texts.type) or pa.types.is_large_string(texts.type)):
        texts = texts.cast(pa.large_string())
    nulls = texts.is_null().to_numpy(zero_copy_only=False) if texts.null_count else np.zeros(len(texts), bool)
    if texts.null_count:
        texts = pc.fill_null(texts, "")
    buffers = texts.buffers()
    dtype = np.int64 if pa.types.is_large_string(texts.type) else np.int32
    offsets = np.frombuffer(buffers[1], dtype=dtype)[texts.offset: texts.offset + len(texts) + 1].astype(np.int64)
    data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None else np.zeros(0, np.uint8)
    data = data[offsets[0]: offsets[-1]]
    return data, offsets - offsets[0], nulls
