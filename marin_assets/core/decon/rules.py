"""13-gram eval decontamination: the public face of the package's modules.

* ``params``: the frozen parameters (reference values) and the index error;
* ``text_normalize``: the coverage rule's text normalization;
* ``features``: tokens, 13-gram hashes and paragraph units, vectorized per batch;
* ``index``: the eval n-gram index (both rules) with attribution, build and load;
* ``marking``: the ``marin`` and ``coverage`` rules, the default flag (either) and the per-shard output;
* ``boilerplate``: the drop sets;
* reading eval files lives in ``eval_sources``.
"""

from marin_assets.core.decon.boilerplate import eval_ngram_frequencies, global_drop_set, source_drop_set
from marin_assets.core.decon.features import HASH_SCHEME, Features, extract_features, feature_hash, text_features
from marin_assets.core.decon.index import COVERAGE_DIR, EvalIndex, _load_index_cached, build_eval_index, load_eval_index
from marin_assets.core.decon.marking import (
    DocumentMarks,
    contamination_shard,
    either_marks,
    load_drop_set,
    mark_coverage,
    mark_documents,
    mark_marin,
    summarize_contamination,
)
from marin_assets.core.decon.params import EITHER, RULES, DeconParams, EvalIndexError, EvalRow
from marin_assets.core.decon.text_normalize import normalize_text

# 2: two rules (coverage index under coverage/, coverage drop sets, per-rule columns); 3: digit runs blanked per
# document; 4: fields of a row as units of the coverage index (rows.parquet "field"), default flag ``either``
CODE_VERSION = "4"

__all__ = [
    "CODE_VERSION",
    "COVERAGE_DIR",
    "EITHER",
    "HASH_SCHEME",
    "RULES",
    "DeconParams",
    "DocumentMarks",
    "EvalIndex",
    "EvalIndexError",
    "EvalRow",
    "Features",
    "_load_index_cached",
    "build_eval_index",
    "contamination_shard",
    "either_marks",
    "eval_ngram_frequencies",
    "extract_features",
    "feature_hash",
    "global_drop_set",
    "load_drop_set",
    "load_eval_index",
    "mark_coverage",
    "mark_documents",
    "mark_marin",
    "normalize_text",
    "source_drop_set",
    "summarize_contamination",
    "text_features",
]
