"""The production artifacts agree with the code: the image installs with the Makefile's own recipe,
and the Helm values, the settings ConfigMap and the KubeRay spec set only settings the code reads,
every required one, in every container, with one image."""

from __future__ import annotations

import re
import shlex
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from marin_assets.defs.resources import RESOURCES
from marin_assets.defs.settings import PRODUCTION_REQUIRED, all_settings

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
IMAGE = f"REGISTRY/marin-assets:{VERSION}"


def dockerfile_runs() -> list[str]:
    text = re.sub(r"\\\n\s*", " ", (DEPLOY / "Dockerfile").read_text())
    return [line.split(None, 1)[1] for line in text.splitlines() if line.startswith("RUN ")]


def make_dry_run(*variables: str) -> list[str]:
    done = subprocess.run(["make", "-n", "-B", "install", "VENV=/venv", *variables], cwd=REPO, capture_output=True, text=True, check=True)
    return done.stdout.splitlines()


def test_the_image_installs_with_the_makefiles_recipe_and_nothing_else() -> None:
    runs = dockerfile_runs()
    installs = [r for r in runs if "make install" in r]
    assert len(installs) == 1, runs
    assert not [r for r in runs if re.search(r"\bpip\b|\bvenv\b|\buv\b", r)], "install steps live in the Makefile only"
    words = shlex.split(installs[0])
    variables = dict(w.split("=", 1) for w in words if "=" in w)
    makefile = (REPO / "Makefile").read_text()
    for name in variables:
        assert re.search(rf"^{name}\s*\??=", makefile, re.M), f"the image sets {name}, which the Makefile does not declare"
    # The image's recipe is the checkout's, but for the extras and (CUDA) the torch index.
    cpu = make_dry_run("ACCELERATOR=cpu", "EXTRAS=")
    cuda = make_dry_run("ACCELERATOR=cuda", "EXTRAS=")
    checkout = make_dry_run()
    assert [c for c in cpu if "torch" not in c] == [c.replace('".[test]"', '"."') for c in checkout if "torch" not in c]
    assert [c for c in cpu if "torch" in c] == [c for c in checkout if "torch" in c] == ["/venv/bin/pip install -q torch==2.13.0"]
    assert [c for c in cuda if "torch" in c] == ["/venv/bin/pip install -q --index-url https://download.pytorch.org/whl/cu128 torch==2.13.0"]
    assert subprocess.run(["make", "-n", "install", "ACCELERATOR=gpu"], cwd=REPO, capture_output=True).returncode != 0


def test_the_image_copies_what_the_install_reads() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    copied = {p for line in text.splitlines() if line.startswith("COPY ") for p in line.split()[1:-1]}
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert {"Makefile", "pyproject.toml", project["project"]["readme"], "marin_assets"} <= copied
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    assert {f"!{p}" for p in copied} <= set(ignore), "the build context keeps what the image copies"


def manifests(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


KNOWN = {s.env for s in all_settings(RESOURCES)}
ENV_CONFIG = next(d for d in manifests(DEPLOY / "helm" / "marin-env.yaml") if d["kind"] == "ConfigMap")
VALUES = yaml.safe_load((DEPLOY / "helm" / "values.yaml").read_text())
RAY = manifests(DEPLOY / "ray" / "raycluster.yaml")[0]


def secret_variables() -> set[str]:
    """The variables the README's ``kubectl create secret ... --from-literal=NAME=`` gives the Secret."""
    text = (DEPLOY / "helm" / "marin-env.yaml").read_text() + (DEPLOY / "README.md").read_text()
    return set(re.findall(r"create secret generic marin-hf-token .*?--from-literal=(\w+)=", text))


def test_the_settings_configmap_sets_known_settings_and_every_required_one() -> None:
    assert ENV_CONFIG["metadata"]["name"] == "marin-env"
    unknown = set(ENV_CONFIG["data"]) - KNOWN
    assert not unknown, f"not settings of the code (marin-assets settings): {sorted(unknown)}"
    assert secret_variables() == {"HF_TOKEN"}
    missing = set(PRODUCTION_REQUIRED) - set(ENV_CONFIG["data"]) - secret_variables()
    assert not missing, f"required in production, set nowhere: {sorted(missing)}"
    assert ENV_CONFIG["data"]["MARIN_EXECUTOR"] == "k8s" and ENV_CONFIG["data"]["MARIN_PREFIX"].startswith("gs://")


def code_containers() -> dict[str, dict[str, Any]]:
    """Every place of values.yaml that runs the project's code, by name."""
    deployment = VALUES["dagster-user-deployments"]["deployments"]
    return {
        "webserver": VALUES["dagsterWebserver"],
        "daemon": VALUES["dagsterDaemon"],
        **{f"code location {d['name']}": d for d in deployment},
        "run pods": VALUES["runLauncher"]["config"]["k8sRunLauncher"],
    }


@pytest.mark.parametrize("where", list(code_containers()))
def test_every_dagster_container_gets_the_settings_and_the_image(where: str) -> None:
    spec = code_containers()[where]
    assert {"name": "marin-env"} in spec["envConfigMaps"] and {"name": "marin-hf-token"} in spec["envSecrets"], where
    inline = spec.get("env") or {}
    names = set(inline) if isinstance(inline, dict) else {e["name"] for e in inline}
    assert names <= KNOWN, f"{where} sets variables the code does not read: {sorted(names - KNOWN)}"
    if "image" in spec:
        assert f"{spec['image']['repository']}:{spec['image']['tag']}" == IMAGE, where


def test_the_code_location_serves_the_definitions_and_hands_its_config_to_runs() -> None:
    (deployment,) = VALUES["dagster-user-deployments"]["deployments"]
    assert deployment["dagsterApiGrpcArgs"] == ["-m", "marin_assets.definitions"]
    assert deployment["includeConfigInLaunchedRuns"]["enabled"] is True


def test_ray_runs_the_same_image_and_settings() -> None:
    groups = [RAY["spec"]["headGroupSpec"], *RAY["spec"]["workerGroupSpecs"]]
    images = {}
    for group in groups:
        for container in group["template"]["spec"]["containers"]:
            refs = container["envFrom"]
            assert {"configMapRef": {"name": "marin-env"}} in refs and {"secretRef": {"name": "marin-hf-token"}} in refs
            images[group.get("groupName", "head")] = container["image"]
    assert images == {"head": IMAGE, "cpu-workers": IMAGE, "gpu-workers": f"{IMAGE}-cuda"}
    assert RAY["spec"]["rayVersion"] == re.search(r'"ray==([\d.]+)"', (REPO / "pyproject.toml").read_text()).group(1)


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.title() for w in rest)


def test_the_chart_writes_the_instance_of_the_production_template() -> None:
    """The chart builds the instance ConfigMap from values.yaml; it must say what
    deploy/dagster.production.yaml says."""
    template = yaml.safe_load((DEPLOY / "dagster.production.yaml").read_text())
    daemon = VALUES["dagsterDaemon"]
    assert daemon["runMonitoring"] == {camel(k): v for k, v in template["run_monitoring"].items()}
    assert daemon["runRetries"] == {camel(k): v for k, v in template["run_retries"].items()}
    assert VALUES["concurrency"]["runs"]["maxConcurrentRuns"] == template["concurrency"]["runs"]["max_concurrent_runs"]
    assert VALUES["concurrency"]["pools"] == {camel(k): v for k, v in template["concurrency"]["pools"].items()}
    assert daemon["sensors"] == {camel(k): v for k, v in template["sensors"].items()}
    assert VALUES["runLauncher"]["type"] == template["run_launcher"]["class"]
    assert VALUES["runLauncher"]["config"]["k8sRunLauncher"]["failPodOnRunFailure"] is template["run_launcher"]["config"]["fail_pod_on_run_failure"]
    assert VALUES["computeLogManager"]["type"] == template["compute_logs"]["class"]
    assert VALUES["postgresql"]["postgresqlScheme"] == template["storage"]["postgres"]["postgres_db"]["scheme"]
    assert VALUES["telemetry"]["enabled"] is template["telemetry"]["enabled"] is False
    assert VALUES["additionalInstanceConfig"]["nux"] == template["nux"]
