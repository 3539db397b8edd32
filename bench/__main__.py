"""`make bench`: run every benchmark script in turn (each prints its own report)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).parent


def main() -> int:
    scripts = sorted(HERE.glob("bench_*.py"))
    wanted = set(sys.argv[1:])
    failed = []
    for script in scripts:
        if wanted and script.stem.removeprefix("bench_") not in wanted:
            continue
        print(f"\n=== {script.stem} ===", flush=True)
        if subprocess.call([sys.executable, str(script)]) != 0:
            failed.append(script.stem)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
