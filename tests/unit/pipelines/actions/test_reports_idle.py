"""When the actions job's reports stream says it has caught up from its query's status alone: its last
trigger found nothing new and no trigger runs. Spark 4 keeps a status per batch, and a batch about to start
is the query's with its initial status (neither active nor with data) before its trigger starts: a ticker
that read the status then took a stream as caught up right after a batch that had not read every report (a
batch replayed after a restart, planned by the run that died), and sent a rollout's messages again to
devices whose answers were still unread."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from pyspark.sql.streaming import StreamingQuery

from pipelines.actions.reports import ReportStream

NOW_MS = 1_796_124_960_000
TRIGGER_MS = 1_000
REPLAYED = {
    "timestamp": "2026-12-01T11:35:00.000Z",
    "sources": [{"latestOffset": None, "endOffset": {"edge": {"devices/d1/ota/report": 2}}}],
}
"""A batch replayed after a restart: Spark gives it no latest offsets (it planned nothing)."""


@dataclass
class Query:
    """A streaming query's ``status`` and ``lastProgress``, as Spark shows them at one moment."""

    status: dict
    lastProgress: dict | None


def status(message: str, active: bool = False, data: bool = False) -> dict:
    return {"message": message, "isDataAvailable": data, "isTriggerActive": active}


def read_until(query: Query) -> int:
    stream = ReportStream(lambda brokers: cast(StreamingQuery, query), [])
    stream.start()
    return stream.read_until(NOW_MS, TRIGGER_MS)


def test_a_batch_about_to_start_after_one_that_read_short_is_not_caught_up():
    assert read_until(Query(status("Initializing StreamExecution"), REPLAYED)) == 0


def test_a_trigger_that_found_nothing_new_is_caught_up_two_trigger_intervals_back():
    for message in ("Waiting for next trigger", "Waiting for data to arrive", "a message of another Spark"):
        assert read_until(Query(status(message), REPLAYED)) == NOW_MS - 2 * TRIGGER_MS, message


def test_a_trigger_running_or_one_that_had_data_is_not_caught_up():
    for shown in (
        status("Processing new data", active=True, data=True),
        status("Getting offsets from timestone", active=True),
        status("Waiting for next trigger", data=True),
    ):
        assert read_until(Query(shown, REPLAYED)) == 0, shown
