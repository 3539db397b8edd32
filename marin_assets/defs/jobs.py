"""Jobs over the asset graph: one per phase of ``core.specs.PHASES``, each selecting the stages
whose spec names that phase, in the order a full build runs them.

Per-source jobs are partitioned by source (backfill them with ``--partitions a,b``); global
jobs are unpartitioned and read every source that has the needed input; study jobs are
partitioned by study (or by study and run). A full build is the build phases in order
(``BUILD_ORDER``); an asset backfill from the UI over the whole graph does the same.
"""

from __future__ import annotations

import dagster as dg

from marin_assets.core import specs as S
from marin_assets.defs.stage_assets import partitions_for


def _job(phase: S.Phase):
    partitions = {partitions_for(s) for s in phase.stages}
    if len(partitions) != 1:
        raise TypeError(f"phase {phase.name}: its stages are partitioned differently ({[s.name for s in phase.stages]})")
    return dg.define_asset_job(
        phase.name,
        selection=dg.AssetSelection.assets(*(s.name for s in phase.stages)),
        description=f"{phase.description} ({', '.join(s.name for s in phase.stages)})",
    )


JOBS = [_job(phase) for phase in S.PHASES]
STUDY_JOBS = [job for job, phase in zip(JOBS, S.PHASES) if not phase.build]
# (job name, asset keys, partitioned?) of a full build, in order
BUILD_ORDER: list[tuple[str, list[str], bool]] = [
    (phase.name, [s.name for s in phase.stages], phase.stages[0].partitioned) for phase in S.PHASES if phase.build
]
