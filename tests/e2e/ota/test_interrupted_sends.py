"""The actions job killed after it published a turn of a rollout and before it recorded it: a tick's turn,
or a new action's first turn at its fan-out.

The devices of that turn have the action, but their rows were still ``QUEUED`` and unsent in
``action_executions`` (a fan-out's rows not written at all): a job started again thought they were never
sent, so a cancel or an abort coming first reached only the devices recorded as sent (no cancel message, no
rollback for the others), and their reports were left out as about an action never sent to them. The job
now marks a turn's rows as being sent, in one merge, before it publishes them: a job started again treats
them as sent.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from pipelines.actions.buckets import bucket_of, report_topic
from pipelines.actions.job import ActionsJob, start_actions_job
from pipelines.actions.operator import cancel_action
from pipelines.actions.phases import rollout_order
from pipelines.actions.rollback import rollback_id
from pipelines.supervisor import RestartConfig
from tests.e2e.broker_clients import PahoClient
from tests.e2e.ota.conftest import (
    ActionsStack,
    action_row,
    actions_stack,
    device_report,
    register_devices,
    summary,
    wait_for,
    write_actions,
)
from tests.e2e.ota.test_rollout_aborts import ROLLBACK, rule
from tests.fleet_harness import quiet_devices

EVERY_TURN_AT_ONCE = 1_000_000
"""A rate (per minute) at which the fan-out sends the first device and the next tick all the others."""


TIMEOUT_S = 15
"""The in-progress timeout of the action an abort rule stops: longer than the rollout takes to its kill (a
device's report through the reports stream, which a loaded machine's Spark may take seconds over)."""


pytestmark = pytest.mark.filterwarnings(
    "ignore:Exception in thread actions-ticker:pytest.PytestUnhandledThreadExceptionWarning"
)
"""The job's ticker thread dies of ``Killed`` in these tests, as planned: pytest's warning says nothing."""


class Killed(BaseException):
    """The job's process dying: nothing of the tick runs after it (not an ``Exception`` the tick handles)."""


def kill_the_ticker_after_it_publishes(
    job: ActionsJob, monkeypatch: pytest.MonkeyPatch, armed: threading.Event | None = None
) -> threading.Event:
    """The job's ticker dies right after a tick's first publish of an action went out (acknowledged by the
    broker), before the tick records anything: the first such tick once ``armed`` is set (at once without
    it). The event returned is set then."""
    killed = threading.Event()
    publish_many = job.engine.publisher.publish_many

    def publishing(messages, *args, **kwargs):
        result = publish_many(messages, *args, **kwargs)
        ticker = threading.current_thread().name == "actions-ticker"
        sending = bool(messages) and not any(b'"kind":"cancel"' in message.payload for message in messages)
        if ticker and sending and (armed is None or armed.is_set()) and not killed.is_set():
            killed.set()
            raise Killed("the actions job died after its tick published, before it recorded the sends")
        return result

    monkeypatch.setattr(job.engine.publisher, "publish_many", publishing)
    return killed


def kill_the_job_after_its_fan_out_publishes(
    job: ActionsJob, monkeypatch: pytest.MonkeyPatch
) -> threading.Event:
    """The job dies right after its fan-out published a new action's first turn (acknowledged by the
    broker), before the batch recorded anything; nothing of it runs afterwards (its ticker, its reports and
    fan-out batches), so the batch stays uncommitted in Spark's checkpoint. The event returned is set then."""
    killed = threading.Event()
    engine = job.engine
    publish_many, on_action_rows, on_reports, tick = (
        engine.publisher.publish_many,
        engine.on_action_rows,
        engine.on_reports,
        engine._tick,
    )

    def publishing(messages, *args, **kwargs):
        result = publish_many(messages, *args, **kwargs)
        if threading.current_thread().name != "actions-ticker" and messages and not killed.is_set():
            killed.set()
            raise Killed("the actions job died after its fan-out published, before it recorded the sends")
        return result

    def dead(work: Callable) -> Callable:
        def working(*args, **kwargs):
            if killed.is_set():
                raise RuntimeError("the actions job is dead")
            try:
                return work(*args, **kwargs)
            except Killed as error:  # through Spark's foreachBatch as the failure of its batch
                raise RuntimeError(str(error)) from None

        return working

    def ticking(*args, **kwargs):
        # Under the engine's lock: a tick that began before the fan-out died and waited for its lock
        # must not go on after it (a dead process's ticker does nothing).
        if killed.is_set():
            raise Killed("the actions job is dead")
        return tick(*args, **kwargs)

    monkeypatch.setattr(engine.publisher, "publish_many", publishing)
    monkeypatch.setattr(engine, "on_action_rows", dead(on_action_rows))
    monkeypatch.setattr(engine, "on_reports", dead(on_reports))
    monkeypatch.setattr(engine, "_tick", ticking)
    return killed


def execution(stack: ActionsStack, action_id: str, device_id: str) -> dict:
    """The row of ``device_id``'s execution of ``action_id`` ({} before there is one)."""
    rows = stack.store.read_arrow("action_executions").to_pylist()
    return next((r for r in rows if (r["action_id"], r["device_id"]) == (action_id, device_id)), {})


def reported(stack: ActionsStack, action_id: str, devices: int) -> bool:
    """Whether ``devices`` devices have finished ``action_id`` and every report they sent is in a broker's
    log (a device's state is final before its report is acknowledged)."""
    return stack.fleet.finished(action_id) == devices and not any(
        device.reports_in_flight for device in stack.fleet.devices
    )


def restart_after(stack: ActionsStack, while_stopped: Callable[[], None]) -> None:
    """Stop the job (the rest of the killed process), do ``while_stopped``, start it again."""
    stack.job.stop()
    while_stopped()
    stack.job = start_actions_job(stack.spark, stack.config, stack.store)


def test_a_cancel_reaches_the_devices_a_killed_tick_sent_the_action_to(spark, tmp_path, monkeypatch):
    """Three devices that hang after IN_PROGRESS: the fan-out sends the first, the next tick the other two
    and dies. The operator cancels the action while no job runs; the job started again sends the cancel to
    all three, which stop (before, only the first heard of it and the other two went on for ever)."""
    behaviour = quiet_devices(silent_attempts=1)
    with actions_stack(spark, tmp_path, {"count": 3, "groups": ["g"]}, behaviour) as stack:
        devices = sorted(d.device_id for d in stack.fleet.devices)
        killed = kill_the_ticker_after_it_publishes(stack.job, monkeypatch)
        write_actions(
            stack.store, [action_row("ks-1", device_ids=devices, max_per_minute=EVERY_TURN_AT_ONCE)], 0
        )
        wait_for(killed.is_set, what="a tick sending the action")

        def cancel() -> None:
            stack.harness.wait_until(
                lambda: all(
                    d.actions.get("ks-1") and d.actions["ks-1"].state == "IN_PROGRESS"
                    for d in stack.fleet.devices
                ),
                30,
            )
            assert cancel_action(stack.store, "ks-1")

        restart_after(stack, cancel)
        wait_for(
            lambda: all(d.actions["ks-1"].state == "CANCELED" for d in stack.fleet.devices),
            what="every device that has the action canceling it",
        )
        wait_for(
            lambda: (summary(stack.store, "ks-1") or {}).get("canceled_count") == 3, what="3 rows CANCELED"
        )
        assert (summary(stack.store, "ks-1") or {}).get("action_state") == "CANCELED"


def test_an_abort_rolls_back_the_devices_a_killed_tick_sent_the_build_to(spark, tmp_path, monkeypatch):
    """The fan-out sends a device the test plays, which reports IN_PROGRESS and nothing more; ticks send the
    build to simulated devices one every two seconds, and one dies after its publish. The devices install it
    while no job runs. The job started again times the first device out at its first tick, which fires the
    abort rule: the rollback goes to every device that installed the build (before, not to the one the
    killed tick sent it to, which kept it)."""
    silent = "r-silent"
    with actions_stack(spark, tmp_path, {"count": 6, "groups": ["g"]}, quiet_devices()) as stack:
        fleet = sorted(d.device_id for d in stack.fleet.devices)
        action_id = next(
            f"kr-{n}" for n in range(1000) if rollout_order(f"kr-{n}", [silent, *fleet])[0] == silent
        )
        device = PahoClient(stack.broker.port, silent)
        try:
            armed = threading.Event()
            killed = kill_the_ticker_after_it_publishes(stack.job, monkeypatch, armed)
            row = action_row(
                action_id,
                device_ids=[silent, *fleet],
                max_per_minute=20,  # a device every 3 s: some left to send once the report is in
                timeout_s=TIMEOUT_S,
                abort_rules=[rule("timed_out", 10.0, 1)],
                rollback=ROLLBACK,
            )
            write_actions(stack.store, [row], 0)
            wait_for(
                lambda: execution(stack, action_id, silent).get("published_at") is not None, what="fan-out"
            )
            topic = report_topic(bucket_of(silent, stack.config.device_buckets))
            device.publish(topic, device_report(action_id, silent, "IN_PROGRESS"), qos=1)
            wait_for(lambda: execution(stack, action_id, silent).get("state") == "IN_PROGRESS", what="report")
            timed_out_at = execution(stack, action_id, silent)["started_at"].timestamp() + TIMEOUT_S
            armed.set()
            wait_for(killed.is_set, what="a tick sending the build")

            holders: list[str] = []

            def installed_while_stopped() -> None:
                holders.extend(sorted(d.device_id for d in stack.fleet.devices if action_id in d.actions))
                stack.harness.wait_until(lambda: stack.fleet.finished(action_id) == len(holders), 30)
                firmware = {d.device_id: d.firmware for d in stack.fleet.devices if d.device_id in holders}
                assert firmware == dict.fromkeys(holders, "2.0.0")
                wait_for(lambda: time.time() > timed_out_at + 0.5, what="the first device's timeout")

            restart_after(stack, installed_while_stopped)
            wait_for(
                lambda: (summary(stack.store, action_id) or {}).get("action_state") == "ABORTED", what="abort"
            )
            aborted = summary(stack.store, action_id) or {}
            assert aborted["rollback_action_id"] == rollback_id(action_id), aborted["reason"]
            rollback = [
                r for r in stack.store.read_arrow("actions").to_pylist() if r["id"] == rollback_id(action_id)
            ]
            assert rollback[0]["target"]["device_ids"] == holders
            wait_for(
                lambda: all(d.firmware == "1.0.0" for d in stack.fleet.devices),
                what="every device that installed the build rolled back",
            )
        finally:
            device.disconnect()


def test_a_cancel_reaches_the_device_a_killed_fan_out_sent_the_action_to(spark, tmp_path, monkeypatch):
    """A paced rollout to group ``g`` (three devices that hang after IN_PROGRESS): the fan-out sends its
    first device and the job dies before it records anything. While no job runs, a fourth device that comes
    first in the rollout's order is registered in ``g`` and the operator cancels the action. The job started
    again sends the cancel to the device that has the action, and nothing to the newcomer. Before, Spark's
    replay of the batch fanned the canceled action out again to the group as it was then: its first turn
    went to the newcomer, the cancel followed it there, and the device that had the action never heard of
    the cancel."""
    restart = RestartConfig(enabled=False)  # a dead job: nothing restarts its queries
    behaviour = quiet_devices(silent_attempts=1)
    spec = {"count": 4, "groups": ["g"]}
    with actions_stack(spark, tmp_path, spec, behaviour, register=False, restart=restart) as stack:
        *first_three, newcomer = sorted(stack.fleet.devices, key=lambda d: d.device_id)
        register_devices(stack.store, {d.device_id: "g" for d in first_three})
        everyone = [d.device_id for d in stack.fleet.devices]
        action_id = next(
            f"kf-{n}" for n in range(1000) if rollout_order(f"kf-{n}", everyone)[0] == newcomer.device_id
        )
        first = next(d for d in first_three if d.device_id == rollout_order(action_id, everyone)[1])
        killed = kill_the_job_after_its_fan_out_publishes(stack.job, monkeypatch)
        write_actions(stack.store, [action_row(action_id, group="g", max_per_minute=1)], 0)
        wait_for(killed.is_set, what="the fan-out sending the action")

        def regroup_and_cancel() -> None:
            stack.harness.wait_until(
                lambda: action_id in first.actions and first.actions[action_id].state == "IN_PROGRESS", 30
            )
            register_devices(stack.store, {newcomer.device_id: "g"})
            assert cancel_action(stack.store, action_id)

        restart_after(stack, regroup_and_cancel)
        wait_for(
            lambda: first.actions[action_id].state == "CANCELED",
            what="the device that has the action canceling it",
        )
        wait_for(
            lambda: (summary(stack.store, action_id) or {}).get("canceled_count") == 3, what="3 rows CANCELED"
        )
        canceled = summary(stack.store, action_id) or {}
        assert (canceled["action_state"], canceled["total_count"]) == ("CANCELED", 3)
        assert action_id not in newcomer.actions
        assert [d.device_id for d in stack.fleet.devices if action_id in d.actions] == [first.device_id]


def test_a_job_started_again_sends_a_killed_fan_outs_action_only_to_devices_that_did_not_answer(
    spark, tmp_path, monkeypatch, caplog
):
    """Three devices and one listed id that no device has: the fan-out sends them all and the job dies
    before it records anything. The devices install it while no job runs. The job started again reads their
    reports before it sends anything: the message goes again to the silent id alone, and no device is sent
    the action twice (before, the first tick after the start sent it again to all four, and the devices
    answered a message they had already done)."""
    restart = RestartConfig(enabled=False)
    with actions_stack(
        spark, tmp_path, {"count": 3, "groups": ["g"]}, quiet_devices(), restart=restart
    ) as stack:
        devices = sorted(d.device_id for d in stack.fleet.devices)
        killed = kill_the_job_after_its_fan_out_publishes(stack.job, monkeypatch)
        write_actions(stack.store, [action_row("ka-1", device_ids=[*devices, "ka-silent"])], 0)
        wait_for(killed.is_set, what="the fan-out sending the action")
        restart_after(stack, lambda: stack.harness.wait_until(lambda: reported(stack, "ka-1", 3), 30))
        wait_for(
            lambda: execution(stack, "ka-1", "ka-silent").get("sending_at", 0) is None,
            what="the silent id sent the action again",
        )
        wait_for(
            lambda: (summary(stack.store, "ka-1") or {}).get("succeeded_count") == 3,
            what="3 devices succeeded",
        )
        assert (summary(stack.store, "ka-1") or {})["queued_count"] == 1
        assert (stack.fleet.stats["actions_received"], stack.fleet.stats["repeated_actions"]) == (3, 0)
        assert "sent again to 1 device " in caplog.text
