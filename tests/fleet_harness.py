"""A simulated fleet plus a status-report listener on their own event loop thread, for synchronous tests."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

from pipelines.actions.buckets import REPORT_TOPICS
from pipelines.actions.states import StatusReport
from pipelines.fleet.background import BackgroundFleet
from pipelines.fleet.client import MqttClient
from pipelines.fleet.device import DeviceBehaviour
from pipelines.fleet.fleet import FleetSpec


class FleetHarness(BackgroundFleet):
    """Runs a fleet and records every status report published on the bucket report topics, or on a device's
    own topic (the earlier protocol)."""

    def __init__(self, broker: tuple[str, int], spec: FleetSpec, behaviour: DeviceBehaviour) -> None:
        super().__init__(spec, behaviour)
        self.broker = broker
        self.reports: list[StatusReport] = []
        self._lock = threading.Lock()
        self._listener: MqttClient | None = None

    def __enter__(self) -> FleetHarness:
        super().__enter__()
        return self

    async def on_start(self) -> None:
        host, port = self.broker
        self._listener = await MqttClient.connect(
            host, port, f"report-listener-{id(self):x}", on_message=self._on_report
        )
        for topic in (REPORT_TOPICS, "devices/+/actions"):
            await self._listener.subscribe(topic, 1)

    async def on_stop(self) -> None:
        if self._listener:
            await self._listener.disconnect()

    def _on_report(self, message) -> None:
        data = json.loads(message.payload)
        report = StatusReport(
            data["action_id"],
            data["device_id"],
            data["state"],
            data["seq"],
            data["ts"],
            data["details"],
            data.get("attempt"),
            received_at=int(time.time() * 1000),  # as the job takes the broker's append time
        )
        with self._lock:
            self.reports.append(report)

    def take_reports(self) -> list[StatusReport]:
        with self._lock:
            taken, self.reports = self.reports, []
        return taken

    def wait_until(self, predicate: Callable[[], bool], timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError("fleet did not reach the expected state")
            time.sleep(0.02)


def ota_message(action_id: str, version: str, **fields) -> dict:
    """A well-formed OTA action message (docs/device-protocol.md): devices refuse one without URL or
    checksum."""
    return {
        "action_id": action_id,
        "kind": "ota",
        "version": version,
        "url": f"https://firmware.example.invalid/fw-{version}.bin",
        "sha256": "0" * 64,
        "issued_at": int(time.time() * 1000),
        **fields,
    }


def quiet_devices(**overrides) -> DeviceBehaviour:
    """Devices that send no telemetry and finish OTA quickly unless told otherwise."""
    options: dict[str, Any] = {"telemetry_interval_s": 0, "download_delay_s": (0.01, 0.05)} | overrides
    return DeviceBehaviour(**options)


__all__ = ["FleetHarness", "FleetSpec", "ota_message", "quiet_devices"]
