"""Actions to an explicit list of device ids, on a real Timestone broker with simulated devices.

The action goes out as one message per device bucket, listing the targeted ids of that bucket: what a device
receives is its bucket's share of the list, not the list; devices outside it never start the action (one in a
listed device's bucket receives the message and ignores it); a listed device that was offline, or that first
connects after the action went out, takes it from its bucket topic's log (it holds its own offset) and
reports. With buckets off, the same holds for one message per device on its own topic.
"""

from __future__ import annotations

import json
import logging
import re
import time
from functools import partial
from typing import Any

import pytest

from broker_edge.runtime.launcher import BrokerProcess
from pipelines.actions.buckets import DEFAULT_BUCKETS, by_bucket
from pipelines.actions.engine import ActionsEngine
from pipelines.actions.publisher import MqttPublisher
from pipelines.actions.states import SUCCEEDED
from tests.e2e.ota.conftest import action_row, write_actions
from tests.fleet_harness import FleetHarness, FleetSpec, quiet_devices

UNLIMITED_PUBLISHER: dict[str, Any] = {
    "limits": {"messages_per_second_per_client": 0, "max_topics_per_client": 0}
}
"""One publish per bucket (or listed device): the job's client publishes up to as many messages as that."""


def fan_out(store, broker: BrokerProcess, row: dict, batch_id: int, buckets: int = DEFAULT_BUCKETS) -> None:
    publisher = MqttPublisher([broker.address], client_id="actions-test")
    engine = ActionsEngine(store, publisher, device_buckets=buckets)
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


def succeeded(harness: FleetHarness, action_id: str) -> set[str]:
    """The devices that reported ``action_id`` succeeded. A device may report its final state more than once
    (a QoS 1 report is delivered at least once, and a device given the action again reports again), so
    devices are counted, not reports."""
    return {r.device_id for r in harness.reports if r.action_id == action_id and r.state == SUCCEEDED}


def all_succeeded(harness: FleetHarness, action_id: str, devices: int) -> bool:
    return len(succeeded(harness, action_id)) == devices


def absent_ids(count: int) -> list[str]:
    """Listed devices that are not connected (offline or not yet installed), all ids of one length."""
    return [f"gone-{i:05d}" for i in range(count)]


def listed_bytes(device_id: str, listed: list[str]) -> int:
    """Bytes of the id list in the message of ``device_id``'s bucket."""
    share = by_bucket(listed, DEFAULT_BUCKETS)[by_bucket([device_id], DEFAULT_BUCKETS).popitem()[0]]
    return len(json.dumps(share, separators=(",", ":")))


def test_each_device_receives_its_buckets_share_of_the_list_not_the_list(table_store, tmp_path):
    with BrokerProcess(tmp_path / "broker", **UNLIMITED_PUBLISHER) as broker:
        spec = FleetSpec(brokers=[broker.address], count=3, groups=["g"])
        with FleetHarness(broker.address, spec, quiet_devices()) as harness:
            listed, outsider = harness.fleet.devices[:2], harness.fleet.devices[2]
            received, lists = {}, {}
            for number, total in enumerate((10, 10_000)):
                action_id = f"act-{total:05d}"
                before = settled_bytes_received(harness)
                lists[total] = [d.device_id for d in listed] + absent_ids(total - len(listed))
                row = action_row(action_id, version=f"{number + 2}.0.0", device_ids=lists[total])
                fan_out(table_store, broker, row, number)
                harness.wait_until(partial(all_succeeded, harness, action_id, len(listed)))
                after = settled_bytes_received(harness)
                received[total] = [b - a for a, b in zip(before, after, strict=True)]
                assert all(d.actions[action_id].state == SUCCEEDED for d in listed)
                assert action_id not in outsider.actions and action_id not in outsider.received_at

            whole_list = len(json.dumps(lists[10_000], separators=(",", ":")))
            for index, device in enumerate(listed):
                shares = {total: listed_bytes(device.device_id, ids) for total, ids in lists.items()}
                # the same message and acknowledgements but for the ids of its own bucket's share
                assert received[10_000][index] - received[10][index] == shares[10_000] - shares[10]
                assert received[10_000][index] < 400 + shares[10_000] < whole_list / 100


@pytest.mark.parametrize(
    "buckets",
    [1, 0],
    ids=["one bucket: outsiders receive the message and ignore it", "per-device topics"],
)
def test_offline_and_late_devices_take_the_action_from_the_log_and_outsiders_never_start_it(
    table_store, tmp_path, buckets
):
    with BrokerProcess(tmp_path / "broker", **UNLIMITED_PUBLISHER) as broker:
        behaviour = quiet_devices()
        early = FleetSpec(
            brokers=[broker.address], count=3, groups=["g"], fleet_size=6, buckets=max(buckets, 1)
        )
        late = FleetSpec(
            brokers=[broker.address],
            count=3,
            groups=["g"],
            fleet_size=6,
            first_index=3,
            buckets=max(buckets, 1),
        )
        with FleetHarness(broker.address, early, behaviour) as harness:
            online, offline, outsider = harness.fleet.devices
            harness.call(lambda: offline.go_offline(3600.0))
            listed = [online.device_id, offline.device_id, late.device_id(3), late.device_id(4)]
            fan_out(table_store, broker, action_row("act-late", device_ids=listed), 0, buckets)
            harness.wait_until(lambda: "act-late" in online.actions)
            assert "act-late" not in offline.actions  # it was away when the action went out
            harness.run(offline.start())  # back, resuming from the offsets it holds
            with FleetHarness(broker.address, late, behaviour) as newcomers:
                joiners, late_outsider = newcomers.fleet.devices[:2], newcomers.fleet.devices[2]
                harness.wait_until(lambda: harness.fleet.finished("act-late") == 2, timeout_s=30)
                newcomers.wait_until(lambda: newcomers.fleet.finished("act-late") == 2, timeout_s=30)
                assert offline.actions["act-late"].state == SUCCEEDED
                assert all(d.actions["act-late"].state == SUCCEEDED for d in joiners)
                for device in (outsider, late_outsider):
                    assert "act-late" not in device.actions and "act-late" not in device.received_at
                if buckets:  # both outsiders share the listed devices' bucket: they saw the message
                    assert harness.fleet.stats["actions_not_listed"] == 1
                    assert newcomers.fleet.stats["actions_not_listed"] == 1
                harness.wait_until(lambda: succeeded(harness, "act-late") == set(listed))
                assert {r.device_id for r in harness.reports} == set(listed)  # none from the outsiders


def test_per_device_topics_beyond_the_brokers_topic_quota_are_held_back_with_a_clear_warning(
    table_store, tmp_path, caplog: pytest.LogCaptureFixture
):
    """The action refused stays marked as being sent, for the ticker to send again (docs/ota.md), its
    WARNING naming the limit."""
    with BrokerProcess(tmp_path / "broker", limits={"max_topics_per_client": 5}) as broker:
        fan_out(table_store, broker, action_row("act-five", device_ids=absent_ids(5)), 0, buckets=0)
        row = action_row("act-more", device_ids=[f"more-{i}" for i in range(10)])
        with caplog.at_level(logging.WARNING):
            fan_out(table_store, broker, row, 1, buckets=0)
        warned = [r.getMessage() for r in caplog.records if "act-more held back" in r.getMessage()]
        assert len(warned) == 1 and re.search(r"10 publishes refused.*0x97.*max_topics_per_client", warned[0])
        executions = table_store.read_arrow("action_executions").to_pylist()
        marked = {
            (r["action_id"], r["published_at"] is not None, r["sending_at"] is not None) for r in executions
        }
        assert marked == {("act-five", True, False), ("act-more", True, True)} and len(executions) == 15


def test_bucket_topics_stay_within_the_topic_quota_whatever_the_list(table_store, tmp_path):
    with BrokerProcess(tmp_path / "broker", limits={"max_topics_per_client": 5}) as broker:
        for batch, total in enumerate((10, 1_000)):
            row = action_row(f"act-{total}", device_ids=absent_ids(total))
            fan_out(table_store, broker, row, batch, buckets=4)
        executions = table_store.read_arrow("action_executions")
        assert len(executions) == 1_010
