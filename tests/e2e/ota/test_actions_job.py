"""The actions job end to end: Spark streams over real Delta tables, a real broker's log and a fleet.

An operator writes one row; the job fans it out through the broker; devices report on their status topic;
the reports come back through the broker's commitlog and the ``timestone`` source; every device ends in a
terminal state and the summary's counts match what the devices did.
"""

from __future__ import annotations

import pyarrow.compute as pc

from pipelines.actions.operator import NewAction, cancel_action, create_action
from pipelines.maintenance.config import MaintenanceConfig
from sinks.delta_rs import DeltaRsTableStore
from sinks.store import Matching
from tests.e2e.ota.conftest import SHA256, actions_stack, summary, wait_for
from tests.e2e.sinks.test_executions_layout import rows_in
from tests.fleet_harness import quiet_devices


def states(store, action_id: str) -> dict[str, str]:
    table = store.read_arrow("action_executions")
    table = table.filter(pc.equal(table["action_id"], action_id))
    return dict(zip(table["device_id"].to_pylist(), table["state"].to_pylist(), strict=True))


async def _go_offline(device, seconds: float) -> None:
    device.go_offline(seconds)


def test_broadcast_reaches_every_device_including_one_that_was_offline(spark, tmp_path):
    behaviour = quiet_devices(failure_rate=0.1, reject_rate=0.05, offline_duration_s=(3.0, 3.0))
    fleet_spec = {"count": 200, "groups": ["canary", "fleet"]}
    with actions_stack(spark, tmp_path, fleet_spec, behaviour) as stack:
        store, fleet = stack.store, stack.fleet
        offline = next(d for d in fleet.devices if d.group == "canary")
        stack.harness.run(_go_offline(offline, 3.0))
        action_id = create_action(
            store,
            NewAction(group="canary", version="2.0.0", url="https://example.invalid/fw.bin", sha256=SHA256),
        )
        wait_for(
            lambda: (s := summary(store, action_id)) is not None and s["action_state"] == "COMPLETED",
            what="the action to complete",
        )
        final = states(store, action_id)
        canary = {d.device_id for d in fleet.devices if d.group == "canary"}
        assert set(final) == canary
        device_states = {
            d.device_id: d.actions[action_id].state for d in fleet.devices if d.group == "canary"
        }
        assert final == device_states
        assert final[offline.device_id] in ("SUCCEEDED", "FAILED", "REJECTED")
        counts = summary(store, action_id)
        assert counts is not None
        assert counts["total_count"] == 100
        for state in ("SUCCEEDED", "FAILED", "REJECTED"):
            assert counts[f"{state.lower()}_count"] == sum(1 for s in final.values() if s == state)
        assert all(action_id not in d.actions for d in fleet.devices if d.group == "fleet")


def test_cancel_through_the_table_stops_devices_that_started(spark, tmp_path):
    behaviour = quiet_devices(download_delay_s=(60.0, 60.0))
    with actions_stack(spark, tmp_path, {"count": 20, "groups": ["g"]}, behaviour, register=False) as stack:
        store, fleet = stack.store, stack.fleet
        action_id = create_action(
            store,
            NewAction(
                all_devices=True, version="3.0.0", url="https://example.invalid/fw3.bin", sha256=SHA256
            ),
        )
        wait_for(lambda: fleet.states(action_id).get("IN_PROGRESS") == 20, what="downloads")
        wait_for(lambda: (summary(store, action_id) or {}).get("in_progress_count") == 20, what="tracking")
        assert cancel_action(store, action_id)
        wait_for(
            lambda: (s := summary(store, action_id)) is not None and s["canceled_count"] == 20,
            what="cancellation",
        )
        canceled = summary(store, action_id)
        assert canceled is not None and canceled["action_state"] == "CANCELED"
        assert {d.firmware for d in fleet.devices} == {"1.0.0"}


def test_the_jobs_maintenance_keeps_each_actions_rows_in_files_of_its_own(spark, tmp_path):
    """Two actions in flight at once: report batches merge rows of both into one file, and the job's
    background compaction splits such files by action while it runs, so that a read of one action opens
    files holding that action's rows only."""
    maintenance = MaintenanceConfig(compact_interval_s=0.5)  # settle_s 600: nothing is packed meanwhile
    spec = {"count": 40, "groups": ["east", "west"]}
    with actions_stack(spark, tmp_path, spec, quiet_devices(), maintenance=maintenance) as stack:
        store = stack.store
        assert isinstance(store, DeltaRsTableStore)
        actions = [
            create_action(
                store,
                NewAction(group=group, version="2.0.0", url="https://example.invalid/fw.bin", sha256=SHA256),
            )
            for group in ("east", "west")
        ]

        def laid_out() -> bool:
            for action_id in actions:
                opened = store.files_read("action_executions", [Matching("action_id", (action_id,))])
                actions_in = store.read_arrow("action_executions", columns=["action_id"]).num_rows
                try:
                    rows = rows_in(store, opened)
                except KeyError:  # the maintenance rewrote a file between the listing and the count
                    return False
                if not opened or rows != 20 or actions_in != 40:
                    return False
            return True

        wait_for(
            lambda: all((summary(store, a) or {}).get("action_state") == "COMPLETED" for a in actions),
            what="both actions to complete",
        )
        wait_for(laid_out, what="each action's rows in files of its own")
        for action_id in actions:
            group = "east" if action_id == actions[0] else "west"
            read = store.read_arrow("action_executions", where=[Matching("action_id", (action_id,))])
            devices = {
                d.device_id: d.actions[action_id].state for d in stack.fleet.devices if d.group == group
            }
            assert dict(zip(read["device_id"].to_pylist(), read["state"].to_pylist(), strict=True)) == devices
        splits = [u for u in stack.job.maintenance.upkeep if u.table == "action_executions"]
        assert [u.error for u in splits if u.error] == []
        assert sum(u.count or 0 for u in splits if u.operation == "compact") > 0
