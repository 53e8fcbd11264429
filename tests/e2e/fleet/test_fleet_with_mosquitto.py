"""The simulated fleet against Mosquitto: the client and device logic work with an independent broker."""

from __future__ import annotations

import asyncio
import json
import time

from pipelines.actions.buckets import REPORT_TOPICS
from pipelines.fleet.client import MqttClient
from pipelines.fleet.device import DeviceBehaviour
from pipelines.fleet.fleet import Fleet, FleetSpec


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
        action = {"action_id": "a-1", "kind": "ota", "version": "2.0.0", "issued_at": int(time.time() * 1000)}
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
        action = {"action_id": "a-2", "kind": "ota", "version": "9.9.9"}
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
