"""Concurrent writers on one table, as two streaming queries of one driver are: threads calling one store.

``foreachBatch`` functions of different queries run on different driver threads, so threads sharing a
store are exactly the production situation, without the seconds a pair of streaming queries would cost.
"""

from __future__ import annotations

import threading

from sinks.delta_rs import DeltaRsTableStore
from tests.e2e.sinks.conftest import arrow_rows, bronze_row, execution_row

BATCHES = 8


def run_together(*workers) -> list[BaseException]:
    errors: list[BaseException] = []
    start = threading.Barrier(len(workers))

    def wrap(work):
        def target():
            start.wait()
            try:
                work()
            except BaseException as exc:
                errors.append(exc)

        return target

    threads = [threading.Thread(target=wrap(w)) for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return errors


def test_two_appenders_each_land_every_batch_once(tmp_path):
    store = DeltaRsTableStore(None, str(tmp_path / "lake"))
    store.ensure("bronze_telemetry")

    def appender(broker: str):
        def work():
            for batch in range(BATCHES):
                rows = [bronze_row(batch * 10 + i, broker=broker) for i in range(3)]
                assert store.append("bronze_telemetry", arrow_rows("bronze_telemetry", rows), broker, batch)

        return work

    assert run_together(appender("b1"), appender("b2")) == []
    rows = store.read_arrow("bronze_telemetry").select(["broker", "offset"]).to_pylist()
    assert len(rows) == 2 * BATCHES * 3
    assert len({(r["broker"], r["offset"]) for r in rows}) == len(rows)
    assert store.committed_batch("bronze_telemetry", "b1") == BATCHES - 1
    assert store.committed_batch("bronze_telemetry", "b2") == BATCHES - 1


def test_conflicting_merges_are_retried_until_both_land(tmp_path):
    store = DeltaRsTableStore(None, str(tmp_path / "lake"))
    store.ensure("action_executions")

    def merger(action_id: str):
        def work():
            for batch in range(BATCHES):
                row = execution_row("d1", "IN_PROGRESS", batch + 1, action_id=action_id)
                table = arrow_rows("action_executions", [row])
                assert store.merge(
                    "action_executions", table, action_id, batch, update_when="s.version > t.version"
                )

        return work

    assert run_together(merger("a1"), merger("a2")) == []
    rows = {r["action_id"]: r["version"] for r in store.read_arrow("action_executions").to_pylist()}
    assert rows == {"a1": BATCHES, "a2": BATCHES}


def test_two_attempts_of_one_batch_write_it_once(tmp_path):
    """A zombie and its restarted query racing on the same (app id, batch id): one commit wins."""
    store = DeltaRsTableStore(None, str(tmp_path / "lake"))
    store.ensure("bronze_telemetry")
    batch = arrow_rows("bronze_telemetry", [bronze_row(0), bronze_row(1)])
    results: list[bool] = []

    def attempt():
        results.append(store.append("bronze_telemetry", batch, "q", 5))

    assert run_together(attempt, attempt) == []
    assert sorted(results) == [False, True]
    assert store.read_arrow("bronze_telemetry").num_rows == 2
