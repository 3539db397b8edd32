"""Fixtures of the fault and security suite; prints its summary line after the run.

Every test runs in a ``world``: a folder holding the data root (several levels down, so a
path climbing out with ``..`` still lands inside the world where the walk sees it), the
staging folder, and whatever servers the test starts. After the test the world is walked:
no file may lie outside the data root (staging must be empty), no credential may have reached
a host other than its own, the rows the test counted must add up, no document may reach a
reader altered, and every peak resident size it measured must lie within its bound.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
from huggingface_hub import constants as hf_constants

from marin_assets_tests.faults.hostile import HostileHub, RecordingHost
from marin_assets_tests.faults.ledger import LEDGER, files_outside

TOKEN = "hf_fault_suite_secret_token"


@dataclasses.dataclass
class World:
    path: Path
    root: Path
    staging: Path
    scratch: Path  # the test's own inputs (catalog files, an instance's home): not pipeline output
    allowed: list[Path]
    off_hosts: list[RecordingHost]
    faults: int = 0
    rows_in: int = 0
    rows_out: int = 0
    drops: int = 0
    altered: int = 0  # documents read back, or passed downstream, with other text than was written
    peaks: list[tuple[str, int, int]] = dataclasses.field(default_factory=list)  # (what, grown bytes, bound)

    def inject(self, n: int = 1) -> None:
        self.faults += n

    def rows(self, rows_in: int, rows_out: int, drops: int) -> None:
        self.rows_in += rows_in
        self.rows_out += rows_out
        self.drops += drops

    def documents_altered(self, n: int) -> None:
        self.altered += n

    def peak(self, what: str, grown: int, bound: int) -> None:
        """A reading process's peak resident size grew by ``grown`` bytes; ``bound`` is what it may grow."""
        self.peaks.append((what, grown, bound))

    def outside(self) -> list[str]:
        return files_outside(self.path, [self.root, *self.allowed])

    def leftovers(self) -> list[str]:
        return [str(p) for p in self.staging.rglob("*")]


def point_hub_client_at(endpoint: str, monkeypatch: pytest.MonkeyPatch, cache: Path, token: str | None = TOKEN) -> None:
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    if token:
        monkeypatch.setenv("HF_TOKEN", token)
    else:
        monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setattr(hf_constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(hf_constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hf_constants, "HF_HUB_DISABLE_TELEMETRY", True)


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    base = tmp_path / "world"
    root = base / "a" / "b" / "c" / "data"
    staging = base / "staging"
    root.mkdir(parents=True)
    staging.mkdir()
    monkeypatch.setenv("MARIN_PREFIX", str(root))
    monkeypatch.setenv("MARIN_STAGING_DIR", str(staging))
    monkeypatch.setenv("MARIN_RETRY_WAIT_S", "0")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(hf_constants, "HF_TOKEN_PATH", str(tmp_path / "no-hf-token"))
    monkeypatch.setattr(hf_constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "no-hf-stored-tokens"))
    # The walk covers the whole test folder; the local Hub's store and the client cache live there too.
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    w = World(path=tmp_path, root=root, staging=staging, scratch=scratch,
              allowed=[tmp_path / "hub", tmp_path / "hf-cache", scratch], off_hosts=[])  # fmt: skip
    yield w
    outside = w.outside() + w.leftovers()
    sent = [s for host in w.off_hosts for s in host.credentials_seen()]
    lost = w.rows_in - w.rows_out - w.drops
    over = [f"{what}: {grown >> 20} MiB > {bound >> 20} MiB" for what, grown, bound in w.peaks if grown > bound]
    LEDGER.peaks += len(w.peaks)
    LEDGER.peaks_over += len(over)
    LEDGER.faults += w.faults
    LEDGER.outside += len(outside)
    LEDGER.credentials_off_host += len(sent)
    LEDGER.rows_lost += max(0, lost)
    LEDGER.documents_altered += w.altered
    assert not outside, f"files written outside the data root or left in staging: {outside}"
    assert not sent, f"a credential reached another host: {sent}"
    assert lost == 0, f"rows in {w.rows_in} != rows out {w.rows_out} + counted drops {w.drops}"
    assert w.altered == 0, f"{w.altered} documents reached a reader with other text than was written"
    assert not over, f"reading grew a process's peak beyond its configured size: {over}"


@pytest.fixture
def hostile(world: World, monkeypatch: pytest.MonkeyPatch) -> Iterator[HostileHub]:
    """The attacker's Hub, configured as ``HF_ENDPOINT`` with a token set."""
    with HostileHub() as hub:
        point_hub_client_at(hub.base, monkeypatch, world.path / "hf-cache")
        yield hub


@pytest.fixture
def elsewhere(world: World) -> Iterator[RecordingHost]:
    """Another host (127.0.0.2) that records every credential it receives."""
    with RecordingHost() as host:
        world.off_hosts.append(host)
        yield host


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ARG001 - pytest's hook signature
    if LEDGER.faults:
        terminalreporter.write_line(LEDGER.line())
