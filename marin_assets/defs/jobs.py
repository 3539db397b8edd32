"""Jobs over the asset graph, in the order a full build runs them.

Per-source jobs are partitioned by source (backfill them with ``--partitions a,b``); global
jobs are unpartitioned and read every source that has the needed input. A full build is the
phases in ``BUILD_ORDER``; an asset backfill from the UI over the whole graph does the same.
"""

import dagster as dg

from marin_assets.core import specs as S
from marin_assets.defs.partitions import source_partitions

# (job name, stages) in the order a full build runs them; a phase is all per-source or all global.
PHASES: list[tuple[str, tuple[S.StageSpec, ...]]] = [
    ("eval_index", (S.EVAL_NGRAMS, S.QUALITY_MODEL)),
    ("source_chain", (S.RAW_FILES, S.NORMALIZED, S.MINHASH_BUCKETS, S.EMBEDDINGS)),
    ("global_decisions", (S.EXACT_DUPLICATES, S.FUZZY_DUPLICATES, S.BOILERPLATE_NGRAMS, S.TOPIC_MODEL)),
    ("source_attributes", (S.CONTAMINATION, S.TOPICS, S.QUALITY_SCORES)),
    ("bands", (S.QUALITY_BANDS,)),
    ("source_pool", (S.POOL,)),
    ("groups", (S.SAMPLING_GROUPS,)),
]
# (job name, asset keys, partitioned?)
BUILD_ORDER: list[tuple[str, list[str], bool]] = [
    (name, [s.name for s in stages], stages[0].partitioned) for name, stages in PHASES
]


def _job(name: str, keys: list[str], partitioned: bool):
    return dg.define_asset_job(
        name,
        selection=dg.AssetSelection.assets(*keys),
        partitions_def=source_partitions if partitioned else None,
        description=f"{'Per source' if partitioned else 'Global'}: {', '.join(keys)}.",
    )


JOBS = [_job(*phase) for phase in BUILD_ORDER]
