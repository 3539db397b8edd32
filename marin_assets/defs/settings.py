"""Every setting of marin-assets, declared once: its environment variable, default and meaning.

Run-time settings are fields of the Dagster resources (``defs/resources.py``), each declared
with ``setting(...)``: a field left unset is read from its environment variable through
``dg.EnvVar`` when a step or sensor tick uses it (never at import), so the same definitions
serve the embedded default, CI and production, and tests pass values directly. Core and
catalog receive the resolved values as plain parameters; they read no environment.

The Dagster definitions read a few settings themselves (``DEFS_SETTINGS``, through
``defs_setting``): some shape the definitions and are read when the code location loads (the
executor, whether sensors start, the sensor and drift cadences, and the catalog the partitions come
from), the drift sensor's pace is read on each tick. ``OTHER_SETTINGS`` are read by Dagster,
the Makefile or the demo. ``settings_table()`` renders them all as the table in docs/operations.md, and a
test holds that page to it.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

import dagster as dg
import pydantic


@dataclasses.dataclass(frozen=True)
class Setting:
    """One environment variable: its default as users see it, and what it means."""

    env: str
    default: str
    doc: str


def setting(env: str, default: str, doc: str) -> Any:
    """A resource field fed by the environment variable ``env`` when left unset (None)."""
    return pydantic.Field(default=None, description=f"{doc} (`{env}`)", json_schema_extra={"env": env, "shown_default": default})


def _declared(field: Any) -> Setting | None:
    extra = field.json_schema_extra or {}
    if "env" not in extra:
        return None
    doc = str(field.description).removesuffix(f" (`{extra['env']}`)")
    return Setting(extra["env"], extra["shown_default"], doc)


def _parse(raw: str, annotation: Any, env: str) -> Any:
    union = isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union
    kind = next((a for a in typing.get_args(annotation) if a is not type(None)), str) if union else annotation
    try:
        return kind(raw.strip()) if kind in (int, float) else raw
    except ValueError:
        raise dg.Failure(f"{env}={raw!r} is not a valid {kind.__name__}; fix or unset it") from None


class SettingsResource(dg.ConfigurableResource):
    """A resource whose unset fields come from their environment variables when used."""

    def resolved(self, name: str) -> Any:
        """The field's value: as configured, else its environment variable (read now), else None.

        An empty string counts as unset, like an empty variable.
        """
        value = getattr(self, name)
        if value is not None and value != "":
            return value
        field = type(self).model_fields[name]
        declared = _declared(field)
        if declared is None:
            return None
        raw = dg.EnvVar(declared.env).get_value()
        if raw is None or raw.strip() == "":
            return None
        return _parse(raw, field.annotation, declared.env)

    def variable_of(self, name: str) -> str | None:
        """The environment variable the field's value comes from now (None: set directly, or unset)."""
        declared = _declared(type(self).model_fields[name])
        if getattr(self, name) not in (None, "") or declared is None or self.resolved(name) is None:
            return None
        return declared.env

    @classmethod
    def declared_settings(cls) -> list[Setting]:
        return [s for s in (_declared(f) for f in cls.model_fields.values()) if s is not None]


# Settings the definitions read themselves, then the ones read outside this package (Dagster,
# the Makefile, the demo runner).
DEFS_SETTINGS = (
    Setting("MARIN_EXECUTOR", "`in_process`", "`in_process` (a run's steps in one process: an unchanged partition re-runs in seconds), `multiprocess` (a subprocess per step) or `k8s` (one pod per step); read when the code location loads"),
    Setting("MARIN_AUTOMATION", "`off`", "`on` starts the automation, catalog and drift sensors; read when the code location loads"),
    Setting("MARIN_AUTOMATION_INTERVAL_S", "30", "seconds between `marin_automation` ticks; read when the code location loads"),
    Setting("MARIN_CATALOG_INTERVAL_S", "60", "seconds between `catalog_changes` ticks (catalog re-read, changed pins recorded); read when the code location loads"),
    Setting("MARIN_DRIFT_PERIOD_S", "86400", "every pin is checked for drift at least once per this many seconds"),
    Setting("MARIN_DRIFT_INTERVAL_S", "600", "seconds between drift sensor ticks; read when the code location loads"),
    Setting("MARIN_DRIFT_BATCH", "10", "at most this many pins checked per drift tick"),
    Setting("MARIN_DRIFT_BUDGET_S", "30", "seconds the drift sensor may spend per tick"),
    Setting("MARIN_ALERT_INTERVAL_S", "30", "seconds between ticks of the `run_failures` and `check_failures` alert sensors; read when the code location loads"),
)
OTHER_SETTINGS = (
    Setting("DAGSTER_HOME", "`./.dagster_home` (Makefile)", "the Dagster instance folder; holds `dagster.yaml`"),
    Setting("MARIN_DEMO_HUB", "`./.demo_hub`", "where the demo's dataset repos are written"),
    Setting("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "`false` (Makefile)", "keeps gcsfs from probing bucket types over gRPC"),
)
_DEFS_SETTING_NAMES = frozenset(s.env for s in DEFS_SETTINGS)
# What a production deployment must set (deploy/helm/marin-env.yaml and the marin-hf-token
# Secret): left at their defaults, data would stay on the pod's disk, gated sources would fail,
# steps would share one pod, and the pool would be embedded with the small demo encoder.
PRODUCTION_REQUIRED = ("MARIN_PREFIX", "HF_TOKEN", "MARIN_EXECUTOR", "MARIN_EMBED_MODEL", "MARIN_EMBED_REVISION")


def defs_setting(env: str) -> str | None:
    """A setting the definitions read themselves (declared in ``DEFS_SETTINGS``); None when unset or empty."""
    if env not in _DEFS_SETTING_NAMES:
        raise KeyError(f"{env} is not a declared setting; declare it in DEFS_SETTINGS (marin_assets/defs/settings.py)")
    value = dg.EnvVar(env).get_value()
    return value.strip() if value and value.strip() else None


def defs_setting_number(env: str, default: float) -> float:
    raw = defs_setting(env)
    try:
        return float(raw) if raw else default
    except ValueError:
        raise ValueError(f"{env}={raw!r} is not a number") from None


def configured_catalog_path() -> str | None:
    """The ``MARIN_CATALOG`` setting, read now (None: the packaged catalog); the partitions are built
    from it when the code location loads."""
    value = dg.EnvVar("MARIN_CATALOG").get_value()
    return value.strip() if value and value.strip() else None


def all_settings(resources: list[type[SettingsResource]]) -> list[Setting]:
    """Every declared setting, resources first, each variable once (first declaration wins)."""
    seen: dict[str, Setting] = {}
    for setting_ in [s for r in resources for s in r.declared_settings()] + list(DEFS_SETTINGS) + list(OTHER_SETTINGS):
        seen.setdefault(setting_.env, setting_)
    return list(seen.values())


def markdown_table(settings: list[Setting]) -> str:
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    lines += [f"| `{s.env}` | {s.default} | {s.doc} |" for s in settings]
    return "\n".join(lines)
