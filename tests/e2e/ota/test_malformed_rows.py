"""Rows written to ``actions`` by another tool are checked by the actions job before anything is sent.

Each malformed row is written straight to the table with delta-rs (``write_deltalake``, in the table's own
schema, as a notebook or another writer would): the job never publishes it, no device receives anything, and
its summary ends ``REJECTED`` with a reason naming the field. A valid row written in the same commit still
reaches its devices and completes.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from broker_edge.offsets_api.client import OffsetsClient
from pipelines.actions.engine import ActionsEngine
from pipelines.actions.publisher import MqttPublisher
from pipelines.actions.states import StatusReport
from pipelines.cli import main
from tests.e2e.ota.conftest import (
    action_row,
    actions_stack,
    register_devices,
    summary,
    wait_for,
    write_actions,
)
from tests.e2e.ota.rollout_harness import finals, rollout_run
from tests.fleet_harness import FleetHarness, FleetSpec, quiet_devices


def _malformed_rows() -> dict[str, tuple[dict, str]]:
    """Action id -> (row, the field its summary must name)."""
    no_target = action_row("no-target")  # device_ids null, group null, all false
    no_url = action_row("no-url", all_devices=True)
    no_url["payload"]["url"] = None
    firmware = action_row("kind-firmware", kind="firmware", all_devices=True)
    unsafe_group = action_row("group-wildcard", group="canary/+")
    window = {"start": "01:00", "duration_min": 240, "days": None, "time_zone": "Europe"}  # a directory
    zone_directory = action_row("zone-directory", group="canary", maintenance_windows=[window])
    return {
        "no-target": (no_target, "target"),
        "no-url": (no_url, "payload.url"),
        "kind-firmware": (firmware, "kind"),
        "group-wildcard": (unsafe_group, "target.group"),
        "zone-directory": (zone_directory, "maintenance_windows[0].time_zone"),
    }


FAR_FUTURE = "created-in-nanoseconds"


def _created_in_nanoseconds(table: pa.Table, action_id: str) -> pa.Table:
    """``table`` with the row of ``action_id`` created "now" in nanoseconds written as microseconds (about
    the year 58,900): a Delta timestamp any writer can store, which no Python ``datetime`` holds."""
    index = table.schema.get_field_index("created_at")
    ticks = table.column(index).cast(pa.int64()).to_pylist()
    ids = table.column("id").to_pylist()
    ticks[ids.index(action_id)] = int(datetime.now(UTC).timestamp() * 1e6) * 1000
    return table.set_column(index, table.field(index), pa.array(ticks, pa.timestamp("us", tz="UTC")))


def _logged_action_messages(offsets_url: str) -> list[bytes]:
    """Every message any action topic of the broker's log holds."""
    with OffsetsClient(offsets_url) as client:
        payloads: list[bytes] = []
        for log in client.list_logs("actions/#"):
            if log.topic.startswith("actions/reports/"):
                continue
            table = client.fetch_arrow(log.topic, log.start_offset, max_records=10_000)
            payloads += table.column("payload").to_pylist()
        return payloads


def test_malformed_rows_reach_no_device_and_are_rejected_naming_the_field(spark, tmp_path, caplog, capsys):
    caplog.set_level(logging.WARNING, logger="pipelines.actions.engine")
    caplog.set_level(logging.WARNING, logger="pipelines.actions.job")
    fleet_spec = {"count": 12, "groups": ["canary", "fleet"]}
    with actions_stack(spark, tmp_path, fleet_spec, quiet_devices()) as stack:
        store, fleet = stack.store, stack.fleet
        malformed = _malformed_rows()
        valid = action_row("valid", group="canary")
        location = store.location("actions")
        schema = pa.schema(DeltaTable(location).schema().to_arrow())  # the table's own schema
        rows = [row for row, _ in malformed.values()] + [valid, action_row(FAR_FUTURE, group="canary")]
        written = pa.Table.from_pylist(rows, schema=schema)
        write_deltalake(location, _created_in_nanoseconds(written, FAR_FUTURE), mode="append")
        malformed[FAR_FUTURE] = (rows[-1], "created_at")

        wait_for(lambda: (summary(store, "valid") or {}).get("action_state") == "COMPLETED", what="valid")
        canary = {d.device_id for d in fleet.devices if d.group == "canary"}
        assert {d.device_id for d in fleet.devices if "valid" in d.actions} == canary

        for action_id, (_, field) in malformed.items():
            result = summary(store, action_id)
            assert result is not None, f"{action_id} has no summary"
            assert result["action_state"] == "REJECTED", result
            assert result["reason"].startswith(f"{field}: "), result["reason"]
            assert result["total_count"] == 0
            assert all(action_id not in d.received_at for d in fleet.devices), action_id
            assert any(action_id in r.message and field in r.message for r in caplog.records), action_id
        assert fleet.stats["bad_actions"] == 0 and "actions_received" in fleet.stats
        stack.job.engine.tick()  # reads every row of the table, the malformed ones included: no raise
        failed = [r.getMessage() for r in caplog.records if r.name == "pipelines.actions.job"]
        assert not [m for m in failed if "failed" in m], failed

        messages = _logged_action_messages(stack.broker.offsets_url)
        assert any(b'"valid"' in m for m in messages)
        for action_id in malformed:
            assert not any(f'"{action_id}"'.encode() in m for m in messages), action_id
        executions = store.read_arrow("action_executions").column("action_id").to_pylist()
        assert set(executions) == {"valid"}

        capsys.readouterr()
        assert main(["ota", "--tables-root", stack.config.tables_root, "status", "no-url"]) == 0
        out = capsys.readouterr().out
        assert "state     REJECTED" in out and "reason    payload.url: required for an ota action" in out
        assert main(["ota", "--tables-root", stack.config.tables_root, "status", FAR_FUTURE]) == 0
        out = capsys.readouterr().out
        assert "state     REJECTED" in out and "reason    created_at: a timestamp after the year 9999" in out
        assert main(["ota", "--tables-root", stack.config.tables_root, "status"]) == 0
        assert FAR_FUTURE in capsys.readouterr().out


def test_a_rejected_action_stays_rejected_when_its_row_is_corrected(spark, tmp_path, caplog):
    """A corrected row under the id of a rejected action is not sent: the operator writes a new action."""
    caplog.set_level(logging.WARNING, logger="pipelines.actions.engine")
    with actions_stack(spark, tmp_path, {"count": 4, "groups": ["g"]}, quiet_devices()) as stack:
        store = stack.store
        broken = action_row("later-fixed", group="g")
        broken["payload"]["sha256"] = "not-a-checksum"
        table = pa.Table.from_pylist([broken], schema=store.spec("actions").arrow_schema)
        store.merge("actions", table, "tests/actions", 0)
        wait_for(
            lambda: (summary(store, "later-fixed") or {}).get("action_state") == "REJECTED", what="reject"
        )

        fixed = dict(action_row("later-fixed", group="g"), updated_at=datetime.now(UTC))
        store.merge("actions", pa.Table.from_pylist([fixed], schema=table.schema), "tests/actions", 1)
        wait_for(
            lambda: any("changed after it ended" in r.message for r in caplog.records), what="the warning"
        )
        stack.job.process_available()
        result = summary(store, "later-fixed")
        assert result is not None
        assert result["action_state"] == "REJECTED" and result["reason"].startswith("payload.sha256: ")
        assert all("later-fixed" not in d.received_at for d in stack.fleet.devices)


def test_a_running_action_whose_row_turns_invalid_goes_on_and_its_cancel_still_counts(
    table_store, mosquitto, caplog
):
    """A row overwritten with an invalid one after its action went out changes nothing of the action (the
    engine keeps it as it was sent, with a WARNING); a cancel flag set on that row still cancels it."""
    caplog.set_level(logging.WARNING, logger="pipelines.actions.engine")
    spec = FleetSpec(brokers=[mosquitto], count=4, groups=["g"])
    with FleetHarness(mosquitto, spec, quiet_devices(download_delay_s=(60.0, 60.0))) as harness:
        register_devices(table_store, {d.device_id: d.group for d in harness.fleet.devices})
        engine = ActionsEngine(table_store, MqttPublisher([mosquitto], client_id="actions-test"))
        row = action_row("r-1", group="g", timeout_s=3600)
        write_actions(table_store, [row], 0)
        engine.on_action_rows([row], "fanout", 0)
        harness.wait_until(lambda: harness.fleet.states("r-1").get("IN_PROGRESS") == 4)

        broken = dict(row, target={"device_ids": None, "group": None, "all": False})
        write_actions(table_store, [broken], 1)
        engine.on_action_rows([broken], "fanout", 1)
        assert any(
            "r-1: its row changed to an invalid one, it goes on as it was sent: target:" in r.message
            for r in caplog.records
        )
        engine.on_reports(harness.take_reports(), "reports", 0)
        engine.tick()
        current = summary(table_store, "r-1")
        assert current is not None
        assert (current["action_state"], current["in_progress_count"]) == ("IN_PROGRESS", 4)

        canceled = dict(broken, cancel=True)
        write_actions(table_store, [canceled], 2)
        engine.on_action_rows([canceled], "fanout", 2)
        harness.wait_until(lambda: harness.fleet.states("r-1").get("CANCELED") == 4)
        engine.on_reports(harness.take_reports(), "reports", 1)
        final = summary(table_store, "r-1")
        assert final is not None and final["action_state"] == "CANCELED"
        engine.publisher.close()


def _append(store, rows: list[dict]) -> None:
    """``rows`` appended in one commit, in the table's own schema, as a notebook would."""
    location = store.location("actions")
    schema = pa.schema(DeltaTable(location).schema().to_arrow())
    write_deltalake(location, pa.Table.from_pylist(rows, schema=schema), mode="append")


def _versions_sent(offsets_url: str, action_id: str) -> set[str]:
    sent = [json.loads(m) for m in _logged_action_messages(offsets_url)]
    return {m["version"] for m in sent if m.get("action_id") == action_id}


def test_two_rows_of_one_new_action_in_one_commit_reject_it_and_the_next_action_goes_out(
    spark, tmp_path, caplog
):
    """Which of two different rows under one id the operator meant is unknown: neither is sent."""
    caplog.set_level(logging.WARNING, logger="pipelines.actions.engine")
    with actions_stack(spark, tmp_path, {"count": 4, "groups": ["g"]}, quiet_devices()) as stack:
        store = stack.store
        two = [
            action_row("twice", group="g", version="2.0.0"),
            action_row("twice", group="g", version="3.0.0"),
        ]
        _append(store, [*two, action_row("next", group="g")])

        wait_for(lambda: (summary(store, "next") or {}).get("action_state") == "COMPLETED", what="next")
        result = summary(store, "twice")
        assert result is not None and result["action_state"] == "REJECTED", result
        assert result["reason"] == (
            "id: 2 rows with different content (payload.url, payload.version) in one commit, none taken: "
            "which one is meant is unknown (write one row per action)"
        )
        assert result["total_count"] == 0
        assert _versions_sent(stack.broker.offsets_url, "twice") == set()
        assert any(
            r.levelno == logging.WARNING
            and "action twice rejected, nothing published: id: 2 rows" in r.message
            for r in caplog.records
        )
        assert not any("under its id" in r.message for r in caplog.records)  # rejected: none taken


def test_a_row_appended_under_the_id_of_a_running_action_is_ignored_with_one_warning(spark, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="pipelines.actions.engine")
    with actions_stack(spark, tmp_path, {"count": 6, "groups": ["g"]}, quiet_devices()) as stack:
        store = stack.store
        _append(store, [action_row("paced", group="g", max_per_minute=30)])
        wait_for(lambda: _versions_sent(stack.broker.offsets_url, "paced") == {"2.0.0"}, what="first send")
        for _ in range(2):  # appended twice: warned about once
            _append(store, [action_row("paced", group="g", max_per_minute=30, version="9.9.9")])
        wait_for(lambda: (summary(store, "paced") or {}).get("action_state") == "COMPLETED", timeout_s=60)

        assert _versions_sent(stack.broker.offsets_url, "paced") == {"2.0.0"}
        assert {d.device_id for d in stack.fleet.devices if "paced" in d.actions} == {
            d.device_id for d in stack.fleet.devices
        }
        warned = [r for r in caplog.records if "paced: another row with other content" in r.message]
        assert len(warned) == 1 and warned[0].levelno == logging.WARNING
        assert "is ignored, the action goes on as it was sent" in warned[0].message


def test_a_job_started_after_a_row_was_appended_takes_the_row_created_first(table_store, mosquitto, caplog):
    """A restarted engine has only the table: of two rows under one id, the one created first is the action
    (what was sent), with a WARNING once."""
    caplog.set_level(logging.WARNING, logger="pipelines.actions.engine")
    register_devices(table_store, {f"d{i}": "g" for i in range(4)})
    first = action_row("paced", group="g", max_per_minute=1)
    write_actions(table_store, [first], 0)
    before = ActionsEngine(table_store, MqttPublisher([mosquitto], client_id="actions-test"))
    before.on_action_rows([first], "fanout", 0)  # sent to its first device; runs
    before.publisher.close()
    later = dict(action_row("paced", group="g", max_per_minute=1, version="9.9.9"))
    later["created_at"] = first["created_at"] + timedelta(minutes=1)
    _append(table_store, [later])
    engine = ActionsEngine(table_store, MqttPublisher([mosquitto], client_id="actions-test"))
    for _ in range(2):
        moved = dict(action_row("other", group="g"))  # the table moves: read again
        write_actions(table_store, [moved], 1)
        (paced,) = [a for a in engine._actions() if a.id == "paced"]
        assert paced.payload["version"] == "2.0.0"
    warned = [r.message for r in caplog.records if "paced: 2 rows with other content" in r.message]
    assert warned == [
        "action paced: 2 rows with other content under its id; the one created first is taken, "
        "the others are ignored"
    ]
    engine.publisher.close()


def test_a_row_appended_under_the_id_of_an_ended_action_is_warned_about_by_a_job_started_since(
    table_store, mosquitto, caplog
):
    """An action completed; while no job ran, a notebook appended a row with a new version under its id.
    Before, the job started afterwards (from its checkpoint: the appended row is all its feed reads) took
    that row for the action's own, said so only at DEBUG, and held the action as the new version from then
    on: the new version was never sent, and nothing said why. Now it compares the row with the one created
    first and logs one WARNING naming the action; the action's own row read again says nothing."""
    caplog.set_level(logging.DEBUG, logger="pipelines.actions.engine")
    register_devices(table_store, {"d0": "g"})
    first = action_row("ended", device_ids=["d0"])
    write_actions(table_store, [first], 0)
    before = ActionsEngine(table_store, MqttPublisher([mosquitto], client_id="actions-test"))
    before.on_action_rows([first], "fanout", 0)
    before.on_reports([StatusReport("ended", "d0", "SUCCEEDED", 1, 1)], "reports", 0)
    before.publisher.close()
    assert (summary(table_store, "ended") or {}).get("action_state") == "COMPLETED"

    later = dict(action_row("ended", device_ids=["d0"], version="3.0.0"))
    later["created_at"] = first["created_at"] + timedelta(minutes=1)
    _append(table_store, [later])
    engine = ActionsEngine(table_store, MqttPublisher([mosquitto], client_id="actions-test"))
    for batch in (1, 2):  # the appended row, then the feed replayed: one WARNING
        engine.on_action_rows([{**later, "_change_type": "insert", "_commit_version": 2}], "fanout", batch)
    engine.on_action_rows([{**first, "_change_type": "insert", "_commit_version": 1}], "fanout", 3)
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warned == [
        "action ended: another row with other content was appended under its id and is ignored, the action "
        "goes on as it was sent (write a new action, or update its row in place)"
    ]
    (ended,) = engine._actions(["ended"])
    assert ended.payload["version"] == "2.0.0"
    assert (summary(table_store, "ended") or {}).get("action_state") == "COMPLETED"
    engine.publisher.close()


def test_a_running_action_keeps_its_own_row_when_a_job_started_since_reads_a_row_appended_under_its_id(
    tmp_path,
):
    """A paced action runs; while no job ran, a row with another version was appended under its id, and the
    job started afterwards reads it from its change feed before its first tick. Before, it took that row
    for the action's own and its ticks sent the next devices the appended version; now they get the one
    the action was sent with."""
    with rollout_run(tmp_path, quiet_devices(), count=3) as run:
        first = action_row("paced-2", group="g", max_per_minute=1)
        run.create(first)  # sent to its first device; runs
        later = dict(action_row("paced-2", group="g", max_per_minute=1, version="9.9.9"))
        later["created_at"] = first["created_at"] + timedelta(minutes=1)
        _append(run.store, [later])
        engine = ActionsEngine(run.store, run.engine.publisher, clock=run.clock, compliance_interval_s=0)
        engine.on_action_rows([{**later, "_change_type": "insert", "_commit_version": 2}], "fanout", 1)
        run.clock.now = run.clock.at(300)
        engine.tick()
        run.harness.wait_until(lambda: finals(list(run.harness.reports), "paced-2") == 3, 20)
        assert {d.firmware for d in run.fleet.devices} == {"2.0.0"}
