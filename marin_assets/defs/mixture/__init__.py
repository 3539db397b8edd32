"""Mixture search: studies, proxy runs, surrogates and optimized weights (assets, jobs, sensor)."""

from marin_assets.defs.mixture.assets import MIXTURE_ASSETS
from marin_assets.defs.mixture.jobs import MIXTURE_JOBS
from marin_assets.defs.mixture.sensors import MIXTURE_SENSORS

__all__ = ["MIXTURE_ASSETS", "MIXTURE_JOBS", "MIXTURE_SENSORS"]
