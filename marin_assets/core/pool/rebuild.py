"""The rebuild report: a rebuilt pool set against what was published.

Per source: the tokens measured in its pool (by the pinned tokenizer) against the catalog's
``rough_tokens_b`` (Marin's published count), and against the same source in the last
published build of the pool; the documents dedup and decontamination removed. Overall: the
tokens dedup removed against Marin's published share (2.13T of 25T tokens, 8.5%). A source
whose tokens are off by more than ``tolerance``, or whose dedup share is far above the
published one, is flagged: a recipe that silently drops half a source, or a dedup that
removes 30%, is seen at the first rebuild.

A verdict says what it rests on. "ok" is said only of a source compared against something the
report did not fit to it: the catalog's count at a given scale, or the last published build.
With a fitted scale (a sample) the median source reads x1.00 by construction, so a source with
no earlier build is "not checked"; and a sample's total dedup share is not the catalog's, so a
total that happens to match the published share says so rather than reading as a validation.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

PUBLISHED_TOKENS = 25e12  # Marin's pool from its catalog's sources
PUBLISHED_DEDUP_REMOVED_TOKENS = 2.13e12  # global dedup's removals from it
PUBLISHED_DEDUP_SHARE = PUBLISHED_DEDUP_REMOVED_TOKENS / PUBLISHED_TOKENS  # 8.5%


@dataclasses.dataclass(frozen=True)
class ReportParams:
    """``tolerance``: the fraction a source's tokens may be off the expected (catalog or last
    build) before it is flagged. ``scale``: expected tokens are ``rough_tokens_b`` x 1e9 x scale
    (1.0: the full corpus); ``None`` fits it as the median ratio over the sources built (a
    sample, like the demo). ``dedup_margin``: how far above the published dedup share (8.5%) a
    source's or the pool's dedup share may be before it is flagged."""

    tolerance: float = 0.3
    scale: float | None = 1.0
    dedup_margin: float = 0.15


@dataclasses.dataclass(frozen=True)
class SourceFigures:
    """What one source's rebuild measured (documents and tokens kept in its pool; documents and
    estimated tokens dedup removed; documents decontamination removed)."""

    source: str
    documents: int
    tokens: int
    dedup_removed_documents: int
    dedup_removed_tokens_est: int
    decon_removed_documents: int
    semantic_flagged: Mapping[str, int] = dataclasses.field(default_factory=dict)  # per eval set (any policy)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, payload: Mapping[str, Any]) -> SourceFigures:
        return cls(**{f.name: payload[f.name] for f in dataclasses.fields(cls) if f.name in payload})


def _share(part: float, whole: float) -> float:
    return part / whole if whole else 0.0


def fitted_scale(figures: Sequence[SourceFigures], catalog_tokens_b: Mapping[str, float]) -> float:
    """The median of measured / catalog tokens over the sources that have both (1.0 if none)."""
    ratios = [f.tokens / (catalog_tokens_b[f.source] * 1e9) for f in figures if f.tokens and catalog_tokens_b.get(f.source)]
    return statistics.median(ratios) if ratios else 1.0


NOT_CHECKED = "not checked: the scale is fitted to these sources and there is no earlier build"


def verdict(flags: list[str], independent: bool) -> str:
    """Flags first; "ok" only where a comparison independent of the fit was made."""
    return "; ".join(flags) if flags else "ok" if independent else NOT_CHECKED


def rebuild_report(
    figures: Sequence[SourceFigures],
    catalog_tokens_b: Mapping[str, float],
    params: ReportParams = ReportParams(),
    published: Mapping[str, SourceFigures] | None = None,
    catalog_size: int | None = None,
) -> dict[str, Any]:
    """Rows per source (``flags`` first: the verdict), the totals, and the scale used.

    ``published``: the same sources in the last published build of the pool, if any.
    ``catalog_size``: sources in the catalog (the rows are a sample when fewer).
    """
    fitted = params.scale is None
    scale = fitted_scale(figures, catalog_tokens_b) if fitted else params.scale
    rows = []
    for f in sorted(figures, key=lambda f: f.source):
        expected = catalog_tokens_b.get(f.source, 0.0) * 1e9 * scale
        before_dedup = f.tokens + f.dedup_removed_tokens_est
        dedup_share = _share(f.dedup_removed_tokens_est, before_dedup)
        last = (published or {}).get(f.source)
        flags = []
        if expected and abs(f.tokens / expected - 1) > params.tolerance:
            flags.append(f"tokens x{f.tokens / expected:.2f} of the catalog's")
        if last is not None and last.tokens and abs(f.tokens / last.tokens - 1) > params.tolerance:
            flags.append(f"tokens x{f.tokens / last.tokens:.2f} of the last published build")
        if dedup_share > PUBLISHED_DEDUP_SHARE + params.dedup_margin:
            flags.append(f"dedup removed {dedup_share:.1%} (published {PUBLISHED_DEDUP_SHARE:.1%})")
        independent = (bool(expected) and not fitted) or bool(last is not None and last.tokens)
        rows.append({
            "flags": verdict(flags, independent), "source": f.source, "documents": f.documents, "tokens": f.tokens, "expected_tokens": int(expected),
            "ratio": round(f.tokens / expected, 3) if expected else None,
            "last_published_tokens": last.tokens if last is not None else None,
            "dedup_removed_documents": f.dedup_removed_documents, "dedup_share_est": round(dedup_share, 4),
            "decon_removed_documents": f.decon_removed_documents,
            "decon_share": round(_share(f.decon_removed_documents, f.documents + f.dedup_removed_documents + f.decon_removed_documents), 4),
            "flagged": bool(flags),
            "semantic_flagged": dict(f.semantic_flagged),
        })  # fmt: skip
    tokens = sum(f.tokens for f in figures)
    removed = sum(f.dedup_removed_tokens_est for f in figures)
    dedup_share = _share(removed, tokens + removed)
    sample = catalog_size is not None and len(figures) < catalog_size
    totals = {
        "sources": len(figures), "tokens": tokens, "expected_tokens": int(sum(r["expected_tokens"] for r in rows)),
        "dedup_removed_tokens_est": removed, "dedup_share_est": round(dedup_share, 4), "published_dedup_share": round(PUBLISHED_DEDUP_SHARE, 4),
        "flag": f"dedup removed {dedup_share:.1%} of tokens (published {PUBLISHED_DEDUP_SHARE:.1%})"
        if dedup_share > PUBLISHED_DEDUP_SHARE + params.dedup_margin else "",
        "note": (f"{len(figures)} of {catalog_size} catalog sources: the published share is the whole catalog's, "
                 "so this total is not a validation of it") if sample else "",
    }  # fmt: skip
    return {"rows": rows, "totals": totals, "scale": scale, "fitted": fitted, "flagged": [r["source"] for r in rows if r["flagged"]]}


def report_lines(report: Mapping[str, Any], tokenizer: str) -> list[str]:
    """The report as the demo prints it."""
    scale = report["scale"]
    lines = [
        f"  tokens by {tokenizer}; expected = catalog rough_tokens_b x {scale:.3g}"
        + (" (fitted to these sources: a sample; a ratio says how a source stands against the others, not against Marin)" if report.get("fitted") else ""),
        f"  {'flags':12s} {'source':28s} {'tokens':>10s} {'expected':>10s} {'ratio':>6s} {'dedup':>6s} {'decon':>6s}",
    ]
    for r in sorted(report["rows"], key=lambda r: (not r["flagged"], r["source"])):
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "-"
        flag = "FLAG" if r["flagged"] else "ok" if r["flags"] == "ok" else "not checked"
        lines.append(f"  {flag:12s} {r['source']:28s} {r['tokens']:>10,} {r['expected_tokens']:>10,} {ratio:>6s} {r['dedup_share_est']:>6.1%} "
                     f"{r['decon_share']:>6.1%}" + (f"  {r['flags']}" if r["flagged"] else ""))  # fmt: skip
    if any(r["flags"] == NOT_CHECKED for r in report["rows"]):
        lines.append(f"  not checked: {NOT_CHECKED.removeprefix('not checked: ')}")
    semantic = [f"{r['source']}: " + ", ".join(f"{k} {v}" for k, v in r["semantic_flagged"].items())
                for r in report["rows"] if r.get("semantic_flagged")]
    if semantic:
        lines.append("  semantic decontamination flags (per eval set): " + "; ".join(semantic))
    t = report["totals"]
    lines.append(f"  all {t['sources']} sources: {t['tokens']:,} tokens; dedup removed ~{t['dedup_share_est']:.1%} of tokens "
                 f"(published {t['published_dedup_share']:.1%}: 2.13T of 25T){'; FLAG' if t['flag'] else ''}")  # fmt: skip
    if t.get("note"):
        lines.append(f"  ({t['note']})")
    return lines
