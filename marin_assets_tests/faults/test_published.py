"""Item 1-2: a flipped bit or a cut-off file in a published output is caught, named and repaired.

Outputs of three kinds are built by the stage runner from real files: ``normalized`` (per source,
per shard), ``exact_duplicates`` (a global dedup decision) and the ``pool`` (per shard, with a
data tree). In each, random single bits are flipped (one at a time, the file restored after) and
a file is cut in half; each time the next materialization must find the file differing from its
manifest, and the stage that reads it next must either fail naming the file or read exactly the
documents that were written (anything else counts as documents altered). Rematerializing then
rebuilds the damaged output, byte for byte what was published first.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest

from marin_assets.core import specs
from marin_assets.core.dedup import decisions
from marin_assets.core.dedup.exact import find_exact_duplicates
from marin_assets.core.dedup.minhash import MinHashParams, minhash_shard
from marin_assets.core.ingest import normalize
from marin_assets.core.pool import curated as pool
from marin_assets.core.runtime import integrity, stages, storage
from marin_assets.core.runtime.runner import ShardRunner
from marin_assets_tests.core.pool.test_curated import build_pool_inputs

FLIPS = int(os.environ.get("FAULT_FLIPS", "20"))  # per output: 60 single-bit flips over the three

WORDS = "river stone light paper market engine garden signal winter harbor theory column planet letter music field".split()


def documents(seed: int, n: int, shared: int = 0) -> list[dict]:
    """``n`` documents of a few hundred words; the first ``shared`` are the same for every seed."""
    rows = []
    for i in range(n):
        rng = random.Random(f"shared-{i}" if i < shared else f"{seed}-{i}")
        rows.append({"text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(50, 400))), "url": f"u{i}"})
    return rows


def build_normalized(world, source: str, seed: int) -> dict:
    raw = world.root / "raw" / source
    raw.mkdir(parents=True, exist_ok=True)
    (raw / "part-0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in documents(seed, 300, shared=40)))
    layout = storage.Layout(str(world.root))
    return stages.run_stage(
        specs.NORMALIZED, layout, source=source, inputs=[stages.StageInput(str(raw), seed_fp(seed), specs.RAW_FILES.name)],
        decided_by={"seed": seed},
        build=lambda out: normalize.normalize_source(source, [str(raw / "part-0.jsonl")], out.uri, normalize.NormalizeParams()),
    )


def seed_fp(seed: int) -> str:
    return storage.fingerprint("raw", seed)


def output_of(manifest: dict) -> stages.Output:
    return stages.Output(manifest["uri"], manifest["fingerprint"], manifest.get("data_uri", ""))


def flip(path: Path, bit: int) -> None:
    data = bytearray(path.read_bytes())
    data[bit // 8] ^= 1 << (bit % 8)
    path.write_bytes(bytes(data))


def rows_differing(a: pa.Table, b: pa.Table) -> int:
    """Rows of ``a`` that are not the same row of ``b`` (all of them where the shapes differ)."""
    if a.schema != b.schema or len(a) != len(b):
        return max(len(a), len(b))
    return sum(x != y for x, y in zip(a.to_pylist(), b.to_pylist()))


def flip_and_read(world, rng: random.Random, manifest: dict, files: list[Path], read: Callable[[], pa.Table]) -> None:
    """``FLIPS`` single-bit flips in ``files``: each found by the next materialization's check,
    and by the reader either refused naming the file or read as written."""
    expected = read()
    out = output_of(manifest)
    refused = 0
    for _ in range(FLIPS):
        path = rng.choice(files)
        original = path.read_bytes()
        flip(path, rng.randrange(8 * len(original)))
        world.inject()
        try:
            assert str(path) in stages.damaged_files(out, manifest), f"a flipped bit in {path} was not found"
            try:
                got = read()
            except Exception as exc:  # noqa: BLE001 - any refusal counts, if it names the file
                assert path.name in str(exc), f"{type(exc).__name__} does not name {path}: {exc}"
                refused += 1
            else:
                world.documents_altered(rows_differing(got, expected))
        finally:
            path.write_bytes(original)
    assert refused, "no flip reached the reader's checks"


def rematerialize_repairs(world, manifest: dict, path: Path, damage: Callable[[Path], None], rebuild: Callable[[], dict]) -> None:
    recorded = {storage.join(manifest["uri"], k): v for k, v in manifest["files"].items()}
    recorded |= {storage.join(manifest.get("data_uri", ""), k): v for k, v in (manifest.get("data_files") or {}).items()}
    damage(path)
    world.inject()
    assert str(path) in stages.damaged_files(output_of(manifest), manifest)
    again = rebuild()
    assert again["reused"] is False and again["fingerprint"] == manifest["fingerprint"]
    assert recorded[str(path)] == [path.stat().st_size, integrity.file_digest(str(path))], "the rebuilt file differs from the one published first"
    assert rebuild()["reused"] is True


def cut_in_half(path: Path) -> None:
    with open(path, "r+b") as handle:
        handle.truncate(path.stat().st_size // 2)


def test_bit_flips_and_a_cut_in_normalized_are_caught_by_the_next_run_and_by_minhash(world):
    rng = random.Random(42)
    manifest = build_normalized(world, "src", 1)
    shards = [Path(u) for u in storage.list_shards(manifest["uri"])]
    scratch = world.scratch / "minhash"

    def minhash_read() -> pa.Table:  # what minhash_buckets does with the shard: its first reader
        shutil.rmtree(scratch, ignore_errors=True)
        outputs = []
        for shard in shards:
            target = str(scratch / shard.name)
            minhash_shard([str(shard)], target, MinHashParams())
            outputs.append(storage.read_parquet(target))
        return pa.concat_tables(outputs)

    flip_and_read(world, rng, manifest, shards, minhash_read)
    world.rows(manifest["rows"], len(minhash_read()), 0)
    rematerialize_repairs(world, manifest, shards[0], lambda p: flip(p, 8 * (p.stat().st_size // 3)), lambda: build_normalized(world, "src", 1))
    rematerialize_repairs(world, manifest, shards[0], cut_in_half, lambda: build_normalized(world, "src", 1))


def test_bit_flips_and_a_cut_in_a_global_dedup_decision_are_caught_by_the_next_run_and_by_the_pool(world):
    rng = random.Random(7)
    inputs = {s: stages.StageInput(m["uri"], m["fingerprint"], specs.NORMALIZED.name) for s, m in
              (("alpha", build_normalized(world, "alpha", 1)), ("beta", build_normalized(world, "beta", 2)))}  # fmt: skip
    layout = storage.Layout(str(world.root))
    params = decisions.ExactDedupParams()

    def decide() -> dict:
        shards = {s: storage.list_shards(i.uri) for s, i in inputs.items()}
        return stages.run_global(specs.EXACT_DUPLICATES, layout, inputs=inputs, params=params,
                                 build=lambda out: find_exact_duplicates(shards, out, params, runner=ShardRunner()))  # fmt: skip

    manifest = decide()
    removed = Path(decisions.removed_uri(manifest["uri"], "beta"))
    assert manifest["stats"]["removed"] == 40  # the shared documents, kept in alpha
    ids = storage.read_parquet(storage.list_shards(inputs["beta"].uri)[0], ["id"]).column("id").combine_chunks()
    pool_params = pool.PoolParams(source="beta", pool_dir="", band_edges_uri="", exact_removed_uri=str(removed), fuzzy_removed_uri="", fuzzy_exempt=True)

    def pool_read() -> pa.Table:  # how the pool reads its slice of the removal list
        return pa.table({"id": pool._removed_ids_in_shard(str(removed), ids, pool_params, "exact").cast(pa.string())})

    flip_and_read(world, rng, manifest, [removed], pool_read)
    rematerialize_repairs(world, manifest, removed, lambda p: flip(p, 8 * (p.stat().st_size // 2)), decide)
    rematerialize_repairs(world, manifest, removed, cut_in_half, decide)


@pytest.fixture
def built_pool(world):
    built = build_pool_inputs(str(world.root / "inputs"))
    layout = storage.Layout(str(world.root))
    slug = pool.source_slug("alpha")
    upstream = [stages.StageInput(storage.join(built.root, folder, slug), folder, stage.name)
                for folder, stage in (("normalized", specs.NORMALIZED), ("topics", specs.TOPICS), ("quality", specs.QUALITY_SCORES),
                                      ("contamination", specs.CONTAMINATION), ("tokens", specs.TOKEN_COUNTS))]  # fmt: skip
    params = next(t.params for t in built.tasks if t.params.source == "alpha")

    def run() -> dict:
        return stages.run_shards(specs.POOL, layout, source="alpha", inputs=upstream, shard_fn=pool.pool_shard, params=None,
                                 fingerprint_params={}, bind_params=lambda out: dataclasses.replace(params, pool_dir=out.data_uri))  # fmt: skip

    return run


def test_bit_flips_and_a_cut_in_the_pool_are_caught_by_the_next_run_and_by_its_readers(world, built_pool):
    rng = random.Random(3)
    manifest = built_pool()
    files = sorted(p for p in Path(manifest["data_uri"]).rglob("*.parquet"))
    assert files and set(manifest["data_files"]) == {str(p.relative_to(manifest["data_uri"])) for p in Path(manifest["data_uri"]).rglob("*") if p.is_file()}

    def read() -> pa.Table:  # what a trainer reads: every group file
        return pa.concat_tables([storage.read_parquet(str(p), ["id", "text"]) for p in files])

    flip_and_read(world, rng, manifest, files, read)
    rematerialize_repairs(world, manifest, files[0], lambda p: flip(p, 8 * (p.stat().st_size // 2)), built_pool)
    rematerialize_repairs(world, manifest, files[-1], cut_in_half, built_pool)


def test_marin_assets_verify_names_a_damaged_file_and_exits_non_zero(world, capsys):
    from marin_assets import cli

    manifest = build_normalized(world, "src", 1)
    assert cli.main(["verify", "--sources", "src"]) == 0
    assert "outputs checked, 0 damaged" in capsys.readouterr().out
    shard = Path(storage.list_shards(manifest["uri"])[0])
    flip(shard, 8 * (shard.stat().st_size // 2))
    world.inject()
    assert cli.main(["verify", "--sources", "src"]) == 1
    out = capsys.readouterr().out
    assert f"DAMAGED {shard}: its digest is" in out and "1 damaged; rematerialize" in out
