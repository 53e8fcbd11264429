"""Actions to an explicit list of device ids, on a real Timestone broker with simulated devices.

Each listed device gets one small message on its own topic: what a device receives does not grow with the
list; devices outside it never see the action; a listed device that was offline, or that first connects
after the action went out, takes it from its topic's log (it holds its own offset) and reports.
"""

from __future__ import annotations

import time

import pytest

from broker_edge.launcher import BrokerProcess
from pipelines.actions.engine import ActionsEngine
from pipelines.actions.publisher import MqttPublisher, PublishRefused
from pipelines.actions.states import SUCCEEDED
from tests.e2e.ota.conftest import action_row, write_actions
from tests.fleet_harness import FleetHarness, FleetSpec, quiet_devices

UNLIMITED_PUBLISHER = {"limits": {"messages_per_second_per_client": 0, "max_topics_per_client": 0}}
"""One publish per listed device: the job's client publishes as many messages as the list is long."""


def fan_out(store, broker: BrokerProcess, row: dict, batch_id: int) -> None:
    engine = ActionsEngine(store, MqttPublisher([broker.address], client_id="actions-test"))
    try:
        write_actions(store, [row], batch_id)
        engine.on_action_rows([row], "fanout", batch_id)
    finally:
        engine.publisher.close()


def settled_bytes_received(harness: FleetHarness) -> list[int]:
    """Bytes each device has read from the broker, once nothing more has arrived for a moment."""

    def read() -> list[int]:
        return harness.call(lambda: [d.client.bytes_received for d in harness.fleet.devices])

    previous = read()
    while True:
        time.sleep(0.3)
        current = read()
        if current == previous:
            return current
        previous = current


def succeeded_reports(harness: FleetHarness, action_id: str) -> int:
    return sum(r.action_id == action_id and r.state == SUCCEEDED for r in harness.reports)


def absent_ids(count: int) -> list[str]:
    """Listed devices that are not connected (offline or not yet installed), all ids of one length."""
    return [f"gone-{i:05d}" for i in range(count)]


def test_each_device_receives_the_same_bytes_whether_10_or_1000_are_listed(table_store, tmp_path):
    with BrokerProcess(tmp_path / "broker", **UNLIMITED_PUBLISHER) as broker:
        spec = FleetSpec(brokers=[broker.address], count=3, groups=["g"])
        with FleetHarness(broker.address, spec, quiet_devices()) as harness:
            listed, outsider = harness.fleet.devices[:2], harness.fleet.devices[2]
            received = {}
            for number, total in enumerate((10, 1000)):
                action_id = f"act-{total:05d}"
                before = settled_bytes_received(harness)
                ids = [d.device_id for d in listed] + absent_ids(total - len(listed))
                row = action_row(action_id, version=f"{number + 2}.0.0", device_ids=ids)
                fan_out(table_store, broker, row, number)
                harness.wait_until(lambda a=action_id: succeeded_reports(harness, a) == len(listed))
                after = settled_bytes_received(harness)
                received[total] = [b - a for a, b in zip(before, after, strict=True)]
                assert all(d.actions[action_id].state == SUCCEEDED for d in listed)
                assert action_id not in outsider.actions and action_id not in outsider.received_at

            # the message, its PUBACKs for two reports: a few hundred bytes, the same for 10 and 1000 ids
            for device in range(len(listed)):
                assert 0 < received[1000][device] < 400
                assert received[1000][device] == received[10][device]
            assert received[10][2] == received[1000][2] == 0


def test_offline_and_late_devices_take_the_action_from_the_log_and_outsiders_never_start_it(
    table_store, tmp_path
):
    with BrokerProcess(tmp_path / "broker", **UNLIMITED_PUBLISHER) as broker:
        behaviour = quiet_devices()
        early = FleetSpec(brokers=[broker.address], count=3, groups=["g"], fleet_size=6)
        late = FleetSpec(brokers=[broker.address], count=3, groups=["g"], fleet_size=6, first_index=3)
        with FleetHarness(broker.address, early, behaviour) as harness:
            online, offline, outsider = harness.fleet.devices
            harness.call(lambda: offline.go_offline(3600.0))
            listed = [online.device_id, offline.device_id, late.device_id(3), late.device_id(4)]
            fan_out(table_store, broker, action_row("act-late", device_ids=listed), 0)
            harness.wait_until(lambda: "act-late" in online.actions)
            assert "act-late" not in offline.actions  # it was away when the action went out
            harness.run(offline.start())  # back, resuming from the offsets it holds
            with FleetHarness(broker.address, late, behaviour) as newcomers:
                joiners, late_outsider = newcomers.fleet.devices[:2], newcomers.fleet.devices[2]
                harness.wait_until(lambda: harness.fleet.finished("act-late") == 2, timeout_s=30)
                newcomers.wait_until(lambda: newcomers.fleet.finished("act-late") == 2, timeout_s=30)
                assert offline.actions["act-late"].state == SUCCEEDED
                assert all(d.actions["act-late"].state == SUCCEEDED for d in joiners)
                assert "act-late" not in outsider.actions and "act-late" not in late_outsider.actions
                harness.wait_until(lambda: succeeded_reports(harness, "act-late") == len(listed))
                assert {r.device_id for r in harness.reports if r.state == SUCCEEDED} == set(listed)


def test_a_list_beyond_the_brokers_topic_quota_fails_with_a_clear_error(table_store, tmp_path):
    with BrokerProcess(tmp_path / "broker", limits={"max_topics_per_client": 5}) as broker:
        fan_out(table_store, broker, action_row("act-five", device_ids=absent_ids(5)), 0)
        row = action_row("act-more", device_ids=[f"more-{i}" for i in range(10)])
        with pytest.raises(PublishRefused, match=r"10 publishes refused.*0x97.*max_topics_per_client"):
            fan_out(table_store, broker, row, 1)
        executions = table_store.read_arrow("action_executions")
        assert executions["action_id"].to_pylist() == ["act-five"] * 5
