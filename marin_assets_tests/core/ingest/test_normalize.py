"""The generic normalize recipe on real files of every supported format."""

from __future__ import annotations

import dataclasses

import gzip
import json

import polars as pl
import pytest
import xxhash
import zstandard

from marin_assets.core import specs
from marin_assets.core.ingest import formats, normalize
from marin_assets.core.runtime import stages, storage
from marin_assets.core.runtime.runner import ShardRunner

TEXTS = [f"Document number {i} about topic {i % 7}.\nIt has two lines." for i in range(40)]


def _jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def _write(path, fmt: str, rows: list[dict]) -> str:
    if fmt == "parquet":
        pl.DataFrame(rows).write_parquet(path)
    elif fmt == "jsonl":
        path.write_bytes(_jsonl(rows))
    elif fmt in ("jsonl.gz", "json.gz"):
        path.write_bytes(gzip.compress(_jsonl(rows)))
    elif fmt == "jsonl.zst":
        path.write_bytes(zstandard.ZstdCompressor().compress(_jsonl(rows)))
    return str(path)


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "jsonl.gz", "json.gz", "jsonl.zst"])
def test_every_format_gives_canonical_rows(tmp_path, fmt: str) -> None:
    rows = [{"doc_id": i, "body": t, "url": f"https://x/{i}"} for i, t in enumerate(TEXTS)]
    src = _write(tmp_path / f"in.{fmt}", fmt, rows)
    out = str(tmp_path / "out")
    manifest = normalize.normalize_source("s", [src], out, normalize.NormalizeParams(text_field="body", id_field="doc_id"))
    frame = normalize.read_normalized(out)
    assert frame.columns == ["id", "text", "source_id", "url"]
    assert manifest["rows"] == len(TEXTS) == frame.height
    assert sorted(frame["text"].to_list()) == sorted(TEXTS)
    first = frame.filter(pl.col("source_id") == "3").row(0, named=True)
    assert first["id"] == xxhash.xxh3_128_hexdigest(TEXTS[3].encode())
    assert len(first["id"]) == 32
    assert frame["id"].to_list() == sorted(frame["id"].to_list())


def test_bare_recipe_keeps_only_canonical_columns(tmp_path) -> None:
    src = _write(tmp_path / "in.parquet", "parquet", [{"id": 1, "text": "hello world", "extra": "x"}])
    out = str(tmp_path / "out")
    normalize.normalize_source("s", [src], out, normalize.NormalizeParams(bare=True))
    assert normalize.read_normalized(out).columns == ["id", "text", "source_id"]


def test_empty_rows_dropped_duplicates_set_aside_whitespace_cut(tmp_path) -> None:
    rows = [{"id": i, "text": t} for i, t in enumerate(TEXTS[:10])]
    rows += [{"id": 100, "text": "   \n\t "}, {"id": 101, "text": None}, {"id": 102, "text": TEXTS[0]}]
    rows += [{"id": 103, "text": "a" + " " * 1000 + "b"}, {"id": 104, "text": "c" + "\n" * 128 + "d"}]
    src = _write(tmp_path / "in.jsonl", "jsonl", rows)
    out = str(tmp_path / "out")
    manifest = normalize.normalize_source("s", [src], out, normalize.NormalizeParams())
    counters = manifest["counters"]
    assert counters["empty_dropped"] == 2
    assert counters["duplicates"] == 1
    assert counters["whitespace_compacted"] == 1
    frame = normalize.read_normalized(out)
    compacted = frame.filter(pl.col("source_id") == "103")["text"].item()
    assert compacted == "a" + " " * 128 + "b"
    assert frame.filter(pl.col("source_id") == "103")["id"].item() == xxhash.xxh3_128_hexdigest(compacted.encode())
    assert frame.filter(pl.col("source_id") == "104")["text"].item() == "c" + "\n" * 128 + "d"
    # the first copy in input order is kept, the later one is under dups/
    assert frame.filter(pl.col("text") == TEXTS[0])["source_id"].to_list() == ["0"]
    dups = pl.concat([pl.read_parquet(u) for u in storage.list_shards(storage.join(out, "dups"))])
    assert dups["source_id"].to_list() == ["102"]


# Unicode whitespace (the regex's \s) in every UTF-8 length, and characters next to them that are
# not whitespace but share lead or continuation bytes with them (U+200B, U+2030, U+0086, U+180E...)
_SPACES = [chr(c) for c in (9, 10, 11, 12, 13, 32, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000)]
_NOT_SPACES = ["a", "é", "ア", "\u200b", "\u2030", "\u0086", "😀", "\u180e", "\ufeff", "\u3001", "\u2060", "\u1681", "\u2080"]


@pytest.mark.parametrize("run", [1, 127, 128])
def test_whitespace_runs_agree_with_the_regex_on_unicode_whitespace(run: int) -> None:
    import random

    rng = random.Random(run)
    texts = []
    for _ in range(3000):
        parts = []
        for _ in range(rng.randint(0, 6)):
            if rng.random() < 0.5:
                parts.append("".join(rng.choice(_SPACES) for _ in range(rng.choice([1, 3, run - 1, run, run + 1, run + 2, 2 * run + 5]))))
            else:
                parts.append("".join(rng.choice(_NOT_SPACES) for _ in range(rng.randint(1, 4))))
        texts.append("".join(parts))
    series = pl.Series(texts)
    expected = series.str.contains(rf"\s{{{run + 1}}}").to_numpy()
    assert 0 < expected.sum() < len(texts)
    assert (normalize.whitespace_runs(series.to_arrow(), run) == expected).all()
    assert (normalize.whitespace_runs(series.slice(5, 100).to_arrow(), run) == expected[5:105]).all()
    assert normalize.text_ids(series.slice(5, 100).to_arrow()) == [xxhash.xxh3_128_hexdigest(t.encode()) for t in texts[5:105]]


def test_bad_rows_are_counted_not_fatal(tmp_path) -> None:
    good = _jsonl([{"id": 1, "text": "valid row"}, {"id": 2, "text": "another valid row"}])
    path = tmp_path / "in.jsonl"
    path.write_bytes(good + b"{not json\n" + b'{"id": 3, "text": "caf\xe9 latin-1"}\n')
    out = str(tmp_path / "out")
    manifest = normalize.normalize_source("s", [str(path)], out, normalize.NormalizeParams())
    assert manifest["bad_rows"]["bad_json"] == 1
    assert manifest["bad_rows"]["invalid_utf8_repaired"] == 1
    texts = normalize.read_normalized(out)["text"].to_list()
    assert "caf\ufffd latin-1" in texts and "valid row" in texts


def test_missing_text_field_names_source_file_and_fix(tmp_path) -> None:
    src = _write(tmp_path / "in.parquet", "parquet", [{"id": 1, "content": "x"}])
    with pytest.raises(normalize.NormalizeError) as err:
        normalize.normalize_source("starcoder2/kaggle", [src], str(tmp_path / "out"), normalize.NormalizeParams())
    message = str(err.value)
    assert "starcoder2/kaggle" in message and "in.parquet" in message and "text_field" in message and "content" in message


def test_same_rows_whatever_the_shard_count(tmp_path) -> None:
    files = [_write(tmp_path / f"in{i}.jsonl", "jsonl", [{"id": j, "text": TEXTS[j]} for j in range(i, 40, 3)]) for i in range(3)]
    one = normalize.normalize_source("s", files, str(tmp_path / "one"), normalize.NormalizeParams())
    many = normalize.normalize_source("s", files, str(tmp_path / "many"), normalize.NormalizeParams(target_shard_bytes=300))
    assert len(one["shards"]) == 1 and len(many["shards"]) > 2
    a = normalize.read_normalized(str(tmp_path / "one")).sort("id")
    b = normalize.read_normalized(str(tmp_path / "many")).sort("id")
    assert a.equals(b)
    for shard in storage.list_shards(str(tmp_path / "many")):
        ids = pl.read_parquet(shard)["id"].to_list()
        assert ids == sorted(ids)


class _Killed(RuntimeError):
    pass


def _normalized_stage(layout: storage.Layout, files: list[str], params: normalize.NormalizeParams, **kwargs) -> dict:
    """The normalize stage as the asset runs it: the stage runner reuses, records and points."""
    return stages.run_stage(
        specs.NORMALIZED, layout, source="s", inputs=[], decided_by=params.fingerprint_params(),
        build=lambda out: normalize.normalize_source("s", files, out.uri, params, **kwargs),
    )  # fmt: skip


def test_killed_run_resumes_without_redoing_finished_work(tmp_path, monkeypatch) -> None:
    files = [_write(tmp_path / f"in{i}.jsonl", "jsonl", [{"id": j, "text": TEXTS[j]} for j in range(i, 40, 4)]) for i in range(4)]
    layout = storage.Layout(str(tmp_path / "root"))
    params = normalize.NormalizeParams(target_shard_bytes=400)
    out = specs.NORMALIZED.output_uri(layout, "s", stages.fingerprint_of(specs.NORMALIZED, params.fingerprint_params(), []))
    reads: list[str] = []
    real_read = normalize.read_batches
    real_gather = normalize.gather_shard

    def counting_read(uri, *args, **kwargs):
        reads.append(uri)
        return real_read(uri, *args, **kwargs)

    def dying_gather(inputs, output, gp):
        if gp.shard == 1:
            raise _Killed("worker killed")
        return real_gather(inputs, output, gp)

    monkeypatch.setattr(normalize, "read_batches", counting_read)
    monkeypatch.setattr(normalize, "gather_shard", dying_gather)
    with pytest.raises(_Killed):
        _normalized_stage(layout, files, params, runner=ShardRunner())
    assert not storage.is_complete(out)
    assert sorted(reads) == sorted(files)

    reads.clear()
    gathered: list[int] = []

    def counting_gather(inputs, output, gp):
        gathered.append(gp.shard)
        return real_gather(inputs, output, gp)

    monkeypatch.setattr(normalize, "gather_shard", counting_gather)
    manifest = _normalized_stage(layout, files, params, runner=ShardRunner())
    assert manifest["uri"] == out and storage.is_complete(out)
    assert storage.read_current(specs.NORMALIZED.group_uri(layout, "s"))["uri"] == out
    assert reads == []  # every input file was already scattered
    assert gathered == list(range(1, len(manifest["shards"])))  # shard 0 had finished
    assert manifest["rows"] == 40
    assert manifest["resumed_tasks"] == len(files) + 1
    again = _normalized_stage(layout, files, params)
    assert again["reused"] is True


def test_transform_counts_filtered_rows(tmp_path) -> None:
    src = _write(tmp_path / "in.parquet", "parquet", [{"q": f"question {i}", "a": f"answer {i}", "ok": i % 2 == 0} for i in range(6)])

    def render(frame: pl.DataFrame):
        kept = frame.filter(pl.col("ok"))
        rendered = kept.select((pl.col("q") + "\n" + pl.col("a")).alias("text"), pl.col("q").alias("source_id"))
        return rendered, {"invalid": frame.height - kept.height}

    out = str(tmp_path / "out")
    manifest = normalize.normalize_source("s", [src], out, normalize.NormalizeParams(id_field="source_id"), transform=render)
    assert manifest["bad_rows"] == {"invalid": 3}
    assert sorted(normalize.read_normalized(out)["text"].to_list()) == ["question 0\nanswer 0", "question 2\nanswer 2", "question 4\nanswer 4"]


def test_unknown_format_is_a_clear_error(tmp_path) -> None:
    path = tmp_path / "data.csv"
    path.write_text("a,b\n")
    with pytest.raises(normalize.NormalizeError, match="unsupported format"):
        normalize.normalize_source("s", [str(path)], str(tmp_path / "out"), normalize.NormalizeParams())


def test_a_file_is_scattered_in_bounded_pieces_with_the_same_result(tmp_path) -> None:
    rows = [{"id": j, "text": TEXTS[j % 40] + f" copy {j}"} for j in range(400)]
    src = _write(tmp_path / "big.jsonl", "jsonl", rows)
    small = normalize.NormalizeParams(target_shard_bytes=8_000, scatter_buffer_bytes=2_000, batch_rows=50)
    big = normalize.NormalizeParams(target_shard_bytes=8_000)
    a = normalize.normalize_source("s", [src], str(tmp_path / "a"), small)
    normalize.normalize_source("s", [src], str(tmp_path / "b"), big)
    assert len(a["shards"]) > 2
    for name in a["shards"]:
        assert pl.read_parquet(str(tmp_path / "a" / name)).equals(pl.read_parquet(str(tmp_path / "b" / name)))
    # rows of one shard are one contiguous id range
    ranges = [(pl.read_parquet(str(tmp_path / "a" / n))["id"].min(), pl.read_parquet(str(tmp_path / "a" / n))["id"].max()) for n in a["shards"]]
    assert all(hi < lo for (_, hi), (lo, _) in zip(ranges, ranges[1:]))


def test_json_lines_are_read_in_chunks_of_the_configured_bytes(tmp_path) -> None:
    rows = [{"id": j, "text": TEXTS[j % 40] + f" copy {j}"} for j in range(400)]
    src = _write(tmp_path / "big.jsonl.zst", "jsonl.zst", rows)
    chunk = storage.size(_write(tmp_path / "plain.jsonl", "jsonl", rows)) // 10
    batches = list(normalize.read_batches(src, "jsonl.zst", 1_000_000, {}, batch_bytes=chunk))
    assert len(batches) >= 9
    assert max(len(_jsonl(b.to_dicts())) for b in batches) < 2 * chunk
    assert pl.concat(batches)["id"].to_list() == list(range(400))
    # the normalize parameter reaches the reader: same shards whatever the chunk
    small = normalize.normalize_source("s", [src], str(tmp_path / "a"), normalize.NormalizeParams(target_shard_bytes=8_000, batch_bytes=chunk))
    big = normalize.normalize_source("s", [src], str(tmp_path / "b"), normalize.NormalizeParams(target_shard_bytes=8_000))
    assert small["shards"] == big["shards"]
    for name in small["shards"]:
        assert pl.read_parquet(str(tmp_path / "a" / name)).equals(pl.read_parquet(str(tmp_path / "b" / name)))


def test_shards_follow_uncompressed_bytes_not_compressed_size(tmp_path) -> None:
    rows = [{"id": j, "text": "the same words again and again " * 20} for j in range(200)]
    plain = _write(tmp_path / "in.jsonl", "jsonl", rows)
    packed = _write(tmp_path / "in.jsonl.zst", "jsonl.zst", rows)
    raw = storage.size(plain)
    assert storage.size(packed) * 20 < raw  # compresses very well
    assert normalize.uncompressed_bytes(packed, "jsonl.zst") >= raw
    target = raw // 4
    zst = normalize.normalize_source("s", [packed], str(tmp_path / "z"), normalize.NormalizeParams(target_shard_bytes=target))
    assert len(zst["shards"]) >= 4  # not 1, as the compressed size would say


def test_scatter_writes_one_file_per_flush_not_one_per_shard(tmp_path) -> None:
    """Files grow with the input, not with inputs x shards; record batch k of a flush holds exactly shard k's rows."""
    rows = [{"id": j, "text": TEXTS[j % 40] + f" copy {j}"} for j in range(300)]
    src = _write(tmp_path / "in.jsonl", "jsonl", rows)
    params = normalize.ScatterParams(normalize.NormalizeParams(scatter_buffer_bytes=10**9), 40, "s", None)
    out = tmp_path / "scatter"
    counters = normalize.scatter_file([src], str(out), params)
    assert sorted(p.name for p in out.glob("*.arrow")) == ["flush-00000.arrow"] and counters["flushes"] == 1
    seen = nonempty = 0
    for shard in range(40):
        got = normalize.gather_shard([str(out / "flush-00000.arrow")], str(tmp_path / "g" / f"{shard}.parquet"), normalize.GatherParams(shard, False))
        ids = pl.read_parquet(str(tmp_path / "g" / f"{shard}.parquet"))["id"]
        assert (normalize.shard_of(ids, 40) == shard).all()
        seen, nonempty = seen + got["rows"], nonempty + bool(got["rows"])
    assert nonempty > 20 and seen == counters["rows_out"] == 300


class _Recording(ShardRunner):
    """Runs tasks as the local runner does, noting each task's kind (a middle task with its level) and inputs."""

    def __init__(self) -> None:
        super().__init__()
        object.__setattr__(self, "tasks", [])

    def map(self, tasks, on_done=None):
        for t in tasks:
            kind = f"level-{t.params.level}" if t.fn.__name__ == "regroup_chunk" else t.fn.__name__
            self.tasks.append((kind, len(t.inputs)))
        return super().map(tasks, on_done)


def _many_flushes(tmp_path) -> tuple[list[str], normalize.NormalizeParams]:
    """6 files of ~6 flushes each (~36 flushes, read in batches of about a flush) into 13 shards."""
    files = [_write(tmp_path / f"in{i}.jsonl", "jsonl", [{"id": j, "text": TEXTS[j % 40] + f" copy {j}"} for j in range(i, 600, 6)])
             for i in range(6)]  # fmt: skip
    return files, normalize.NormalizeParams(target_shard_bytes=4_000, scatter_buffer_bytes=1_500, batch_bytes=1_500)


@pytest.mark.parametrize(("fan_in", "levels"), [(8, 1), (4, 2), (2, 5)])
def test_a_source_with_more_flushes_than_the_fan_in_gets_middle_levels_with_the_same_shards(tmp_path, fan_in, levels) -> None:
    """Every task (middle levels and gathers) reads at most the fan-in of files; the shards are byte-identical."""
    files, direct = _many_flushes(tmp_path)
    a = normalize.normalize_source("s", files, str(tmp_path / "a"), direct)
    runner = _Recording()
    b = normalize.normalize_source("s", files, str(tmp_path / "b"), dataclasses.replace(direct, gather_fan_in=fan_in), runner=runner)
    shards = len(a["shards"])
    assert shards > 9 and a["shards"] == b["shards"] and a["counters"] == b["counters"]
    kinds = [kind for kind, _ in runner.tasks]
    assert kinds.count("scatter_file") == len(files) and kinds.count("gather_shard") == shards
    assert {k for k in kinds if k.startswith("level-")} == {f"level-{level}" for level in range(1, levels + 1)}
    assert max(n for _, n in runner.tasks) <= fan_in  # not the ~30 flushes of the source
    for name in a["shards"]:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_flushes_are_cut_into_chunks_of_about_equal_count() -> None:
    chunks = normalize.chunk_flushes([3, 0, 5, 1], 3)
    assert chunks == [((0, 0, 3),), ((2, 0, 3),), ((2, 3, 2), (3, 0, 1))]


def test_the_tree_has_a_level_per_power_of_the_fan_in_and_buckets_of_about_one_shard_per_task() -> None:
    few = normalize.GatherTree(shards=100, planned=1024, flushes=1024, fan_in=1024)
    assert few.levels == 0 and few.per_bucket(0) == 1 and few.chunk(1) == 1024  # a slot per shard, as before
    large = normalize.GatherTree(shards=51_181, planned=102_362, flushes=102_362, fan_in=1024)  # the pool's largest source
    assert large.levels == 1 and large.per_bucket(0) == 100 and large.buckets(0) == 512 and large.split(1) == 100
    assert (large.chunk(1), large.chunk(2)) == (1024, 100)  # a middle task reads the fan-in, a gather 100 files
    deep = normalize.GatherTree(shards=40_000, planned=4 * 1024**2, flushes=4 * 1024**2, fan_in=1024)
    assert deep.levels == 2 and deep.per_bucket(2) == 1 and deep.chunk(1) == deep.chunk(2) == 1024 and deep.chunk(3) == 4
    for level in (1, 2):  # a middle task holds about one shard: its bucket's share of the rows in its chunk
        assert deep.per_bucket(level - 1) * deep.chunk(level) / deep.files(level - 1) <= 1.1
    more = dataclasses.replace(few, flushes=1025)  # the scatter wrote more flushes than planned: one more level
    assert more.levels == 1 and more.per_bucket(0) == 1 and more.chunk(1) <= 1024 and more.chunk(2) == 2
    fewer = dataclasses.replace(deep, flushes=1024**2)  # fewer than planned: one level splits the planned buckets into shards
    assert fewer.levels == 1 and fewer.per_bucket(0) == deep.per_bucket(0) and fewer.split(1) == deep.per_bucket(0)
    assert dataclasses.replace(large, flushes=1000).levels == 1  # the scatter's slots hold 100 shards: one level still


def test_a_source_of_many_files_is_sized_by_tasks_not_by_the_step(tmp_path, monkeypatch) -> None:
    files = [_write(tmp_path / f"in{i}.jsonl", "jsonl", [{"id": j, "text": TEXTS[j % 40] + f" copy {j}"} for j in range(i, 400, 20)])
             for i in range(20)]  # fmt: skip
    params = normalize.NormalizeParams(target_shard_bytes=8_000)
    kinds: list[str] = []

    class Recording(ShardRunner):
        def map(self, tasks, on_done=None):
            kinds.extend(t.fn.__name__ for t in tasks)
            return super().map(tasks, on_done)

    by_tasks = normalize.normalize_source("s", files, str(tmp_path / "a"), params, runner=Recording())
    assert kinds.count("measure_files") == 1 and kinds.count("scatter_file") == 20
    monkeypatch.setattr(normalize, "SIZES_IN_DRIVER", 100)
    in_step = normalize.normalize_source("s", files, str(tmp_path / "b"), params)
    assert by_tasks["shards"] == in_step["shards"] and len(in_step["shards"]) > 2
    for name in in_step["shards"]:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_a_killed_run_with_middle_levels_resumes_without_redoing_finished_tasks(tmp_path, monkeypatch) -> None:
    files, params = _many_flushes(tmp_path)
    params = dataclasses.replace(params, gather_fan_in=4)  # two middle levels
    expected = normalize.normalize_source("s", files, str(tmp_path / "whole"), params)
    real_regroup = normalize.regroup_chunk

    def dying_regroup(inputs, output, rp):
        if rp.level == 2 and rp.bucket == 1:
            raise _Killed("worker killed")
        return real_regroup(inputs, output, rp)

    monkeypatch.setattr(normalize, "regroup_chunk", dying_regroup)
    out = str(tmp_path / "out")
    with pytest.raises(_Killed):
        normalize.normalize_source("s", files, out, params)
    regrouped: list[tuple[int, int]] = []
    monkeypatch.setattr(normalize, "regroup_chunk", lambda i, o, p: regrouped.append((p.level, p.bucket)) or real_regroup(i, o, p))
    resumed = normalize.normalize_source("s", files, out, params)
    assert regrouped and {level for level, _ in regrouped} == {2}  # every level-1 task had finished
    assert min(bucket for _, bucket in regrouped) == 1  # and level 2's tasks of bucket 0
    assert resumed["resumed_tasks"] == len(files)  # every scatter
    for name in expected["shards"]:
        assert (tmp_path / "whole" / name).read_bytes() == (tmp_path / "out" / name).read_bytes()


def test_a_killed_run_with_a_middle_level_resumes_without_redoing_it(tmp_path, monkeypatch) -> None:
    files = [_write(tmp_path / f"in{i}.jsonl", "jsonl", [{"id": j, "text": TEXTS[j % 40] + f" copy {j}"} for j in range(i, 600, 6)])
             for i in range(6)]  # fmt: skip
    params = normalize.NormalizeParams(target_shard_bytes=4_000, scatter_buffer_bytes=1_500, gather_fan_in=4)
    expected = normalize.normalize_source("s", files, str(tmp_path / "whole"), params)
    real_gather, real_regroup = normalize.gather_shard, normalize.regroup_chunk

    def dying_gather(inputs, output, gp):
        if gp.shard == 3:
            raise _Killed("worker killed")
        return real_gather(inputs, output, gp)

    monkeypatch.setattr(normalize, "gather_shard", dying_gather)
    out = str(tmp_path / "out")
    with pytest.raises(_Killed):
        normalize.normalize_source("s", files, out, params)
    regrouped: list[str] = []
    monkeypatch.setattr(normalize, "gather_shard", real_gather)
    monkeypatch.setattr(normalize, "regroup_chunk", lambda i, o, p: regrouped.append(o) or real_regroup(i, o, p))
    resumed = normalize.normalize_source("s", files, out, params)
    assert regrouped == []  # every middle task had finished
    assert resumed["resumed_tasks"] == len(files) + 3  # every scatter, and shards 0-2
    for name in expected["shards"]:
        assert (tmp_path / "whole" / name).read_bytes() == (tmp_path / "out" / name).read_bytes()


def _words_jsonl(docs: int, seed: int = 0) -> bytes:
    """JSON lines of random words: text that zstd compresses ~2-3x, well below the old 5x guess."""
    import random  # noqa: PLC0415

    rng = random.Random(seed)
    vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(20_000)]
    return _jsonl([{"id": j, "text": " ".join(rng.choice(vocab) for _ in range(300))} for j in range(docs)])


def test_a_zst_file_with_its_content_size_gets_the_shards_its_content_calls_for(tmp_path) -> None:
    content = _words_jsonl(3_000)
    path = tmp_path / "in.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor(write_content_size=True).compress(content))
    size = storage.size(str(path))
    assert 2 * size < len(content) < 4 * size  # compressible, but less than 5x
    assert zstandard.get_frame_parameters(path.read_bytes()[:18]).content_size == len(content)
    target = len(content) // 5 + 1  # the content calls for 5 shards (the old 5x-compressed guess: more)
    assert normalize.plan_shards([5 * size], target) > 5
    sized = normalize.uncompressed_bytes(str(path), "jsonl.zst")
    assert sized == len(content)
    out = normalize.normalize_source("s", [str(path)], str(tmp_path / "out"), normalize.NormalizeParams(target_shard_bytes=target))
    assert len(out["shards"]) == 5


def test_a_small_zst_file_is_sized_from_its_header_and_held_to_it_when_read(tmp_path, monkeypatch) -> None:
    """A file within the sample, one frame with its content size: that size, nothing decoded to plan
    (it would double the file's reading); a frame that claims another size fails when it is read."""
    content = _words_jsonl(200)
    packed = bytearray(zstandard.ZstdCompressor(write_content_size=True).compress(content))
    path = tmp_path / "in.jsonl.zst"
    path.write_bytes(packed)
    with monkeypatch.context() as patched:
        patched.setattr(formats, "zstd_sample", lambda *a: pytest.fail("a small file with its content size was decoded to size it"))
        assert normalize.uncompressed_bytes(str(path), "jsonl.zst") == len(content)
    fhd = packed[4]  # the frame header: its content size field follows the window byte (absent for a single segment)
    at = 5 + (0 if fhd & 0x20 else 1) + (0, 1, 2, 4)[fhd & 0x03]
    width = (1 if fhd & 0x20 else 0, 2, 4, 8)[fhd >> 6]
    claimed = int.from_bytes(packed[at : at + width], "little") + 1_000
    packed[at : at + width] = claimed.to_bytes(width, "little")
    path.write_bytes(packed)
    assert normalize.uncompressed_bytes(str(path), "jsonl.zst") > len(content)
    with pytest.raises(formats.FormatError, match="in.jsonl.zst.*corruption"):
        normalize.normalize_source("s", [str(path)], str(tmp_path / "out"), normalize.NormalizeParams())


@pytest.mark.parametrize("frames", [1, 4])
def test_a_zst_file_without_a_usable_content_size_is_sized_from_a_sample(tmp_path, monkeypatch, frames: int) -> None:
    """No size recorded (a streamed frame), or several frames (the first one's size is not the file's):
    the sample's ratio, extrapolated, lands near the content and not below the file."""
    content = _words_jsonl(6_000, seed=1)
    monkeypatch.setattr(normalize, "ZSTD_SAMPLE_BYTES", 256 * 1024)  # the file is several samples long
    step = -(-len(content) // frames)
    packed = b"".join(
        zstandard.ZstdCompressor(write_content_size=frames > 1).compress(content[i : i + step]) if frames > 1
        else zstandard.ZstdCompressor().compressobj().compress(content[i : i + step]) + zstandard.ZstdCompressor().compressobj().flush()
        for i in range(0, len(content), step)
    )  # fmt: skip
    path = tmp_path / "in.jsonl.zst"
    path.write_bytes(packed)
    if frames == 1:
        assert zstandard.get_frame_parameters(packed[:18]).content_size == zstandard.CONTENTSIZE_UNKNOWN
    sized = normalize.uncompressed_bytes(str(path), "jsonl.zst")
    assert 0.9 * len(content) < sized < 1.1 * len(content)


def test_a_shard_has_the_bytes_of_its_rows_sorted_and_written_whole(tmp_path) -> None:
    """Read in several batches per file, a shard is written as polars' own read, clean, hash, sort and
    write of all its rows would write it, byte for byte (pages span batches: > 2 MiB of text)."""
    import numpy as np
    import pyarrow.parquet as pq

    rng = np.random.default_rng(7)
    words = np.array([f"w{i}" for i in range(2000)])
    paths = []
    for f in range(3):
        rows = [{"id": f * 10_000 + i, "text": " ".join(rng.choice(words, int(rng.integers(20, 300))))} for i in range(1000)]
        rows[5]["text"], rows[9]["text"] = "a" + " " * 300 + "b", rows[0]["text"] if f == 0 else f"repeated {f % 2}"
        for row in rows[::7] if f == 1 else []:
            row["lang"] = "en"
        paths.append(_write(tmp_path / f"in-{f}.jsonl", "jsonl", rows))
    out = str(tmp_path / "out")
    manifest = normalize.normalize_source("s", paths, out, normalize.NormalizeParams(batch_bytes=256 << 10))
    assert manifest["counters"]["duplicates"] == 3 and len(manifest["shards"]) == 1

    frame = pl.concat([pl.read_ndjson(p) for p in paths], how="diagonal_relaxed").filter(pl.col("text").str.contains(r"\S"))
    frame = frame.with_columns(pl.col("text").str.replace_all(r"(\s{128})\s+", "${1}"), pl.col("id").cast(pl.Utf8).alias("source_id"))
    frame = frame.with_columns(pl.Series("id", [xxhash.xxh3_128_hexdigest(t.encode()) for t in frame["text"]]))
    frame = frame.select("id", "text", "source_id", "lang").sort("id", maintain_order=True)
    first = frame["id"].is_first_distinct()
    options = {**storage.PARQUET_WRITE_OPTIONS, **storage.POLARS_WRITE}
    for rows, path in ((frame.filter(first), tmp_path / "shard.parquet"), (frame.filter(~first), tmp_path / "dups.parquet")):
        pq.write_table(rows.to_arrow(compat_level=pl.CompatLevel.oldest()), path, **options)
    assert pq.ParquetFile(tmp_path / "shard.parquet").metadata.row_group(0).column(1).total_uncompressed_size > 2 << 20
    assert (tmp_path / "shard.parquet").read_bytes() == open(f"{out}/{manifest['shards'][0]}", "rb").read()
    assert (tmp_path / "dups.parquet").read_bytes() == open(f"{out}/dups/{manifest['shards'][0]}", "rb").read()
