"""Jobs of a mixture study: propose (per study), proxies (per study and run), fit (per study).

Backfill ``mixture_proxies`` over a study's runs to train them in parallel; a failed run
retries alone.
"""

import dagster as dg

from marin_assets.defs.mixture.partitions import proxy_run_partitions, study_partitions

mixture_proposal = dg.define_asset_job(
    "mixture_proposal", selection=dg.AssetSelection.assets("mixture_swarm"), partitions_def=study_partitions,
    description="Per study: propose the proxy mixtures (mixture_swarm).",
)
mixture_proxies = dg.define_asset_job(
    "mixture_proxies", selection=dg.AssetSelection.assets("proxy_results"), partitions_def=proxy_run_partitions,
    description="Per study and run: train (built-in) or collect (external) one proxy's results.",
)
mixture_fit = dg.define_asset_job(
    "mixture_fit", selection=dg.AssetSelection.assets("mixture_model", "mixture_weights"), partitions_def=study_partitions,
    description="Per study: fit the surrogates and optimize the weights.",
)
MIXTURE_JOBS = [mixture_proposal, mixture_proxies, mixture_fit]
