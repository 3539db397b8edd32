"""Every stage of the pipeline as a ``StageSpec``: its name (= the Dagster asset), the stages it
reads, whether it is per source, its parameters' type and its code version.

This is the one place a stage is named. The asset wiring (``defs/stage_assets.py``) takes its
dependencies, partitions, group and code version from here; stage code finds its inputs by
spec, never by a string. Bump a ``code_version`` when a stage's output changes for the same
inputs and parameters: its outputs (and everything downstream) get new fingerprints.
"""

from __future__ import annotations

from marin_assets.core.decon.rules import CODE_VERSION as DECON_CODE_VERSION
from marin_assets.core.decon.rules import DeconParams
from marin_assets.core.dedup.decisions import ExactDedupParams, FuzzyDedupParams
from marin_assets.core.dedup.minhash import MinHashParams
from marin_assets.core.embed.embeddings import EmbedParams
from marin_assets.core.embed.quality import BandParams, QualityParams, QualityScoreParams
from marin_assets.core.embed.topics import AssignParams, TopicParams
from marin_assets.core.ingest import normalize
from marin_assets.core.ingest import raw as ingest
from marin_assets.core.mixture.fit import FitParams, OptimizeParams
from marin_assets.core.mixture.swarm import MIXTURE_CODE_VERSION, StudyParams
from marin_assets.core.pool.curated import PoolParams
from marin_assets.core.pool.groups import MixtureParams
from marin_assets.core.runtime.stages import StageSpec

# ingest: observed recipes, then provider copies (addressed by content under raw/, recorded by pin)
SOURCE_PINS = StageSpec("source_pins", group="ingest")
RAW_FILES = StageSpec("raw_files", (SOURCE_PINS,), code_version=ingest.CODE_VERSION, group="ingest", folder="raw/_pins/{source}")
NORMALIZED = StageSpec(
    "normalized", (RAW_FILES,), params=normalize.NormalizeParams, code_version=normalize.CODE_VERSION,
    group="normalize", folder="normalized/{source}",
)  # fmt: skip

# dedup
MINHASH_BUCKETS = StageSpec("minhash_buckets", (NORMALIZED,), params=MinHashParams, group="dedup")
EXACT_DUPLICATES = StageSpec("exact_duplicates", (NORMALIZED,), partitioned=False, params=ExactDedupParams, group="dedup")
FUZZY_DUPLICATES = StageSpec(
    "fuzzy_duplicates", (MINHASH_BUCKETS, NORMALIZED), partitioned=False, params=FuzzyDedupParams, group="dedup"
)

# decontamination
EVAL_NGRAMS = StageSpec("eval_ngrams", (), partitioned=False, params=DeconParams, code_version=DECON_CODE_VERSION, group="decon")
BOILERPLATE_NGRAMS = StageSpec("boilerplate_ngrams", (NORMALIZED, EVAL_NGRAMS), partitioned=False, params=DeconParams, code_version=DECON_CODE_VERSION, group="decon")
CONTAMINATION = StageSpec("contamination", (NORMALIZED, EVAL_NGRAMS, BOILERPLATE_NGRAMS), params=DeconParams, code_version=DECON_CODE_VERSION, group="decon")

# embeddings and topics
EMBEDDINGS = StageSpec("embeddings", (NORMALIZED,), params=EmbedParams, group="embed")
TOPIC_MODEL = StageSpec("topic_model", (EMBEDDINGS, NORMALIZED), partitioned=False, params=TopicParams, group="embed")
TOPICS = StageSpec("topics", (EMBEDDINGS, TOPIC_MODEL), params=AssignParams, group="embed")

# quality
QUALITY_MODEL = StageSpec("quality_model", (), partitioned=False, params=QualityParams, group="quality")
QUALITY_SCORES = StageSpec("quality_scores", (EMBEDDINGS, QUALITY_MODEL), params=QualityScoreParams, group="quality")
QUALITY_BANDS = StageSpec("quality_bands", (TOPICS, QUALITY_SCORES), partitioned=False, params=BandParams, group="quality")

# the curated pool (stored per source, so a source whose inputs did not change keeps its pool)
POOL = StageSpec(
    "pool",
    (NORMALIZED, CONTAMINATION, FUZZY_DUPLICATES, EXACT_DUPLICATES, TOPICS, QUALITY_SCORES, QUALITY_BANDS),
    params=PoolParams,
    code_version="2",  # 2: a source's group files merged into a bounded number per group, indexed in group_files.parquet
    group="pool",
    data_folder="pool/{source}",
)
SAMPLING_GROUPS = StageSpec("sampling_groups", (POOL, TOPIC_MODEL), partitioned=False, params=MixtureParams, group="pool")

# mixture studies: partitioned by study (``{source}`` is the study), proxy results by study and
# run; ``core.stages.run_study`` records them under mixture/<study>/<study_stage>[/<run>]
MIXTURE_SWARM = StageSpec(
    "mixture_swarm", (SAMPLING_GROUPS,), params=StudyParams, code_version=MIXTURE_CODE_VERSION, group="mixture",
    folder="mixture/{source}/swarm", study_stage="swarm",
)
PROXY_RESULTS = StageSpec(
    "proxy_results", (MIXTURE_SWARM,), params=StudyParams, code_version=MIXTURE_CODE_VERSION, group="mixture",
    folder="mixture/{source}/proxy_results", study_stage="proxy_results",
)
MIXTURE_MODEL = StageSpec(
    "mixture_model", (PROXY_RESULTS,), params=FitParams, code_version=MIXTURE_CODE_VERSION, group="mixture",
    folder="mixture/{source}/model", study_stage="model",
)
MIXTURE_WEIGHTS = StageSpec(
    "mixture_weights", (MIXTURE_MODEL, SAMPLING_GROUPS), params=OptimizeParams, code_version=MIXTURE_CODE_VERSION, group="mixture",
    folder="mixture/{source}/weights", study_stage="weights",
)  # fmt: skip
MIXTURE_VALIDATION = StageSpec(
    "mixture_validation", (MIXTURE_WEIGHTS, MIXTURE_SWARM), params=StudyParams, code_version=MIXTURE_CODE_VERSION, group="mixture",
    folder="mixture/{source}/validation", study_stage="validation",
)  # fmt: skip

ALL: tuple[StageSpec, ...] = (
    SOURCE_PINS,
    RAW_FILES,
    NORMALIZED,
    MINHASH_BUCKETS,
    EXACT_DUPLICATES,
    FUZZY_DUPLICATES,
    EVAL_NGRAMS,
    BOILERPLATE_NGRAMS,
    CONTAMINATION,
    EMBEDDINGS,
    TOPIC_MODEL,
    TOPICS,
    QUALITY_MODEL,
    QUALITY_SCORES,
    QUALITY_BANDS,
    POOL,
    SAMPLING_GROUPS,
    MIXTURE_SWARM,
    PROXY_RESULTS,
    MIXTURE_MODEL,
    MIXTURE_WEIGHTS,
    MIXTURE_VALIDATION,
)
BY_NAME = {s.name: s for s in ALL}
