"""``marin-assets``: the catalog, the offline demo, the local Hub server and the UI.

    marin-assets sources            list the catalog with kind, pin, tokens, runnable
    marin-assets status             every catalog source: built, stale (why), failed (why), never built; tokens, last build
    marin-assets status --recipes   whether this version implements each catalog entry's recipe
    marin-assets materialize --select a,b --partition SOURCE   one source's assets here; a failure prints its cause first
    marin-assets settings           every setting (environment variable), its default and meaning
    marin-assets demo               run the offline demo pipeline into DAGSTER_HOME/MARIN_PREFIX
    marin-assets serve-hub ROOT     serve a directory of dataset repos with the Hub HTTP API
    marin-assets evals lock         pin the eval registry: branch -> commit, web file -> sha256 and rows
    marin-assets dev                the Dagster UI (`dg dev`) on the embedded default (demo Hub if no HF_ENDPOINT)
    marin-assets build [--sources a,b]  each source's chain and the global steps after it, one backfill, followed to the end
    marin-assets verify [--sources a,b]  re-read published outputs; every file against its recorded size and digest
    marin-assets instance           create the DAGSTER_HOME instance's storage once, before any run
    marin-assets runs [--free]      runs whose process died (still STARTED, holding pool slots); --free frees them
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys


def _catalog_path(args: argparse.Namespace) -> str | None:
    """``--catalog``, else the ``MARIN_CATALOG`` setting, else None (the packaged catalog)."""
    from marin_assets.defs.settings import configured_catalog_path

    return args.catalog or configured_catalog_path()


def _cmd_sources(args: argparse.Namespace) -> int:
    from marin_assets.catalog.sources import format_sources_table
    from marin_assets.core.ingest.recipes import checked_catalog
    from marin_assets.core.ingest import raw as ingest
    from marin_assets.core.ingest.transforms import known_transforms

    catalog = checked_catalog(_catalog_path(args))
    print(format_sources_table(catalog))
    transforms = known_transforms()
    runnable, missing = [], []
    for source in catalog:
        try:
            ingest.check_recipe(source, transforms)
            runnable.append(source.name)
        except ingest.RecipeNotImplemented as exc:
            missing.append(str(exc).removeprefix("recipe not implemented yet: "))
    print(f"\nrunnable now: {len(runnable)} of {len(catalog)}")
    for line in missing if args.verbose else []:
        print(f"  not yet: {line}")
    if missing and not args.verbose:
        print(f"  {len(missing)} need a recipe not implemented yet (--verbose lists them)")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    if args.recipes:
        from marin_assets.core.ingest.recipes import format_status

        print(format_status(_catalog_path(args)))
        return 0
    from dagster import DagsterInstance

    from marin_assets.catalog.sources import load_catalog
    from marin_assets.definitions import defs
    from marin_assets.defs.status import format_source_status, source_status

    instance = DagsterInstance.get()
    try:
        statuses = source_status(instance, defs.resolve_asset_graph(), load_catalog(_catalog_path(args), strict=False))
        print(format_source_status(statuses, every=args.all))
    finally:
        instance.dispose()
    return 0


def _cmd_materialize(args: argparse.Namespace) -> int:
    """Materialize assets of one partition in this process, on the DAGSTER_HOME instance; a
    failure ends with its cause on the first line of the error."""
    import dagster as dg

    from marin_assets.definitions import defs
    from marin_assets.defs.alerts import run_failure_alert

    instance = dg.DagsterInstance.get()
    try:
        result = dg.materialize(
            [*(defs.assets or []), *(defs.asset_checks or [])],
            selection=args.select, partition_key=args.partition or None, instance=instance,
            resources=dict(defs.resources or {}), raise_on_error=False,
            run_config={"loggers": {"console": {"config": {"log_level": args.log_level.upper()}}}},
        )  # fmt: skip
        if result.success:
            print(f"run {result.run_id}: materialized {args.select}" + (f" [{args.partition}]" if args.partition else ""))
            return 0
        alert = run_failure_alert(instance, result.run_id, "run failed")
        print(f"error: {alert['cause']}", file=sys.stderr)
        print(f"  run {result.run_id} ({', '.join(alert['assets'])}" + (f" [{alert['partition']}]" if alert["partition"] else "")
              + "): the whole log and the stack trace are on the run's page in the UI (make dev)", file=sys.stderr)  # fmt: skip
        return 1
    finally:
        instance.dispose()


def _cmd_settings(args: argparse.Namespace) -> int:
    from marin_assets.defs.resources import settings_table

    print(settings_table())
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from marin_assets.demo.run import run_demo

    return run_demo(sources=args.sources.split(",") if args.sources else None)


def _cmd_serve_hub(args: argparse.Namespace) -> int:
    from marin_assets.testing.hub_server import serve  # test and demo infrastructure, not a stage

    serve(args.root, port=args.port, host=args.host)
    return 0


def _cmd_instance(args: argparse.Namespace) -> int:
    """Create the DAGSTER_HOME instance's storage (its databases and their schema version) now,
    in one process: runs started at once on a fresh instance would each create it, and a
    version table stamped twice leaves every later command failing."""
    from dagster import DagsterInstance

    DagsterInstance.get().dispose()
    return 0


def _cmd_runs(args: argparse.Namespace) -> int:
    """List (and with ``--free`` fail and release) runs whose process is gone, on the DAGSTER_HOME instance."""
    from dagster import DagsterInstance

    from marin_assets.defs.runs import format_stuck, free_stuck_runs, stuck_runs

    instance = DagsterInstance.get()
    try:
        stuck = free_stuck_runs(instance) if args.free else stuck_runs(instance)
        print(format_stuck(stuck, freed=args.free))
    finally:
        instance.dispose()
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    """Re-read every published output (of ``--sources``) and compare each file with its manifest's size and digest."""
    from marin_assets.catalog.sources import load_catalog
    from marin_assets.core import specs
    from marin_assets.core.runtime import stages
    from marin_assets.defs.resources import MarinResource

    sources = args.sources.split(",") if args.sources else [s.name for s in load_catalog(_catalog_path(args))]
    checked, damaged = 0, 0
    for uri, found in stages.verify_outputs(MarinResource().layout(), specs.ALL, sources):
        checked += 1
        damaged += bool(found)
        for name, why in found.items():
            print(f"DAMAGED {name}: {why}")
    print(f"{checked} outputs checked, {damaged} damaged" + ("; rematerialize their partitions: a damaged output is rebuilt, not reused" if damaged else ""))
    return 1 if damaged else 0


def _cmd_evals(args: argparse.Namespace) -> int:
    from marin_assets.catalog.evals import load_evals, write_lock
    from marin_assets.core.decon.eval_sources import lock_registry
    from marin_assets.errors import MarinError
    from marin_assets.defs.resources import MarinResource

    marin = MarinResource()  # MARIN_EVALS, HF_ENDPOINT, HF_TOKEN, MARIN_WEB_MIRROR, retry waits
    registry = load_evals(args.registry) if args.registry else marin.evals()
    try:
        lock, changes = lock_registry(registry, access=marin.provider_access(), refresh=args.refresh)
    except MarinError as err:
        print(f"error: {err}", file=sys.stderr)
        print("fix: `evals lock` asks the Hub (HF_ENDPOINT) and the eval sets' web hosts (MARIN_WEB_MIRROR) for their "
              f"current versions; run it where they are reachable. The lock {registry.lock_path} is unchanged and builds keep using it.",
              file=sys.stderr)  # fmt: skip
        return 2
    for line in changes:
        print(line)
    if args.check:
        print(f"{len(changes)} change(s); lock not written (--check)")
        return 1 if changes else 0
    write_lock(lock, registry.lock_path)
    print(f"{len(changes)} change(s); wrote {registry.lock_path}" if changes else f"{registry.lock_path} is up to date")
    return 0


def _cmd_dev(args: argparse.Namespace) -> int:
    """Run ``dg dev``; without ``HF_ENDPOINT`` the demo Hub serves the bundled sample.

    It runs in ``DAGSTER_HOME`` (the checkout when unset), whose ``dagster.yaml`` configures the
    instance: started in the checkout, the server would warn that the checkout's ``dagster.yaml``
    is not used (it is, through the link ``make home`` puts in ``DAGSTER_HOME``). The daemon's
    run-retry cursors start at the newest event first, as the daemon would, without its warning.
    """
    from marin_assets.demo.run import demo_hub

    env = dict(os.environ)
    # The dg next to this interpreter: `make dev` runs without an activated venv.
    dg = os.path.join(os.path.dirname(sys.executable), "dg")
    workspace = os.path.abspath("workspace.yaml")
    command = [dg if os.path.exists(dg) else "dg", "dev", "-w", workspace, "-p", str(args.port)]
    home = env.get("DAGSTER_HOME") or os.getcwd()
    if env.get("DAGSTER_HOME"):
        from dagster import DagsterInstance

        from marin_assets.defs.runs import start_retry_cursors

        with DagsterInstance.get() as instance:
            start_retry_cursors(instance)
    if env.get("HF_ENDPOINT"):
        return subprocess.call(command, env=env, cwd=home)
    from marin_assets.demo.run import DEMO_ENV

    with demo_hub() as endpoint:
        env["HF_ENDPOINT"] = endpoint
        for key, value in DEMO_ENV.items():
            env.setdefault(key, value)
        from marin_assets.demo.sample import DEMO_SOURCES

        print(f"offline demo Hub at {endpoint}: it serves the {len(DEMO_SOURCES)} demo sources ({', '.join(DEMO_SOURCES)}); "
              "the UI lists every catalog source, the others need HF_ENDPOINT=https://huggingface.co", flush=True)  # fmt: skip
        try:
            return subprocess.call(command, env=env, cwd=home)
        except KeyboardInterrupt:
            return 0


def build_selection(with_models: bool = False) -> list[list[str]]:
    """The assets ``build`` backfills: every per-source asset (but ``source_pins``, which is
    observed) and every global step downstream of the sources; the model-training steps only
    when asked (they are manual in automation too)."""
    from marin_assets.core.specs import SOURCE_PINS
    from marin_assets.defs.automation.conditions import EXCEPTIONS, MANUAL
    from marin_assets.definitions import defs
    from marin_assets.defs.partitions import source_partitions

    graph = defs.resolve_asset_graph()
    keys = []
    for key in graph.materializable_asset_keys:
        node = graph.get(key)
        if key.to_user_string() == SOURCE_PINS.name or node.partitions_def not in (None, source_partitions):
            continue
        if not with_models and EXCEPTIONS.get(key.to_user_string(), True) is MANUAL:
            continue
        keys.append(key.path)
    return sorted(keys)


def _cmd_build(args: argparse.Namespace) -> int:
    from marin_assets import backfill
    from marin_assets.core.ingest.recipes import checked_catalog

    names = list(checked_catalog(_catalog_path(args)).names)
    sources = [s.strip() for s in args.sources.split(",") if s.strip()] or names
    unknown = sorted(set(sources) - set(names))
    if unknown:
        print(f"error: not in the catalog: {', '.join(unknown)} (see `marin-assets sources`)", file=sys.stderr)
        return 2
    assets = build_selection(args.models)
    try:
        backfill_id = backfill.launch(args.url, sources, assets, args.title, launched_by="marin-assets build")
        print(f"backfill {backfill_id}: {len(sources)} sources x {len(assets)} assets ({', '.join('/'.join(a) for a in assets)})")
        print(f"  {args.url.rstrip('/')}/runs/b/{backfill_id}", flush=True)
        return 0 if args.no_wait else backfill.follow(args.url, backfill_id, args.timeout, args.poll)
    except backfill.BackfillError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="marin-assets", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("sources", help="list the catalog")
    p.add_argument("--catalog", default=None, help="catalog file (default: MARIN_CATALOG or the packaged one)")
    p.add_argument("--verbose", action="store_true")
    p.set_defaults(fn=_cmd_sources)

    p = sub.add_parser("status", help="every catalog source on the DAGSTER_HOME instance: built, stale (why), failed (why), never built")
    p.add_argument("--catalog", default=None, help="catalog file (default: MARIN_CATALOG or the packaged one)")
    p.add_argument("--all", action="store_true", help="list never-built sources one per line too (default: counted in one line)")
    p.add_argument("--recipes", action="store_true", help="instead: whether this version implements each catalog entry's recipe")
    p.set_defaults(fn=_cmd_status)

    p = sub.add_parser("materialize", help="materialize assets of one partition here, on the DAGSTER_HOME instance")
    p.add_argument("--select", required=True, help="assets, e.g. raw_files,normalized")
    p.add_argument("--partition", default="", help="the source (partitioned assets)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"], help="Dagster's console log (default: info)")
    p.set_defaults(fn=_cmd_materialize)

    p = sub.add_parser("settings", help="every setting: environment variable, default, meaning (the table in docs/operations.md)")
    p.set_defaults(fn=_cmd_settings)

    p = sub.add_parser("demo", help="run the offline demo pipeline")
    p.add_argument("--sources", default="", help="comma-separated demo sources (default: all)")
    p.set_defaults(fn=_cmd_demo)

    p = sub.add_parser("serve-hub", help="serve dataset repos with the Hub HTTP API")
    p.add_argument("root")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--host", default="127.0.0.1")
    p.set_defaults(fn=_cmd_serve_hub)

    p = sub.add_parser("evals", help="the eval registry: `evals lock` pins branches and web files")
    p.add_argument("action", choices=["lock"])
    p.add_argument("--registry", default=None, help="the registry file (default: MARIN_EVALS or the packaged one)")
    p.add_argument("--refresh", action="store_true", help="re-resolve every pin, not only the missing ones")
    p.add_argument("--check", action="store_true", help="print the changes, write nothing, exit 1 if any")
    p.set_defaults(fn=_cmd_evals)

    p = sub.add_parser("dev", help="the Dagster UI on the embedded default")
    p.add_argument("--port", type=int, default=3000)
    p.set_defaults(fn=_cmd_dev)

    p = sub.add_parser("build", help="each source's chain and the global steps after it, as one backfill, followed to the end")
    p.add_argument("--sources", default="", help="comma-separated catalog sources (default: every source)")
    p.add_argument("--catalog", default=None, help="catalog file (default: MARIN_CATALOG or the packaged one)")
    p.add_argument("--models", action="store_true", help="also (re)train topic_model and quality_model")
    p.add_argument("--url", default="http://127.0.0.1:3000", help="the Dagster webserver (default: http://127.0.0.1:3000)")
    p.add_argument("--title", default=None)
    p.add_argument("--no-wait", action="store_true", help="launch and return")
    p.add_argument("--timeout", type=float, default=7 * 24 * 3600, help="seconds to follow it at most")
    p.add_argument("--poll", type=float, default=10.0, help="seconds between polls")
    p.set_defaults(fn=_cmd_build)

    p = sub.add_parser("verify", help="re-read published outputs and compare every file with its recorded size and digest")
    p.add_argument("--sources", default="", help="comma-separated catalog sources (default: every source)")
    p.add_argument("--catalog", default=None, help="catalog file (default: MARIN_CATALOG or the packaged one)")
    p.set_defaults(fn=_cmd_verify)

    p = sub.add_parser("instance", help="create the DAGSTER_HOME instance's storage once, before any run (make home does)")
    p.set_defaults(fn=_cmd_instance)

    p = sub.add_parser("runs", help="runs whose process died and that still hold pool slots")
    p.add_argument("--free", action="store_true", help="mark them failed and free their pool slots")
    p.set_defaults(fn=_cmd_runs)

    args = parser.parse_args(argv)
    return int(args.fn(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
