"""Status reports the actions job must survive: any client that may publish on a report topic can send
anything there, and no such message may stop the reports of the rest of the fleet reaching Delta."""

from __future__ import annotations

import json

from pipelines.actions.buckets import bucket_of, report_topic
from pipelines.actions.operator import NewAction, create_action
from tests.e2e.broker_clients import PahoClient
from tests.e2e.ota.conftest import SHA256, actions_stack, summary, wait_for
from tests.fleet_harness import quiet_devices

BUCKETS = 4


def _report(**fields: object) -> bytes:
    body = {
        "action_id": "a-x",
        "device_id": "dev-x",
        "state": "FAILED",
        "seq": 1,
        "ts": 1,
        "details": "",
    } | fields
    return json.dumps(body).encode()


UNREADABLE = [
    _report(seq=float("inf")),  # Infinity: json reads it, no integer holds it
    _report(seq=2**70),  # past the 64-bit report_seq column
    _report(attempt=2**40),  # past the 32-bit attempt column
    _report(action_id=None),  # not the action "None"
    b"[" * 100_000,  # nested past what json reads
]


def test_reports_no_row_can_hold_are_skipped_and_the_fleets_reports_still_land(spark, tmp_path):
    """Each unreadable report is skipped as 'not a report': before, one of them failed every replay of its
    micro-batch (OverflowError, RecursionError, a Delta write out of range), and the reports of every device
    after it never reached Delta."""
    with actions_stack(
        spark, tmp_path, {"count": 4, "groups": ["g"], "buckets": BUCKETS}, quiet_devices()
    ) as stack:
        devices = [d.device_id for d in stack.fleet.devices]
        client = PahoClient(stack.broker.port, client_id="hostile-reporter")
        for device in devices:  # in every bucket the fleet reports on, before the devices' reports
            topic = report_topic(bucket_of(device, BUCKETS))
            for payload in UNREADABLE:
                client.publish(topic, payload, qos=1)
        action_id = create_action(
            stack.store,
            NewAction(device_ids=devices, version="2.0.0", url="https://x.invalid/fw", sha256=SHA256),
        )

        def all_succeeded() -> bool:
            row = summary(stack.store, action_id)
            return row is not None and row["succeeded_count"] == len(devices)

        wait_for(all_succeeded, timeout_s=40, what="every device's report in Delta")


def test_reports_about_an_action_never_sent_to_their_device_change_nothing(spark, tmp_path):
    """A device the list does not name reports FAILED, and another reports on an action id nobody wrote:
    neither makes a row, counts towards the abort rule (which held the rollout at 1 of 1 failed) or writes a
    summary; the listed devices complete the action."""
    with actions_stack(
        spark, tmp_path, {"count": 4, "groups": ["g"], "buckets": BUCKETS}, quiet_devices()
    ) as stack:
        devices = sorted(d.device_id for d in stack.fleet.devices)
        listed, outsider = devices[:2], devices[2]
        client = PahoClient(stack.broker.port, client_id="outsider")
        outsider_topic = report_topic(bucket_of(outsider, BUCKETS))
        client.publish(
            outsider_topic, _report(action_id="a-listed", device_id=outsider, state="FAILED"), qos=1
        )
        client.publish(outsider_topic, _report(action_id="a-nobody-wrote", device_id=outsider), qos=1)
        create_action(
            stack.store,
            NewAction(
                action_id="a-listed",
                device_ids=listed,
                version="2.0.0",
                url="https://x.invalid/fw",
                sha256=SHA256,
                abort_rules=[{"failure_kind": "failed", "threshold_pct": 50.0, "min_executed": 1}],
            ),
        )

        def ended() -> bool:
            row = summary(stack.store, "a-listed")
            return row is not None and row["action_state"] != "IN_PROGRESS"

        client.publish(outsider_topic, _report(action_id="a-listed", device_id=outsider, seq=2), qos=1)
        wait_for(ended, timeout_s=40, what="the action to end")
        row = summary(stack.store, "a-listed")
        assert row is not None
        assert (row["action_state"], row["succeeded_count"], row["failed_count"], row["total_count"]) == (
            "COMPLETED",
            2,
            0,
            2,
        )
        stack.job.process_available()
        executions = stack.store.read_arrow("action_executions").to_pylist()
        assert sorted((r["action_id"], r["device_id"]) for r in executions) == [
            ("a-listed", d) for d in listed
        ]
        assert summary(stack.store, "a-nobody-wrote") is None


def test_a_report_on_a_devices_own_topic_naming_another_device_is_not_taken(spark, tmp_path):
    """``devices/<id>/actions`` is the topic an ACL (``%c``) gives one device alone: a report there that names
    another device is skipped, where it failed that device's execution (a device that never ran the action);
    the device's own report on it is taken."""
    with actions_stack(
        spark, tmp_path, {"count": 2, "groups": ["g"], "buckets": BUCKETS}, quiet_devices()
    ) as stack:
        devices = [d.device_id for d in stack.fleet.devices]
        victim = "earlier-protocol-7"
        impostor = PahoClient(stack.broker.port, client_id="earlier-protocol-8")
        impostor.publish(
            "devices/earlier-protocol-8/actions",
            _report(action_id="a-own", device_id=victim, state="FAILED"),
            qos=1,
        )
        create_action(
            stack.store,
            NewAction(
                action_id="a-own",
                device_ids=[*devices, victim],
                version="2.0.0",
                url="https://x.invalid/fw",
                sha256=SHA256,
            ),
        )

        def fleet_done() -> bool:
            row = summary(stack.store, "a-own")
            return row is not None and row["succeeded_count"] == len(devices)

        wait_for(fleet_done, timeout_s=40, what="the fleet's reports in Delta")
        impostor.publish(  # once more, now that the victim has a row
            "devices/earlier-protocol-8/actions",
            _report(action_id="a-own", device_id=victim, state="FAILED", seq=2),
            qos=1,
        )
        stack.job.process_available()
        row = summary(stack.store, "a-own")
        assert row is not None and (row["failed_count"], row["queued_count"]) == (0, 1)

        victim_client = PahoClient(stack.broker.port, client_id=victim)
        victim_client.publish(
            f"devices/{victim}/actions",
            _report(action_id="a-own", device_id=victim, state="SUCCEEDED"),
            qos=1,
        )
        wait_for(
            lambda: (summary(stack.store, "a-own") or {}).get("action_state") == "COMPLETED", timeout_s=30
        )
