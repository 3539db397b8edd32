"""What the fault suite injected and what got through: the summary line of ``make faults``."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from pathlib import Path


@dataclasses.dataclass
class Ledger:
    faults: int = 0
    rows_lost: int = 0
    documents_altered: int = 0  # documents a reader or a later stage got with other bytes than were written
    outside: int = 0
    credentials_off_host: int = 0
    peaks: int = 0  # reading processes whose peak resident size (VmHWM) was measured
    peaks_over: int = 0  # ... and found above the size configured for them

    def line(self) -> str:
        return (
            f"fault suite: {self.faults} faults injected, {self.rows_lost} rows lost, {self.documents_altered} documents altered, "
            f"{self.outside} files outside the prefix, {self.credentials_off_host} credentials sent off-host, "
            f"{self.peaks_over} of {self.peaks} measured task peaks over their configured size"
        )


LEDGER = Ledger()


def files_outside(world: Path, allowed: Iterable[Path]) -> list[str]:
    """Every file under ``world`` that is not under one of the ``allowed`` folders (walks the filesystem)."""
    roots = [str(Path(a).resolve()) for a in allowed]
    outside = []
    for folder, _dirs, names in os.walk(world):
        for name in names:
            path = str((Path(folder) / name).resolve())
            if not any(path == r or path.startswith(r + os.sep) for r in roots):
                outside.append(path)
    return outside
