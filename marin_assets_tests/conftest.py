"""Shared test setup: quiet Hugging Face client and the fixture modules."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from marin_assets_tests.fixtures.gcs import gcs_emulator, gcs_prefix  # noqa: E402,F401
from marin_assets_tests.fixtures.hub import hub_server, hub_store  # noqa: E402,F401
from marin_assets_tests.fixtures.pipeline import pipeline  # noqa: E402,F401
