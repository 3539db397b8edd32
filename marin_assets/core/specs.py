"""Every stage of the pipeline as a ``StageSpec``: its name (= the Dagster asset), the stages it
reads, whether it is per source, its parameters' type and its code version.

This is the one place a stage is named. The asset wiring (``defs/stage_assets.py``) takes its
dependencies, partitions, group and code version from here; stage code finds its inputs by
spec, never by a string. Bump a ``code_version`` when a stage's output changes for the same
inputs and parameters: its outputs (and everything downstream) get new fingerprints.
"""

from __future__ import annotations

import dataclasses

from marin_assets.core.decon.rules import CODE_VERSION as DECON_CODE_VERSION
from marin_assets.core.decon.rules import DeconParams
from marin_assets.core.decon.semantic import CODE_VERSION as SEMANTIC_CODE_VERSION
from marin_assets.core.decon.semantic import SemanticParams
from marin_assets.core.dedup.decisions import ExactDedupParams, FuzzyDedupParams
from marin_assets.core.dedup.minhash import MinHashParams, minhash_shard
from marin_assets.core.embed.embeddings import EmbedParams
from marin_assets.core.embed.quality import BandParams, QualityParams, QualityScoreParams
from marin_assets.core.embed.topics import AssignParams, TopicParams
from marin_assets.core.ingest import normalize
from marin_assets.core.ingest import raw as ingest
from marin_assets.core.mixture.fit import FitParams, OptimizeParams
from marin_assets.core.mixture.swarm import MIXTURE_CODE_VERSION, StudyParams
from marin_assets.core.pool.curated import PoolParams
from marin_assets.core.pool.groups import MixtureParams
from marin_assets.core.pool.tokens import TokenCountParams
from marin_assets.errors import ConfigurationError
from marin_assets.core.runtime.stages import Bench, StageSpec, StepSize


@dataclasses.dataclass(frozen=True)
class Phase:
    """A job over the stages whose ``phase`` names it; a full build runs the build phases in order."""

    name: str
    description: str
    build: bool = True  # part of a full build (mixture studies run per study instead)

    @property
    def stages(self) -> tuple[StageSpec, ...]:
        return tuple(s for s in ALL if s.phase == self.name)


PHASES: tuple[Phase, ...] = (
    Phase("eval_index", "Global: the eval n-gram index and the quality scorer."),
    Phase("source_chain", "Per source: provider files, normalized shards, MinHash buckets, token counts, embeddings."),
    Phase("global_decisions", "Global: exact and fuzzy dedup, drop sets, the topic model."),
    Phase("source_attributes", "Per source: contamination, topics, quality scores."),
    Phase("bands", "Global: 5 quality bands per topic."),
    Phase("source_pool", "Per source: the curated pool, filed by group."),
    Phase("groups", "Global: the 200 sampling groups."),
    Phase("mixture_proposal", "Per study: propose the proxy mixtures.", build=False),
    Phase("mixture_proxies", "Per study and run: train (built-in) or collect (external) one proxy's results; backfill a study's runs to train them in parallel.", build=False),
    Phase("mixture_fit", "Per study: fit the surrogates and optimize the weights.", build=False),
    Phase("mixture_validate", "Per study: train the optimized and the token-proportional mixtures with several seeds and measure the gain.", build=False),
)

GROUPS = ("ingest", "dedup", "decon", "embed", "pool", "mixture")
"""The stage families: each is a core package (``core/<group>/``) and a defs folder (``defs/<group>/``)."""

# ingest: observed recipes, then provider copies (addressed by content under raw/, recorded by pin)
SOURCE_PINS = StageSpec(
    "source_pins", group="ingest",
    bench=Bench("rerun", "no peer: one provider listing per source; inside the rerun bench's no-change rerun time goal"),
)
RAW_FILES = StageSpec(
    "raw_files", (SOURCE_PINS,), code_version=ingest.CODE_VERSION, group="ingest", folder="raw/_pins/{source}",
    phase="source_chain", bench=Bench("download", "the fetch (verified, resumable) vs huggingface_hub.snapshot_download from the local Hub, MiB/s"),
)
NORMALIZED = StageSpec(
    "normalized", (RAW_FILES,), params=normalize.NormalizeParams, code_version=normalize.CODE_VERSION,
    group="ingest", folder="normalized/{source}",
    phase="source_chain", step=StepSize("2", "4Gi", scratch="64Gi"), bench=Bench("normalize", "vs plain polars read+hash+write, small files and one large file, memory growth"),
)  # fmt: skip

# dedup
MINHASH_BUCKETS = StageSpec(
    "minhash_buckets", (NORMALIZED,), params=MinHashParams, group="dedup", shard_fn=minhash_shard, rows_counter="docs",
    code_version="2",  # 2: ASCII punctuation read as a space, not deleted (code's near-copies were missed)
    description="Co-partitioned LSH band buckets (26 bands x 11 rows of a 286-permutation MinHash) per document.",
    phase="source_chain", bench=Bench("minhash", "vs datasketch update_batch, MinHash.bulk and rensa, per CPU second"),
)
EXACT_DUPLICATES = StageSpec(
    "exact_duplicates", (NORMALIZED,), partitioned=False, params=ExactDedupParams, group="dedup",
    phase="global_decisions", step=StepSize("4", "16Gi", scratch="200Gi"), bench=Bench("dedup", "scale rows: time and memory per document at 1x..64x"),
)
FUZZY_DUPLICATES = StageSpec(
    "fuzzy_duplicates", (MINHASH_BUCKETS, NORMALIZED), partitioned=False, params=FuzzyDedupParams, group="dedup",
    phase="global_decisions", step=StepSize("8", "32Gi", scratch="500Gi"), bench=Bench("minhash", "peak memory growth 4k -> 16k documents (and the dedup bench's scale rows)"),
)

# decontamination
EVAL_NGRAMS = StageSpec(
    "eval_ngrams", (), partitioned=False, params=DeconParams, code_version=DECON_CODE_VERSION, group="decon",
    phase="eval_index", step=StepSize("2", "8Gi"), bench=Bench("decon", "index build inside the marking rows (production index size)"),
)
EVAL_EMBEDDINGS = StageSpec(
    "eval_embeddings", (), partitioned=False, params=SemanticParams, code_version=SEMANTIC_CODE_VERSION, group="decon",
    phase="eval_index", bench=Bench("semantic", "recall of reworded eval items standalone and inside long documents, false positives, CPU beside the embedding pass"),
)
BOILERPLATE_NGRAMS = StageSpec(
    "boilerplate_ngrams", (NORMALIZED, EVAL_NGRAMS), partitioned=False, params=DeconParams, code_version=DECON_CODE_VERSION, group="decon",
    phase="global_decisions", bench=Bench("decon", "drop sets computed on the planted source"),
)

# embeddings, topics and quality (one family: everything read off the document vectors)
EMBEDDINGS = StageSpec(
    "embeddings", (NORMALIZED,), params=EmbedParams, group="embed",
    phase="source_chain", step=StepSize("8", "32Gi", gpu=1), bench=Bench("embed", "embed_shard vs a bare SentenceTransformer.encode"),
)

# the 13-gram rules and the semantic tier, which reads the kept document vectors
CONTAMINATION = StageSpec(
    "contamination", (NORMALIZED, EVAL_NGRAMS, BOILERPLATE_NGRAMS, EMBEDDINGS, EVAL_EMBEDDINGS), params=DeconParams, code_version=DECON_CODE_VERSION, group="decon",
    phase="source_attributes", bench=Bench("stages", "contamination_shard vs a Python set of 13-gram strings, per CPU second and memory"),
)
TOPIC_MODEL = StageSpec(
    "topic_model", (EMBEDDINGS, NORMALIZED), partitioned=False, params=TopicParams, group="embed",
    phase="global_decisions", step=StepSize("16", "64Gi"), bench=Bench("embed", "k-means CPU per point at 4x the sample"),
)
TOPICS = StageSpec(
    "topics", (EMBEDDINGS, TOPIC_MODEL), params=AssignParams, group="embed",
    phase="source_attributes", bench=Bench("stages", "assign_topics_shard vs one plain faiss IndexFlatL2 search of the shard, per CPU second and memory"),
)

QUALITY_MODEL = StageSpec(
    "quality_model", (), partitioned=False, params=QualityParams, group="embed",
    phase="eval_index", bench=Bench("stages", "train_quality_model on the labels' vectors vs scikit-learn RidgeCV on the same split, per CPU second and memory (encoding: the embed bench)"),
)
QUALITY_SCORES = StageSpec(
    "quality_scores", (EMBEDDINGS, QUALITY_MODEL), params=QualityScoreParams, group="embed",
    phase="source_attributes", bench=Bench("stages", "quality_scores_shard vs the same weights as a plain numpy product and np.interp, per CPU second and memory"),
)
QUALITY_BANDS = StageSpec(
    "quality_bands", (TOPICS, QUALITY_SCORES), partitioned=False, params=BandParams, group="embed",
    code_version="2",  # 2: per-topic and per-source digests of the band edges in the manifest (automation reads them)
    phase="bands", step=StepSize("2", "8Gi"), bench=Bench("stages", "streamed score histograms and band edges vs polars: join on id, quantiles per topic, per CPU second and memory"),
)

# the curated pool (stored per source, so a source whose inputs did not change keeps its pool);
# its token counts are counted once per normalized output and tokenizer, and only summed by the pool
TOKEN_COUNTS = StageSpec(
    "token_counts", (NORMALIZED,), params=TokenCountParams, group="pool",
    phase="source_chain", bench=Bench("stages", "token_counts_shard vs the tokenizers library's encode_batch_fast on the shard, per CPU second and memory "
                                      "(the pool that sums the counts vs the task that counted them: make bench-scale)"),
)  # fmt: skip
POOL = StageSpec(
    "pool",
    (NORMALIZED, CONTAMINATION, FUZZY_DUPLICATES, EXACT_DUPLICATES, TOPICS, QUALITY_SCORES, QUALITY_BANDS, TOKEN_COUNTS),
    params=PoolParams,
    code_version="4",  # 4: tokens summed from token_counts (no tokenizer in a pool task); 3: merges planned from shard file names (no index read by the step); 2: group files merged per group, indexed in group_files.parquet
    group="pool",
    data_folder="pool/{source}",
    phase="source_pool", bench=Bench("stages", "pool_shard vs polars anti-join on the removal lists, per CPU second and memory"),
)
SAMPLING_GROUPS = StageSpec(
    "sampling_groups", (POOL, TOPIC_MODEL), partitioned=False, params=MixtureParams, group="pool",
    phase="groups", step=StepSize("2", "8Gi"), bench=Bench("stages", "group counts and file list vs one polars group_by over every shard index"),
)

# mixture studies: partitioned by study (``{source}`` is the study), proxy results by study and
# run; ``core.runtime.stages.run_study`` records them under mixture/<study>/<study_stage>[/<run>]
MIXTURE_SWARM = StageSpec(
    "mixture_swarm", (SAMPLING_GROUPS,), params=StudyParams, code_version=MIXTURE_CODE_VERSION, group="mixture",
    folder="mixture/{source}/swarm", study_stage="swarm",
    phase="mixture_proposal", bench=Bench("stages", "no peer (no library proposes mixtures under epoch caps and blocks): CPU seconds per study and peak memory", row="mixture"),
)
PROXY_RESULTS = StageSpec(
    "proxy_results", (MIXTURE_SWARM,), params=StudyParams, code_version=MIXTURE_CODE_VERSION, group="mixture",
    folder="mixture/{source}/proxy_results", study_stage="proxy_results",
    phase="mixture_proxies", by_run=True, bench=Bench("stages", "no peer: the built-in trainer's CPU seconds per run (cut to a fixed token count) and peak memory (an external trainer's time is its own)"),
)
MIXTURE_MODEL = StageSpec(
    "mixture_model", (PROXY_RESULTS,), params=FitParams, code_version=MIXTURE_CODE_VERSION, group="mixture",
    folder="mixture/{source}/model", study_stage="model",
    phase="mixture_fit", bench=Bench("stages", "fit_surrogates vs LightGBM used plainly (5-fold out-of-fold predictions, a final fit per metric), per CPU second and memory", row="mixture"),
)
MIXTURE_WEIGHTS = StageSpec(
    "mixture_weights", (MIXTURE_MODEL, SAMPLING_GROUPS), params=OptimizeParams, code_version=MIXTURE_CODE_VERSION, group="mixture",
    folder="mixture/{source}/weights", study_stage="weights",
    phase="mixture_fit", bench=Bench("stages", "no peer (no library searches mixtures under these constraints): CPU seconds per study and peak memory", row="mixture"),
)  # fmt: skip
MIXTURE_VALIDATION = StageSpec(
    "mixture_validation", (MIXTURE_WEIGHTS, MIXTURE_SWARM), params=StudyParams, code_version=MIXTURE_CODE_VERSION, group="mixture",
    folder="mixture/{source}/validation", study_stage="validation",
    phase="mixture_validate", bench=Bench("mixture", "a synthetic ground truth: true regret of each optimizer and the gates' calls on signal and on noise"),
)  # fmt: skip


def registered(stages: tuple[StageSpec, ...]) -> tuple[StageSpec, ...]:
    """``stages``, refused when one names a phase or group nothing places (it would be in no job,
    or its asset in no ``defs/<group>/assets.py``); only ``source_pins``, observed, has no phase."""
    phases = [p.name for p in PHASES]
    for spec in stages:
        if spec.group not in GROUPS:
            raise ConfigurationError(f"stage spec '{spec.name}': unknown group '{spec.group}'; the known groups are {list(GROUPS)}")
        if spec.phase not in phases and not (spec.name == SOURCE_PINS.name and not spec.phase):
            raise ConfigurationError(f"stage spec '{spec.name}': unknown phase '{spec.phase}'; the known phases are {phases}")
    return stages


ALL: tuple[StageSpec, ...] = registered(tuple(v for v in dict(globals()).values() if isinstance(v, StageSpec)))
"""Every stage above, in the order written: a new spec is found without listing it again."""
BY_NAME = {s.name: s for s in ALL}
