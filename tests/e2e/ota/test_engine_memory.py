"""What the actions engine holds and reads: the executions of the actions in flight, not the table, and a
group's devices read with the group pushed down to the table, not the registry (real Delta tables, a real
broker and a simulated fleet).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from pipelines.actions.engine import ActionsEngine
from pipelines.actions.publisher import MqttPublisher
from pipelines.actions.states import SUCCEEDED
from sinks.store import TableStore
from tests.e2e.ota.conftest import action_row, register_devices, write_actions
from tests.fleet_harness import FleetHarness, FleetSpec, quiet_devices

OTHERS = 200
"""Registered devices of another group, which no simulated device answers for."""


class CountingStore:
    """A table store that counts the rows each read materialised, per table."""

    def __init__(self, store: TableStore) -> None:
        self._store = store
        self.rows_read: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def read_arrow(self, name: str, *args: Any, **kwargs: Any) -> pa.Table:
        table = self._store.read_arrow(name, *args, **kwargs)
        self.rows_read[name] += table.num_rows
        return table

    def scan_arrow(self, name: str, **kwargs: Any) -> Iterator[pa.RecordBatch]:
        for batch in self._store.scan_arrow(name, **kwargs):
            self.rows_read[name] += batch.num_rows
            yield batch

    def taken(self) -> Counter[str]:
        """The rows read since the last call."""
        taken, self.rows_read = self.rows_read, Counter()
        return taken


def register_others(store: TableStore) -> None:
    now = datetime.now(UTC)
    rows = [{"device_id": f"other-{i:03}", "group": "others", "last_seen": now} for i in range(OTHERS)]
    assert store.append(
        "devices", pa.Table.from_pylist(rows, schema=store.spec("devices").arrow_schema), "o", 0
    )


def held(engine: ActionsEngine) -> Counter[str]:
    """The executions the engine holds in memory, per action."""
    table = engine.tables.held
    return Counter() if table is None else Counter(table["action_id"].to_pylist())


def test_an_ended_actions_executions_leave_memory_and_targets_are_read_by_group(table_store, mosquitto):
    spec = FleetSpec(brokers=[mosquitto], count=3, groups=["canary"])
    with FleetHarness(mosquitto, spec, quiet_devices()) as harness:
        canary = {d.device_id for d in harness.fleet.devices}
        register_devices(table_store, {d: "canary" for d in canary})
        register_others(table_store)
        store = CountingStore(table_store)
        engine = ActionsEngine(store, MqttPublisher([mosquitto], client_id="actions-test"))

        done, open_ = action_row("to-canary", group="canary"), action_row("to-others", group="others")
        write_actions(table_store, [done, open_], 0)
        engine.on_action_rows([done], "fanout", 0)
        assert store.taken()["devices"] == len(canary)  # the group's rows, not the registry's
        engine.on_action_rows([open_], "fanout", 1)
        assert store.taken()["devices"] == OTHERS
        assert held(engine) == {"to-canary": 3, "to-others": OTHERS}

        harness.wait_until(lambda: harness.fleet.finished("to-canary") == 3)
        harness.wait_until(lambda: sum(r.state == SUCCEEDED for r in harness.reports) == 3)
        reports = harness.take_reports()
        engine.on_reports(reports, "reports", 0)
        assert held(engine) == {"to-others": OTHERS}  # completed: its rows left memory
        assert engine.tables.held_actions == {"to-others"}
        assert table_store.read_arrow("action_executions").num_rows == 3 + OTHERS  # the table keeps them

        store.taken()
        engine.on_reports(
            reports, "reports", 1
        )  # the same reports again: the ended action is read, then let go
        assert store.taken()["action_executions"] == 3
        assert held(engine) == {"to-others": OTHERS}

        engine.refresh_compliance()  # folded from the tables: the successes, and the registry's rows
        assert store.taken()["action_executions"] == 3
        compliance = {
            (r["group"], r["installed_version"]): (r["devices"], r["desired_version"])
            for r in table_store.read_arrow("fleet_compliance").to_pylist()
        }
        assert compliance == {("canary", "2.0.0"): (3, "2.0.0"), ("others", "unknown"): (OTHERS, "2.0.0")}
        engine.publisher.close()
