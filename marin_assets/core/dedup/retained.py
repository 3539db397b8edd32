"""The retained members' n-grams of one cluster, as arrays, within a memory budget.

Verification compares each member with the retained members that could contain it, found by
the postings (n-gram -> retained members) of a few of its n-grams. A dict of Python lists costs
~190 bytes per posting (~320 KB per distinct 10 KB member); here a posting is 12 bytes in
sorted runs merged like a binary counter (O(log n) runs, each searched by bisection), and each
member's n-grams are 8 bytes each in one growing store. Past ``memory_bytes`` the runs that are
merged and the n-grams that are added go to files in a temporary folder, read memory-mapped: a
component of any number of distinct documents keeps its resident memory near the budget, with
the same decisions (the postings and n-grams read are the same).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref

import numpy as np


class _Spill:
    """A temporary folder of memory-mapped arrays (created on first use, removed on close)."""

    def __init__(self) -> None:
        self.folder: str | None = None
        self.files = 0

    def array(self, values: np.ndarray) -> np.ndarray:
        if self.folder is None:
            self.folder = tempfile.mkdtemp(prefix="dedup-retained-")
            weakref.finalize(self, shutil.rmtree, self.folder, True)
        path = os.path.join(self.folder, f"{self.files:06d}.bin")
        self.files += 1
        values.tofile(path)
        return np.memmap(path, dtype=values.dtype, mode="r", shape=values.shape) if values.size else values

    def close(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None


class _GramStore:
    """Each retained member's sorted n-grams: in memory until the budget, then appended to one
    spill file (read memory-mapped)."""

    def __init__(self, flush: int) -> None:
        self.flush = flush  # n-grams buffered before an append to the spill file
        self.where: dict[int, tuple[int, int]] = {}  # member -> (start, size) in the spill file (or its buffer)
        self.memory: dict[int, np.ndarray] = {}
        self.pending: list[np.ndarray] = []
        self.pending_size = 0
        self.file_size = 0
        self.path: str | None = None
        self.mapped: np.ndarray | None = None

    def add(self, i: int, grams: np.ndarray, spill: _Spill | None) -> None:
        if spill is None:
            self.memory[i] = grams
            return
        self.where[i] = (self.file_size + self.pending_size, int(grams.size))
        self.pending.append(grams)
        self.pending_size += int(grams.size)
        if self.pending_size >= self.flush:
            self._flush(spill)

    def _flush(self, spill: _Spill) -> None:
        if not self.pending:
            return
        if self.path is None:
            spill.array(np.zeros(0, np.uint64))  # makes the folder
            self.path = os.path.join(spill.folder or "", "grams.bin")
        with open(self.path, "ab") as handle:
            np.concatenate(self.pending).astype(np.uint64, copy=False).tofile(handle)
        self.file_size += self.pending_size
        self.pending, self.pending_size = [], 0
        self.mapped = np.memmap(self.path, dtype=np.uint64, mode="r", shape=(self.file_size,))

    def get(self, i: int) -> np.ndarray:
        if i in self.memory:
            return self.memory[i]
        start, size = self.where[i]
        if start >= self.file_size:  # still buffered
            offset = self.file_size
            for part in self.pending:
                if offset == start:
                    return part
                offset += part.size
        assert self.mapped is not None
        return self.mapped[start : start + size]


class RetainedIndex:
    """Postings and n-grams of a cluster's retained members (see the module docstring)."""

    def __init__(self, memory_bytes: int = 1 << 30) -> None:
        self.memory_bytes = memory_bytes
        self.runs: list[tuple[np.ndarray, np.ndarray]] = []  # (n-gram hashes sorted, member) per run
        self.grams = _GramStore(max(1, memory_bytes // 128))
        self.lengths: dict[int, int] = {}
        self.held = 0  # bytes of the postings and n-grams held in memory
        self.spilled = 0  # bytes written to the spill folder
        self.spill: _Spill | None = None

    def __len__(self) -> int:
        return len(self.lengths)

    def close(self) -> None:
        if self.spill is not None:
            self.spill.close()

    def add(self, i: int, length: int, grams: np.ndarray) -> None:
        """Member ``i`` (of ``length`` characters) is retained: index its sorted n-grams."""
        if self.spill is None and self.held + 20 * grams.size > self.memory_bytes * 3 // 4:  # a quarter left for the runs not yet spilled
            self.spill = _Spill()
        self.lengths[i] = length
        self.grams.add(i, grams, self.spill)
        self.held += 8 * int(grams.size) if self.spill is None else 0
        self.spilled += 8 * int(grams.size) if self.spill is not None else 0
        self._push(grams, np.full(grams.size, i, np.int32))

    def _push(self, hashes: np.ndarray, members: np.ndarray) -> None:
        """Add a run; merge the last two while the older is at most twice the newer. Spilling, a
        run of ``memory_bytes / 8`` or more goes to a file and is merged no more (a merge holds
        both runs), so at most ~``memory_bytes / 4`` of runs stay in memory beside the three
        quarters held before spilling began."""
        self.runs.append((hashes, members))
        self.held += 12 * int(hashes.size)
        frozen = self.memory_bytes // 8
        while len(self.runs) >= 2 and self.runs[-2][0].size <= 2 * self.runs[-1][0].size:
            if self.spill is not None and 12 * (self.runs[-2][0].size + self.runs[-1][0].size) > 2 * frozen:
                break
            (h2, m2), (h1, m1) = self.runs.pop(), self.runs.pop()
            hashes, members = np.concatenate([h1, h2]), np.concatenate([m1, m2])
            order = np.argsort(hashes, kind="stable")
            hashes, members = hashes[order], members[order]
            if self.spill is not None and hashes.size * 12 >= frozen:
                self.held -= 12 * int(hashes.size)
                self.spilled += 12 * int(hashes.size)
                hashes, members = self.spill.array(hashes), self.spill.array(members)
            self.runs.append((hashes, members))

    def counts(self, values: np.ndarray) -> np.ndarray:
        """Per n-gram of ``values``: how many retained members hold it."""
        out = np.zeros(values.size, np.int64)
        for hashes, _ in self.runs:
            out += np.searchsorted(hashes, values, side="right") - np.searchsorted(hashes, values, side="left")
        return out

    def holders(self, values: np.ndarray) -> np.ndarray:
        """The retained members holding any n-gram of ``values``, sorted, each once."""
        found = []
        for hashes, members in self.runs:
            lo = np.searchsorted(hashes, values, side="left")
            count = np.searchsorted(hashes, values, side="right") - lo
            total = int(count.sum())
            if total:
                rows = np.repeat(lo - (np.cumsum(count) - count), count) + np.arange(total)
                found.append(np.asarray(members[rows]))
        return np.unique(np.concatenate(found)) if found else np.zeros(0, np.int32)
