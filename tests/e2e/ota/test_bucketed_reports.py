"""Status reports on the device buckets' report topics, folded into Delta by the actions job.

A device reports on ``actions/reports/<bucket>`` (its bucket as for actions, the report naming the device):
the reports of N devices are at most bucket-count logs and no log per device. Every final state reaches Delta
exactly once: the same final reports delivered again after the job restarted from its checkpoints change no
count. A device on the earlier protocol, reporting on its own ``devices/<id>/actions``, is still read.
"""

from __future__ import annotations

import time
from collections import Counter

import pyarrow.compute as pc

from broker_edge.offsets_api.client import OffsetsClient
from pipelines.actions.buckets import REPORT_TOPICS, bucket_of, report_topic
from pipelines.actions.operator import NewAction, create_action
from pipelines.actions.publisher import MqttPublisher, Outgoing
from pipelines.actions.states import SUCCEEDED
from tests.e2e.ota.conftest import SHA256, actions_stack, device_report, epoch_ms, summary, wait_for
from tests.fleet_harness import quiet_devices

DEVICES = 60
BUCKETS = 8
EARLIER_DEVICE = "earlier-protocol-1"


def executions(store, action_id: str) -> list[tuple[str, str]]:
    table = store.read_arrow("action_executions")
    table = table.filter(pc.equal(table["action_id"], action_id))
    return list(zip(table["device_id"].to_pylist(), table["state"].to_pylist(), strict=True))


def finished_at_ms(store, action_id: str, device_id: str) -> int:
    table = store.read_arrow("action_executions")
    table = table.filter(
        pc.and_(pc.equal(table["action_id"], action_id), pc.equal(table["device_id"], device_id))
    )
    return epoch_ms(table["finished_at"][0].as_py())


def own_report_topic(device_id: str) -> str:
    """Where this device reports: its own topic on the earlier protocol, else its bucket's report topic."""
    if device_id == EARLIER_DEVICE:
        return f"devices/{device_id}/actions"
    return report_topic(bucket_of(device_id, BUCKETS))


def all_succeeded(store, action_id: str, count: int) -> bool:
    row = summary(store, action_id)
    return row is not None and row["succeeded_count"] == count


def test_reports_of_n_devices_land_in_bucket_logs_and_reach_delta_once(spark, tmp_path):
    """The duplicates are read by the restarted job and counted no second time."""
    spec = {"count": DEVICES, "groups": ["g"], "buckets": BUCKETS}
    with actions_stack(spark, tmp_path, spec, quiet_devices()) as stack:
        store, harness = stack.store, stack.harness
        listed = [d.device_id for d in stack.fleet.devices]
        action_id = create_action(
            store,
            NewAction(
                device_ids=[*listed, EARLIER_DEVICE],
                version="2.0.0",
                url="https://x.invalid/fw",
                sha256=SHA256,
            ),
        )
        harness.wait_until(lambda: stack.fleet.finished(action_id) == DEVICES, timeout_s=60)
        publisher = MqttPublisher([stack.broker.address], client_id="earlier-protocol-device")
        try:
            sent_ms = int(time.time() * 1000)
            publisher.publish(
                own_report_topic(EARLIER_DEVICE), device_report(action_id, EARLIER_DEVICE, SUCCEEDED, 1)
            )
            wait_for(lambda: all_succeeded(store, action_id, DEVICES + 1), what="every final state in Delta")
            # its report says ts 1 (a clock at 1970): the row holds when the broker took the report in
            finished_ms = finished_at_ms(store, action_id, EARLIER_DEVICE)
            assert sent_ms - 1_000 <= finished_ms <= int(time.time() * 1000)

            offsets_api = OffsetsClient(stack.broker.offsets_url)
            report_logs = offsets_api.list_logs(REPORT_TOPICS)
            assert {log.topic for log in report_logs} == {report_topic(bucket_of(d, BUCKETS)) for d in listed}
            assert len(report_logs) <= BUCKETS
            assert (
                sum(log.end_offset - log.start_offset for log in report_logs) == 2 * DEVICES
            )  # IN_PROGRESS, final
            assert [log.topic for log in offsets_api.list_logs("devices/+/actions")] == [
                f"devices/{EARLIER_DEVICE}/actions"
            ]
            before = executions(store, action_id)
            assert Counter(device for device, _ in before) == Counter([*listed, EARLIER_DEVICE])
            assert {state for _, state in before} == {SUCCEEDED}

            stack.restart_job()
            finals = [r for r in harness.take_reports() if r.action_id == action_id and r.state == SUCCEEDED]
            assert len(finals) == DEVICES + 1
            publisher.publish_many(  # the same final reports again, as a device resends them on reconnecting
                [
                    Outgoing(
                        own_report_topic(r.device_id), device_report(action_id, r.device_id, r.state, r.seq)
                    )
                    for r in finals
                ]
            )
        finally:
            publisher.close()
        stack.job.process_available()
        read_again = sum(p.numInputRows for p in stack.job.reports.query.recentProgress)
        assert read_again >= DEVICES + 1
        assert sorted(executions(store, action_id)) == sorted(before)
        row = summary(store, action_id)
        assert row is not None
        assert (row["total_count"], row["succeeded_count"]) == (DEVICES + 1, DEVICES + 1)
