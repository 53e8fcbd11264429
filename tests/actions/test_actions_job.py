"""The actions job end to end: Spark streams over real Delta tables, a real broker's log and a fleet.

An operator writes one row; the job fans it out through the broker; devices report on their status topic;
the reports come back through the broker's commitlog and the ``timestone`` source; every device ends in a
terminal state and the summary's counts match what the devices did.
"""

from __future__ import annotations

import time

import pyarrow.compute as pc

from pipelines.actions.config import ActionsConfig, BrokerEndpoint
from pipelines.actions.job import start_actions_job
from pipelines.actions.operator import NewAction, cancel_action, create_action
from sinks import open_table_store
from tests.actions.conftest import register_devices
from tests.broker_process import BrokerProcess
from tests.fleet_harness import FleetHarness, FleetSpec, quiet_devices


def wait_for(predicate, timeout_s: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.2)


def summary(store, action_id: str) -> dict | None:
    if not store.exists("action_summary"):
        return None
    table = store.read_arrow("action_summary")
    rows = table.filter(pc.equal(table["action_id"], action_id)).to_pylist()
    return rows[0] if rows else None


def states(store, action_id: str) -> dict[str, str]:
    table = store.read_arrow("action_executions")
    table = table.filter(pc.equal(table["action_id"], action_id))
    return dict(zip(table["device_id"].to_pylist(), table["state"].to_pylist(), strict=True))


def test_broadcast_reaches_every_device_including_one_that_was_offline(spark, tmp_path):
    store = open_table_store(spark, str(tmp_path / "tables"), backend="delta-rs")
    with BrokerProcess(tmp_path / "broker") as broker:
        spec = FleetSpec(brokers=[broker.address], count=200, groups=["canary", "fleet"])
        behaviour = quiet_devices(failure_rate=0.1, reject_rate=0.05, offline_duration_s=(3.0, 3.0))
        with FleetHarness(broker.address, spec, behaviour) as harness:
            fleet = harness.fleet
            register_devices(store, {d.device_id: d.group for d in fleet.devices})
            config = ActionsConfig(
                tables_root=str(tmp_path / "tables"),
                checkpoint_root=str(tmp_path / "checkpoints"),
                brokers=[BrokerEndpoint(mqtt_port=broker.port, offsets_api=broker.offsets_url)],
                trigger_interval_s=0.5,
                tick_interval_s=0.5,
            )
            job = start_actions_job(spark, config, store)
            try:
                offline = next(d for d in fleet.devices if d.group == "canary")
                harness.run(_go_offline(offline, 3.0))
                action_id = create_action(
                    store, NewAction(group="canary", version="2.0.0", url="https://example.invalid/fw.bin")
                )
                wait_for(
                    lambda: (s := summary(store, action_id)) is not None and s["action_state"] == "COMPLETED",
                    what="the action to complete",
                )
            finally:
                job.stop()
            final = states(store, action_id)
            canary = {d.device_id for d in fleet.devices if d.group == "canary"}
            assert set(final) == canary
            device_states = {
                d.device_id: d.actions[action_id].state for d in fleet.devices if d.group == "canary"
            }
            assert final == device_states
            assert final[offline.device_id] in ("SUCCEEDED", "FAILED", "REJECTED")
            counts = summary(store, action_id)
            assert counts["total_count"] == 100
            for state in ("SUCCEEDED", "FAILED", "REJECTED"):
                assert counts[f"{state.lower()}_count"] == sum(1 for s in final.values() if s == state)
            assert all(action_id not in d.actions for d in fleet.devices if d.group == "fleet")


async def _go_offline(device, seconds: float) -> None:
    device.go_offline(seconds)


def test_cancel_through_the_table_stops_devices_that_started(spark, tmp_path):
    store = open_table_store(spark, str(tmp_path / "tables"), backend="delta-rs")
    with BrokerProcess(tmp_path / "broker") as broker:
        spec = FleetSpec(brokers=[broker.address], count=20, groups=["g"])
        with FleetHarness(broker.address, spec, quiet_devices(download_delay_s=(60.0, 60.0))) as harness:
            config = ActionsConfig(
                tables_root=str(tmp_path / "tables"),
                checkpoint_root=str(tmp_path / "checkpoints"),
                brokers=[BrokerEndpoint(mqtt_port=broker.port, offsets_api=broker.offsets_url)],
                trigger_interval_s=0.5,
                tick_interval_s=0.5,
            )
            job = start_actions_job(spark, config, store)
            try:
                action_id = create_action(
                    store, NewAction(all_devices=True, version="3.0.0", url="https://example.invalid/fw3.bin")
                )
                wait_for(lambda: harness.fleet.states(action_id).get("IN_PROGRESS") == 20, what="downloads")
                wait_for(
                    lambda: (summary(store, action_id) or {}).get("in_progress_count") == 20, what="tracking"
                )
                assert cancel_action(store, action_id)
                wait_for(
                    lambda: (s := summary(store, action_id)) is not None and s["canceled_count"] == 20,
                    what="cancellation",
                )
            finally:
                job.stop()
            assert summary(store, action_id)["action_state"] == "CANCELED"
            assert {d.firmware for d in harness.fleet.devices} == {"1.0.0"}
