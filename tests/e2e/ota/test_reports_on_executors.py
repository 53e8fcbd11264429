"""The reports stream's work on the executors (``reports.fold_batch``): a batch's reports are parsed, checked
for who sent them and folded per (action, device) in its Spark tasks, and the driver receives one row per
pair, never a report. The engine writes from those rows what it writes from the reports themselves (real
Spark, real Delta tables, the action sent through a real broker)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pyarrow.compute as pc
import pytest

from pipelines.actions.buckets import bucket_of, report_topic
from pipelines.actions.engine import ActionsEngine
from pipelines.actions.model import parse_reports
from pipelines.actions.publisher import MqttPublisher
from pipelines.actions.reports import FoldedReports, fold_batch
from pipelines.actions.states import FAILED, IN_PROGRESS, SUCCEEDED
from sinks.backends import open_table_store
from tests.e2e.ota.conftest import action_row, write_actions

DEVICES = ["d1", "d2", "d3"]
RECORDS = "payload binary, timestamp timestamp, topic string, client_id string"


def _record(device_id: str, state: str, seq: int, client_id: str | None = None) -> tuple:
    """A report's record as the ``timestone`` source reads it: on the device's bucket topic, appended at a
    time of its sequence number, by ``client_id`` (the device itself unless said)."""
    body = {
        "action_id": "a-1",
        "device_id": device_id,
        "state": state,
        "seq": seq,
        "ts": 1,
        "details": f"{seq}",
    }
    at = datetime.fromtimestamp(1_800_000_000 + seq, UTC)
    return (json.dumps(body).encode(), at, report_topic(bucket_of(device_id, 1024)), client_id or device_id)


class _Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000_000

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def engines(tmp_path, mosquitto):
    """Two engines on tables of their own that sent one action to ``DEVICES`` at the same time: one takes
    batches folded on the executors, the other their reports."""
    clock = _Clock()
    made = []
    for name in ("folded", "reports"):
        store = open_table_store(None, str(tmp_path / name), backend="delta-rs")
        engine = ActionsEngine(store, MqttPublisher([mosquitto], client_id=f"actions-{name}"), clock=clock)
        row = action_row("a-1", device_ids=DEVICES)
        write_actions(store, [row], 0)
        engine.on_action_rows([row], "fanout", 0)
        made.append(engine)
    yield made
    for engine in made:
        engine.publisher.close()


def _take(spark, engines, records: list[tuple], batch_id: int, slices: bool = False) -> FoldedReports:
    """One batch of ``records`` in three Spark tasks, each reading whole topics as the ``timestone`` source
    does (``slices``: each reading every third record, as a topic read in slices): folded for the first
    engine, as reports for the second."""
    records_df = spark.createDataFrame(records, RECORDS)
    batch = records_df.repartition(3) if slices else records_df.repartition(3, "topic")
    folded = fold_batch(batch, "client_id")
    engines[0].on_reports(folded, "reports/q", batch_id)
    engines[1].on_reports(parse_reports(batch.toArrow(), "client_id"), "reports/q", batch_id)
    return folded


def _executions(engine: ActionsEngine) -> list[dict]:
    table = engine.tables.store.read_arrow("action_executions")
    return sorted(table.filter(pc.equal(table["action_id"], "a-1")).to_pylist(), key=lambda r: r["device_id"])


def test_a_batch_of_many_reports_per_device_reaches_the_driver_as_one_row_per_device(spark, engines):
    records = [_record(d, IN_PROGRESS, seq) for seq in range(1, 31) for d in DEVICES]
    folded = _take(spark, engines, records, 0)
    assert sorted(folded.by_key) == [("a-1", d) for d in DEVICES]
    assert folded.received == len(DEVICES)  # one row per device, of 90 reports
    assert folded.expanded == 0
    rows = _executions(engines[0])
    assert [(r["state"], r["report_seq"], r["version"]) for r in rows] == [(IN_PROGRESS, 30, 33)] * 3
    assert rows == _executions(engines[1])

    again = [_record("d1", IN_PROGRESS, 30), *(_record("d1", IN_PROGRESS, s) for s in range(31, 36))]
    ends = [_record("d1", SUCCEEDED, 36), _record("d2", FAILED, 31), _record("d2", SUCCEEDED, 32)]
    folded = _take(spark, engines, [*again, *ends], 1)
    assert folded.received == 2  # d1, d2
    assert folded.expanded == 1  # d1's row has seen its report 30: only d1's reports are read again
    rows = _executions(engines[0])
    assert [(r["device_id"], r["state"]) for r in rows] == [
        ("d1", SUCCEEDED),
        ("d2", FAILED),
        ("d3", IN_PROGRESS),
    ]
    assert rows == _executions(engines[1])


def test_a_report_from_another_client_than_its_device_is_dropped_on_the_executors(spark, engines):
    forged = _record("d1", SUCCEEDED, 9, client_id="d2")
    records = [
        _record("d1", IN_PROGRESS, 1),
        forged,
        _record("d2", IN_PROGRESS, 1),
        (b"not a report", *forged[1:]),
    ]
    folded = _take(spark, engines, records, 0)
    assert folded.impostor_count == 1 and folded.impostors == ["d2 for d1"]
    assert folded.not_reports == 1
    assert sorted(folded.by_key) == [("a-1", "d1"), ("a-1", "d2")]
    assert folded.by_key[("a-1", "d1")].row.state == IN_PROGRESS
    rows = _executions(engines[0])
    assert [r["state"] for r in rows] == [IN_PROGRESS, IN_PROGRESS, "QUEUED"]
    assert rows == _executions(engines[1])


def test_a_device_whose_reports_several_tasks_read_is_folded_again_after_a_shuffle(spark, engines):
    # each device's reports one after another: round robin spreads them over the tasks
    records = [_record(d, IN_PROGRESS, seq) for d in DEVICES for seq in range(1, 13)]
    folded = _take(spark, engines, [*records, _record("d3", SUCCEEDED, 13)], 0, slices=True)
    assert folded.refolded == {("a-1", d) for d in DEVICES}
    assert folded.expanded == 0  # no report reached the driver
    assert folded.received <= 3 * len(DEVICES) + len(DEVICES)  # a fold per task and device, then one each
    rows = _executions(engines[0])
    assert [(r["state"], r["report_seq"], r["version"]) for r in rows] == [
        (IN_PROGRESS, 12, 15),
        (IN_PROGRESS, 12, 15),
        (SUCCEEDED, 13, 16),
    ]
    assert rows == _executions(engines[1])
