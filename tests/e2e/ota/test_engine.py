"""The actions engine against real Delta tables (delta-rs) and a real MQTT broker with a simulated fleet.

Reports reach the engine straight from an MQTT listener here; the Spark job that reads them from the brokers'
logs is tested in test_actions_job.py.
"""

from __future__ import annotations

import json

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from pipelines.actions.engine import ActionsEngine
from pipelines.actions.model import parse_report
from pipelines.actions.publisher import MqttPublisher
from pipelines.actions.states import CANCELED, FAILED, IN_PROGRESS, QUEUED, SUCCEEDED, TIMED_OUT, StatusReport
from tests.e2e.broker_clients import PahoClient
from tests.e2e.ota.conftest import action_row, epoch_ms, register_devices, write_actions
from tests.e2e.ota.rollout_harness import finals, rollout_run
from tests.fleet_harness import FleetHarness, FleetSpec, quiet_devices


class ManualClock:
    def __init__(self) -> None:
        import time

        self.now = int(time.time() * 1000)

    def __call__(self) -> int:
        return self.now


def executions(store, action_id: str) -> dict[str, dict]:
    table = store.read_arrow("action_executions")
    table = table.filter(pc.equal(table["action_id"], action_id))
    return {row["device_id"]: row for row in table.to_pylist()}


def summary(store, action_id: str) -> dict:
    table = store.read_arrow("action_summary")
    rows = table.filter(pc.equal(table["action_id"], action_id)).to_pylist()
    assert len(rows) == 1
    return rows[0]


def make_engine(store, broker, clock=None) -> ActionsEngine:
    publisher = MqttPublisher([broker], client_id="actions-test")
    return ActionsEngine(store, publisher, clock=clock) if clock else ActionsEngine(store, publisher)


def test_group_broadcast_reaches_the_group_and_completes(table_store, mosquitto):
    spec = FleetSpec(brokers=[mosquitto], count=6, groups=["g1", "g2"])
    with FleetHarness(mosquitto, spec, quiet_devices()) as harness:
        register_devices(table_store, {d.device_id: d.group for d in harness.fleet.devices})
        engine = make_engine(table_store, mosquitto)
        row = action_row("a-1", group="g1")
        write_actions(table_store, [row], 0)
        engine.on_action_rows([row], "fanout", 0)
        queued = executions(table_store, "a-1")
        assert {r["state"] for r in queued.values()} == {QUEUED}
        assert len(queued) == 3 and all(r["published_at"] is not None for r in queued.values())

        harness.wait_until(lambda: harness.fleet.finished("a-1") == 3)
        harness.wait_until(lambda: sum(r.state == SUCCEEDED for r in harness.reports) == 3)
        reports = harness.take_reports()
        engine.on_reports(reports, "reports", 0)
        final = executions(table_store, "a-1")
        assert {r["state"] for r in final.values()} == {SUCCEEDED}
        assert all(r["started_at"] <= r["finished_at"] for r in final.values())
        result = summary(table_store, "a-1")
        assert (result["succeeded_count"], result["total_count"], result["action_state"]) == (
            3,
            3,
            "COMPLETED",
        )

        versions = (table_store.version("action_executions"), table_store.version("action_summary"))
        engine.on_reports(reports, "reports", 0)  # a replayed micro-batch
        engine.on_reports(reports, "reports", 1)  # the same reports again in a later batch: stale, ignored
        assert table_store.version("action_executions") == versions[0]
        assert executions(table_store, "a-1") == final
        engine.publisher.close()


def test_failures_abort_a_paced_rollout_and_cancel_the_rest(table_store, mosquitto):
    clock = ManualClock()
    spec = FleetSpec(brokers=[mosquitto], count=6, groups=["g"])
    with FleetHarness(mosquitto, spec, quiet_devices(failure_rate=1.0)) as harness:
        register_devices(table_store, {d.device_id: d.group for d in harness.fleet.devices})
        engine = make_engine(table_store, mosquitto, clock)
        row = action_row("a-2", group="g", max_per_minute=60, failure_pct=50.0, min_executed=2)
        write_actions(table_store, [row], 0)
        engine.on_action_rows([row], "fanout", 0)
        assert sum(r["published_at"] is not None for r in executions(table_store, "a-2").values()) == 1
        clock.now += 1_000  # one more device per second at 60/min
        engine.tick()
        assert sum(r["published_at"] is not None for r in executions(table_store, "a-2").values()) == 2

        harness.wait_until(lambda: sum(r.state == FAILED for r in harness.reports) == 2)
        engine.on_reports(harness.take_reports(), "reports", 0)
        final = executions(table_store, "a-2")
        states = sorted(r["state"] for r in final.values())
        assert states == [CANCELED] * 4 + [FAILED] * 2
        aborted = summary(table_store, "a-2")
        assert aborted["action_state"] == "ABORTED"
        assert aborted["reason"] == (
            "abort_criteria.failure_pct 50 % reached: 2 of 2 finished devices failed or timed out "
            "(100.0 %; abort_criteria.min_executed 2)"
        )
        clock.now += 60_000
        engine.tick()  # an aborted rollout publishes nothing more
        assert sum(r["published_at"] is not None for r in executions(table_store, "a-2").values()) == 2
        assert sum(1 for d in harness.fleet.devices if "a-2" in d.actions) == 2
        engine.publisher.close()


def test_in_progress_timeout_and_operator_cancel(table_store, mosquitto):
    clock = ManualClock()
    spec = FleetSpec(brokers=[mosquitto], count=4, groups=["g"])
    with FleetHarness(mosquitto, spec, quiet_devices(download_delay_s=(60.0, 60.0))) as harness:
        devices = [d.device_id for d in harness.fleet.devices]
        engine = make_engine(table_store, mosquitto, clock)
        slow = action_row("a-3", device_ids=devices[:2], timeout_s=5)
        canceled_later = action_row("a-4", device_ids=devices[2:])
        write_actions(table_store, [slow, canceled_later], 0)
        engine.on_action_rows([slow, canceled_later], "fanout", 0)
        harness.wait_until(lambda: sum(r.state == IN_PROGRESS for r in harness.reports) == 4)
        started = harness.take_reports()
        engine.on_reports(started, "reports", 0)

        # past the time-out counted from when the reports were received, not from the clock's start
        clock.now = max(report.at for report in started) + 6_000
        engine.tick()
        assert {r["state"] for r in executions(table_store, "a-3").values()} == {TIMED_OUT}
        assert summary(table_store, "a-3")["timed_out_count"] == 2

        cancel = dict(canceled_later, cancel=True)
        write_actions(table_store, [cancel], 1)
        engine.on_action_rows([cancel], "fanout", 1)
        harness.wait_until(lambda: sum(r.state == CANCELED for r in harness.reports) == 2)
        engine.on_reports(harness.take_reports(), "reports", 1)
        assert {r["state"] for r in executions(table_store, "a-4").values()} == {CANCELED}
        canceled = summary(table_store, "a-4")
        assert (canceled["action_state"], canceled["reason"]) == ("CANCELED", "canceled by operator")
        engine.publisher.close()


def test_time_outs_count_from_when_reports_were_received_whatever_the_devices_clocks(table_store, mosquitto):
    """Devices stamp reports with their own clock: one an hour behind, one an hour ahead, one that booted at
    1970 without a real-time clock. The rows keep the platform's times (when the broker took each report in),
    so each device is timed out 60 s after its report arrived: not at the first tick, not an hour late."""
    clock = ManualClock()
    engine = make_engine(table_store, mosquitto, clock)
    hour = 3_600_000
    received = clock.now
    device_clocks = {"clock-behind": received - hour, "clock-ahead": received + hour, "clock-at-1970": 1}
    row = action_row("a-5", device_ids=[*device_clocks, "finishes-at-1970"], timeout_s=60)
    write_actions(table_store, [row], 0)
    engine.on_action_rows([row], "fanout", 0)
    started = [
        StatusReport("a-5", device, IN_PROGRESS, 1, ts, "downloading", 1, received_at=received)
        for device, ts in {**device_clocks, "finishes-at-1970": 1}.items()
    ]
    engine.on_reports(started, "reports", 0)
    done = StatusReport(
        "a-5", "finishes-at-1970", SUCCEEDED, 2, 2, "installed", 1, received_at=received + 1_000
    )
    engine.on_reports([done], "reports", 1)

    rows = executions(table_store, "a-5")
    assert {device: epoch_ms(r["started_at"]) for device, r in rows.items()} == dict.fromkeys(rows, received)
    assert epoch_ms(rows["finishes-at-1970"]["finished_at"]) == received + 1_000
    assert epoch_ms(rows["finishes-at-1970"]["updated_at"]) == received + 1_000

    clock.now = received + 59_000
    engine.tick()
    assert {d: r["state"] for d, r in executions(table_store, "a-5").items()} == {
        **dict.fromkeys(device_clocks, IN_PROGRESS),
        "finishes-at-1970": SUCCEEDED,
    }
    clock.now = received + 61_000
    engine.tick()
    assert {d: r["state"] for d, r in executions(table_store, "a-5").items()} == {
        **dict.fromkeys(device_clocks, TIMED_OUT),
        "finishes-at-1970": SUCCEEDED,
    }
    assert summary(table_store, "a-5")["timed_out_count"] == 3
    engine.publisher.close()


def test_a_row_written_without_an_id_is_ignored_with_a_warning_and_the_rest_are_sent(
    table_store, mosquitto, caplog
):
    """A table created by hand with every column nullable (SQL ``CREATE TABLE`` without ``NOT NULL``) can
    hold a row without an id: nothing can name its summary, so it is skipped, and its batch is not lost."""
    import logging

    import pyarrow as pa
    from deltalake import write_deltalake

    caplog.set_level(logging.WARNING, logger="pipelines.actions.engine")
    nullable = pa.schema([c.with_nullable(True) for c in table_store.spec("actions").arrow_schema])
    rows = [dict(action_row("no-id", group="g1"), id=None), action_row("sent", group="g1")]
    write_deltalake(table_store.location("actions"), pa.Table.from_pylist(rows, schema=nullable))
    spec = FleetSpec(brokers=[mosquitto], count=2, groups=["g1"])
    with FleetHarness(mosquitto, spec, quiet_devices()) as harness:
        register_devices(table_store, {d.device_id: d.group for d in harness.fleet.devices})
        engine = make_engine(table_store, mosquitto)
        engine.on_action_rows(table_store.read_arrow("actions").to_pylist(), "fanout", 0)
        assert {r["state"] for r in executions(table_store, "sent").values()} == {QUEUED}
        engine.tick()  # reads every row of the table, the one without an id included
        harness.wait_until(lambda: harness.fleet.finished("sent") == 2)
    summaries = table_store.read_arrow("action_summary").column("action_id").to_pylist()
    assert summaries == ["sent"]
    warned = [r.getMessage() for r in caplog.records if "without an id" in r.getMessage()]
    assert warned == ["an actions row without an id is ignored: nothing can name its action"]


def test_devices_whose_sends_a_failed_write_did_not_record_are_counted_and_not_sent_again(
    tmp_path, monkeypatch
):
    """The fan-out publishes, then its write recording the sends fails (a store error): the devices took
    the action and reported. Their rows were written before the publish, marked as being sent, so their
    reports are taken at once, and Spark's replay of the failed batch publishes nothing again. Before, the
    rows were written only after the publish: the reports found no row and were left out, and only the
    replay's second publish, which every device answered with its latest report again, completed it."""
    with rollout_run(tmp_path, quiet_devices(), count=4) as run:
        devices = sorted(d.device_id for d in run.fleet.devices)
        write = run.engine.tables.write_executions
        writes: list[str] = []

        def failing_after_the_publish(rows, app_id, batch_id):
            writes.append(app_id)
            if app_id == "fanout/executions" and writes.count(app_id) == 1:
                raise OSError("injected failure of the write recording the sends")
            return write(rows, app_id, batch_id)

        monkeypatch.setattr(run.engine.tables, "write_executions", failing_after_the_publish)
        row = action_row("rw-1", device_ids=devices)
        write_actions(run.store, [row], 0)
        with pytest.raises(OSError):
            run.engine.on_action_rows([row], "fanout", 0)
        run.feed(lambda reports: finals(reports, "rw-1") == len(devices))
        assert run.states("rw-1") == {SUCCEEDED: len(devices)}
        run.engine.on_action_rows([row], "fanout", 0)  # Spark's replay of the failed batch
        assert run.summary("rw-1")["action_state"] == "COMPLETED"
        assert run.fleet.stats["actions_received"] == len(devices)  # each device sent it once
        assert run.fleet.stats["reported_SUCCEEDED"] == len(devices)


def test_a_restarted_job_replaying_an_ended_actions_first_row_says_nothing_of_a_change(
    table_store, mosquitto, caplog
):
    """A job started again reads the change feed from its checkpoint, or from the start: the row an ended
    action was created with came back as 'changed after it ended', a WARNING per ended action though nobody
    changed one. The first row is replayed quietly; a row updated after the end is still said."""
    spec = FleetSpec(brokers=[mosquitto], count=2, groups=["g1"])
    with FleetHarness(mosquitto, spec, quiet_devices()) as harness:
        register_devices(table_store, {d.device_id: d.group for d in harness.fleet.devices})
        engine = make_engine(table_store, mosquitto)
        row = action_row("ended", group="g1")
        write_actions(table_store, [row], 0)
        engine.on_action_rows([row], "fanout", 0)
        harness.wait_until(lambda: sum(r.state == SUCCEEDED for r in harness.reports) == 2)
        engine.on_reports(harness.take_reports(), "reports", 0)
        assert summary(table_store, "ended")["action_state"] == "COMPLETED"
        engine.publisher.close()

        restarted = make_engine(table_store, mosquitto)
        caplog.set_level("WARNING", logger="pipelines.actions.engine")
        restarted.on_action_rows([dict(row, _change_type="insert", _commit_version=1)], "fanout", 0)
        assert not [r.message for r in caplog.records if "changed after it ended" in r.message]
        updated = dict(row, _change_type="update_postimage", _commit_version=2)
        updated["payload"] = dict(row["payload"], version="3.0.0")
        restarted.on_action_rows([updated], "fanout", 1)
        assert [r.message for r in caplog.records if "changed after it ended" in r.message]
        assert summary(table_store, "ended")["action_state"] == "COMPLETED"
        assert harness.fleet.finished("ended") == 2
        restarted.publisher.close()


def test_a_report_with_a_lone_surrogate_in_its_details_lands_with_its_batch(table_store, mosquitto):
    """A device's report whose ``details`` JSON-escapes half of a UTF-16 pair (``\\ud800``, from a device's
    buggy string handling) failed the write of its whole batch, at every replay, so no report of the batch
    (other devices' included) ever reached the tables; it is now taken, the half pair kept escaped."""
    register_devices(table_store, {"d1": "g", "d2": "g"})
    engine = make_engine(table_store, mosquitto)
    try:
        row = action_row("a-1", group="g")
        write_actions(table_store, [row], 0)
        engine.on_action_rows([row], "fanout", 0)
        body = {"action_id": "a-1", "state": "FAILED", "seq": 1, "ts": 1, "details": "flash \ud800 error"}
        payloads = [json.dumps(body | {"device_id": "d1"}).encode()]
        payloads.append(json.dumps(body | {"device_id": "d2", "state": "SUCCEEDED", "details": ""}).encode())
        reports = [parse_report(payload, received_at=engine.clock()) for payload in payloads]
        engine.on_reports([r for r in reports if r is not None], "reports", 0)
        rows = executions(table_store, "a-1")
        assert (rows["d1"]["state"], rows["d1"]["status_details"]) == (FAILED, "flash \\ud800 error")
        assert rows["d2"]["state"] == SUCCEEDED
    finally:
        engine.publisher.close()


def test_a_running_action_whose_row_is_deleted_by_hand_ends_canceled_also_after_a_restart(
    table_store, mosquitto
):
    """``DELETE FROM actions WHERE id = ...`` on a paced rollout: the action stayed IN_PROGRESS for ever with
    nothing said (no row: no pacing, timeout, expiry or cancel; ``timestone ota cancel`` knows no such
    action). Now the next tick, of this engine or of one started after the delete, cancels the devices not
    sent it, tells the one that has it to stop, and ends the action CANCELED saying why."""
    register_devices(table_store, {f"d{n}": "g" for n in range(3)})
    device = PahoClient(mosquitto[1], "watcher")
    device.subscribe("actions/#", 1)
    clock = ManualClock()
    engine = make_engine(table_store, mosquitto, clock)
    try:
        row = action_row("a-del", group="g", max_per_minute=1)
        write_actions(table_store, [row], 0)
        engine.on_action_rows([row], "fanout", 0)
        (sent,) = device.expect(1)
        first = json.loads(sent.payload)["device_ids"]
        DeltaTable(table_store.location("actions")).delete("id = 'a-del'")
    finally:
        engine.publisher.close()
    clock.now += 120_000
    restarted = make_engine(table_store, mosquitto, clock)
    try:
        restarted.tick()
        rows = executions(table_store, "a-del")
        assert {d: r["state"] for d, r in rows.items() if d not in first} == {
            d: CANCELED for d in rows if d not in first
        }
        assert all(rows[d]["published_at"] is None for d in rows if d not in first)
        result = summary(table_store, "a-del")
        assert (result["action_state"], result["reason"]) == ("CANCELED", "its row was deleted from actions")
        (told,) = device.expect(1)
        assert json.loads(told.payload) | {"issued_at": 0} == {
            "action_id": "a-del",
            "kind": "cancel",
            "issued_at": 0,
            "device_ids": first,
        }
        restarted.tick()  # ended: nothing more
        device.expect_none(0.3)
    finally:
        restarted.publisher.close()
        device.disconnect()
