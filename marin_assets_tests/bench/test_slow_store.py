"""The latency store's request counts per task: made in a worker process, returned with the task."""

from __future__ import annotations

from bench import slow_store
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.runner import ShardTask


def read_all(inputs: list[str], output: str, params: object) -> dict:
    """A task: reads each input through the store, writes one output."""
    chars = sum(len(storage.read_bytes(uri)) for uri in inputs)
    storage.write_bytes(output, b"%d" % chars)
    return {"chars": chars}


def test_each_task_returns_the_requests_its_worker_made(tmp_path) -> None:
    uris = []
    for i in range(5):
        (tmp_path / f"in-{i}").write_bytes(b"x" * (1000 + i))
        uris.append(slow_store.uri(str(tmp_path / f"in-{i}")))
    tasks = [ShardTask(read_all, tuple(uris[:k]), slow_store.uri(str(tmp_path / "out" / f"part-{k}"))) for k in (1, 3, 5)]
    expected = []
    for k in (1, 3, 5):  # the same reads in this process, counted here
        before = slow_store.SlowStore.total()
        read_all(uris[:k], slow_store.uri(str(tmp_path / "reference" / f"part-{k}")), None)
        expected.append(slow_store.SlowStore.total() - before)
    assert expected[0] < expected[1] < expected[2]

    runner = slow_store.RequestCountingRunner(processes=2)
    before = slow_store.SlowStore.total()
    results = runner.map(tasks)
    driver = slow_store.SlowStore.total() - before
    assert [r.stats["requests"] for r in results] == expected
    assert runner.per_task == {"read_all": expected}
    assert runner.widest == {"read_all": 5}
    assert driver < expected[0], "the tasks' requests were made in the workers, not here"

    again = slow_store.RequestCountingRunner(processes=2)
    assert all(r.reused for r in again.map(tasks))  # finished shards: nothing run, nothing counted
    assert again.per_task == {} and again.widest == {"read_all": 5}
