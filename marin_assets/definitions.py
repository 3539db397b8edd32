"""The Dagster code location of marin-assets: every stage's asset (found from its spec), the
checks, the jobs of its phases, the sensors and the resources."""

import importlib

import dagster as dg

from marin_assets.core import specs
from marin_assets.defs.alerts import ALERT_SENSORS
from marin_assets.defs.automation import CHECKS, SENSORS, executor_from_env, with_automation
from marin_assets.defs.jobs import JOBS
from marin_assets.defs.mixture.sensors import MIXTURE_SENSORS
from marin_assets.defs.resources import AlertResource, CurationResource, DedupResource, EncoderResource, MarinResource
from marin_assets.defs.slices import slice_assets
from marin_assets.defs.stage_assets import shard_asset
from marin_assets.defs.status import source_status_check, source_status_sensor


def stage_assets() -> list[dg.AssetsDefinition | dg.SourceAsset]:
    """The asset of every spec: generated from it when it names its shard function, else found in
    the ``assets`` module of its group's folder (``marin_assets/defs/<group>/assets.py``)."""
    found: dict[str, dg.AssetsDefinition | dg.SourceAsset] = {s.name: shard_asset(s) for s in specs.ALL if s.shard_fn}
    for group in dict.fromkeys(s.group for s in specs.ALL):
        module = importlib.import_module(f"marin_assets.defs.{group}.assets")
        for value in vars(module).values():
            name = value.key.to_user_string() if isinstance(value, (dg.AssetsDefinition, dg.SourceAsset)) else ""
            if name in found and found[name] is not value:
                raise TypeError(f"stage {name}: its spec names a shard_fn (the asset is generated) and marin_assets/defs/{group}/assets.py writes one too; keep one")
            if name in specs.BY_NAME:
                found[name] = value
    missing = [s.name for s in specs.ALL if s.name not in found]
    if missing:
        raise TypeError(f"no asset for the stages {missing}: name a shard_fn in the spec, or write one with @stage_asset in marin_assets/defs/<group>/assets.py")
    return [found[s.name] for s in specs.ALL]


# Pipeline stages run by automation; mixture studies run per study, from their own sensor.
_ASSETS = stage_assets()
_PIPELINE = [a for a in _ASSETS if not specs.BY_NAME[a.key.to_user_string()].study_stage]

defs = dg.Definitions(
    assets=with_automation(_PIPELINE) + slice_assets({s.name: s.group for s in specs.ALL}) + [a for a in _ASSETS if a not in _PIPELINE],
    asset_checks=CHECKS + [source_status_check],
    jobs=JOBS,
    sensors=SENSORS + MIXTURE_SENSORS + ALERT_SENSORS + [source_status_sensor],
    executor=executor_from_env(),
    resources={"marin": MarinResource(), "encoder": EncoderResource(), "curation": CurationResource(), "fuzzy_dedup": DedupResource(), "alerts": AlertResource()},
)
