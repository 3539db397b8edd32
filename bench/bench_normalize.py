"""Normalize throughput and peak memory, side by side with a plain polars read-hash-write.

The reference reads each file with polars, hashes the text with the same xxh3-128 and writes
zstd Parquet: the least any normalizer must do. Each run happens in a child process so that
its peak RSS is its own. A 5x larger corpus shows that memory is bounded by the shard size.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import polars as pl

MIB = 1 << 20
FILE_BYTES = 40 * MIB
REPEATS = 3
SHARD_BYTES = 64 * MIB


def make_corpus(directory: str, total_bytes: int, seed: int = 0) -> list[str]:
    """Parquet files of ~2 KB documents drawn from a Zipfian vocabulary."""
    rng = np.random.default_rng(seed)
    vocab = np.array([f"w{i}" for i in range(50_000)])
    weights = 1.0 / np.arange(1, len(vocab) + 1)
    weights /= weights.sum()
    paths, written, index = [], 0, 0
    while written < total_bytes:
        docs = []
        size = 0
        while size < FILE_BYTES:
            words = vocab[rng.choice(len(vocab), size=rng.integers(150, 450), p=weights)]
            text = " ".join(words.tolist())
            docs.append(text)
            size += len(text)
        path = os.path.join(directory, f"in-{index:04d}.parquet")
        pl.DataFrame({"id": np.arange(len(docs)) + index * 10_000_000, "text": docs}).write_parquet(path)
        paths.append(path)
        written += size
        index += 1
    return paths


def run_project(paths: list[str], out: str) -> dict:
    from marin_assets.core import normalize

    manifest = normalize.normalize_source("bench", paths, out, normalize.NormalizeParams(target_shard_bytes=SHARD_BYTES))
    return {"docs": manifest["counters"]["rows_in"]}


def run_reference(paths: list[str], out: str) -> dict:
    import xxhash

    os.makedirs(out, exist_ok=True)
    docs = 0
    for i, path in enumerate(paths):
        frame = pl.read_parquet(path)
        ids = [xxhash.xxh3_128_hexdigest(t.encode()) for t in frame["text"].to_list()]
        frame.with_columns(pl.Series("id", ids)).write_parquet(os.path.join(out, f"{i}.parquet"), compression="zstd")
        docs += frame.height
    return {"docs": docs}


def child(kind: str, listing: str, out: str) -> None:
    paths = json.loads(open(listing).read())
    start = time.perf_counter()
    result = (run_project if kind == "project" else run_reference)(paths, out)
    result["seconds"] = time.perf_counter() - start
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))


def measure(kind: str, paths: list[str], workdir: str) -> dict:
    listing = os.path.join(workdir, f"{kind}-{len(paths)}.json")
    with open(listing, "w") as handle:
        json.dump(paths, handle)
    out = os.path.join(workdir, f"out-{kind}-{len(paths)}")
    line = subprocess.check_output([sys.executable, __file__, "--child", kind, listing, out], text=True).strip().splitlines()[-1]
    return json.loads(line)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-normalize-") as workdir:
        small_dir, large_dir = os.path.join(workdir, "small"), os.path.join(workdir, "large")
        os.makedirs(small_dir)
        os.makedirs(large_dir)
        small = make_corpus(small_dir, 200 * MIB)
        mb = sum(os.path.getsize(p) for p in small) / MIB
        text_mb = pl.scan_parquet(small).select(pl.col("text").str.len_bytes().sum()).collect().item() / MIB
        # Alternate the two, three times each, and keep each one's best time: other work on the
        # machine then slows both alike instead of biasing one.
        runs: dict[str, list[dict]] = {"reference": [], "project": []}
        for _ in range(REPEATS):
            for kind in runs:
                runs[kind].append(measure(kind, small, workdir))
                shutil.rmtree(os.path.join(workdir, f"out-{kind}-{len(small)}"), ignore_errors=True)
        ref, ours = (min(runs[k], key=lambda r: r["seconds"]) for k in ("reference", "project"))
        print(f"corpus: {len(small)} files, {mb:.0f} MiB parquet, {text_mb:.0f} MiB of text, {ours['docs']:,} docs; 1 process, best of {REPEATS}")
        for name, r in (("reference (polars read+hash+write)", ref), ("marin-assets normalize", ours)):
            print(f"  {name:36s} {text_mb / r['seconds']:7.1f} MB/s  {r['docs'] / r['seconds']:9.0f} docs/s/core  peak RSS {r['peak_rss_mib']:7.0f} MiB")
        print(f"  throughput ratio project/reference: {ref['seconds'] / ours['seconds']:.2f}x (goal >= 0.7x)")
        large = make_corpus(large_dir, 1000 * MIB, seed=1)
        big = measure("project", large, workdir)
        print(f"  5x corpus ({len(large)} files): peak RSS {big['peak_rss_mib']:.0f} MiB = {big['peak_rss_mib'] / ours['peak_rss_mib']:.2f}x the 1x run (goal < 1.3x)")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(*sys.argv[2:5])
    else:
        main()
