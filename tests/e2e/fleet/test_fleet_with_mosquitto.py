"""The simulated fleet against Mosquitto: the client and device logic work with an independent broker."""

from __future__ import annotations

import asyncio
import json
import time

from pipelines.actions.buckets import REPORT_TOPICS
from pipelines.fleet.client import MqttClient
from pipelines.fleet.device import DeviceBehaviour
from pipelines.fleet.fleet import Fleet, FleetSpec
from tests.fleet_harness import ota_message


async def _wait_until(predicate, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.02)


def test_ota_broadcast_reaches_every_device_and_reports_come_back(mosquitto):
    host, port = mosquitto

    async def scenario() -> tuple[dict, dict]:
        reports: dict[str, list[dict]] = {}

        def on_report(message) -> None:
            report = json.loads(message.payload)
            reports.setdefault(report["device_id"], []).append(report)

        operator = await MqttClient.connect(host, port, "operator", on_message=on_report)
        assert await operator.subscribe(REPORT_TOPICS, 1) == [1]
        behaviour = DeviceBehaviour(telemetry_interval_s=0, download_delay_s=(0.01, 0.05), failure_rate=0.0)
        fleet = Fleet(FleetSpec(brokers=[(host, port)], count=20, groups=["g1", "g2"]), behaviour)
        await fleet.start()
        assert fleet.connected() == 20
        action = ota_message("a-1", "2.0.0")
        assert await operator.publish("actions/groups/g1", json.dumps(action).encode(), qos=1) == 0
        await _wait_until(lambda: fleet.finished("a-1") == 10)
        await _wait_until(lambda: sum(1 for r in reports.values() if r[-1]["state"] == "SUCCEEDED") == 10)
        firmware = {d.device_id: d.firmware for d in fleet.devices}
        await fleet.stop()
        await operator.disconnect()
        return reports, firmware

    reports, firmware = asyncio.run(scenario())
    assert len(reports) == 10
    for device_id, device_reports in reports.items():
        assert [r["state"] for r in device_reports] == ["IN_PROGRESS", "SUCCEEDED"]
        assert [r["seq"] for r in device_reports] == [1, 2]
        assert firmware[device_id] == "2.0.0"
    untouched = [d for d, version in firmware.items() if d not in reports]
    assert len(untouched) == 10 and all(firmware[d] == "1.0.0" for d in untouched)


def test_cancel_stops_an_action_in_progress(mosquitto):
    host, port = mosquitto

    async def scenario():
        behaviour = DeviceBehaviour(telemetry_interval_s=0, download_delay_s=(30.0, 30.0))
        fleet = Fleet(FleetSpec(brokers=[(host, port)], count=3, groups=["g"]), behaviour)
        await fleet.start()
        operator = await MqttClient.connect(host, port, "operator")
        action = ota_message("a-2", "9.9.9")
        await operator.publish("actions/all", json.dumps(action).encode(), qos=1)
        await _wait_until(lambda: fleet.states("a-2").get("IN_PROGRESS") == 3)
        cancel = {"action_id": "a-2", "kind": "cancel"}
        await operator.publish("actions/all", json.dumps(cancel).encode(), qos=1)
        await _wait_until(lambda: fleet.states("a-2").get("CANCELED") == 3)
        firmware = {d.firmware for d in fleet.devices}
        await fleet.stop()
        await operator.disconnect()
        return firmware

    assert asyncio.run(scenario()) == {"1.0.0"}


def test_devices_refuse_an_ota_without_url_or_checksum_and_an_unknown_kind(mosquitto):
    """Devices check what they receive, whoever sent it: a malformed action is reported REJECTED with the
    reason, nothing is installed, and a well-formed one after it still runs (docs/device-protocol.md)."""
    host, port = mosquitto
    malformed = {
        "no-url": ota_message("no-url", "2.0.0", url=None),
        "no-checksum": {k: v for k, v in ota_message("no-checksum", "2.0.0").items() if k != "sha256"},
        "bad-checksum": ota_message("bad-checksum", "2.0.0", sha256="abc"),
        "not-a-url": ota_message("not-a-url", "2.0.0", url="notaurl"),
        "firmware": dict(ota_message("firmware", "2.0.0"), kind="firmware"),
    }
    reasons = {
        "no-url": "ota without url",
        "no-checksum": "ota without sha256",
        "bad-checksum": "bad sha256: expected 64 hexadecimal digits",
        "not-a-url": "bad url: not an http(s) URL with a host",
        "firmware": "unknown kind 'firmware'",
    }

    async def scenario() -> tuple[dict, set]:
        reports: dict[str, list[dict]] = {}

        def on_report(message) -> None:
            report = json.loads(message.payload)
            reports.setdefault(report["action_id"], []).append(report)

        operator = await MqttClient.connect(host, port, "operator", on_message=on_report)
        await operator.subscribe(REPORT_TOPICS, 1)
        behaviour = DeviceBehaviour(telemetry_interval_s=0, download_delay_s=(0.01, 0.05))
        fleet = Fleet(FleetSpec(brokers=[(host, port)], count=3, groups=["g"]), behaviour)
        await fleet.start()
        for message in [*malformed.values(), ota_message("good", "2.0.0")]:
            await operator.publish("actions/all", json.dumps(message).encode(), qos=1)
        await _wait_until(lambda: len(reports.get("good", [])) == 6 and len(reports) == 6)
        firmware = {d.firmware for d in fleet.devices}
        await fleet.stop()
        await operator.disconnect()
        return reports, firmware

    reports, firmware = asyncio.run(scenario())
    for action_id, reason in reasons.items():
        assert len(reports[action_id]) == 3, action_id
        for report in reports[action_id]:
            assert report["state"] == "REJECTED" and report["details"].startswith(reason), report
    assert sorted(r["state"] for r in reports["good"]) == ["IN_PROGRESS"] * 3 + ["SUCCEEDED"] * 3
    assert firmware == {"2.0.0"}
