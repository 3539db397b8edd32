"""A long-lived worker hands back what a finished task freed, so its next task starts small."""

from __future__ import annotations

import ctypes
import ctypes.util
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from marin_assets.core.runtime.runner import ShardTask, _run_in_worker

BLOCKS = 200_000  # 1 KiB each: ~200 MiB of small heap blocks, below the size glibc maps apart


def _resident_mib() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024


def _fragmenting_task(inputs: list[str], output: str, params: object) -> dict[str, float]:
    """Allocate many small blocks, touch them, free all but the last: the freed pages sit below a
    live block, so the heap cannot shrink from its top and stays resident until trimmed."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = [libc.malloc(1024) for _ in range(BLOCKS)]
    for block in blocks:
        ctypes.memset(block, 1, 1024)
    held = _resident_mib()
    for block in blocks[:-1]:
        libc.free(block)
    return {"held_mib": held}


def test_a_worker_starts_its_next_task_without_the_last_ones_freed_memory(tmp_path: Path) -> None:
    task = ShardTask(_fragmenting_task, (), str(tmp_path / "out.parquet"))
    # a fresh process, as a Ray worker is (a forked one would start with this test process's heap)
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as worker:
        before = worker.submit(_resident_mib).result()
        result = worker.submit(_run_in_worker, task).result()
        after = worker.submit(_resident_mib).result()
    assert result.stats["held_mib"] - before > 150  # the task really held its blocks
    assert after - before < 50, f"worker at {before:.0f} MiB, {result.stats['held_mib']:.0f} during the task, {after:.0f} after"
