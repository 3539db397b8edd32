"""Compare two data roots (``MARIN_PREFIX``) file by file, e.g. a ``make demo`` before and after a change.

Files are matched by relative path with fingerprint folder names (16 hex chars) replaced by
``<fp>`` and renamed stage folders mapped (``--rename attributes/minhash=attributes/minhash_buckets``).
Data files are compared byte for byte; JSON, YAML and text files, and the string columns of a
Parquet file that names its root, after replacing each root by ``<root>`` (some record absolute paths). JSON keys that differ between any two runs (timings
``*_seconds``, ``docs_per_second``, a shard's ``cpu_s``, ``warmup_cpu_s`` and ``rss_kb``, the eval index ``build_id``) are compared as present, not by
value. Records of the runner (``_manifest.json``, ``_current.json``, pin records) hold
fingerprints and are listed apart, not compared. Use one demo Hub (``MARIN_DEMO_HUB``) for both
runs: the demo Hub's commit ids depend on when it was built, and every fingerprint on them.

    .venv/bin/python scripts/compare_roots.py BEFORE AFTER [--rename OLD=NEW ...]

``--rows`` compares Parquet files by their rows (values, column names and types, a large string
the same as a string) instead of their bytes: for a change that writes the same rows in another
encoding (page checksums, another writer, other row-group sizes).

Exits 1 when a data file differs or exists on one side only.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys

FP = re.compile(r"^[0-9a-f]{16}$")
RECORDS = ("_manifest.json", "_current.json")
TEXT = (".json", ".csv", ".txt", ".md", ".jsonl", ".yaml")
VOLATILE = re.compile(r"(_seconds|^docs_per_second|^build_id|^cpu_s|^warmup_cpu_s|^rss_kb)$")


def key(rel: str, renames: list[tuple[str, str]]) -> str:
    for old, new in renames:
        if rel == old or rel.startswith(old + "/"):
            rel = new + rel[len(old):]
    return "/".join("<fp>" if FP.match(p) else p for p in rel.split("/"))


def is_record(rel: str) -> bool:
    return rel.rsplit("/", 1)[-1] in RECORDS or rel.startswith("raw/_pins/")


def files(root: pathlib.Path, renames: list[tuple[str, str]]) -> dict[str, pathlib.Path]:
    found: dict[str, pathlib.Path] = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            k = key(path.relative_to(root).as_posix(), renames)
            if k in found:
                raise SystemExit(f"two files map to {k}: {found[k]} and {path}; compare roots with one output per stage")
            found[k] = path
    return found


def _steady(value: object) -> object:
    if isinstance(value, dict):
        return {k: "<volatile>" if VOLATILE.search(k) else _steady(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_steady(v) for v in value]
    return value


def content(path: pathlib.Path, root: pathlib.Path, rows: bool = False) -> bytes:
    data = path.read_bytes()
    if path.suffix == ".parquet" and (rows or str(root).encode() in data):
        return _parquet_without_root(path, root)
    if path.suffix not in TEXT:
        return data
    data = data.replace(str(root).encode(), b"<root>")
    if path.suffix == ".json":
        return json.dumps(_steady(json.loads(data)), sort_keys=True).encode()
    return data


def _parquet_without_root(path: pathlib.Path, root: pathlib.Path) -> bytes:
    """A Parquet file that records paths under its root (``pool_files.parquet``): its rows, with the
    root replaced in every string column, so two roots holding the same data compare equal."""
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.compute as pc  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    table = pq.read_table(path)
    plain = {pa.large_string(): pa.string(), pa.large_binary(): pa.binary()}
    columns = [c.cast(plain[c.type]) if c.type in plain else c for c in table.columns]
    columns = [pc.replace_substring(c, str(root), "<root>") if pa.types.is_string(c.type) else c for c in columns]
    return repr(pa.table(columns, names=table.column_names).to_pylist()).encode()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", type=pathlib.Path)
    parser.add_argument("after", type=pathlib.Path)
    parser.add_argument("--rename", action="append", default=[], help="OLD=NEW relative folder of a renamed stage")
    parser.add_argument("--rows", action="store_true", help="compare Parquet files by their rows, not their bytes")
    args = parser.parse_args()
    renames = [tuple(r.split("=", 1)) for r in args.rename]
    before, after = files(args.before, renames), files(args.after, [])
    data = sorted(k for k in set(before) | set(after) if not is_record(k))
    same = [k for k in data if k in before and k in after and content(before[k], args.before, args.rows) == content(after[k], args.after, args.rows)]
    differ = [k for k in data if k in before and k in after and k not in same]
    only_before = [k for k in data if k not in after]
    only_after = [k for k in data if k not in before]
    records = sorted(k for k in set(before) | set(after) if is_record(k))
    for label, keys in (("DIFFER", differ), ("ONLY BEFORE", only_before), ("ONLY AFTER", only_after)):
        for k in keys:
            print(f"{label}: {k}")
    print(f"data files: {len(data)}, {'identical (Parquet by rows)' if args.rows else 'byte-identical'}: {len(same)}, differ: {len(differ)}, "
          f"only before: {len(only_before)}, only after: {len(only_after)}; runner records not compared: {len(records)}")
    return 1 if differ or only_before or only_after else 0


if __name__ == "__main__":
    sys.exit(main())
