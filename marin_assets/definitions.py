"""The Dagster code location of marin-assets: every domain's definitions, merged."""

import warnings

import dagster as dg

warnings.filterwarnings("ignore", category=dg.BetaWarning)
warnings.filterwarnings("ignore", category=dg.PreviewWarning)

from marin_assets.defs.automation import CHECKS, SENSORS, executor_from_env, with_automation
from marin_assets.defs.pool.assets import pool, sampling_groups
from marin_assets.defs.quality.assets import quality_bands, quality_model, quality_scores
from marin_assets.defs.decon.assets import boilerplate_ngrams, contamination, eval_ngrams
from marin_assets.defs.dedup.assets import exact_duplicates, fuzzy_duplicates, minhash_buckets
from marin_assets.defs.embed.assets import embeddings, topic_model, topics
from marin_assets.defs.ingest.assets import raw_files, source_pins
from marin_assets.defs.jobs import JOBS
from marin_assets.defs.mixture import MIXTURE_ASSETS, MIXTURE_JOBS, MIXTURE_SENSORS
from marin_assets.defs.normalize.assets import normalized
from marin_assets.defs.resources import CurationResource, DedupResource, EncoderResource, MarinResource

defs = dg.Definitions(
    assets=with_automation(
        [
            source_pins,
            raw_files,
            normalized,
            minhash_buckets,
            exact_duplicates,
            fuzzy_duplicates,
            eval_ngrams,
            boilerplate_ngrams,
            contamination,
            embeddings,
            topic_model,
            topics,
            quality_model,
            quality_scores,
            quality_bands,
            pool,
            sampling_groups,
        ]
    )
    + MIXTURE_ASSETS,
    asset_checks=CHECKS,
    jobs=JOBS + MIXTURE_JOBS,
    sensors=SENSORS + MIXTURE_SENSORS,
    executor=executor_from_env(),
    resources={"marin": MarinResource(), "encoder": EncoderResource(), "curation": CurationResource(), "fuzzy_dedup": DedupResource()},
)
