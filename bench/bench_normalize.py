"""Normalize throughput and peak memory at the production shard target, against a plain polars
read-hash-write, on many small files and on one large file.

The reference reads each file whole with polars, hashes every text with the same xxh3-128 and
writes zstd Parquet: the least any normalizer must do. ``normalize_source`` runs with the
production ``target_shard_bytes`` (256 MiB), in process (the embedded default runner), so its
scatter and gather phases run one after the other in the child. Each run is a child process
(``bench.harness``), the two interleaved; peak memory is each child's own ``VmHWM``.

Corpora (Parquet, snappy, Zipfian ~2 KB documents, as providers ship them):

* many small files: ``SMALL_FILES`` files of ``SMALL_FILE_MIB`` each;
* one large file of >= 1 GiB on disk (row groups of ~45 MiB of text).

Goals: throughput >= 0.7x the reference on both; the peak memory on the large file at most
1.3x the peak on the small files (memory bounded by the shard and batch sizes, not the file).

JSON lines (``.jsonl.zst``, the most common provider format; one zstd frame per file with its
content size, as ``zstd`` writes a file), the same documents: ``SMALL_FILES`` small files and one
file of ``JSONL_LARGE_MIB`` on disk, against bare polars doing the same per-row work (decompress,
``read_ndjson``, drop empty texts, cut whitespace runs past 128, xxh3-128 of each text, sort by id,
write zstd Parquet), 3 rounds interleaved, medians. On the small files polars runs twice: file by
file (one sorted output per file), and writing normalize's output (every file's rows in one file
sorted by id, as normalize writes small files into one shard: it must hold them all to sort
them). Goals on the small files: CPU <= 1.05x polars' file by file, and peak memory <= 1.5x
polars' writing the same output (the file-by-file peak ratio is printed beside it); the large
file's figures are printed (polars holds the whole file, normalize a batch and a shard).
"""

from __future__ import annotations

import os
import sys
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench import harness

MIB = 1 << 20
SHARD_BYTES = 256 * MIB  # the production target (NormalizeParams' default)
SMALL_FILES = harness.pick(48, 16)
SMALL_FILE_MIB = harness.pick(12, 8)
LARGE_FILE_MIB = harness.pick(1100, 300)  # on disk; >= 1 GiB in the full run
JSONL_LARGE_MIB = harness.pick(240, 60)  # on disk (zstd, ~2.5x): ~600 MiB of JSON lines in the full run
MAX_WHITESPACE_RUN = 128  # NormalizeParams' default


def _pool(rng: np.random.Generator, docs: int = 4096) -> list[str]:
    """Distinct ~2 KB documents of Zipfian words from a 50k vocabulary."""
    vocab = np.array([f"w{i}" for i in range(50_000)])
    p = 1.0 / np.arange(1, vocab.size + 1)
    p /= p.sum()
    lengths = rng.integers(150, 450, docs)
    words = vocab[rng.choice(vocab.size, size=int(lengths.sum()), p=p)]
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    return [" ".join(words[bounds[i] : bounds[i + 1]].tolist()) for i in range(docs)]


def write_file(path: str, target_mib: float, rng: np.random.Generator, pool: list[str], first_id: int) -> int:
    """A Parquet file of about ``target_mib`` on disk; returns the number of rows. Each text is a
    pool document behind its own number and a random pool tail, so every text is distinct."""
    rows, group = 0, int(min(30_000, max(1_000, target_mib * 400)))  # ~1 KB a row on disk
    with pq.ParquetWriter(path, pa.schema([("id", pa.int64()), ("text", pa.string())]), compression="snappy") as writer:
        while os.path.getsize(path) < target_mib * MIB or rows == 0:
            pick = rng.integers(0, len(pool), (group, 2))
            texts = [f"{first_id + rows + i} {pool[a]} {pool[b][: 200]}" for i, (a, b) in enumerate(pick.tolist())]
            writer.write_table(pa.table({"id": np.arange(rows, rows + group) + first_id, "text": texts}))
            rows += group
    return rows


def write_jsonl_zst(path: str, target_mib: float, rng: np.random.Generator, pool: list[str], first_id: int) -> int:
    """A ``.jsonl.zst`` file of about ``target_mib`` on disk (one frame, content size recorded), the
    same documents as :func:`write_file`; returns the number of rows."""
    import json

    import zstandard

    lines, rows, size = [], 0, 0
    while size < target_mib * MIB * 2.5 or rows == 0:  # ~2.5x: the text's zstd ratio
        pick = rng.integers(0, len(pool), (1_000, 2))
        block = "".join(json.dumps({"id": first_id + rows + i, "text": f"{first_id + rows + i} {pool[a]} {pool[b][:200]}"}) + "\n"
                        for i, (a, b) in enumerate(pick.tolist()))  # fmt: skip
        lines.append(block.encode())
        rows, size = rows + 1_000, size + len(lines[-1])
    with open(path, "wb") as out:
        out.write(zstandard.ZstdCompressor(level=3, write_content_size=True).compress(b"".join(lines)))
    return rows


# --------------------------------------------------------------------------- cases (in the child)


def project(paths: list[str], out: str) -> dict:
    import polars as pl

    from marin_assets.core.ingest import normalize

    # one-time costs of a first call (lazy imports, compiled patterns) paid before the timed
    # region, as the peer's library is loaded by its import: the bench measures the per-row work
    normalize.canonical_rows(pl.DataFrame({"text": ["warm up the kernels"]}), normalize.NormalizeParams(), source="warm-up", file="-")
    with harness.timed():
        manifest = normalize.normalize_source("bench", paths, out, normalize.NormalizeParams(target_shard_bytes=SHARD_BYTES))
    _clear(out)
    return {"items": manifest["counters"]["rows_in"], "shards": len(manifest["shards"])}


def reference(paths: list[str], out: str) -> dict:
    import polars as pl
    import xxhash

    os.makedirs(out, exist_ok=True)
    docs = 0
    with harness.timed():
        for i, path in enumerate(paths):
            frame = pl.read_parquet(path)
            ids = [xxhash.xxh3_128_hexdigest(t.encode()) for t in frame["text"].to_list()]
            frame.with_columns(pl.Series("id", ids)).write_parquet(os.path.join(out, f"{i}.parquet"), compression="zstd")
            docs += frame.height
    _clear(out)
    return {"items": docs}


def reference_jsonl(paths: list[str], out: str, one_file: bool = False) -> dict:
    """Bare polars on ``.jsonl.zst``: the same per-row work as normalize, one file at a time,
    each written sorted by id; or, ``one_file``, normalize's output too: every file's rows in
    one file sorted by id (as normalize writes small files into one shard)."""
    import io

    import polars as pl
    import xxhash
    import zstandard

    os.makedirs(out, exist_ok=True)
    docs, frames = 0, []
    with harness.timed():
        for i, path in enumerate(paths):
            with open(path, "rb") as handle:
                data = zstandard.ZstdDecompressor().stream_reader(handle).read()
            frame = pl.read_ndjson(io.BytesIO(data))
            del data
            frame = frame.filter(pl.col("text").str.contains(r"\S").fill_null(False)).with_columns(
                pl.col("text").str.replace_all(rf"(\s{{{MAX_WHITESPACE_RUN}}})\s+", "${1}"), pl.col("id").cast(pl.Utf8).alias("source_id"))
            ids = [xxhash.xxh3_128_hexdigest(t.encode()) for t in frame["text"].to_list()]
            frame = frame.with_columns(pl.Series("id", ids))
            docs += frame.height
            if one_file:
                frames.append(frame)
            else:
                frame.sort("id").write_parquet(os.path.join(out, f"{i}.parquet"), compression="zstd")
        if one_file:
            pl.concat(frames, how="diagonal_relaxed").sort("id").write_parquet(os.path.join(out, "0.parquet"), compression="zstd")
    _clear(out)
    return {"items": docs}


def _clear(out: str) -> None:
    import shutil

    shutil.rmtree(out, ignore_errors=True)


# --------------------------------------------------------------------------- the bench (in the parent)


def main() -> None:
    rng = np.random.default_rng(0)
    pool = _pool(rng)
    rounds = 2  # A B A B: a large-file run takes minutes
    with tempfile.TemporaryDirectory(prefix="bench-normalize-") as workdir:
        small = [os.path.join(workdir, f"small-{i:03d}.parquet") for i in range(SMALL_FILES)]
        rows = 0
        for path in small:
            rows += write_file(path, SMALL_FILE_MIB, rng, pool, rows)
        large = os.path.join(workdir, "large.parquet")
        large_rows = write_file(large, LARGE_FILE_MIB, rng, pool, 10**9)
        results = {}
        for name, paths in (("many small files", small), ("one large file", [large])):
            on_disk = sum(os.path.getsize(p) for p in paths) / MIB
            out = os.path.join(workdir, "out")
            cases = [
                harness.Case("polars read+hash+write", "bench.bench_normalize:reference", {"paths": paths, "out": out}),
                harness.Case("marin-assets normalize", "bench.bench_normalize:project", {"paths": paths, "out": out}),
            ]
            docs = rows if paths is small else large_rows
            title = f"normalize, {name}: {len(paths)} file(s), {on_disk:.0f} MiB Parquet on disk, {docs:,} docs, shard target {SHARD_BYTES // MIB} MiB, one process"
            results[name] = result = harness.compare(title, cases, rounds=rounds, unit="docs")
            print(f"  marin-assets wrote {result['marin-assets normalize'].runs[-1]['shards']} shard(s)")
            harness.speed_goal("marin-assets normalize", "polars read+hash+write", 0.7, f"normalize >= 0.7x plain polars read-hash-write ({name})").check(result)
        big, many = results["one large file"]["marin-assets normalize"], results["many small files"]["marin-assets normalize"]
        ratio = big.peak_mib() / many.peak_mib()
        harness.absolute_goal(
            "normalize peak memory on one large file <= 1.3x that on many small files",
            f"{big.peak_mib():.0f} MiB / {many.peak_mib():.0f} MiB = {ratio:.2f}x",
            ratio <= 1.3,
        )
        json_lines(workdir, rng, pool)


PER_FILE = "polars read_ndjson+hash+sort+write, file by file"
ONE_FILE = "polars, normalize's output: one file sorted by id"


def json_lines(workdir: str, rng: np.random.Generator, pool: list[str]) -> None:
    """normalize on ``.jsonl.zst`` against bare polars (small files: the goals; one large file: printed)."""
    small = [os.path.join(workdir, f"small-{i:03d}.jsonl.zst") for i in range(SMALL_FILES)]
    rows = sum(write_jsonl_zst(path, SMALL_FILE_MIB / 2.5, rng, pool, k * 10**7) for k, path in enumerate(small))
    large = os.path.join(workdir, "large.jsonl.zst")
    large_rows = write_jsonl_zst(large, JSONL_LARGE_MIB, rng, pool, 10**9)
    for name, paths, docs in (("many small files", small, rows), ("one large file", [large], large_rows)):
        on_disk = sum(os.path.getsize(p) for p in paths) / MIB
        out = os.path.join(workdir, "out")
        cases = [
            harness.Case(PER_FILE, "bench.bench_normalize:reference_jsonl", {"paths": paths, "out": out}),
            harness.Case("marin-assets normalize", "bench.bench_normalize:project", {"paths": paths, "out": out}),
        ]
        if paths is small:
            cases.append(harness.Case(ONE_FILE, "bench.bench_normalize:reference_jsonl", {"paths": paths, "out": out, "one_file": True}))
        title = f"normalize on JSON lines, {name}: {len(paths)} .jsonl.zst file(s), {on_disk:.0f} MiB on disk, {docs:,} docs, shard target {SHARD_BYTES // MIB} MiB, one process"
        result = harness.compare(title, cases, rounds=3, unit="docs")
        if paths is small:
            harness.speed_goal("marin-assets normalize", PER_FILE, 1 / 1.05,
                               "normalize on .jsonl.zst small files: CPU <= 1.05x bare polars' file by file (docs per CPU second >= 0.95x)", "cpu").check(result)  # fmt: skip
            harness.memory_goal("marin-assets normalize", ONE_FILE, 1.5,
                                "normalize on .jsonl.zst small files: peak <= 1.5x bare polars' writing the same output").check(result)  # fmt: skip
            ours, per_file = result["marin-assets normalize"].peak_mib(), result[PER_FILE].peak_mib()
            print(f"  (peak against polars file by file, which never holds more than one file: {ours:.0f} / {per_file:.0f} MiB = {ours / per_file:.2f}x)")


if __name__ == "__main__":
    sys.exit(harness.exit_status(main()))
