"""Automation: conditions on assets, the sensors that evaluate them, and the asset checks.

``with_automation(assets)`` gives every asset its condition (see ``conditions``);
``SENSORS`` are ``marin_automation`` (declarative automation), ``catalog_changes`` and
``pin_drift``, all started or stopped by ``MARIN_AUTOMATION`` (default off);
``CHECKS`` are the stage checks plus the catalog and drift checks on ``source_pins``.
"""

import dagster as dg

from marin_assets.defs.automation.conditions import EXCEPTIONS, with_conditions
from marin_assets.defs.automation.drift_sensor import DRIFT_CHECKS, pin_drift
from marin_assets.defs.automation.execution import executor_from_env
from marin_assets.defs.automation.sensors import automation_sensor, catalog_changes, catalog_in_sync
from marin_assets.defs.checks import STAGE_CHECKS

SENSORS: list[dg.SensorDefinition] = [automation_sensor(), catalog_changes, pin_drift]
CHECKS: list[dg.AssetChecksDefinition] = [*STAGE_CHECKS, catalog_in_sync, *DRIFT_CHECKS]


def with_automation(assets: list) -> list:
    """The assets with their automation conditions attached."""
    return with_conditions(assets, EXCEPTIONS)


__all__ = ["CHECKS", "SENSORS", "executor_from_env", "with_automation"]
