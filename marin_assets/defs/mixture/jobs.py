"""Jobs of a mixture study: propose (per study), proxies (per study and run), fit (per study),
validate (per study).

Backfill ``mixture_proxies`` over a study's runs to train them in parallel; a failed run
retries alone. ``mixture_validate`` trains (or collects) the validation runs of the published
mixture and token-proportional sampling.
"""

import dagster as dg

from marin_assets.core.specs import (
    MIXTURE_MODEL,
    MIXTURE_SWARM,
    MIXTURE_VALIDATION,
    MIXTURE_WEIGHTS,
    PROXY_RESULTS,
)
from marin_assets.defs.mixture.partitions import proxy_run_partitions, study_partitions

mixture_proposal = dg.define_asset_job(
    "mixture_proposal", selection=dg.AssetSelection.assets(MIXTURE_SWARM.name), partitions_def=study_partitions,
    description="Per study: propose the proxy mixtures (mixture_swarm).",
)
mixture_proxies = dg.define_asset_job(
    "mixture_proxies", selection=dg.AssetSelection.assets(PROXY_RESULTS.name), partitions_def=proxy_run_partitions,
    description="Per study and run: train (built-in) or collect (external) one proxy's results.",
)
mixture_fit = dg.define_asset_job(
    "mixture_fit", selection=dg.AssetSelection.assets(MIXTURE_MODEL.name, MIXTURE_WEIGHTS.name), partitions_def=study_partitions,
    description="Per study: fit the surrogates, gate them and optimize (or publish token-proportional) weights.",
)
mixture_validate = dg.define_asset_job(
    "mixture_validate", selection=dg.AssetSelection.assets(MIXTURE_VALIDATION.name), partitions_def=study_partitions,
    description="Per study: train the optimized and the token-proportional mixtures with several seeds and measure the gain.",
)
MIXTURE_JOBS = [mixture_proposal, mixture_proxies, mixture_fit, mixture_validate]
