"""The demo Hub says which sources it serves: the Hub's own 404, a build of another source and
the drift check all name the demo's sources and how to get the rest (HF_ENDPOINT)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from marin_assets.catalog.sources import load_catalog
from marin_assets.core.ingest import drift, hub
from marin_assets.core.ingest.providers import ProviderAccess
from marin_assets.errors import NotServedHere, kind_of
from marin_assets.demo.sample import DEMO_SOURCES

OTHER = "nemotron_cc_v2/high_actual"  # a Hub source of the catalog the demo does not serve


@pytest.fixture(scope="module")
def demo_endpoint(tmp_path_factory) -> Iterator[str]:
    from marin_assets.demo.run import demo_hub

    with demo_hub(str(tmp_path_factory.mktemp("demo_served") / "hub")) as endpoint:
        yield endpoint


def _names_the_demo(text: str) -> None:
    assert "demo" in text and all(name in text for name in DEMO_SOURCES), text
    assert "HF_ENDPOINT=https://huggingface.co" in text, text


def _hub_source(name: str):
    catalog = load_catalog()
    source = catalog.by_name(name) if name in catalog.names else next(s for s in catalog if s.provider.kind == "hf" and s.provider.repo_type == "dataset" and s.name not in DEMO_SOURCES)
    assert source.name not in DEMO_SOURCES
    return source


def test_the_hub_404_names_what_the_demo_serves(demo_endpoint: str) -> None:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError

    source = _hub_source(OTHER)
    with pytest.raises(RepositoryNotFoundError) as caught:
        HfApi(endpoint=demo_endpoint).repo_info(source.provider.repo_id, repo_type="dataset")
    _names_the_demo(str(caught.value))


def test_building_another_source_fails_naming_the_demo_set(demo_endpoint: str, tmp_path: Path) -> None:
    source = _hub_source(OTHER)
    with pytest.raises(NotServedHere) as caught:
        hub.resolve_revision(source.provider.repo_id, source.provider.revision, "dataset", endpoint=demo_endpoint)
    _names_the_demo(str(caught.value))
    assert source.provider.repo_id in str(caught.value) and kind_of(caught.value) == "provider_refused"
    assert "set HF_TOKEN to a token that can read it" not in str(caught.value), "no private-repo advice on the demo"


def test_drift_on_the_demo_reports_unserved_sources_as_unknown_not_gone(demo_endpoint: str, tmp_path: Path) -> None:
    from marin_assets.core.runtime import storage

    catalog = load_catalog()
    access = ProviderAccess(hf_endpoint=demo_endpoint)
    layout = storage.Layout(str(tmp_path))
    other = drift.check_source_pin(_hub_source(OTHER), layout=layout, access=access)
    assert other.status == drift.UNKNOWN, other
    _names_the_demo(other.detail)
    bucket = drift.check_source_pin(catalog.by_name("biocorpus"), layout=layout, access=access)
    assert bucket.status == drift.UNKNOWN, bucket
    _names_the_demo(bucket.detail)
    served = drift.check_source_pin(catalog.by_name(DEMO_SOURCES[0]), layout=layout, access=access)
    assert served.status in (drift.OK, drift.BRANCH_MOVED), served


def test_an_unknown_revision_of_a_demo_source_names_the_revision(demo_endpoint: str) -> None:
    source = load_catalog().by_name(DEMO_SOURCES[0])
    revision = "f" * 40
    with pytest.raises(Exception) as caught:
        hub.resolve_revision(source.provider.repo_id, revision, "dataset", endpoint=demo_endpoint)
    text = str(caught.value)
    assert revision in text and source.provider.repo_id in text, text
    assert "serves only" not in text and not isinstance(caught.value, NotServedHere), "the repo is served: the revision is what is missing"
