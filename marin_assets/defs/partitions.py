"""Every partitioning of the assets, and the pin versions a per-source partition can carry.

Per source: a partition per catalog source name. Mixture studies: one per study, and one per
(study, proxy run). Both study dimensions are dynamic: a study becomes a partition when its spec
is found (the ``mixture_studies`` sensor, or ``add_study``), and ``mixture_swarm`` adds its run
ids (``r0000``...) when it proposes the runs. Runs are shared keys across studies; a study uses
the first ``n_runs`` of them.
"""

from __future__ import annotations

import dagster as dg

from marin_assets.core.ingest.recipes import checked_catalog
from marin_assets.defs.settings import configured_catalog_path

# Loaded leniently: an invalid entry becomes a partition whose source_pins observation fails
# with its error, and every other source still loads. The partitions are fixed when the code
# location loads (a reload picks up new entries).
source_partitions = dg.StaticPartitionsDefinition(list(checked_catalog(configured_catalog_path(), strict=False).partition_names))

# The pin version of a partition with no recipe: its catalog entry is gone, or does not load.
REMOVED = "removed-from-catalog"
INVALID = "invalid-catalog-entry"

STUDIES = "mixture_studies"
RUNS = "mixture_runs"

study_partitions = dg.DynamicPartitionsDefinition(name=STUDIES)
run_partitions = dg.DynamicPartitionsDefinition(name=RUNS)
proxy_run_partitions = dg.MultiPartitionsDefinition({"study": study_partitions, "run": run_partitions})


def proxy_run_key(study: str, run: str) -> dg.MultiPartitionKey:
    return dg.MultiPartitionKey({"study": study, "run": run})


def add_study(instance: dg.DagsterInstance, study: str) -> None:
    """Register a study (its spec must exist under ``<root>/mixture/<study>/study.yaml``)."""
    if not instance.has_dynamic_partition(STUDIES, study):
        instance.add_dynamic_partitions(STUDIES, [study])
