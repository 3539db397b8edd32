"""The Dagster code location of marin-assets: every stage's asset (found from its spec), the
checks, the jobs of its phases, the sensors and the resources."""

import dagster as dg

from marin_assets.core import specs
from marin_assets.defs.alerts import ALERT_SENSORS
from marin_assets.defs.automation import CHECKS, SENSORS, executor_from_env, with_automation
from marin_assets.defs.jobs import JOBS
from marin_assets.defs.mixture.sensors import MIXTURE_SENSORS
from marin_assets.defs.resources import AlertResource, CurationResource, DedupResource, EncoderResource, MarinResource
from marin_assets.defs.slices import slice_assets
from marin_assets.defs.stage_assets import stage_assets
from marin_assets.defs.status import source_status_check, source_status_sensor

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
