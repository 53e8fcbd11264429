"""Status reports read from the ``timestone`` source's records: what is a report, and when it was received."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pyarrow as pa

from pipelines.actions.model import parse_report, parse_reports
from pipelines.actions.states import IN_PROGRESS, SUCCEEDED, StatusReport
from sources.slice_reader import SOURCE_ARROW_SCHEMA


def record(payload: bytes, appended: datetime) -> dict:
    return {
        "broker": "b1",
        "topic": "actions/reports/7",
        "offset": 0,
        "timestamp": appended,
        "client_id": "dev-1",
        "qos": 1,
        "retain": False,
        "properties": [],
        "payload": payload,
    }


def report_payload(state: str, seq: int, ts: int) -> bytes:
    return json.dumps(
        {"action_id": "a1", "device_id": "dev-1", "state": state, "seq": seq, "ts": ts}
    ).encode()


def test_each_report_is_received_when_the_broker_appended_its_record_not_at_the_devices_ts():
    appended = datetime(2026, 11, 27, 12, 0, 0, 123_456, tzinfo=UTC)
    records = pa.Table.from_pylist(
        [
            record(report_payload(IN_PROGRESS, 1, 1), appended),  # a device whose clock says 1970
            record(b"not json", appended),
            record(json.dumps({"action_id": "a1", "state": SUCCEEDED}).encode(), appended),  # no device, seq
            record(report_payload("QUEUED", 2, 1), appended),  # a state only the platform sets
            record(report_payload(SUCCEEDED, 3, 2), appended.replace(second=5)),
        ],
        schema=SOURCE_ARROW_SCHEMA,
    )
    reports = parse_reports(records)
    appended_ms = int(appended.timestamp() * 1000)  # the append time, truncated to the millisecond
    assert [(r.state, r.ts, r.received_at, r.at) for r in reports] == [
        (IN_PROGRESS, 1, appended_ms, appended_ms),
        (SUCCEEDED, 2, appended_ms + 5_000, appended_ms + 5_000),
    ]


def test_a_report_of_unknown_receipt_is_timed_by_its_own_ts():
    """What the engine is handed without a receipt time (a caller of ``on_reports`` of its own)."""
    report = parse_report(report_payload(IN_PROGRESS, 1, 1_234))
    assert report == StatusReport("a1", "dev-1", IN_PROGRESS, 1, 1_234)
    assert report.at == 1_234


def _sent(client_id: str, device_id: str, topic: str = "actions/reports/7") -> dict:
    appended = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
    payload = json.dumps({"action_id": "a1", "device_id": device_id, "state": "FAILED", "seq": 1, "ts": 1})
    return record(payload.encode(), appended) | {"client_id": client_id, "topic": topic}


def test_a_report_on_a_shared_topic_counts_only_for_the_client_that_sent_it():
    records = pa.Table.from_pylist(
        [
            _sent("dev-2", "dev-1"),  # dev-2 failing dev-1 on their bucket's topic
            _sent("dev-1", "dev-1"),
            _sent("dev-3", "dev-3", topic="devices/dev-3/actions"),
            _sent("gateway", "dev-4", topic="devices/dev-4/actions"),  # its own topic: the ACL ties it
        ],
        schema=SOURCE_ARROW_SCHEMA,
    )
    impostors: list[str] = []

    taken = parse_reports(records, "client_id", impostors)

    assert [r.device_id for r in taken] == ["dev-1", "dev-3", "dev-4"]
    assert impostors == ["dev-2 for dev-1"]
    believed = parse_reports(records, "payload")
    assert [r.device_id for r in believed] == ["dev-1", "dev-1", "dev-3", "dev-4"]
    without_senders = parse_reports(records.select(["payload", "timestamp", "topic"]))
    assert len(without_senders) == 4  # nothing to check them against


def test_a_lone_surrogate_is_escaped_in_details_and_makes_an_id_no_report():
    """JSON may escape half of a UTF-16 pair (``\\ud800``), which no UTF-8 column holds: in ``details`` it is
    kept escaped and the report taken; in an id no device or action can have it, and it is no report."""

    def payload(**fields: str) -> bytes:
        body = {"action_id": "a1", "device_id": "dev-1", "state": "FAILED", "seq": 1, "ts": 1} | fields
        return json.dumps(body).encode()  # json.dumps writes a lone surrogate as its \\ud800 escape

    report = parse_report(payload(details="flash \ud800 error"))
    assert report is not None
    assert report.details == "flash \\ud800 error"
    report.details.encode()  # a column can hold it
    assert parse_report(payload(device_id="dev-\udfff")) is None
    assert parse_report(payload(action_id="a\ud83d")) is None


def test_a_report_of_seq_0_is_no_report_rather_than_one_dropped_unseen():
    """An execution with no report applied holds ``report_seq`` 0 and takes only a greater one: a device that
    counted its reports from 0 had its first report (its only one, for a device that reports just its
    outcome) dropped as stale with nothing said. ``seq`` starts at 1: 0 is not a report, so the job counts
    and logs it as one of the status messages it skipped."""
    body = {"action_id": "a1", "device_id": "dev-1", "state": SUCCEEDED, "ts": 1}
    assert parse_report(json.dumps(body | {"seq": 0}).encode()) is None
    report = parse_report(json.dumps(body | {"seq": 1}).encode())
    assert report is not None and report.seq == 1
    records = pa.Table.from_pylist(
        [record(json.dumps(body | {"seq": 0}).encode(), datetime(2026, 12, 1, tzinfo=UTC))],
        schema=SOURCE_ARROW_SCHEMA,
    )
    assert parse_reports(records) == []


def test_details_null_is_no_details_not_the_word_none():
    """A device sending ``"details": null`` had "None" written as its execution's details (and shown by
    ``timestone ota status``); null is no details."""
    body = {"action_id": "a1", "device_id": "dev-1", "state": SUCCEEDED, "seq": 1, "ts": 1, "details": None}
    report = parse_report(json.dumps(body).encode())
    assert report is not None and report.details == ""


def test_details_that_are_not_text_are_kept_as_the_json_the_device_sent():
    """``"details": {"code": 5, "ok": false}`` was written as Python's ``{'code': 5, 'ok': False}``, which no
    JSON reader of the column takes; it is kept as JSON."""
    body = {"action_id": "a1", "device_id": "dev-1", "state": SUCCEEDED, "seq": 1, "ts": 1}
    report = parse_report(json.dumps(body | {"details": {"code": 5, "ok": False, "at": "ü"}}).encode())
    assert report is not None and json.loads(report.details) == {"code": 5, "ok": False, "at": "ü"}
    report = parse_report(json.dumps(body | {"details": True}).encode())
    assert report is not None and report.details == "true"
