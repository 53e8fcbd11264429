"""The actions engine on a clock the test moves, with a real broker, a simulated fleet and Delta tables.

A rollout over days (phases days apart, backoffs, maintenance windows) runs in seconds: the engine's clock
is a :class:`ManualClock`, moved by the test between ticks; the devices act in real time and their reports
reach the engine when the test feeds them (straight from an MQTT listener, as the job's reports stream
would). Everything the engine writes is read back from the Delta tables.
"""

from __future__ import annotations

import itertools
import json
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from broker_edge.runtime.launcher import BrokerProcess
from pipelines.actions.engine import ActionsEngine
from pipelines.actions.publisher import MqttPublisher
from pipelines.actions.states import TERMINAL_STATES, StatusReport
from pipelines.fleet.device import DeviceBehaviour
from sinks import TableStore, open_table_store
from tests.e2e.ota.conftest import epoch_ms, register_devices, write_actions
from tests.fleet_harness import FleetHarness, FleetSpec

BROKER_LIMITS = {"messages_per_second_per_client": 0, "max_topics_per_client": 0}


class ManualClock:
    """Epoch ms that move only when told (from now, or from ``start_ms``)."""

    def __init__(self, start_ms: int | None = None) -> None:
        self.now = start_ms if start_ms is not None else int(time.time() * 1000)
        self.start = self.now

    def __call__(self) -> int:
        return self.now

    def at(self, seconds: float) -> int:
        """The time ``seconds`` after the clock's start, in epoch ms."""
        return self.start + int(seconds * 1000)


def finals(reports: list[StatusReport], action_id: str, attempt: int | None = None) -> int:
    """Devices whose latest report of ``action_id`` (of ``attempt``, when given) is a final state."""
    latest: dict[str, StatusReport] = {}
    for report in reports:
        if report.action_id != action_id or (attempt is not None and report.attempt != attempt):
            continue
        if report.device_id not in latest or report.seq > latest[report.device_id].seq:
            latest[report.device_id] = report
    return sum(1 for report in latest.values() if report.state in TERMINAL_STATES)


@dataclass
class RolloutRun:
    store: TableStore
    engine: ActionsEngine
    harness: FleetHarness
    clock: ManualClock
    broker: BrokerProcess
    _batches: Iterator[int] = field(default_factory=itertools.count)
    _fed: list[StatusReport] = field(default_factory=list)

    @property
    def fleet(self):
        return self.harness.fleet

    def create(self, row: dict) -> None:
        """Write the row and hand it to the engine, as the job's change feed would."""
        batch = next(self._batches)
        write_actions(self.store, [row], batch)
        self.engine.on_action_rows([row], "fanout", batch)

    def tick_at(self, seconds: float) -> None:
        """Move the clock to ``seconds`` after its start and tick."""
        self.clock.now = self.clock.at(seconds)
        self.engine.tick()

    def tick_after_reports(self, seconds: float) -> None:
        """Move the clock to ``seconds`` after the latest report handed to the engine was received and tick:
        on a busy machine the reports come seconds after the clock's start, and a time-out counted from them
        ends later than one counted from the start."""
        latest = max(report.at for report in self._fed)
        self.clock.now = max(self.clock.now, latest + int(seconds * 1000))
        self.engine.tick()

    def feed(self, until: Callable[[list[StatusReport]], bool], timeout_s: float = 20.0) -> None:
        """Wait until every report published so far satisfies ``until``, then hand the engine those it has
        not had yet (one batch)."""
        self.harness.wait_until(lambda: until(self._fed + list(self.harness.reports)), timeout_s)
        taken = self.harness.take_reports()
        self._fed += taken
        self.engine.on_reports(taken, "reports", next(self._batches))

    def executions(self, action_id: str) -> dict[str, dict]:
        table = self.store.read_arrow("action_executions")
        table = table.filter(pc.equal(table["action_id"], action_id))
        return {row["device_id"]: row for row in table.to_pylist()}

    def published(self, action_id: str) -> dict[str, float | None]:
        """When each device was first sent the action, in seconds after the clock's start (None: never)."""
        return {
            device_id: None
            if row["published_at"] is None
            else round(epoch_ms(row["published_at"]) / 1000 - self.clock.start / 1000, 3)
            for device_id, row in self.executions(action_id).items()
        }

    def states(self, action_id: str) -> Counter:
        return Counter(row["state"] for row in self.executions(action_id).values())

    def summary(self, action_id: str) -> dict:
        table = self.store.read_arrow("action_summary")
        rows = table.filter(pc.equal(table["action_id"], action_id)).to_pylist()
        assert len(rows) == 1, rows
        return rows[0]

    def received(self, action_id: str) -> set[str]:
        """Devices that have started (or answered) the action."""
        return {d.device_id for d in self.fleet.devices if action_id in d.actions}

    def logged(self) -> dict[str, int]:
        """Records in the broker's log per topic the platform sends actions on (from its offsets API)."""
        with urllib.request.urlopen(f"{self.broker.offsets_url}/v1/logs", timeout=10) as answer:
            logs = json.load(answer)["logs"]
        return {
            log["topic"]: log["end_offset"] - log["start_offset"]
            for log in logs
            if log["topic"].startswith("actions/") and not log["topic"].startswith("actions/reports/")
        }

    def register(self, devices: dict[str, str], firmware: str = "1.0.0") -> None:
        """Rows of ``devices`` (id -> group), written or updated as the telemetry pipeline does."""
        now = datetime.now(UTC)
        rows = [
            {"device_id": d, "group": g, "last_seen": now, "firmware_version": firmware, "updated_at": now}
            for d, g in devices.items()
        ]
        table = pa.Table.from_pylist(rows, schema=self.store.spec("devices").arrow_schema)
        self.store.merge("devices", table, "tests/devices", next(self._batches))


@contextmanager
def rollout_run(
    tmp_path: Path,
    behaviour: DeviceBehaviour,
    count: int,
    groups: list[str] | None = None,
    register: bool = True,
    start_ms: int | None = None,
) -> Iterator[RolloutRun]:
    """A broker process, ``count`` devices (in ``groups``, round robin) and an engine on a manual clock."""
    store = open_table_store(None, str(tmp_path / "tables"), backend="delta-rs")
    with BrokerProcess(tmp_path / "broker", limits=BROKER_LIMITS) as broker:
        spec = FleetSpec(brokers=[broker.address], count=count, groups=groups or ["g"])
        with FleetHarness(broker.address, spec, behaviour) as harness:
            if register:
                register_devices(store, {d.device_id: d.group for d in harness.fleet.devices})
            clock = ManualClock(start_ms)
            publisher = MqttPublisher([broker.address], client_id="actions-test")
            engine = ActionsEngine(store, publisher, clock=clock, compliance_interval_s=0)
            try:
                yield RolloutRun(store, engine, harness, clock, broker)
            finally:
                publisher.close()
