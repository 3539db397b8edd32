"""Parameters, errors and the eval row shared by the decontamination modules (reference values of Marin's rule)."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

from marin_assets.errors import BadInput

RULES = ("coverage", "marin")  # the rules computed for every document
EITHER = "either"  # the default flag: a document either rule flags


class EvalRow(NamedTuple):
    """One eval row: its whole indexed text and, when it has several, each field's own text.

    The coverage rule scores every field (question, answer, solution, passage...) as its own
    unit beside the whole row, so a copy of one field of a long row is still found.
    """

    eval_set: str
    row_id: str
    text: str | None
    fields: tuple[tuple[str, str], ...] = ()  # (field name, text) in registry order; () for one field


@dataclasses.dataclass(frozen=True)
class DeconParams:
    """Reference values of the decontamination rule; URIs say where the index and drop sets are."""

    rule_name: str = EITHER  # what fills ``contaminated``: ``either`` rule, or one of RULES; both are reported
    ngram_tokens: int = 13
    record_min_tokens: int = 3
    record_max_tokens: int = 12
    overlap_threshold: float = 0.5
    min_matched_features: int = 2
    # the coverage rule (normalized tokens, paragraph boundaries ignored)
    coverage_share: float = 0.5  # of some eval row's distinct 13-grams present in the document
    run_tokens: int = 50  # or consecutive matched 13-grams covering this many tokens
    run_gap_windows: int = 13  # missing 13-grams that do not end a run (one changed token removes 13)
    short_min_tokens: int = 6  # short rows (< 13 tokens) of at least this many match anywhere, whole
    # each field of a row is also a unit of the share, when distinctive: at least this many of its
    # 13-grams found in no other row of its set (a short answer or a shared instruction never flags alone)
    field_min_features: int = 8
    # drop sets
    source_sample_docs: int = 5_000
    source_min_docs: int = 5
    source_min_fraction: float = 0.005
    global_sample_docs: int = 1_000_000
    global_min_docs: int = 50
    global_min_sources: int = 3
    # reporting
    flagged_sample_size: int = 8
    max_matched_rows: int = 16
    excerpt_chars: int = 600
    # execution
    text_column: str = "text"
    batch_bytes: int = 1 << 20  # per-byte work arrays stay small enough to be reused, not re-faulted
    index_uri: str = ""
    drop_set_uris: tuple[str, ...] = ()  # the marin rule's (Marin's drop sets)
    coverage_drop_set_uris: tuple[str, ...] = ()  # the coverage rule's (boilerplate, copies excluded)
    index_cache_dir: str = ""  # local copies of a remote index (empty: the system temp folder)
    # the semantic tier (``semantic``): its settings, the eval_embeddings folder (empty: off) and the
    # encoder of its windows (the pool's); the contamination stage fingerprints them itself
    semantic: Any = None  # SemanticParams
    semantic_index_uri: str = ""
    encoder: Any = None  # EncoderParams

    def rule(self) -> dict[str, Any]:
        """The 13-gram parameters that decide the output (fingerprint input); URIs, cache, batch size and
        the semantic tier's settings excluded (the contamination stage adds those)."""
        skip = {"index_uri", "drop_set_uris", "coverage_drop_set_uris", "batch_bytes", "index_cache_dir",
                "semantic", "semantic_index_uri", "encoder"}
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in skip}


class EvalIndexError(BadInput, RuntimeError):
    """The eval corpus is incomplete or unusable; the message lists every problem and the fix."""

