"""`marin-assets evals lock` against the local Hub server and a loopback web fixture, and builds
that read only the lock."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import shutil
import zipfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from marin_assets import cli
from marin_assets.catalog.evals import EvalRegistryError, HuggingFaceProvider, load_evals, write_lock
from marin_assets.core.decon import rules as decon
from marin_assets.core.decon.eval_sources import fetch_eval_set, lock_registry, registry_rows
from marin_assets.core.runtime import storage
from marin_assets.defs.resources import MarinResource
from marin_assets_tests.recipes.loopback import LoopbackServer

QUESTIONS = [
    {"id": f"q{i}", "question": f"Which of the planted questions number {i} asks about the orbit of a small moon "
                                f"around a distant gas giant in a quiet corner of the sky?", "answer": f"answer {i}"}
    for i in range(4)
]
TASKS = [{"id": f"t{i}", "user_scenario": {"instructions": f"You are a customer number {i} who wants to close an "
                                                           f"old savings account and move the balance elsewhere."}}
         for i in range(3)]


def _parquet(rows) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf)
    return buf.getvalue()


@pytest.fixture
def web(monkeypatch):
    monkeypatch.setenv("MARIN_RETRY_WAIT_S", "0")
    server = LoopbackServer().start()
    try:
        yield server
    finally:
        server.stop()


def _registry(tmp_path, web, hub_store):
    commit = hub_store.publish("org/qa", {"data/test-00000.parquet": _parquet(QUESTIONS)})
    tasks = json.dumps(TASKS).encode()
    url = web.put("/tasks.json", tasks)
    path = tmp_path / "evals.toml"
    path.write_text(f"""version = 1
[[eval]]
name = "qa"
mandatory = true
rows = 4
fields = ["question", "answer"]
id_field = "id"
provider = {{ kind = "huggingface", repo = "org/qa", split = "test", revision = "main", files = ["data/*.parquet"] }}

[[eval]]
name = "tasks"
mandatory = true
rows = 3
fields = ["user_scenario"]
id_field = "id"
provider = {{ kind = "web", url = "{url}", format = "json" }}

[[eval]]
name = "gone"
mandatory = false
fields = ["question"]
provider = {{ kind = "huggingface", repo = "org/gone", split = "test", revision = "0123456789abcdef0123456789abcdef01234567" }}
""")
    return path, commit, hashlib.sha256(tasks).hexdigest()


def test_lock_pins_branches_and_web_files_once_and_prints_changes(tmp_path, web, hub_store, hub_server, capsys):
    path, commit, sha = _registry(tmp_path, web, hub_store)
    registry = load_evals(path)
    with pytest.raises(EvalRegistryError, match="marin-assets evals lock"):
        registry.revision("qa")
    with pytest.raises(EvalRegistryError, match="marin-assets evals lock"):
        registry.archive_sha256("tasks")

    assert cli.main(["evals", "lock", "--registry", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"+ revision org/qa@main: {commit}" in out and f"+ sha256 {web.url('/tasks.json')}: {sha}" in out
    assert f"+ rows {web.url('/tasks.json')}: 3" in out
    assert web.count("/tasks.json") == 1
    locked = load_evals(path)
    assert locked.revision("qa") == commit and locked.archive_sha256("tasks") == sha
    assert locked.lock.rows == {web.url("/tasks.json"): 3}

    # a second run changes nothing and downloads nothing; a moved branch is only seen with --refresh
    hub_store.publish("org/qa", {"data/test-00000.parquet": _parquet(QUESTIONS[:3])})
    lock, changes = lock_registry(load_evals(path))
    assert changes == [] and web.count("/tasks.json") == 1
    lock, changes = lock_registry(load_evals(path), refresh=True)
    assert any(line.startswith("~ revision org/qa@main") for line in changes)
    assert cli.main(["evals", "lock", "--registry", str(path), "--check", "--refresh"]) == 1
    assert load_evals(path).revision("qa") == commit  # --check writes nothing


def test_build_reads_only_the_lock_and_reports_an_unavailable_best_effort_set(tmp_path, web, hub_store, hub_server):
    path, commit, sha = _registry(tmp_path, web, hub_store)
    assert cli.main(["evals", "lock", "--registry", str(path)]) == 0
    hub_store.publish("org/qa", {"data/test-00000.parquet": _parquet(QUESTIONS[:1])})  # the branch moves on
    registry = load_evals(path)
    layout = storage.Layout(str(tmp_path / "data"))
    access = MarinResource().provider_access()  # the settings' retry waits (MARIN_RETRY_WAIT_S=0), not production's
    skipped = []
    rows = list(registry_rows(registry, lambda s: fetch_eval_set(s, registry, layout, access),
                              on_skip=lambda s, exc: skipped.append((s.name, str(exc)))))
    stats = decon.build_eval_index(rows, str(tmp_path / "index"), decon.DeconParams(), registry.expected_rows())
    assert stats["eval_sets"]["qa"]["rows"] == 4  # the locked commit, not the moved branch
    assert stats["eval_sets"]["tasks"]["rows"] == 3 and stats["coverage"]["eval_sets"]["tasks"]["features"] > 0
    assert [name for name, _ in skipped] == ["gone"] and "org/gone" in skipped[0][1]

    # a changed web file is refused, naming the command that re-pins it
    web.put("/tasks.json", json.dumps(TASKS[:2]).encode())
    fresh = tmp_path / "fresh"
    with pytest.raises(Exception, match="sha256"):
        list(registry_rows(registry, lambda s: fetch_eval_set(s, registry, storage.Layout(str(fresh)), access)))


def test_packaged_lock_pins_nothing_it_could_not_verify():
    """The committed lock holds only pins checked against stored copies of the providers' repositories."""
    registry = load_evals(storage.join(str(decon.__file__).rsplit("/core/", 1)[0], "catalog", "evals.toml"))
    for key, commit in registry.lock.revisions.items():
        assert len(commit) == 40
    unpinned = [s.name for s in registry.mandatory
                if getattr(s.provider, "is_branch", False) and s.provider.lock_key not in registry.lock.revisions]
    for name in unpinned:
        with pytest.raises(EvalRegistryError, match="marin-assets evals lock"):
            registry.revision(name)


# ----------------------------------------------------------------------------- the packaged registry, end to end


def _fixture_rows(eval_set, n):
    """Rows with every field the registry entry reads, written as the provider publishes them."""
    rows = []
    for i in range(n):
        row = {}
        for field in eval_set.fields + eval_set.passage_fields:
            row[field.split(".")[0]] = (f"{eval_set.name} row {i} field {field}: the stone falls for a while and "
                                        f"the observer writes down what the clock shows at the bridge")
        if eval_set.id_field:
            row[eval_set.id_field] = f"{eval_set.name}-{i}"
        if eval_set.explode:
            row = {eval_set.id_field: f"{eval_set.name}-{i}", "problem_description_main": row.pop(
                "problem_description_main", "main"), eval_set.explode: [row]}
        rows.append(row)
    return rows


def _file_bytes(path, rows):
    if path.endswith(".csv"):
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
        return buf.getvalue().encode()
    if path.endswith(".jsonl"):
        return "\n".join(json.dumps(r) for r in rows).encode()
    return _parquet(rows)


@pytest.mark.system
def test_the_packaged_registry_locks_and_builds_without_edits(tmp_path, web, hub_store, hub_server, monkeypatch):
    """The packaged registry (copied as is), its mandatory sets served by the local Hub and a loopback
    mirror with fixture data of the registry's own field names and row counts: the lock command pins
    them, reports the best-effort sets it cannot pin, and the index builds from the lock alone."""
    catalog = Path(__file__).parents[3] / "marin_assets" / "catalog"
    for name in ("evals.toml", "evals_lm_eval.toml"):
        shutil.copy(catalog / name, tmp_path / name)
    registry = load_evals(tmp_path / "evals.toml")
    monkeypatch.setenv("MARIN_WEB_MIRROR", f"https://raw.githubusercontent.com={web.url('/raw')};"
                                           f"https://github.com={web.url('/gh')}")
    for eval_set in registry.mandatory:
        provider = eval_set.provider
        if isinstance(provider, HuggingFaceProvider):
            path = provider.files[0].replace("**/", "data/").replace("*", "00000")
            hub_store.publish(provider.repo, {path: _file_bytes(path, _fixture_rows(eval_set, eval_set.rows))})
        elif provider.format == "json":
            web.put(provider.url.replace("https://raw.githubusercontent.com", "/raw"),
                    json.dumps(_fixture_rows(eval_set, eval_set.rows)).encode())
        else:
            buf = io.BytesIO()
            with zipfile.ZipFile(buf, "w") as archive:
                for i in range(eval_set.rows):
                    for field in eval_set.fields:
                        archive.writestr(f"bench-2.1/task-{i}/{field}", f"task {i} {field}: list the files, sort "
                                                                         f"them by size and print the largest one")
            web.put(provider.url.replace("https://github.com", "/gh"), buf.getvalue())

    access = MarinResource().provider_access()  # the mirror setting, as `marin-assets evals lock` reads it
    lock, changes = lock_registry(registry, access=access)
    pinned = [c for c in changes if c.startswith("+ ")]
    assert len([c for c in pinned if c.startswith("+ revision")]) == 7  # the mandatory Hub sets
    assert len([c for c in pinned if c.startswith("+ sha256")]) == 2  # the mandatory web files
    assert sum(c.startswith("! not pinned (best effort)") for c in changes) > 100
    write_lock(lock, registry.lock_path)

    locked = load_evals(tmp_path / "evals.toml")
    layout = storage.Layout(str(tmp_path / "data"))
    skipped = []
    rows = registry_rows(locked, lambda s: fetch_eval_set(s, locked, layout, access),
                         on_skip=lambda s, exc: skipped.append(s.name))
    stats = decon.build_eval_index(rows, str(tmp_path / "index"), decon.DeconParams(), locked.expected_rows())
    assert {name: v["rows"] for name, v in stats["eval_sets"].items()} == locked.expected_rows()
    assert len(skipped) == len(locked.sets) - len(locked.mandatory)


def test_a_local_eval_file_is_fingerprinted_by_its_bytes_not_its_path(tmp_path):
    """The same registry in two checkouts gives one eval index fingerprint; edited rows give another."""
    from marin_assets.core.decon.eval_sources import registry_digest  # noqa: PLC0415

    demo = Path(__file__).parents[3] / "marin_assets" / "demo"
    digests = []
    for name in ("checkout_a", "checkout_b"):
        copy = tmp_path / name
        copy.mkdir()
        for file in ("evals.toml", "evals_demo.jsonl"):
            shutil.copy(demo / file, copy / file)
        digests.append(registry_digest(load_evals(str(copy / "evals.toml"))))
    assert digests[0] == digests[1]
    edited = tmp_path / "checkout_b" / "evals_demo.jsonl"
    edited.write_text(edited.read_text().replace("?", "?!", 1))
    assert registry_digest(load_evals(str(tmp_path / "checkout_b" / "evals.toml"))) != digests[0]


def test_lock_check_offline_ends_with_the_message_and_the_fix(tmp_path, web, hub_store, monkeypatch, capsys):
    path, _, _ = _registry(tmp_path, web, hub_store)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: the Hub is unreachable
    monkeypatch.setenv("MARIN_RETRY_WAIT_S", "0")
    before = path.with_suffix(".lock").exists()
    assert cli.main(["evals", "lock", "--registry", str(path), "--check"]) == 2
    err = capsys.readouterr().err
    assert "error: " in err and "org/qa" in err and "Traceback" not in err
    assert "fix: `evals lock` asks the Hub (HF_ENDPOINT)" in err.splitlines()[-1]
    assert path.with_suffix(".lock").exists() == before
