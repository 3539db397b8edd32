"""The sensors that run marin-assets on its own: declarative automation and catalog changes.

All of them start in the state ``MARIN_AUTOMATION`` names when the code location loads:
``off`` (the default: a UI opened to explore the demo launches nothing by itself) or ``on``
(production). Either way each can be switched in the UI (Automation tab).
"""

import hashlib
import json
from typing import Any

import dagster as dg
from dagster._core.definitions.data_version import DATA_VERSION_TAG
from dagster._core.events import DagsterEventType

from marin_assets.core import specs
from marin_assets.core.ingest import raw as ingest
from marin_assets.defs.automation.conditions import catalog_names
from marin_assets.defs.partitions import INVALID, REMOVED
from marin_assets.defs.partitions import source_partitions
from marin_assets.defs.resources import MarinResource
from marin_assets.defs.settings import defs_setting, defs_setting_number

AUTOMATION_ENV = "MARIN_AUTOMATION"
SOURCE_PINS = dg.AssetKey(specs.SOURCE_PINS.name)
CATALOG_CHECK = "catalog_in_sync"
# Tick cadences, read when the code location loads (tests set them to seconds).
AUTOMATION_INTERVAL_S = max(5, int(defs_setting_number("MARIN_AUTOMATION_INTERVAL_S", 30)))
CATALOG_INTERVAL_S = max(5, int(defs_setting_number("MARIN_CATALOG_INTERVAL_S", 60)))


def _every(seconds: int) -> str:
    return "Every minute" if seconds == 60 else f"Every {seconds // 60} minutes" if seconds % 60 == 0 else f"Every {seconds} s"


def automation_enabled(value: str | None = None) -> bool:
    """``MARIN_AUTOMATION``: on/true/1 or off/false/0 (unset: off)."""
    raw = (value if value is not None else defs_setting(AUTOMATION_ENV) or "").strip().lower()
    if raw in ("", "off", "false", "0", "no"):
        return False
    if raw in ("on", "true", "1", "yes"):
        return True
    raise ValueError(f"{AUTOMATION_ENV}={raw!r} is not understood: set it to 'on' or 'off'")


def default_status() -> dg.DefaultSensorStatus:
    return dg.DefaultSensorStatus.RUNNING if automation_enabled() else dg.DefaultSensorStatus.STOPPED


def automation_sensor() -> dg.AutomationConditionSensorDefinition:
    """Evaluates every asset's condition every ``MARIN_AUTOMATION_INTERVAL_S`` (30 s) (``source_pins`` has none: ``catalog_changes`` records it).

    It runs in the code server because one operand (``in_catalog``) reads the catalog file;
    requests become asset backfills, so a tick's partitions are grouped into runs per source.
    """
    return dg.AutomationConditionSensorDefinition(
        "marin_automation",
        # "*" in the UI; checks have no condition, so the sensor evaluates assets only.
        target=dg.AssetSelection.all(include_sources=True),
        use_user_code_server=True,
        default_status=default_status(),
        minimum_interval_seconds=AUTOMATION_INTERVAL_S,
        description=(
            f"{_every(AUTOMATION_INTERVAL_S)}: rebuilds the chain of every source whose pin changed (as recorded by catalog_changes), "
            "then the global steps, then the partitions whose inputs changed. Starts on when MARIN_AUTOMATION=on."
        ),
    )


# --------------------------------------------------------------------------- catalog changes


def catalog_state(catalog: Any, partitions: set[str]) -> dict[str, Any]:
    """What differs between the catalog on disk and the partitions the code location loaded."""
    names = set(catalog.names)
    return {
        "entries": len(names),
        "new": sorted(names - partitions),  # in the catalog, not yet partitions: reload needed
        "removed": sorted(partitions - names),  # partitions whose entry left the catalog
    }


def _catalog_message(state: dict[str, Any], changed: list[str]) -> str:
    parts = []
    if state["new"]:
        parts.append(
            f"{len(state['new'])} catalog entries are not partitions yet: {', '.join(state['new'])}; "
            "reload the code location (UI: Deployment > Reload, or restart the code server) to build them"
        )
    if state["removed"]:
        parts.append(
            f"{len(state['removed'])} partitions left the catalog: {', '.join(state['removed'])}; "
            "source_pins reports them as removed-from-catalog and automation skips them; reload to drop them"
        )
    if changed:
        parts.append(f"recipes changed since the last tick: {', '.join(changed)} (recorded on source_pins; marin_automation rebuilds their chains)")
    if not parts:
        parts.append(f"catalog and partitions agree ({state['entries']} entries); no recipe changed")
    return ". ".join(parts)


def catalog_check_result(state: dict[str, Any]) -> dict[str, Any]:
    """The ``catalog_in_sync`` verdict as keyword arguments for a check result or evaluation."""
    in_sync = not state["new"] and not state["removed"]
    return dict(
        passed=in_sync,
        severity=dg.AssetCheckSeverity.WARN,
        description="catalog entries and partitions agree" if in_sync else _catalog_message(state, []),
        metadata={
            "entries": state["entries"],
            "new_entries": ", ".join(state["new"]) or "none",
            "removed_entries": ", ".join(state["removed"]) or "none",
        },
    )




def pin_observations(versions: dict[str, str], known: dict[str, str]) -> list[dg.AssetObservation]:
    """Runless observations of ``source_pins`` for the partitions whose recipe differs from
    ``known`` (all of them when ``known`` is empty: the baseline); the data version is the
    recipe fingerprint."""
    return [
        dg.AssetObservation(asset_key=SOURCE_PINS, partition=name, tags={DATA_VERSION_TAG: version})
        for name, version in sorted(versions.items())
        if known.get(name) != version
    ]


@dg.sensor(
    name="catalog_changes",
    minimum_interval_seconds=CATALOG_INTERVAL_S,
    default_status=default_status(),
    description=(
        f"{_every(CATALOG_INTERVAL_S)}: records source_pins for the sources whose recipe changed (one runless "
        "observation each, no run; the first tick records every pin as the baseline), and reports "
        "catalog entries that need a code-location reload or left the catalog."
    ),
)
def catalog_changes(context: dg.SensorEvaluationContext, marin: MarinResource) -> dg.SensorResult:
    catalog = marin.catalog()
    partitions = set(source_partitions.get_partition_keys())
    state = catalog_state(catalog, partitions)
    previous = json.loads(context.cursor) if context.cursor else {}
    fingerprints = {s.name: ingest.recipe_fingerprint(s) for s in catalog if s.name in partitions}
    broken = dict(getattr(catalog, "broken", {}) or {})
    versions = {n: fingerprints.get(n, INVALID if n in broken else REMOVED) for n in sorted(partitions)}
    digest = versions_digest(versions)
    if not previous:
        known: dict[str, str] = {}  # the first tick records every pin: the baseline
    elif previous.get("digest") == digest:
        known = versions  # nothing moved: not even one query
    else:
        known = previous.get("versions") or recorded_pins(context.instance)
    changed = sorted(n for n, fp in fingerprints.items() if n in known and known[n] != fp)
    reported = {"new": state["new"], "removed": state["removed"]}
    events: list = pin_observations(versions, known)
    if reported != previous.get("reported"):
        events.append(dg.AssetCheckEvaluation(asset_key=SOURCE_PINS, check_name=CATALOG_CHECK, **catalog_check_result(state)))
    message = _catalog_message(state, changed)
    if state["new"] or state["removed"]:
        context.log.warning(message)
    return dg.SensorResult(
        asset_events=events,
        # compact: a digest of every recipe; the recipes themselves are the observations' data versions
        cursor=json.dumps({"digest": digest, "entries": len(versions), "reported": reported}, sort_keys=True),
        skip_reason=message,
    )


def versions_digest(versions: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(versions, sort_keys=True).encode()).hexdigest()[:16]


def recorded_pins(instance: dg.DagsterInstance) -> dict[str, str]:
    """The recipe fingerprint ``source_pins`` last recorded per partition (one indexed query)."""
    tags = instance.event_log_storage.get_latest_tags_by_partition(SOURCE_PINS, DagsterEventType.ASSET_OBSERVATION, [DATA_VERSION_TAG])
    return {partition: t[DATA_VERSION_TAG] for partition, t in tags.items() if DATA_VERSION_TAG in t}


@dg.asset_check(asset=SOURCE_PINS, name=CATALOG_CHECK, description="Catalog entries and loaded partitions agree (new entries need a code-location reload).")
def catalog_in_sync(marin: MarinResource) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(**catalog_check_result(catalog_state(marin.catalog(), set(source_partitions.get_partition_keys()))))


__all__ = ["automation_sensor", "catalog_changes", "catalog_in_sync", "automation_enabled", "catalog_names"]
