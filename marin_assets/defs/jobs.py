"""Jobs over the asset graph, in the order a full build runs them.

Per-source jobs are partitioned by source (backfill them with ``--partitions a,b``); global
jobs are unpartitioned and read every source that has the needed input. A full build is the
phases in ``BUILD_ORDER``; an asset backfill from the UI over the whole graph does the same.
"""

import dagster as dg

from marin_assets.defs.partitions import source_partitions

# (job name, asset keys, partitioned?) in the order a full build runs them.
BUILD_ORDER: list[tuple[str, list[str], bool]] = [
    ("eval_index", ["eval_ngrams", "quality_model"], False),
    ("source_chain", ["raw_files", "normalized", "minhash_buckets", "embeddings"], True),
    ("global_decisions", ["exact_duplicates", "fuzzy_duplicates", "boilerplate_ngrams", "topic_model"], False),
    ("source_attributes", ["contamination", "topics", "quality_scores"], True),
    ("bands", ["quality_bands"], False),
    ("source_pool", ["pool"], True),
    ("groups", ["sampling_groups"], False),
]


def _job(name: str, keys: list[str], partitioned: bool):
    return dg.define_asset_job(
        name,
        selection=dg.AssetSelection.assets(*keys),
        partitions_def=source_partitions if partitioned else None,
        description=f"{'Per source' if partitioned else 'Global'}: {', '.join(keys)}.",
    )


JOBS = [_job(*phase) for phase in BUILD_ORDER]
