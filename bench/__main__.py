"""`make bench`: run every benchmark module in turn and print a summary of their goals.

Usage: ``python -m bench [--quick] [--only NAME[,NAME...]] [--strict]`` (names without the
``bench_`` prefix: ``minhash``, ``normalize``, ``embed``, ...). ``--quick`` (or ``BENCH_QUICK=1``)
asks each bench for fewer rounds and smaller inputs. It exits non-zero when a bench fails to run
or a goal is missed (each bench exits 1 on a missed goal of its own, too).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, smaller inputs (same as BENCH_QUICK=1)")
    parser.add_argument("--only", default="", help="comma-separated bench names, e.g. minhash,normalize")
    parser.add_argument("names", nargs="*", help="bench names (same as --only)")
    args = parser.parse_args(argv)
    available = [p.stem.removeprefix("bench_") for p in sorted(HERE.glob("bench_*.py"))]
    wanted = {n for n in args.only.split(",") if n} | set(args.names)
    unknown = wanted - set(available)
    if unknown:
        parser.error(f"unknown bench {', '.join(sorted(unknown))}; choose from {', '.join(available)}")
    env = dict(os.environ)
    if args.quick:
        env["BENCH_QUICK"] = "1"
    root = str(HERE.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    failed: list[str] = []
    with tempfile.NamedTemporaryFile("r", prefix="bench-verdicts-", suffix=".jsonl") as verdicts:
        env["BENCH_VERDICTS"] = verdicts.name
        started = time.perf_counter()
        for name in available:
            if wanted and name not in wanted:
                continue
            print(f"\n=== bench_{name} ===", flush=True)
            begun = time.perf_counter()
            code = subprocess.call([sys.executable, "-m", f"bench.bench_{name}"], cwd=root, env={**env, "BENCH_NAME": name})
            print(f"(bench_{name}: {time.perf_counter() - begun:.0f} s)", flush=True)
            if code != 0 and not any(json.loads(line)["bench"] == name and not json.loads(line)["passed"] for line in open(verdicts.name) if line.strip()):
                failed.append(name)  # failed to run (not: missed a goal, which the summary shows)
        rows = [json.loads(line) for line in verdicts.read().splitlines() if line.strip()]
    print(f"\n=== summary ({time.perf_counter() - started:.0f} s) ===")
    for row in rows:
        print(f"  {'PASS' if row['passed'] else 'MISS'}  {row['bench']:<10} {row['goal']}: {row['measured']}")
    missed = [row for row in rows if not row["passed"]]
    print(f"  {len(rows) - len(missed)} of {len(rows)} goals met" + (f"; benches that failed to run: {', '.join(failed)}" if failed else ""))
    return 1 if failed or missed else 0


if __name__ == "__main__":
    sys.exit(main())
