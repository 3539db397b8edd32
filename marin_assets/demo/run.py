"""The offline demo: serve the bundled sample through the local Hub and run the pipeline.

Runs go into the Dagster instance under ``DAGSTER_HOME`` and data under ``MARIN_PREFIX``, so
``make dev`` shows them afterwards. The real client code path runs: ``huggingface_hub`` talks
to the local Hub server through ``HF_ENDPOINT``.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from marin_assets.core.ingest.recipes import checked_catalog
from marin_assets.demo.sample import DEMO_SOURCES, build_sample_files

SAMPLE_VERSION = "2"
DEMO_DIR = Path(__file__).parent
# The embedded default runs offline: demo eval set, bundled quality labels, offline encoder.
DEMO_ENV = {
    "MARIN_EVALS": str(DEMO_DIR / "evals.toml"),
    "MARIN_QUALITY_ANNOTATIONS": str(DEMO_DIR / "quality_labels.jsonl"),
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "MARIN_REPORT_SCALE": "fit",  # the demo serves a sample: its tokens are set against the catalog's at a fitted scale
}
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
EVALS_FILE = Path(__file__).with_name("evals_demo.jsonl")


def demo_hub_root() -> str:
    return os.path.abspath(os.environ.get("MARIN_DEMO_HUB") or ".demo_hub")


def demo_eval_items() -> list[dict[str, Any]]:
    """The demo's eval items (a local JSONL eval set), if present."""
    if not EVALS_FILE.exists():
        return []
    items = []
    for line in EVALS_FILE.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            question = record.get("question") or record.get("prompt") or record.get("text") or ""
            items.append({"question": question, "answer": record.get("answer", "")})
    return items


def build_demo_hub(root: str | None = None) -> str:
    """Publish the sample repos (idempotent: rebuilt only when the sample version changes)."""
    from marin_assets.testing.hub_server import HubRepoStore

    root = root or demo_hub_root()
    marker = Path(root) / f".sample-v{SAMPLE_VERSION}"
    if marker.exists():
        return root
    catalog = checked_catalog()
    store = HubRepoStore(root)
    files = build_sample_files(demo_eval_items())
    for name in DEMO_SOURCES:
        provider = catalog.by_name(name).provider
        store.publish(provider.repo_id, files[name], commit=provider.revision)
    marker.write_text(time.strftime("%Y-%m-%dT%H:%M:%S"))
    return root


def served_note() -> str:
    """What the demo Hub says on every 404: the sources it serves, and how to build the others."""
    return (
        f"This is the offline demo Hub: it serves only the {len(DEMO_SOURCES)} demo sources "
        f"({', '.join(DEMO_SOURCES)}). Every other catalog source needs its real provider: set "
        "HF_ENDPOINT=https://huggingface.co (and HF_TOKEN for gated sources) on a machine with network access"
    )


@contextlib.contextmanager
def demo_hub(root: str | None = None) -> Iterator[str]:
    """A running local Hub server over the demo repos; yields its endpoint."""
    from marin_assets.testing.hub_server import LocalHubServer

    with LocalHubServer(build_demo_hub(root), served_note=served_note()) as server:
        yield server.endpoint


def _materializations(result: Any) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for event in result.all_events:
        if event.event_type_value == "ASSET_MATERIALIZATION":
            mat = event.event_specific_data.materialization
            found[mat.asset_key.to_user_string()] = {k: getattr(v, "value", v) for k, v in mat.metadata.items()}
    return found


def run_demo(sources: Sequence[str] | None = None) -> int:
    import dagster as dg

    from marin_assets.definitions import defs

    sources = list(sources or DEMO_SOURCES)
    if not os.environ.get("DAGSTER_HOME"):
        raise SystemExit("DAGSTER_HOME is not set; run the demo with `make demo` or set DAGSTER_HOME to a folder")
    os.makedirs(os.environ["DAGSTER_HOME"], exist_ok=True)
    with demo_hub() as endpoint, dg.DagsterInstance.get() as instance:
        os.environ["HF_ENDPOINT"] = endpoint
        os.environ.pop("HF_TOKEN", None)
        for key, value in DEMO_ENV.items():
            os.environ.setdefault(key, value)
        print(f"offline Hub at {endpoint}; data under {os.environ.get('MARIN_PREFIX', '.marin_data')}", flush=True)
        from marin_assets.defs.jobs import BUILD_ORDER

        _record_pins(instance, sources)
        rows: list[dict[str, Any]] = []
        for job_name, _keys, partitioned in BUILD_ORDER:
            job = defs.resolve_job_def(job_name)
            print(f"\n== {job_name} ==", flush=True)
            for name in sources if partitioned else [None]:
                result = job.execute_in_process(partition_key=name, instance=instance, raise_on_error=True, run_config=QUIET)
                meta = _materializations(result)
                if job_name == "source_chain":
                    rows.append(_normalized_row(name, meta.get("normalized", {})))
                    row = rows[-1]
                    print(f"  {name}: {row['rows']} documents ({row['empty']} empty dropped, {row['dups']} copies set aside)", flush=True)
                else:
                    _print_summaries(meta)
        from marin_assets.demo.mixture import run_mixture_demo

        run_mixture_demo(defs, instance)
    print("\nnormalized sources:")
    print(f"  {'source':28s} {'rows in':>8s} {'empty':>6s} {'dups':>5s} {'rows':>6s} reused")
    for row in rows:
        print(f"  {row['source']:28s} {row['rows_in']!s:>8s} {row['empty']!s:>6s} {row['dups']!s:>5s} {row['rows']!s:>6s} {row['reused']}")
    print("\nSee the runs in the UI: make dev  (http://127.0.0.1:3000)")
    return 0


def _record_pins(instance: Any, sources: Sequence[str]) -> None:
    """Record the built sources' pins first (as ``catalog_changes`` does): each build then
    remembers the pin it was built for, and the UI marks its chain stale when the pin changes."""
    from marin_assets.core.ingest import raw as ingest
    from marin_assets.defs.automation.sensors import pin_observations

    catalog = checked_catalog(os.environ.get("MARIN_CATALOG") or None)
    for event in pin_observations({name: ingest.recipe_fingerprint(catalog.by_name(name)) for name in sources}, {}):
        instance.report_runless_asset_event(event)


def _normalized_row(name: str, norm: dict[str, Any]) -> dict[str, Any]:
    keys = {"rows_in": "rows_in", "empty": "empty_dropped", "dups": "duplicates", "rows": "dagster/row_count", "reused": "reused"}
    return {"source": name} | {k: norm.get(v) for k, v in keys.items()}


def _print_summaries(meta: dict[str, dict[str, Any]]) -> None:
    """Global stages print their own summaries from their metadata."""
    for key in sorted(meta):
        for field, title in (("summary", key), ("rebuild_report_summary", "rebuild report (against the catalog and the last published build)")):
            text = meta[key].get(field)
            if text:
                lines = [line for line in str(text).splitlines() if not line.startswith("```")]
                print(f"\n{title}:\n" + "\n".join(lines))
