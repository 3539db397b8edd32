"""The stage registry refuses a spec it cannot place, and README's stage table says what the specs say."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from marin_assets.core import specs
from marin_assets.errors import ConfigurationError

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_registry_takes_every_spec_written() -> None:
    assert specs.registered(specs.ALL) == specs.ALL


def test_a_mistyped_phase_is_refused_naming_the_spec_and_the_known_phases() -> None:
    typo = dataclasses.replace(specs.CONTAMINATION, name="doc_lengths", phase="source_atributes")
    with pytest.raises(ConfigurationError, match=r"'doc_lengths': unknown phase 'source_atributes'.*'source_attributes'"):
        specs.registered((*specs.ALL, typo))


def test_a_stage_with_no_phase_is_refused_but_the_observed_pins() -> None:
    with pytest.raises(ConfigurationError, match=r"'doc_lengths': unknown phase ''"):
        specs.registered((dataclasses.replace(specs.TOPICS, name="doc_lengths", phase=""),))
    assert specs.SOURCE_PINS.phase == "" and specs.registered((specs.SOURCE_PINS,))


def test_an_unknown_group_is_refused_naming_the_spec_and_the_known_groups() -> None:
    typo = dataclasses.replace(specs.TOPICS, name="doc_lengths", group="normalise")
    with pytest.raises(ConfigurationError, match=r"'doc_lengths': unknown group 'normalise'.*'ingest'"):
        specs.registered((typo,))


def readme_stage_rows() -> dict[str, str]:
    """README's stage table: asset -> its "partitioned" cell."""
    table = README.read_text().split("| asset | partitioned | what it does |", 1)[1].split("\n\n", 1)[0]
    return {m.group(1): m.group(2) for m in re.finditer(r"(?m)^\| `(\w+)` \| ([^|]+) \|", table)}


def test_readmes_stage_table_lists_the_built_stages_as_their_specs_say() -> None:
    """Every stage of a full build (and the observed pins) has a row saying whether it is per
    source; no row names a stage that is not one. Mixture studies have their own section."""
    rows = readme_stage_rows()
    built = [s for s in specs.ALL if s.phase in {p.name for p in specs.PHASES if p.build} or s is specs.SOURCE_PINS]
    assert list(rows) == [s.name for s in built]
    for spec in built:
        assert rows[spec.name].strip().startswith("yes" if spec.partitioned else "no"), (spec.name, rows[spec.name])
