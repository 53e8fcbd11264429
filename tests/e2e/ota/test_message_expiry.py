"""A device that never takes an action: its message expires (``message_expiry_s``, a day by default), the
device would ignore it from then on, and the job ends its execution ``EXPIRED``: final, so the action
completes once every other device is done, and no failure, so a rollout whose online devices succeeded is
not aborted (docs/ota.md, "Devices that never take an action").

Against a real broker, real Delta tables and a simulated fleet: on the engine with a clock the test moves (a
day in one step), and through the whole job (its Spark streams, its ticker) with a message that expires in
seconds, also across a restart after the expiry whose reports stream has still to read a report the device
sent in time.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter

import pytest

from pipelines.actions.buckets import bucket_of, report_topic
from pipelines.actions.engine import ActionsEngine
from pipelines.actions.job import start_actions_job
from pipelines.actions.model import DEFAULT_EXPIRY_S, group_topic
from pipelines.actions.operator import NewAction, create_action
from pipelines.actions.states import StatusReport
from pipelines.actions.status import describe, read_statuses
from tests.e2e.broker_clients import PahoClient
from tests.e2e.ota.conftest import (
    FIRMWARE,
    action_row,
    actions_stack,
    device_report,
    epoch_ms,
    register_devices,
    summary,
    wait_for,
    write_actions,
)
from tests.e2e.ota.rollout_harness import finals, rollout_run
from tests.e2e.ota.test_actions_job import states
from tests.fleet_harness import quiet_devices


def test_a_device_that_never_takes_a_broadcast_expires_and_the_rollout_completes_not_aborted(tmp_path):
    with rollout_run(tmp_path, quiet_devices(), count=3, groups=["g"]) as run:
        run.register({"dev-off": "g"})  # in the group, never connects
        run.create(action_row("a-1", group="g", failure_pct=10, min_executed=1))
        run.feed(lambda reports: finals(reports, "a-1") == 3)
        assert run.states("a-1") == Counter(SUCCEEDED=3, QUEUED=1)

        run.tick_at(DEFAULT_EXPIRY_S - 60)  # a minute before its message expires: still open
        assert run.states("a-1") == Counter(SUCCEEDED=3, QUEUED=1)
        assert run.summary("a-1")["action_state"] == "IN_PROGRESS"

        run.tick_at(DEFAULT_EXPIRY_S + 60)
        assert run.states("a-1") == Counter(SUCCEEDED=3, EXPIRED=1)
        final = run.summary("a-1")
        assert (final["action_state"], final["aborted_by"]) == ("COMPLETED", None)
        assert (final["expired_count"], final["failed_count"], final["total_count"]) == (1, 0, 4)
        assert final["reason"] == "1 device had not taken it when its message expired"
        off = run.executions("a-1")["dev-off"]
        assert off["published_at"] is not None and off["finished_at"] is not None
        assert "message expired at" in off["status_details"]
        assert "before the device took it" in off["status_details"]

        # a report read afterwards (a device whose clock is a day behind took the expired message) moves no
        # final row
        late = StatusReport("a-1", "dev-off", "FAILED", 1, run.clock.now, received_at=run.clock.now)
        run.engine.on_reports([late], "reports", 1_000)
        assert run.states("a-1") == Counter(SUCCEEDED=3, EXPIRED=1)
        assert run.summary("a-1")["action_state"] == "COMPLETED"


def test_the_job_expires_a_device_that_never_connects_and_completes_the_action(spark, tmp_path):
    with actions_stack(
        spark, tmp_path, {"count": 3, "groups": ["g"]}, quiet_devices(), register=False, message_expiry_s=3
    ) as stack:
        store = stack.store
        register_devices(store, {**{d.device_id: "g" for d in stack.fleet.devices}, "dev-off": "g"})
        action_id = create_action(store, NewAction(group="g", failure_pct=10, min_executed=1, **FIRMWARE))
        wait_for(
            lambda: (summary(store, action_id) or {}).get("action_state") == "COMPLETED",
            what="the action to complete",
        )
        assert states(store, action_id) == {
            **{d.device_id: "SUCCEEDED" for d in stack.fleet.devices},
            "dev-off": "EXPIRED",
        }
        final = summary(store, action_id)
        assert final is not None
        assert (final["expired_count"], final["failed_count"], final["aborted_by"]) == (1, 0, None)
        (status,) = read_statuses(store, action_id)
        described = describe(status, "")
        assert "expired=1" in described
        assert "1 device had not taken it when its message expired" in described


def test_a_report_sent_in_time_and_read_after_a_restart_past_the_expiry_is_not_overtaken(spark, tmp_path):
    """The job stops after the action went out; the device takes it in time and reports while no job runs;
    the job starts again once the message has expired. Its ticker ends nothing as expired before its reports
    stream has read what the brokers took in meanwhile: the device's row is its report's, not EXPIRED."""
    expiry_s = 15
    with actions_stack(
        spark,
        tmp_path,
        {"count": 2, "groups": ["g"]},
        quiet_devices(),
        register=False,
        message_expiry_s=expiry_s,
    ) as stack:
        store = stack.store
        register_devices(store, {**{d.device_id: "g" for d in stack.fleet.devices}, "dev-late": "g"})
        action_id = create_action(store, NewAction(group="g", **FIRMWARE))

        def sent() -> int | None:
            table = store.read_arrow("action_executions").to_pylist()
            row = next(
                (r for r in table if (r["action_id"], r["device_id"]) == (action_id, "dev-late")), None
            )
            return None if row is None or row["published_at"] is None else epoch_ms(row["published_at"])

        wait_for(lambda: sent() is not None, what="the action to go out")
        stack.job.stop()
        published_at = sent()
        assert published_at is not None

        late = PahoClient(stack.broker.port, "dev-late")
        topic = report_topic(bucket_of("dev-late", stack.config.device_buckets))
        late.publish(topic, device_report(action_id, "dev-late", "IN_PROGRESS", seq=1), qos=1)
        late.publish(topic, device_report(action_id, "dev-late", "SUCCEEDED", seq=2), qos=1)
        assert time.time() * 1000 < published_at + expiry_s * 1000, "reported after the expiry: too slow"

        time.sleep(max(0.0, (published_at + expiry_s * 1000) / 1000 + 1 - time.time()))
        stack.job = start_actions_job(stack.spark, stack.config, store)  # stopped above
        wait_for(
            lambda: (summary(store, action_id) or {}).get("action_state") == "COMPLETED",
            what="the action to complete",
        )
        assert states(store, action_id) == {
            **{d.device_id: "SUCCEEDED" for d in stack.fleet.devices},
            "dev-late": "SUCCEEDED",
        }
        final = summary(store, action_id)
        assert final is not None and final["expired_count"] == 0


@pytest.mark.mqtt5("MQTT-3.3.2-5", "MQTT-3.3.2-6")
def test_the_broker_never_delivers_a_message_whose_row_ended_expired(spark, tmp_path):
    """[MQTT-3.3.2-5] [MQTT-3.3.2-6] through the whole job (message_expiry_s 3): two devices with persistent
    sessions are offline when the action goes out. One comes back in time and receives it with what is left
    of its Message Expiry Interval; the other comes back once the job has ended its row ``EXPIRED`` and
    receives nothing, whatever its own clock says."""
    expiry_s = 3
    with actions_stack(
        spark, tmp_path, {"count": 1, "groups": ["g"]}, quiet_devices(), message_expiry_s=expiry_s
    ) as stack:
        store = stack.store
        register_devices(store, {"dev-soon": "g", "dev-late": "g"})
        devices = {}
        for device_id in ("dev-soon", "dev-late"):
            device = PahoClient(stack.broker.port, device_id, clean=False, session_expiry=3600)
            device.subscribe(group_topic("g"), 1)
            device.disconnect()
            devices[device_id] = device
        action_id = create_action(store, NewAction(group="g", **FIRMWARE))
        wait_for(lambda: states(store, action_id).get("dev-soon") is not None, what="the action to go out")

        soon = devices["dev-soon"]
        soon.connect()
        (message,) = soon.expect(1)
        left_ms = json.loads(message.payload)["expires_at"] - time.time() * 1000
        interval = message.properties.MessageExpiryInterval
        assert 1 <= interval <= math.ceil(left_ms / 1000) <= expiry_s
        soon.disconnect()

        wait_for(lambda: states(store, action_id).get("dev-late") == "EXPIRED", what="dev-late to expire")
        late = devices["dev-late"]
        late.connect()
        assert late.connack_result[0].session_present
        late.expect_none(1.0)
        late.disconnect()


def test_a_row_keeps_the_expiry_its_message_was_sent_with_across_a_lower_message_expiry_s(tmp_path):
    """Sent with message_expiry_s 100, then the job runs again with 10: the row (and the brokers' copy of
    the message) still expire 100 s after it went out. Before, every row was judged by the value the job ran
    with now, and ended ``EXPIRED`` at 10 s while the device could still take the message and had its
    report ignored."""
    with rollout_run(tmp_path, quiet_devices(), count=1, groups=["g"]) as run:
        run.register({"dev-off": "g"})
        first = ActionsEngine(run.store, run.engine.publisher, clock=run.clock, message_expiry_s=100)
        row = action_row("a-1", group="g", timeout_s=3600)  # on the clock at every tick
        write_actions(run.store, [row], 0)
        first.on_action_rows([row], "fanout", 0)
        run.feed(lambda reports: finals(reports, "a-1") == 1)
        sent = run.executions("a-1")["dev-off"]
        expires_at = epoch_ms(sent["expires_at"])  # 100 s after it was sent (or the action created, if later)
        assert 0 <= expires_at - (epoch_ms(sent["published_at"]) + 100_000) < 5_000

        again = ActionsEngine(run.store, run.engine.publisher, clock=run.clock, message_expiry_s=10)
        run.clock.now = run.clock.at(50)
        again.tick()
        assert run.executions("a-1")["dev-off"]["state"] == "QUEUED"
        run.clock.now = expires_at + 1_000
        again.tick()
        off = run.executions("a-1")["dev-off"]
        assert off["state"] == "EXPIRED"
        assert off["status_details"].startswith("message expired at ")
