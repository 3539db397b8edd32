"""Alerts reach a receiver on loopback within one sensor tick: a failed run and a failed blocking
check, each with its run id, asset and cause (a real Dagster instance, a real HTTP server)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import dagster as dg
import pytest

from marin_assets.defs.alerts import ALERT_SENSORS
from marin_assets.defs.resources import AlertResource

pytestmark = pytest.mark.system  # runs on a real instance and an HTTP server (~4 s each)

SENSORS = {s.name: s for s in ALERT_SENSORS}


class Receiver(HTTPServer):
    """Collects the JSON bodies POSTed to it; answers ``status``."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.status = 200
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if receiver.status == 200:
                    receiver.bodies.append(json.loads(body))
                self.send_response(receiver.status)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/alerts"


@pytest.fixture
def receiver():
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@dg.asset(partitions_def=dg.StaticPartitionsDefinition(["cp/peps", "wiki"]))
def pool(context) -> None:
    raise dg.Failure(f"source '{context.partition_key}': shard 3 of normalized is missing; rebuild normalized")


@dg.asset
def sampling_groups() -> None:
    return None


@dg.asset_check(asset=sampling_groups, blocking=True)
def pools_current() -> dg.AssetCheckResult:
    return dg.AssetCheckResult(passed=False, description="2 pools are stale: cp/peps, wiki; rebuild them first")


def tick(name: str, instance, cursor: str | None, sink: AlertResource):
    context = dg.build_sensor_context(instance=instance, cursor=cursor, resources={"alerts": sink})
    return SENSORS[name].evaluate_tick(context)


def test_a_failed_run_reaches_the_webhook_within_one_tick(receiver) -> None:
    sink = AlertResource(webhook=receiver.url)
    with dg.instance_for_test() as instance:
        first = tick("run_failures", instance, None, sink)  # the baseline: history is not replayed
        assert receiver.bodies == []
        result = dg.materialize([pool], partition_key="cp/peps", instance=instance, raise_on_error=False)
        assert not result.success
        after = tick("run_failures", instance, first.cursor, sink)
        assert len(receiver.bodies) == 1, after.skip_message
        alert = receiver.bodies[0]
        assert alert["kind"] == "run_failure" and alert["run_id"] == result.run_id
        assert alert["assets"] == ["pool"] and alert["partition"] == "cp/peps"
        assert alert["cause"] == "pool: source 'cp/peps': shard 3 of normalized is missing; rebuild normalized"
        again = tick("run_failures", instance, after.cursor, sink)
        assert len(receiver.bodies) == 1, "an alert is sent once"
        assert "nothing failed" in again.skip_message


def test_a_failed_blocking_check_reaches_the_command_within_one_tick(tmp_path: Path) -> None:
    out = tmp_path / "alerts.jsonl"
    sink = AlertResource(command=f"cat >> {out}; echo >> {out}")
    with dg.instance_for_test() as instance:
        first = tick("check_failures", instance, None, sink)
        result = dg.materialize([sampling_groups, pools_current], instance=instance, raise_on_error=False)
        tick("check_failures", instance, first.cursor, sink)
        alerts = [json.loads(line) for line in out.read_text().splitlines() if line]
        assert len(alerts) == 1
        assert alerts[0]["kind"] == "check_failure" and alerts[0]["run_id"] == result.run_id
        assert alerts[0]["assets"] == ["sampling_groups"] and alerts[0]["check"] == "pools_current"
        assert alerts[0]["cause"] == "2 pools are stale: cp/peps, wiki; rebuild them first"


def test_a_refused_alert_fails_the_tick_and_is_sent_on_the_next(receiver) -> None:
    sink = AlertResource(webhook=receiver.url)
    with dg.instance_for_test() as instance:
        first = tick("run_failures", instance, None, sink)
        dg.materialize([pool], partition_key="wiki", instance=instance, raise_on_error=False)
        receiver.status = 503
        with pytest.raises(Exception, match="503"):
            tick("run_failures", instance, first.cursor, sink)
        receiver.status = 200
        tick("run_failures", instance, first.cursor, sink)  # the daemon keeps the cursor of a failed tick
        assert [a["partition"] for a in receiver.bodies] == ["wiki"]


def test_without_a_sink_the_tick_says_what_it_would_send() -> None:
    with dg.instance_for_test() as instance:
        first = tick("run_failures", instance, None, AlertResource())
        dg.materialize([pool], partition_key="wiki", instance=instance, raise_on_error=False)
        after = tick("run_failures", instance, first.cursor, AlertResource())
        assert "not sent (set MARIN_ALERT_WEBHOOK or MARIN_ALERT_COMMAND)" in after.skip_message
        assert "source 'wiki': shard 3" in after.skip_message
