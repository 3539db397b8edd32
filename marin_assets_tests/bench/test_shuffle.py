"""The shuffle bench's helpers: the process tree it reads peaks from, and its output check."""

from __future__ import annotations

import os
import signal
import subprocess

import pyarrow as pa
import pyarrow.parquet as pq

from bench import bench_shuffle


def test_process_tree_finds_children_and_grandchildren() -> None:
    child = subprocess.Popen(["bash", "-c", "sleep 30; true"])  # bash forks the sleep: a grandchild
    grandchild = None
    try:
        for _ in range(500):  # until bash has started its sleep
            tree = bench_shuffle.process_tree(os.getpid())
            grandchild = next((pid for pid, p in tree.items() if p.command.startswith("sleep")), None)
            if grandchild:
                break
        assert grandchild is not None and grandchild != child.pid
        assert tree[child.pid].command.startswith("bash") and all(p.hwm_kib > 0 for p in tree.values())
        assert os.getpid() not in tree
    finally:
        if grandchild:
            os.kill(grandchild, signal.SIGKILL)
        child.kill()
        child.wait()


def test_ray_workers_are_told_from_ray_services() -> None:
    assert bench_shuffle.is_ray_worker("ray::HashShuffleAggregator")
    assert bench_shuffle.is_ray_worker("/venv/bin/python /venv/lib/ray/_private/workers/default_worker.py --node-ip-address=127.0.0.1")
    assert not bench_shuffle.is_ray_worker("/venv/lib/ray/core/src/ray/raylet/raylet --raylet_socket_name=x")


def _write(path, keys, nodes) -> str:
    pq.write_table(pa.table({"key": pa.array(keys, pa.int64()), "node": pa.array(nodes, pa.int64())}), path)
    return str(path)


def test_partitions_check_sees_lost_rows_and_split_keys(tmp_path) -> None:
    rows = pa.table({"key": pa.array([1, 1, 2, 3], pa.int64()), "node": pa.array([10, 11, 20, 30], pa.int64())})
    digest = bench_shuffle.rows_digest(rows)
    grouped = [_write(tmp_path / "a.parquet", [3, 1], [30, 11]), _write(tmp_path / "b.parquet", [2, 1], [20, 10])]
    assert bench_shuffle.partitions_check(grouped)["grouped"] is False  # key 1 in both files
    grouped = [_write(tmp_path / "a.parquet", [3, 1, 1], [30, 11, 10]), _write(tmp_path / "b.parquet", [2], [20])]
    check = bench_shuffle.partitions_check(grouped)
    assert check["grouped"] and check["digest"] == digest and check["rows"] == 4
    lost = [_write(tmp_path / "a.parquet", [3, 1], [30, 11]), grouped[1]]
    assert bench_shuffle.partitions_check(lost)["digest"] != digest
