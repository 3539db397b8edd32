"""Checks on the curation stages: how much of a source decontamination flags, and how the
quality bands split the documents."""

import dagster as dg

from marin_assets.core.decon import rules as decon
from marin_assets.core.runtime import storage
from marin_assets.core.specs import CONTAMINATION, QUALITY_BANDS
from marin_assets.defs.checks.output import NoOutput, missing_output, output_uri
from marin_assets.defs.metadata import markdown_table
from marin_assets.defs.partitions import source_partitions

# Over the whole pool about 0.04% of documents match an eval set. A source far above that is
# usually flagged on boilerplate shared with an eval (a drop set to review). The flagged
# documents leave the pool either way, so the check warns rather than stops anything.
WARN_CONTAMINATION_RATE = 0.01
# Bands that hold (almost) nothing or most of the documents mean the edges or the scorer drifted.
MIN_BAND_SHARE = 0.005
MAX_BAND_SHARE = 0.60


@dg.asset_check(asset=CONTAMINATION.name, name="contamination_rate", partitions_def=source_partitions,
                description=f"At most {WARN_CONTAMINATION_RATE:.0%} of the source's documents are flagged; more asks for a review.")  # fmt: skip
def contamination_rate(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
    try:
        uri = output_uri(context, CONTAMINATION.name)
    except NoOutput as err:
        return missing_output(CONTAMINATION.name, err)
    summary = decon.summarize_contamination((storage.read_manifest(uri) or {}).get("per_shard", []))
    rate = float(summary["contamination_rate"])
    flagged = summary["flagged_by_eval"]
    return dg.AssetCheckResult(
        passed=rate <= WARN_CONTAMINATION_RATE,
        severity=dg.AssetCheckSeverity.WARN,
        description=f"{summary['contaminated']} of {summary['documents']} documents flagged ({rate:.3%})"
        + ("" if rate <= WARN_CONTAMINATION_RATE else "; review the flagged sample and the boilerplate drop sets"),
        metadata={
            "contamination_rate": rate,
            "documents": int(summary["documents"]),
            "contaminated": int(summary["contaminated"]),
            "flagged_by_eval": markdown_table([{"eval set": k, "documents": v} for k, v in flagged.items()]),
        },
    )


@dg.asset_check(asset=QUALITY_BANDS.name, name="band_sizes",
                description=f"Every quality band holds between {MIN_BAND_SHARE:.1%} and {MAX_BAND_SHARE:.0%} of the documents.")  # fmt: skip
def band_sizes(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
    try:
        uri = output_uri(context, QUALITY_BANDS.name)
    except NoOutput as err:
        return missing_output(QUALITY_BANDS.name, err)
    summary = ((storage.read_manifest(uri) or {}).get("stats") or {}).get("band_summary") or {}
    per_topic = summary.get("documents_per_band") or []
    bands = max((len(row) for row in per_topic), default=0)
    totals = [sum(row[b] for row in per_topic if b < len(row)) for b in range(bands)]
    documents = sum(totals)
    shares = [t / documents if documents else 0.0 for t in totals]
    off = [f"q{b}: {share:.1%}" for b, share in enumerate(shares) if not MIN_BAND_SHARE <= share <= MAX_BAND_SHARE]
    return dg.AssetCheckResult(
        passed=documents > 0 and not off,
        severity=dg.AssetCheckSeverity.WARN,
        description=("no documents in any band" if not documents else
                     f"bands outside {MIN_BAND_SHARE:.1%}-{MAX_BAND_SHARE:.0%}: {', '.join(off)}" if off else
                     "band shares " + ", ".join(f"q{b} {s:.1%}" for b, s in enumerate(shares))),  # fmt: skip
        metadata={
            "documents": documents,
            "topic_count": len(per_topic),
            "band_shares": markdown_table([{"band": f"q{b}", "documents": totals[b], "share": f"{shares[b]:.2%}"} for b in range(bands)]),
        },
    )


CURATION_CHECKS = [contamination_rate, band_sizes]
