"""One-off converter: the reference source table (TSV) -> marin_assets/catalog/sources.toml.

The TOML is the source of truth once written; edit pins there, not here. This script
records how each free-text TSV column was turned into structured fields, so the
first version of the catalog can be regenerated and reviewed.

    python scripts/catalog_from_tsv.py /path/to/marin_sources.tsv > marin_assets/catalog/sources.toml
"""

from __future__ import annotations

import csv
import json
import re
import sys
from typing import Any

# ----------------------------------------------------------------------------- decisions

# The 16 sources never removed by fuzzy dedup. The reference names DNA (biocorpus), both
# biocollection streams, massive_function_calling and swe-rebench-contree, and then
# "several Nemotron synthetic specialised sets". We fill the remaining 11 places with
# the template-generated specialised releases: all of Specialized-v1.1 (5) and v1.2 (4),
# plus the two programmatically generated v1 sets (InfiniByte reasoning, scientific coding).
FUZZY_EXEMPT = (
    "biocorpus",
    "biocollection/free_text_stream",
    "biocollection/instruction_stream",
    "massive_function_calling",
    "swe-rebench-contree",
    "nemotron_specialized_v1_1/code_concepts",
    "nemotron_specialized_v1_1/economics",
    "nemotron_specialized_v1_1/formal_logic",
    "nemotron_specialized_v1_1/multiple_choice",
    "nemotron_specialized_v1_1/unconditional_algorithmic",
    "nemotron_specialized_v1_2/fact_seeking",
    "nemotron_specialized_v1_2/generative",
    "nemotron_specialized_v1_2/moral_scenarios",
    "nemotron_specialized_v1_2/multiple_choice",
    "nemotron_specialized/infinibyte_reasoning",
    "nemotron_specialized/scientific_coding",
)

FAMILY_COMMENTS = {
    "common_pile": "Common Pile v0.1 filtered subsets: each its own repo and download; Dolma JSON lines.",
    "finepdfs": (
        "FinePDFs languages: one repo, one download per language. allow scopes each download\n"
        "# to its language directory so a fresh fetch does not pull the whole repo."
    ),
    "dolma4pdfs": "Dolma 3.5 pool, PDF component (same repo/revision as dolma_code_prose, own download).",
    "nemotron_v2": (
        "Nemotron pretraining collection: ten library families, each one whole-repo download\n"
        "# shared (share_key) by its catalog subsets; subdir picks the subset. Gated: needs HF_TOKEN."
    ),
    "safety_pretraining": "Safety Pretraining score buckets: one download per repo, shared by its buckets.",
    "starcoder2_extras": "StarCoder2 extras: one repo, one download per subset (ir_low_resource not used).",
    "biocollection": "TheBioCollection: one repo, one download per stream.",
    "davinci_dev": "daVinci-Dev: one gated repo, two downloads (PR context, agent trajectories).",
}

# Per-entry decisions for the single-entry sources, keyed by source name.
# Keys: transform, allow, exclude, subdir, staged_path, input_format, id_field, text_field,
# license, notes, bare, exact_dedup, gated, and provider pins (kind, repo_id, repo_type,
# revision, url, sha256, expected_shards).
SINGLES: dict[str, dict[str, Any]] = {
    "agenttrove": dict(
        transform="agenttrove_transcript",
        notes="Terminal-agent rollouts rendered as role-tagged transcripts with an outcome tag; "
        "rollouts taught by proprietary models are dropped (gpt-oss kept); ~781k docs.",
    ),
    "biocorpus": dict(
        repo_id="timodonnell/biocorpus",
        repo_type="bucket",
        allow=["data/*.jsonl.zst"],
        subdir="data",
        sha256="1c3ff878f17cd8398919a414f1b3646c1d010b99aaaf0a6fb82274edc939ea39",
        notes="Sequence-first biology corpus (DNA/protein) in an HF storage bucket; the pin is a "
        "snapshot date, sha256 holds the snapshot's xet fingerprint; 21.1M docs.",
    ),
    "cp/biodiversity": dict(
        transform="biodiversity_pages",
        input_format="json.gz",
        id_field="item_id",
        notes="Biodiversity Heritage Library scans, one row per page upstream; pages are stitched "
        "into one document per item (item_id kept as source_id).",
    ),
    "climblab-ja": dict(
        license="ODC-BY",
        notes="Japanese ClimbLab adaptation of LLM-jp Corpus v4 (~201M rows); quality and "
        "advertisement score columns are kept.",
    ),
    "coderforge": dict(
        transform="coderforge_trajectory",
        allow=[
            "trajectories/SWE_Rebench-*.parquet",
            "trajectories/SWE_Smith-*.parquet",
            "trajectories/R2E_Gym-*.parquet",
        ],
        notes="Software-engineering agent trajectories (SWE-Rebench, SWE-Smith, R2E-Gym splits) "
        "rendered as tool/role blocks with a reward outcome tag.",
    ),
    "common-crawl-focus-2026-22": dict(
        # Staged copy location under our prefix. The canonical copy sits on CoreWeave S3
        # under a legacy normalized/common_crawl_focus_2026_22_ed4b8bc9 directory.
        staged_path="raw/common_crawl_focus_2026_22_ed4b8bc9",
        subdir="outputs/main",
        allow=["outputs/main/*.parquet"],
        expected_shards=4573,
        input_format="parquet",
        id_field="source_id",
        notes="Focus crawl of CC-SUPPLEMENTAL-2026-22: HTML from all 4,573 WARCs extracted with "
        "jusText (commit 1652a149); 36.3M docs in 4,573 shards (89.4 GB). Shards repeat ids in "
        "no order, so exact dedup stays on; the WARC record UUID is the source id. Copy the "
        "shards from the CoreWeave S3 copy before a run.",
    ),
    "davinci-dev/ctx-native": dict(
        transform="davinci_pr_markdown",
        allow=["ctx-native/llm_enhanced_prs/*.parquet"],
        gated=True,
        license="gated on HF (auto-approved terms)",
        notes="Pull requests rendered as Markdown sections (repo context, issue, PR, summary, "
        "files, commits and diffs).",
    ),
    "davinci-dev/env-native": dict(
        transform="davinci_env_trajectory",
        allow=["env-native.jsonl"],
        input_format="jsonl",
        gated=True,
        license="gated on HF (auto-approved terms)",
        notes="SWE-Agent rollouts on SWE-rebench tasks rendered as role blocks with a success tag; "
        "one ~3 GB file, normalize needs a large-memory worker.",
    ),
    "docx-corpus/en": dict(
        kind="api",
        url="https://api.docxcorp.us/manifest?lang=en",
        sha256="34c7a3beae63d942a8d02dd3b49d4421acc1f351be5106b42262c192fc58fea9",
        revision="2026-07-28",
        input_format="txt",
        transform="docx_corpus_records",
        notes="English Word documents: the sha256-pinned manifest lists ids, each document's "
        "extracted text is fetched from docxcorp.us/extracted/{id}.txt; 242,086 docs.",
    ),
    "dolma_code_prose": dict(
        allow=["dolma_code_prose/**/*.jsonl.zst"],
        subdir="dolma_code_prose",
        notes="Web documents mixing prose and code from the Dolma 3.5 pool; very long documents "
        "need roomy tokenizer workers; 31.2M docs.",
    ),
    "eai-taxonomy-code-w-dclm": dict(
        allow=["data/train-*.parquet"],
        notes="Common Crawl text selected for code/CS reasoning by the EAI taxonomy plus DCLM "
        "instruction density; 273.8M docs.",
    ),
    "finetranslations": dict(
        transform="finetranslations_fold",
        allow=["data/**/*.parquet"],
        id_field="",
        notes="Parallel text: original and English translation folded into one document, order "
        "chosen per document by a hash of its id; the fold keeps only text.",
    ),
    "ghalogs/public": dict(
        kind="web",
        url="https://zenodo.org/records/14796970/files/github_run_logs.zip",
        revision="zenodo-14796970",
        staged_path="raw/diagnostic_logs/ghalogs/zenodo-14796970",
        subdir="zenodo.org/records/14796970/files",
        allow=["zenodo.org/records/14796970/files/github_run_logs.zip"],
        input_format="zip",
        transform="ghalogs_sanitize",
        license="CC-BY-SA-4.0",
        notes="GitHub Actions CI logs (Zenodo record 14796970, 143.4 GB zip) that must be staged "
        "by hand; logs are sanitized (secrets redacted, users pseudonymized) and hash-split "
        "97/1/1/1, only the train split is kept. Token count is the 150 B estimate.",
    ),
    "glm-5.2-kernelgym-rollouts": dict(
        transform="kernelgym_trajectory",
        allow=["data/*.jsonl.gz"],
        input_format="jsonl.gz",
        notes="GLM-5.2 KernelGym CUDA/Triton kernel-optimization trajectories ending on a passing "
        "kernel; rows whose last turn hit max_tokens are dropped; 2,835 docs.",
    ),
    "gpt-oss-rollouts": dict(
        transform="gpt_oss_chat",
        allow=["NuminaMath-CoT/train.jsonl", "WildChat-1M/train.jsonl", "ultrachat_200k/train_sft.jsonl"],
        input_format="jsonl",
        notes="GPT-OSS-20B rollouts on non-benchmark prompt sets rendered as user/thinking/assistant "
        "tags.",
    ),
    "hplt_v3": dict(
        kind="web",
        url="https://data.hplt-project.org/three/sorted/eng_Latn/{tier}_{shard}.jsonl.zst",
        revision="v3.0",
        allow=["5_*.jsonl.zst", "6_*.jsonl.zst", "7_*.jsonl.zst", "8_*.jsonl.zst", "9_*.jsonl.zst", "10_*.jsonl.zst"],
        expected_shards=1294,
        input_format="jsonl.zst",
        transform="hplt_register_filter",
        notes="HPLT v3.0 English, WDS tiers 5-10 (74+119+275+479+344+3 shards); keeps only the "
        "non-Common-Crawl crawls (wide*, survey*) and applies a web-register quality filter.",
    ),
    "institutional_books": dict(
        transform="institutional_books_pages",
        subdir="data",
        id_field="",
        notes="Digitized library books; pages joined with blank lines, preferring the OCR-corrected "
        "page text.",
    ),
    "massive_function_calling": dict(
        kind="web",
        url="https://amazon-massive-nlu-dataset.s3.amazonaws.com/amazon-massive-dataset-1.1.tar.gz",
        revision="1.1",
        input_format="tar.gz",
        transform="massive_function_calling",
        notes="MASSIVE v1.1 (52 locales, all partitions including test and validation) rendered as "
        "function-calling text: a tool list with distractors, the request and the gold call.",
    ),
    "molmo2-cap": dict(
        transform="molmo2_captions",
        allow=["data/train-*.parquet"],
        notes="Long-form video captions: merged caption followed by per-frame timestamped captions.",
    ),
    "nemotron_code_v1/content": dict(
        kind="prestaged",
        staged_path="raw/nemotron-code-v1-content",
        allow=["*.parquet"],
        expected_shards=514,
        revision="2026.07.30",
        bare=True,
        exact_dedup=False,
        license="upstream ships metadata only; file contents are not redistributable",
        notes="Source files of Nemotron-Pretraining-Code-v1 rebuilt from (repo, commit, path) "
        "metadata via Software Heritage; 513.1M rows, 585 GB. Canonical copy on Cloudflare R2, "
        "copy it in before a run. Tokens extrapolated from v2.",
    ),
    "nemotron_code_v2/content": dict(
        kind="prestaged",
        staged_path="raw/nemotron-code-v2-content",
        allow=["*.parquet"],
        expected_shards=133,
        revision="2026.07.14",
        bare=True,
        exact_dedup=False,
        notes="Source files of Nemotron-Pretraining-Code-v2 rebuilt from its code metadata; "
        "132.9M rows, 139 GB. Canonical copy on Cloudflare R2, copy it in before a run.",
    ),
    "nemotron-terminal": dict(
        transform="nemotron_terminal_conversations",
        notes="Terminal-agent rollouts with thinking traces rendered as role-tagged blocks.",
    ),
    "nsf_awards": dict(
        kind="api",
        url="https://api.nsf.gov/services/v2/s3/list-files",
        input_format="zip",
        id_field="awd_id",
        transform="nsf_award_abstracts",
        notes="NSF award records, years 1960-2025, from presigned per-year zips; text is title plus "
        "abstract, awards without an abstract are dropped.",
    ),
    "numinamath-1.5": dict(
        transform="numinamath_chat",
        allow=["data/train-*.parquet"],
        notes="Competition math problems with solutions as user/assistant turns; only rows whose "
        "problem and solution are marked valid.",
    ),
    "numinamath-tir": dict(
        transform="numinamath_tir_chat",
        allow=["data/train-*.parquet"],
        notes="Tool-integrated math reasoning conversations rendered as role tags.",
    ),
    "sec-edgar": dict(
        transform="sec_edgar_reencode",
        allow=[f"{t}/*.parquet" for t in ("10-K", "10-Q", "8-K", "20-F", "S-1", "S-8", "144", "3", "4", "5")],
        notes="SEC filings of ten form types; shards are re-encoded with DuckDB because pyarrow "
        "cannot read their page statistics (needs duckdb).",
    ),
    "stack-v3": dict(
        transform="stack_v3_repository",
        allow=["data/*.parquet"],
        license="per file (detected licenses kept in file_metadata)",
        notes="One document per repository: files serialized in directory-block DFS order under "
        "Repository:/File: headers; 172.9M docs, the largest source.",
    ),
    "superior-reasoning": dict(
        transform="superior_reasoning_chat",
        allow=[
            "Superior-Reasoning-SFT-gpt-oss-120b-stage1-train-data.jsonl",
            "Superior-Reasoning-SFT-gpt-oss-120b-stage2-train-data.jsonl",
        ],
        input_format="jsonl",
        notes="gpt-oss-120b reasoning SFT data (stages 1 and 2) as user/assistant turns with think "
        "tags removed.",
    ),
    "svg": dict(
        transform="svg_prompt",
        allow=["svgfind-CREATIVECOMMONS_*.jsonl.zst"],
        license="Creative Commons shards only",
        notes="SVG files from svgfind as prompt (title, pack, tags) plus raw SVG; the public-domain "
        "shard is not used.",
    ),
    "swe-rebench-contree": dict(
        allow=["data/*.parquet"],
        exclude=["metadata/licenses.parquet"],
        notes="Line-by-line Python execution traces of SWE-rebench V2 test suites, already rendered "
        "and filtered upstream; read as-is.",
    ),
    "swe-rebench-openhands": dict(
        transform="swe_rebench_openhands_trajectory",
        notes="OpenHands trajectories on SWE-rebench rendered as role-tagged text with a resolved tag.",
    ),
    "swe-zero-12m": dict(
        transform="swe_zero_trajectory",
        notes="12.3M execution-free mini-swe-agent trajectories rendered as role-tagged blocks.",
    ),
    "synthetic-1": dict(
        transform="synthetic1_scored_response",
        notes="Verified reasoning data: prompt, a verifier score tag and the response with think "
        "tags removed.",
    ),
    "dolma4pdfs": dict(
        allow=[
            "dolma4pdfs/olmo-crawled-pdfs_ngram_filtered/**/*.jsonl.zst",
            "dolma4pdfs/s2orcforolmo_nogpl_ngram_filtered_license_partioned/**/*.jsonl.zst",
        ],
        exclude=["dolma4pdfs/finepdfs_wo_partitioned_qual_ngram_filtered/**"],
        subdir="dolma4pdfs",
        bare=True,
        notes="OCR'd PDF text from the Dolma 3.5 pool; the FinePDFs component is left out to avoid "
        "counting finepdfs twice; bare because component metadata types clash; 137.1M docs.",
    ),
}

# ----------------------------------------------------------------------------- derivation


def _family_entry(row: dict[str, str]) -> dict[str, Any]:
    """Structured fields for rows of the multi-entry families, parsed from the TSV text."""
    name, family = row["name"], row["family"]
    fs, notes_in = row["file_selection"], row["notes"]
    out: dict[str, Any] = {}
    if family == "common_pile":
        out["input_format"] = "json.gz"
        out["notes"] = "Common Pile v0.1 filtered subset; Dolma JSON lines (.json.gz or .jsonl.gz)."
    elif family == "finepdfs":
        lang = re.search(r"language subset (\S+);", fs).group(1)
        out["allow"] = [f"data/{lang}/**/*.parquet"]
        out["subdir"] = f"data/{lang}"
        out["notes"] = f"FinePDFs text of PDFs, language {lang}" + (" (English)." if name == "finepdfs" else ".")
    elif family == "nemotron_v2":
        subset = re.search(r"subset dir (\S+) \(glob", fs).group(1)
        library = re.search(r"library family (\S+) \(key", notes_in).group(1)
        out["subdir"] = subset
        out["share_key"] = library
        out["gated"] = True
        out["license"] = "NVIDIA Nemotron collection terms (gated, HF_TOKEN)"
        extra = []
        if row["text_field"] == "content":
            extra = ["text in the content column"]
        if "64g" in notes_in:
            extra.append("skewed shards, normalize needs a large-memory worker")
        if "distinct, larger regeneration" in notes_in:
            extra.append("a larger regeneration of specialized_v1_1/multiple_choice; both are kept")
        if "4plus, not in catalog" in notes_in:
            extra.append("the family's 4plus subset is not used")
        out["notes"] = f"{library} subset {subset}" + ("; " + "; ".join(extra) if extra else "") + "."
    elif family == "safety_pretraining":
        bucket = re.search(r"score-bucket dir (\S+) ", fs).group(1)
        repo = row["hf_repo_id"].split("/")[1]
        out["subdir"] = bucket
        out["share_key"] = f"safety_pretraining/{repo}"
        out["license"] = "ODC-BY"
        out["notes"] = f"Safety Pretraining {repo} score bucket {bucket}."
    elif family == "starcoder2_extras":
        subset = re.search(r"\(subset (\S+)\)", fs).group(1)
        out["allow"] = [f"{subset}/*.parquet"]
        out["subdir"] = subset
        out["notes"] = f"StarCoder2 extras subset {subset}."
    elif family == "biocollection":
        stream = name.split("/")[1]
        out["allow"] = [f"data/{stream}/*.jsonl.zst"]
        out["subdir"] = f"data/{stream}"
        out["transform"] = "biocollection_stream"
        out["notes"] = f"Synthetic bio/chem {stream.replace('_', ' ')}; the record_type column is dropped."
    else:
        raise KeyError(f"no rule for family {family!r} (entry {name!r})")
    return out


def build_entry(row: dict[str, str]) -> dict[str, Any]:
    name = row["name"]
    spec = dict(SINGLES.get(name) or _family_entry(row))
    kind = spec.pop("kind", row["provider_kind"])
    assert kind == row["provider_kind"], name
    tokens = float(row["rough_token_count_b"])
    fmt = spec.pop("input_format", row["input_format"].split(" ")[0])
    id_field = spec.pop("id_field", row["id_field"].split(" ")[0])
    entry: dict[str, Any] = {
        "name": name,
        "family": row["family"],
        "rough_tokens_b": tokens,
        "license": spec.pop("license", ""),
        "notes": spec.pop("notes"),
        "gated": spec.pop("gated", False),
        "fuzzy_exempt": name in FUZZY_EXEMPT,
        "input_format": fmt,
        "text_field": spec.pop("text_field", row["text_field"]),
        "id_field": id_field,
    }
    transform = spec.pop("transform", None)
    if transform:
        entry["transform"] = transform
    entry["bare"] = spec.pop("bare", False)
    entry["exact_dedup"] = spec.pop("exact_dedup", True)
    provider: dict[str, Any] = {"kind": kind}
    if kind == "hf":
        provider["repo_id"] = spec.pop("repo_id", row["hf_repo_id"])
        provider["revision"] = row["revision"]
        provider["repo_type"] = spec.pop("repo_type", "dataset")
    elif "revision" in spec:
        provider["revision"] = spec.pop("revision")
    for key in ("allow", "exclude"):
        provider[key] = spec.pop(key, [])
    staged = spec.pop("staged_path", row["staged_path"].replace(" (relative to MARIN_PREFIX)", "").strip())
    for key, value in (
        ("subdir", spec.pop("subdir", "")),
        ("staged_path", staged),
        ("expected_shards", spec.pop("expected_shards", None)),
        ("url", spec.pop("url", "")),
        ("sha256", spec.pop("sha256", "")),
    ):
        if value not in ("", None):
            provider[key] = value
    share_key = spec.pop("share_key", name)
    if share_key != name:
        provider["share_key"] = share_key
    assert not spec, (name, spec)
    entry["provider"] = provider
    return entry


# ----------------------------------------------------------------------------- TOML


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value, ensure_ascii=False)


HEADER = """\
# The Marin source catalog: one [[source]] table per source (146 entries, ~24,478 B tokens).
#
# Read by marin_assets.catalog.load_catalog() on every call (MARIN_CATALOG overrides the path).
# Field meanings:
#   name            partition key (Dagster-safe: no "...", "|", ",", "[", "]", whitespace)
#   rough_tokens_b  rough size in billions of Llama-3/marin-tokenizer tokens
#   license         licence or access terms when known; "" = not recorded, see the provider card
#   gated           needs accepted terms on the Hub and HF_TOKEN
#   fuzzy_exempt    never removed by fuzzy dedup (exact dedup and decontamination still apply)
#   input_format    upstream file format as downloaded (json.gz = Dolma-style gzipped JSON lines)
#   text_field      column holding the text the normalize step reads (after any transform)
#   id_field        upstream id column kept as source_id; "" = none
#   transform       registered recipe that renders provider rows into documents; absent = generic
#   bare            keep only id, text, source_id
#   exact_dedup     per-source exact dedup during normalize
# [source.provider]:
#   kind            hf | prestaged | web | api
#   repo_id, revision, repo_type   Hub pin; revision is a 7/40-char sha, or a snapshot date for
#                   a bucket (then sha256 is the snapshot's xet fingerprint)
#   allow, exclude  file globs relative to the repo / staged root / url listing; empty = all
#   subdir          directory of the download this source reads (subset, language, split)
#   staged_path     MARIN_PREFIX-relative directory holding an already-present copy
#   expected_shards number of input files that must be present (prestaged, hplt)
#   url, sha256     web/api pin; revision there is a free version label
#   share_key       sources with the same key share one download; omitted = the source name
#
# Fuzzy-dedup exemptions (16). The reference names DNA (biocorpus), both biocollection streams,
# massive_function_calling and swe-rebench-contree, then "several Nemotron synthetic specialised
# sets". The other 11 places go to the template-generated specialised releases: all of
# Specialized-v1.1 (5) and v1.2 (4), plus Specialized-v1 InfiniByte reasoning and scientific
# coding, the two v1 sets generated programmatically.
"""


def render(rows: list[dict[str, str]]) -> str:
    families: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        families.setdefault(row["family"], []).append(row)
    singles = sorted((r for f, rs in families.items() if len(rs) == 1 and f not in FAMILY_COMMENTS for r in rs),
                     key=lambda r: r["name"])
    lines = [HEADER]
    lines.append("# " + "=" * 78)
    lines.append("# Single-entry sources, by name.")
    lines.append("# " + "=" * 78)
    for row in singles:
        lines.extend(_table(row))
    for family, comment in FAMILY_COMMENTS.items():
        lines.append("")
        lines.append("# " + "=" * 78)
        lines.append(f"# {family}: {comment}")
        lines.append("# " + "=" * 78)
        for row in families[family]:
            lines.extend(_table(row))
    return "\n".join(lines) + "\n"


def _table(row: dict[str, str]) -> list[str]:
    entry = build_entry(row)
    provider = entry.pop("provider")
    out = ["", "[[source]]"]
    out += [f"{k} = {_value(v)}" for k, v in entry.items()]
    out.append("[source.provider]")
    out += [f"{k} = {_value(v)}" for k, v in provider.items()]
    return out


def main(argv: list[str]) -> int:
    with open(argv[1], newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    sys.stdout.write(render(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
