"""Every Hugging Face catalog entry through ``raw_files`` and ``normalized`` on its fixture.

The fixture repos are published on a local Hub at each entry's real repo id and pin; the
real assets run on a temporary Dagster instance, one materialization per source. Sources of
one family download (``share_key``) run in one test, which also checks that the first member
downloads the files and every later member reuses that copy without fetching a file.

One Hub server, instance and storage root serve the whole module (starting them per source
would cost more than the sources themselves); each source gets a catalog file holding only
its family, so the assets re-read a small catalog on every call.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl
import pytest
from huggingface_hub import constants as hf_constants

from marin_assets.catalog.sources import load_catalog
from marin_assets.core.ingest import normalize
from marin_assets.defs.ingest.assets import normalized, raw_files
from marin_assets.defs.resources import MarinResource
from marin_assets.testing.hub_server import HubRepoStore, LocalHubServer
from marin_assets_tests.fixtures.pipeline import catalog_with
from marin_assets_tests.recipes import FixtureCase, fixture_builders

CATALOG = load_catalog()
BUILDERS = fixture_builders()
HF_SOURCES = [s for s in CATALOG if s.provider.kind == "hf" and s.provider.repo_type != "bucket"]
GROUPS: dict[str, list[str]] = {}
for _s in HF_SOURCES:
    if _s.name in BUILDERS:
        GROUPS.setdefault(_s.provider.share_key, []).append(_s.name)




@dataclasses.dataclass
class RecipeEnv:
    root: Path
    prefix: str
    store: HubRepoStore
    server: LocalHubServer
    instance: dg.DagsterInstance
    cases: dict[str, FixtureCase]

    def materialize(self, name: str, catalog_path: str) -> dg.ExecuteInProcessResult:
        resource = MarinResource(prefix=self.prefix, catalog_path=catalog_path, retry_wait_s=0.0)
        return dg.materialize(
            [raw_files, normalized], partition_key=name, instance=self.instance, resources={"marin": resource}
        )


def metadata(result: dg.ExecuteInProcessResult, asset: str) -> dict[str, Any]:
    for event in result.get_asset_materialization_events():
        mat = event.event_specific_data.materialization
        if mat.asset_key.to_user_string() == asset:
            return {k: getattr(v, "value", v) for k, v in mat.metadata.items()}
    raise KeyError(f"no materialization of {asset}")


def bad_rows_of(meta: dict[str, Any]) -> dict[str, int]:
    """The ``bad_rows`` table of a ``normalized`` materialization as reason -> rows."""
    table = meta.get("bad_rows")
    if not table or table == "_none_":
        return {}
    found = {record.data["reason"]: int(record.data["rows"]) for record in table.records}
    assert sum(found.values()) == meta["bad_rows_total"]
    return found


@pytest.fixture(scope="module")
def recipe_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RecipeEnv]:
    """One local Hub serving every fixture repo at its pin, one instance, one storage root.

    The client setup mirrors ``marin_assets_tests.fixtures.hub`` at module scope.
    """
    root = tmp_path_factory.mktemp("recipes")
    store = HubRepoStore(root / "hub")
    cases = {name: BUILDERS[name](CATALOG.by_name(name)) for names in GROUPS.values() for name in names}
    repos: dict[tuple[str, str], dict[str, bytes]] = {}
    for name, case in cases.items():
        provider = CATALOG.by_name(name).provider
        files = repos.setdefault((provider.repo_id, provider.revision), {})
        for path, data in case.files.items():
            assert files.get(path, data) == data, f"fixtures of one repo disagree on {path}"
            files[path] = data
    for (repo, revision), files in repos.items():
        store.publish(repo, files, commit=revision)
    server = LocalHubServer(store).start()
    cache = root / "hf-cache"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_ENDPOINT", server.endpoint)
        mp.delenv("HF_TOKEN", raising=False)
        mp.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
        mp.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        mp.setenv("HF_HUB_CACHE", str(cache))
        mp.setenv("MARIN_PREFIX", str(root / "data"))
        mp.setattr(hf_constants, "ENDPOINT", server.endpoint)
        mp.setattr(hf_constants, "HUGGINGFACE_CO_URL_TEMPLATE", server.endpoint + "/{repo_id}/resolve/{revision}/{filename}")
        mp.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
        mp.setattr(hf_constants, "HF_HUB_DISABLE_TELEMETRY", True)
        mp.setattr(hf_constants, "HF_TOKEN_PATH", str(root / "no-hf-token"))
        mp.setattr(hf_constants, "HF_STORED_TOKENS_PATH", str(root / "no-hf-stored-tokens"))
        try:
            yield RecipeEnv(root, str(root / "data"), store, server, dg.DagsterInstance.ephemeral(), cases)
        finally:
            server.stop()


def check_case(name: str, case: FixtureCase, meta: dict[str, Any]) -> None:
    frame = normalize.read_normalized(meta["uri"])
    assert frame.columns[:3] == ["id", "text", "source_id"], name
    assert frame.schema["source_id"] in (pl.Utf8, pl.Null), name
    assert bad_rows_of(meta) == dict(case.bad_rows), name
    for key, value in case.counters.items():
        assert meta[key] == value, (name, key)
    assert meta["dagster/row_count"] == case.rows == frame.height, name
    for source_id, text in case.texts.items():
        match = frame.filter(pl.col("source_id").is_null() if source_id is None else pl.col("source_id") == source_id)
        assert match["text"].to_list() == [text], (name, source_id)
    if case.all_texts is not None:
        assert sorted(frame["text"].to_list()) == sorted(case.all_texts), name
    assert set(case.columns) <= set(frame.columns), (name, frame.columns)
    assert not set(case.absent_columns) & set(frame.columns), (name, frame.columns)
    if case.check is not None:
        case.check(frame)


@pytest.mark.system  # every recipe family through the assets; `make test` runs them
@pytest.mark.parametrize("family", sorted(GROUPS), ids=lambda key: key.replace("/", "_"))
def test_fixture_through_assets(recipe_env: RecipeEnv, family: str) -> None:
    members = GROUPS[family]
    catalog_path = str(catalog_with(recipe_env.root / f"catalog-{re.sub(r'[^A-Za-z0-9]+', '-', family)}.toml", keep=members))
    shared_uri = None
    for name in members:
        recipe_env.server.clear_requests()
        result = recipe_env.materialize(name, catalog_path)
        raw = metadata(result, "raw_files")
        if shared_uri is None:
            shared_uri = raw["uri"]
        else:  # one download serves the family: same copy, no file fetched again
            assert raw["uri"] == shared_uri, name
            assert not [r.path for r in recipe_env.server.requests if "/resolve/" in r.path], name
        check_case(name, recipe_env.cases[name], metadata(result, "normalized"))


def test_every_hf_entry_has_a_fixture() -> None:
    missing = [s.name for s in HF_SOURCES if s.name not in BUILDERS]
    assert not missing, f"Hugging Face sources without a recipe fixture: {missing}"


@pytest.mark.system
def test_sec_edgar_on_object_storage_reads_its_oversized_page_headers(pipeline, hub_store, gcs_prefix) -> None:
    """On ``gs://`` normalize reads Parquet through Arrow, which refuses the provider's page
    headers; the recipe's own reader must take over (``transform.read_file``)."""
    source = CATALOG.by_name("sec-edgar")
    case = BUILDERS["sec-edgar"](source)
    hub_store.publish(source.provider.repo_id, dict(case.files), commit=source.provider.revision)
    pipeline.prefix = gcs_prefix
    result = pipeline.materialize(["raw_files", "normalized"], partition="sec-edgar")
    check_case("sec-edgar", case, pipeline.metadata(result, "normalized"))
