"""Mixture search: studies, proxy runs, surrogates, gated weights and their validation (assets, jobs, sensor)."""

from marin_assets.defs.mixture.assets import MIXTURE_ASSETS as _STUDY_ASSETS
from marin_assets.defs.mixture.jobs import MIXTURE_JOBS
from marin_assets.defs.mixture.sensors import MIXTURE_SENSORS
from marin_assets.defs.mixture.validation import mixture_validation

MIXTURE_ASSETS = [*_STUDY_ASSETS, mixture_validation]

__all__ = ["MIXTURE_ASSETS", "MIXTURE_JOBS", "MIXTURE_SENSORS"]
