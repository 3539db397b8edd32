"""README "Layout" says how to add a per-source stage: two blocks, a core function and a spec. This
applies exactly those blocks to a copy of the repository and checks that the new stage is wired everywhere a stage
must be (its job, the asset graph, the co-partition checks, the bench map), and that the tests
that hold the registry stay green with it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from marin_assets_tests.test_readme_commands import fresh_copy

REPO = Path(__file__).resolve().parents[1]
SECTION = "### Stages: one spec, one core function, one asset"


def readme_blocks() -> dict[str, str]:
    """The file each part of the section's Python block goes to -> that part."""
    section = (REPO / "README.md").read_text().split(SECTION, 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    parts = re.split(r"(?m)^# (marin_assets/\S+): .*\n", code)
    return {path: body.strip() + "\n" for path, body in zip(parts[1::2], parts[2::2])}


def apply_blocks(root: Path, blocks: dict[str, str]) -> None:
    for rel, body in blocks.items():
        path = root / rel
        if rel.endswith("core/specs.py"):  # "the import with the imports at the top, the spec beside the others"
            imports, spec = body.split("\n\n", 1)
            text = path.read_text()
            last_import = [m.end() for m in re.finditer(r"(?m)^from marin_assets\.\S+ import .*\n", text)][-1]
            text = text[:last_import] + imports + "\n" + text[last_import:]
            at = text.index("\n\ndef registered(") + 2
            path.write_text(text[:at] + spec + "\n\n" + text[at:])
        else:
            path.write_text(body)


def test_the_readme_adds_a_stage_with_a_core_function_and_a_spec() -> None:
    blocks = readme_blocks()
    assert len(blocks) == 2 and not any("/defs/" in p for p in blocks)
    imports, _ = blocks["marin_assets/core/specs.py"].split("\n\n", 1)
    assert all(line.startswith("from marin_assets.") for line in imports.splitlines()), "the spec block opens with its import"
    assert "noqa" not in "".join(blocks.values())


CHECK = """
from marin_assets.core import specs
from marin_assets.definitions import defs
from marin_assets.defs.checks.attributes import CO_PARTITIONED
from bench import bench_stages

spec = specs.BY_NAME["doc_lengths"]
graph = defs.resolve_asset_graph()
node = graph.get(__import__("dagster").AssetKey("doc_lengths"))
assert sorted(k.to_user_string() for k in node.parent_keys) == ["normalized", "source_pins"], node.parent_keys
assert node.group_name == "ingest"
job = defs.resolve_job_def(spec.phase)
assert "doc_lengths" in {k.to_user_string() for k in job.asset_layer.selected_asset_keys}
assert "doc_lengths" in CO_PARTITIONED
assert bench_stages.STAGES["doc_lengths"][0] == "normalize"
print("wired")
"""


@pytest.mark.system  # a copy of the repository and a pytest run in it (~30 s)
def test_a_toy_stage_added_as_the_readme_says_is_wired_and_the_registry_tests_pass(tmp_path) -> None:
    root = fresh_copy(tmp_path)
    apply_blocks(root, readme_blocks())
    env = {**os.environ, "PYTHONPATH": str(root), "DAGSTER_HOME": str(tmp_path / "home")}
    (tmp_path / "home").mkdir()
    done = subprocess.run([sys.executable, "-c", CHECK], cwd=root, env=env, capture_output=True, text=True)
    assert done.returncode == 0 and "wired" in done.stdout, done.stderr[-3000:]
    registry_tests = [
        "marin_assets_tests/defs/test_definitions.py", "marin_assets_tests/defs/test_stage_assets.py",
        "marin_assets_tests/test_bench_harness.py", "marin_assets_tests/test_layers.py",
    ]
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not system", *registry_tests],
                          cwd=root, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:]
