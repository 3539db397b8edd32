"""Asset checks that tell users whether a stage's output is usable (``STAGE_CHECKS``).

Checks read the output the asset's latest materialization names (its ``uri`` metadata)
through ``core.runtime.storage``; they are partitioned like their asset, so each source has its own
verdict. Checks on outputs that later stages join on are blocking: a failure stops the rest
of that run's chain for the source.
"""

from marin_assets.defs.checks.attributes import ATTRIBUTE_CHECKS
from marin_assets.defs.checks.curation import CURATION_CHECKS
from marin_assets.defs.checks.normalized import NORMALIZED_CHECKS

STAGE_CHECKS = [*NORMALIZED_CHECKS, *ATTRIBUTE_CHECKS, *CURATION_CHECKS]
