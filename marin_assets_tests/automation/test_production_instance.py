"""The production instance template is a valid Dagster instance configuration, class by class."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml
from dagster._config import process_config, resolve_to_config_type
from dagster._core.instance.config import dagster_instance_config
from dagster._serdes.config_class import ConfigurableClassData, class_from_code_pointer

from marin_assets.defs.automation.execution import executor_from_env

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "deploy" / "dagster.production.yaml"


def env_names(node: Any) -> set[str]:
    """Every ``{env: NAME}`` the YAML reads."""
    if isinstance(node, dict):
        if set(node) == {"env"}:
            return {node["env"]}
        return set().union(*(env_names(v) for v in node.values())) if node else set()
    if isinstance(node, list):
        return set().union(*(env_names(v) for v in node)) if node else set()
    return set()


def load(tmp_path: Path, source: Path = TEMPLATE) -> dict[str, Any]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    shutil.copy(source, home / "dagster.yaml")
    config, _ = dagster_instance_config(str(home))
    return dict(config)


@pytest.fixture
def dummy_env(monkeypatch) -> set[str]:
    names = env_names(yaml.safe_load(TEMPLATE.read_text()))
    for name in names:
        monkeypatch.setenv(name, "5432" if name.endswith("_PORT") else f"dummy-{name.lower()}")
    return names


def class_errors(module: str, name: str, config: dict[str, Any]) -> list[str]:
    """Errors of ``config`` against the configurable class's own schema, env vars resolved."""
    pointer = ConfigurableClassData(module, name, "")  # maps dagster.core -> dagster._core
    cls = class_from_code_pointer(pointer.module_name, pointer.class_name)
    result = process_config(resolve_to_config_type(cls.config_type()), config)
    return [e.message for e in result.errors or []]


def sections(config: dict[str, Any]) -> dict[str, tuple[str, str, dict[str, Any]]]:
    out = {s: (config[s]["module"], config[s]["class"], config[s].get("config") or {}) for s in ("run_coordinator", "run_launcher", "compute_logs")}
    out["storage"] = ("dagster_postgres", "DagsterPostgresStorage", config["storage"]["postgres"])
    return out


def test_template_validates_against_the_instance_schema_and_each_class(tmp_path, dummy_env) -> None:
    assert {"DAGSTER_PG_PASSWORD", "MARIN_LOG_BUCKET", "MARIN_IMAGE"} <= dummy_env, "secrets and site values come from the environment"
    config = load(tmp_path)
    for section, (module, name, data) in sections(config).items():
        assert class_errors(module, name, data) == [], f"{section} ({name})"
    assert config["run_launcher"]["class"] == "K8sRunLauncher"
    assert config["compute_logs"]["class"] == "GCSComputeLogManager"
    assert config["run_coordinator"]["class"] == "QueuedRunCoordinator"
    assert "postgres_db" in config["storage"]["postgres"]


def test_template_keeps_retries_from_stacking_and_frees_slots_of_dead_runs(tmp_path, dummy_env) -> None:
    config = load(tmp_path)
    assert config["run_retries"]["enabled"] and config["run_retries"]["retry_on_asset_or_op_failure"] is False
    assert config["run_monitoring"]["enabled"] and config["run_monitoring"]["free_slots_after_run_end_seconds"] > 0
    assert config["concurrency"]["pools"]["granularity"] == "op"


@pytest.mark.parametrize(("variable", "section"), [("DAGSTER_PG_PASSWORD", "storage"), ("MARIN_LOG_BUCKET", "compute_logs"), ("MARIN_IMAGE", "run_launcher")])
def test_a_missing_variable_is_named(tmp_path, dummy_env, monkeypatch, variable, section) -> None:
    config = load(tmp_path)
    monkeypatch.delenv(variable)
    errors = class_errors(*sections(config)[section])
    assert errors and variable in " ".join(errors)


def test_embedded_default_is_valid_too(tmp_path) -> None:
    config = load(tmp_path, REPO / "dagster.yaml")
    assert config["run_coordinator"]["class"] == "QueuedRunCoordinator"


def test_kubernetes_executor_runs_the_embedding_step_on_a_gpu() -> None:
    from marin_assets.definitions import defs
    from marin_assets.defs.automation.execution import in_process_executor

    assert executor_from_env("") is in_process_executor, "the embedded default runs a partition's steps in one process"
    assert in_process_executor.name == "in_process"
    assert executor_from_env("multiprocess") is dg.multiprocess_executor
    executor = executor_from_env("k8s")
    assert executor is not None and executor.name == "k8s_job_executor"
    with pytest.raises(ValueError, match="MARIN_EXECUTOR"):
        executor_from_env("ray")
    from dagster_k8s.job import get_user_defined_k8s_config

    step_config = get_user_defined_k8s_config(defs.resolve_assets_def("embeddings").op.tags)  # what the executor reads
    assert step_config.container_config["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert defs.resolve_assets_def("embeddings").op.pool == "gpu"
    assert dg.Definitions(assets=[], executor=executor).executor == executor
