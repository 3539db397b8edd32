"""One pin edit on a built demo instance with the full catalog, automation on, the real daemon
running what it requests (default conditions, tick intervals in seconds).

The edit publishes a new revision of one demo source that lacks one document it shares with
exactly one other source, in a topic only those two sources have documents in: the other
source's exact-dedup removals move (it no longer loses its copy), and so do both sources' band
edges; no other source's slice of any global decision moves. The test waits until the ticks
settle and checks that the edited source's chain, the global steps, and the pools of exactly
those two sources were built, each once, every pool after the decisions it reads had landed;
then that every per-source asset of every built source is current (re-run: reused), and that
Dagster's stale status (the UI's Unsynced) marks no partition of the 146. Then one global decision
alone (the fuzzy rule, rebuilt by hand): Unsynced are exactly the pools whose fuzzy slice moved.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import time
import unicodedata
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
from dagster._core.execution.backfill import BulkActionStatus

from marin_assets_tests.automation.system import REPO, wait_for
from marin_assets_tests.automation.test_automation_at_scale import Daemon, SensorTicks
from marin_assets_tests.fixtures.pipeline import catalog_with

pytestmark = pytest.mark.system  # the daemon building one source's chain, the global steps and two pools: minutes

SETTLE_TIMEOUT_S = 900
QUIET_TICKS = 3  # automation ticks in a row that request nothing, with no run left: settled


def _copy_rerooted(src: Path, dst: Path) -> None:
    """A copy of a data root whose records (``_current.json``, manifests) name the copy."""
    shutil.copytree(src, dst)
    for path in dst.rglob("*.json"):
        text = path.read_text()
        if str(src) in text:
            path.write_text(text.replace(str(src), str(dst)))


def _frame(layout, stage, source: str, columns: list[str]) -> pl.DataFrame:
    from marin_assets.core.runtime import stages, storage

    found = stages.current_input(layout, stage, source)
    return pl.concat([pl.from_arrow(storage.read_parquet(u, columns)) for u in storage.list_shards(found.uri)])


def _shared_document(layout, catalog) -> tuple[str, str, str, str]:
    """(edited source, the other source, document id, its text): a document in exactly two
    demo sources, the edited one keeping it in exact dedup (first in name order), in a topic
    only those two sources have documents in; the edited source is served as JSON lines."""
    from marin_assets.core import specs
    from marin_assets.demo.sample import DEMO_SOURCES

    names = sorted(DEMO_SOURCES)
    ids = {s: set(_frame(layout, specs.NORMALIZED, s, ["id"])["id"]) for s in names}
    topics = {s: _frame(layout, specs.TOPICS, s, ["id", "topic"]) for s in names}
    in_topic: dict[int, set[str]] = {}
    for s, frame in topics.items():
        for t in frame["topic"].unique():
            in_topic.setdefault(int(t), set()).add(s)
    for i, edited in enumerate(names):
        if "json" not in catalog.by_name(edited).input_format:
            continue
        topic_of = dict(zip(topics[edited]["id"], topics[edited]["topic"]))
        for other in names[i + 1 :]:
            for doc in sorted(ids[edited] & ids[other]):
                if any(doc in ids[s] for s in names if s not in (edited, other)) or in_topic[int(topic_of[doc])] != {edited, other}:
                    continue
                texts = _frame(layout, specs.NORMALIZED, edited, ["id", "text"]).filter(pl.col("id") == doc)["text"]
                return edited, other, doc, texts[0]
    raise AssertionError("the demo sample has no document shared by two sources alone in a topic of their own")


def _publish_without(hub_root: Path, repo_id: str, revision: str, text: str) -> str:
    """A new commit of the repo without the record whose text is ``text``; its sha."""
    from marin_assets.testing.hub_server import HubRepoStore

    store = HubRepoStore(hub_root)
    commit = store.commit(repo_id, store.resolve(repo_id, revision))
    files, dropped = {}, 0
    for path, stored in commit.files.items():
        data = store.blob_path(stored.sha256).read_bytes()
        if path.endswith(".json.gz") or path.endswith(".jsonl.gz"):
            lines = gzip.decompress(data).decode().splitlines(keepends=True)
            kept = [line for line in lines if unicodedata.normalize("NFC", json.loads(line).get("text") or "").strip() != text.strip()]
            dropped += len(lines) - len(kept)
            data = gzip.compress("".join(kept).encode())
        files[path] = data
    assert dropped == 1, f"{repo_id}: {dropped} records carry the document"
    return store.publish(repo_id, files, commit="")


def _built_after(instance: dg.DagsterInstance, key: dg.AssetKey, after: float) -> list[tuple[str | None, float]]:
    records = instance.fetch_materializations(key, limit=1000).records
    return [(r.partition_key, r.timestamp) for r in records if r.timestamp >= after]


def test_one_pin_edit_rebuilds_only_the_sources_whose_slice_moved(built_demo: Path, tmp_path: Path) -> None:
    from marin_assets.catalog.sources import load_catalog
    from marin_assets.core import specs
    from marin_assets.core.runtime import stages, storage
    from marin_assets.demo.run import DEMO_ENV, served_note
    from marin_assets.demo.sample import DEMO_SOURCES
    from marin_assets.testing.hub_server import LocalHubServer

    home, data, hub_root = tmp_path / "dagster_home", tmp_path / "data", tmp_path / "hub"
    shutil.copytree(built_demo / "dagster_home_as_built", home)
    _copy_rerooted(built_demo / "data", data)
    shutil.copytree(built_demo / "hub", hub_root)
    catalog_path = catalog_with(tmp_path / "catalog.toml")
    catalog = load_catalog(catalog_path)
    layout = storage.Layout(str(data))
    edited, other, doc, text = _shared_document(layout, catalog)
    provider = catalog.by_name(edited).provider
    new_sha = _publish_without(hub_root, provider.repo_id, provider.revision, text)
    before = {s: stages.stats_of(stages.current_input(layout, specs.EXACT_DUPLICATES))["removed_ids_digest"].get(s) for s in DEMO_SOURCES}

    with LocalHubServer(str(hub_root), served_note=served_note()) as hub, dg.DagsterInstance.from_config(str(home)) as instance:
        env = {
            **DEMO_ENV, "DAGSTER_HOME": str(home), "MARIN_PREFIX": str(data), "MARIN_CATALOG": str(catalog_path),
            "MARIN_AUTOMATION": "on", "MARIN_CATALOG_INTERVAL_S": "5", "MARIN_AUTOMATION_INTERVAL_S": "5",
            "MARIN_DRIFT_INTERVAL_S": "3600", "HF_ENDPOINT": hub.endpoint, "MARIN_RETRY_WAIT_S": "0",
            "HF_HUB_DISABLE_TELEMETRY": "1", "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1",
        }  # fmt: skip
        with Daemon({k: v for k, v in {**os.environ, **env}.items() if k != "HF_TOKEN"}, tmp_path / "daemon.log") as daemon:
            runs, seconds, edit_at = _edit_and_settle(instance, daemon, catalog_path, edited, new_sha)
        built = {key.to_user_string(): _built_after(instance, key, edit_at) for key in _graph().materializable_asset_keys}
        after = {s: stages.stats_of(stages.current_input(layout, specs.EXACT_DUPLICATES))["removed_ids_digest"].get(s) for s in DEMO_SOURCES}
        per_source_runs = [r for r in runs if r.tags.get("dagster/partition")]
        moved = sorted(s for s in DEMO_SOURCES if before[s] != after[s])
        print(f"pin edit of {edited} (dropping a document it shares with {other}): {len(runs)} runs in {seconds:.0f} s, "
              f"{len(per_source_runs)} per-source runs ({sum(r.tags['dagster/partition'] != edited for r in per_source_runs)} for other sources); "
              f"exact-dedup slices moved for {moved}; built: "
              + ", ".join(f"{n} {sorted(str(p) for p, _ in b)}" for n, b in sorted(built.items()) if b), flush=True)  # fmt: skip

        assert not [r.run_id for r in runs if r.status != dg.DagsterRunStatus.SUCCESS], daemon.tail()
        assert moved == [other], "the edit moves the exact-dedup removals of exactly one other source (the edited one keeps its copies)"
        for name in ("raw_files", "normalized", "minhash_buckets", "embeddings", "topics", "quality_scores"):
            assert [p for p, _ in built[name]] == [edited], f"{name}: only the edited source's chain, once"
        assert sorted(p for p, _ in built["pool"]) == sorted({edited, other}), "pools rebuilt only where a slice moved, each once"
        contamination = [p for p, _ in built["contamination"]]
        assert set(contamination) <= {edited, other} and len(contamination) == len(set(contamination))
        landed = max(t for name in ("exact_duplicates", "fuzzy_duplicates", "quality_bands") for _, t in built[name])
        assert all(t > landed for _, t in built["pool"]), "no pool built before the global decisions it reads had landed"
        assert built["sampling_groups"] and min(t for _, t in built["sampling_groups"]) > max(t for _, t in built["pool"])
        assert not {p for b in built.values() for p, _ in b if p is not None} - {edited, other, "demo"}, "no other source's partition was built"
        others = [r for r in per_source_runs if r.tags["dagster/partition"] != edited]
        assert len(others) <= len(moved), f"no more per-source runs for other sources than sources whose slice moved: {len(others)}"

        # after the ticks settle every asset is current: each per-source asset of each built source, re-run, is reused
        with pytest.MonkeyPatch.context() as mp:
            for key, value in env.items():
                mp.setenv(key, value)
            mp.delenv("HF_TOKEN", raising=False)
            not_reused = _rerun_every_per_source_asset(instance, list(DEMO_SOURCES))
        assert not_reused == [], f"not current after the ticks settled: {not_reused}"
        # ... and Dagster's own stale status (the UI's Unsynced) says so, over all 146 partitions
        assert _unsynced(instance) == set(), "after the edit settled, no current partition is shown Unsynced"

        # one global decision alone: the fuzzy rule changed and fuzzy_duplicates rebuilt (no daemon):
        # Unsynced are exactly the pools whose fuzzy slice moved
        fuzzy = lambda: stages.stats_of(stages.current_input(layout, specs.FUZZY_DUPLICATES))["removed_ids_digest"]  # noqa: E731
        before_rule = fuzzy()
        with pytest.MonkeyPatch.context() as mp:
            for key, value in {**env, "MARIN_FUZZY_CONTAINMENT": "0.95"}.items():
                mp.setenv(key, value)
            mp.delenv("HF_TOKEN", raising=False)
            _materialize(instance, "fuzzy_duplicates")
        after_rule = fuzzy()
        moved_rule = {s for s in set(before_rule) | set(after_rule) if before_rule.get(s) != after_rule.get(s)}
        unsynced = _unsynced(instance)
        print(f"fuzzy rule changed: slices moved for {sorted(moved_rule)}; Unsynced: {sorted(unsynced)}", flush=True)
        assert moved_rule and len(moved_rule) < len(DEMO_SOURCES), "a stricter rule keeps copies some sources lost, not all"
        assert unsynced == {("pool", s) for s in moved_rule}, "Unsynced: exactly the pools whose slice moved"


def _edit_and_settle(instance: dg.DagsterInstance, daemon: Daemon, catalog_path: Path, edited: str, new_sha: str) -> tuple[list, float, float]:
    """After the baseline catalog tick, edit the pin; wait until no run is left and automation
    ticks in a row request nothing. The runs launched, the seconds it took, the edit's time."""
    catalog_ticks, automation_ticks = SensorTicks(instance, "catalog_changes"), SensorTicks(instance, "marin_automation")

    def baseline():
        daemon.alive()
        return catalog_ticks.finished()

    wait_for("the baseline catalog tick", baseline, 300, every_s=1.0, diagnose=daemon.tail)
    runs_before = len(instance.get_run_records())
    catalog_with(catalog_path, edit={edited: {"provider": {"revision": new_sha}}})
    edit_at, started = time.time(), time.monotonic()

    def settled():
        daemon.alive()
        records = instance.get_run_records()
        runs = [r.dagster_run for r in records[: len(records) - runs_before]]
        if not runs or not all(r.is_finished for r in runs) or instance.get_backfills(status=BulkActionStatus.REQUESTED):
            return None  # a backfill still open holds its partitions "in progress" for automation
        backfills = [b.backfill_end_timestamp or 0 for b in instance.get_backfills(limit=100) if b.backfill_timestamp >= edit_at]
        last_end = max([r.end_time or 0 for r in records[: len(runs)]] + backfills)
        quiet = [t for t in automation_ticks.finished() if t.timestamp > last_end]
        return runs if len(quiet) >= QUIET_TICKS and not any(t.requested_asset_materialization_count for t in quiet) else None

    runs = wait_for("automation to settle after the pin edit", settled, SETTLE_TIMEOUT_S, every_s=2.0, diagnose=daemon.tail)
    return runs, time.monotonic() - started, edit_at


def _rerun_every_per_source_asset(instance: dg.DagsterInstance, sources: list[str]) -> list[str]:
    """Each per-source asset of each source re-run in process; those whose output was not reused."""
    from marin_assets.definitions import defs
    from marin_assets.defs.partitions import source_partitions

    graph = _graph()
    keys = [k for k in graph.materializable_asset_keys if graph.get(k).partitions_def == source_partitions]
    assets = [a for a in defs.assets or [] if isinstance(a, dg.AssetsDefinition) and a.is_executable]
    job = dg.define_asset_job("rerun", selection=dg.AssetSelection.assets(*keys), partitions_def=source_partitions)
    resolved = dg.Definitions(assets=assets, jobs=[job], resources=defs.resources).resolve_job_def("rerun")
    not_reused = []
    for source in sources:
        result = resolved.execute_in_process(instance=instance, partition_key=source, raise_on_error=True)
        for event in result.get_asset_materialization_events():
            mat = event.materialization
            if getattr(mat.metadata.get("reused"), "value", None) is not True:
                not_reused.append(f"{mat.asset_key.to_user_string()}[{source}]")
    return not_reused


def _unsynced(instance: dg.DagsterInstance) -> set[tuple[str, str]]:
    """(asset, partition) of every per-source asset that Dagster's stale status calls stale (the
    UI's Unsynced), over every partition of the catalog."""
    from dagster._core.definitions.data_version import CachingStaleStatusResolver, StaleStatus
    from dagster._core.loader import LoadingContextForTest

    from marin_assets.defs.partitions import source_partitions

    graph = _graph()
    resolver = CachingStaleStatusResolver(instance, graph, LoadingContextForTest(instance))
    keys = [k for k in graph.materializable_asset_keys if graph.get(k).partitions_def == source_partitions]
    return {(k.to_user_string(), p) for k in keys for p in source_partitions.get_partition_keys()
            if resolver.get_status(k, p) == StaleStatus.STALE}  # fmt: skip


def _materialize(instance: dg.DagsterInstance, name: str) -> None:
    """One asset materialized in this process with the code location's assets and resources."""
    from marin_assets.definitions import defs

    assets = [a for a in defs.assets or [] if isinstance(a, dg.AssetsDefinition)]
    result = dg.materialize(assets, selection=[name], instance=instance, resources=defs.resources, raise_on_error=True)
    assert result.success


def _graph():
    from marin_assets.definitions import defs

    return defs.resolve_asset_graph()
