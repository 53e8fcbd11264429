"""Retries per device by failure kind, with a limit and a backoff, with a simulated fleet on a real broker.

A device that failed is queued again with its next attempt in the same write as its failure, sent a retry
notice (the action message with ``attempt``) once the backoff has passed, and starts again; the execution row
records the attempt, and the summary counts the retries. A device whose retries ran out stays failed; a
report from an attempt that was retried since changes nothing.
"""

from __future__ import annotations

from pipelines.actions.states import StatusReport
from tests.e2e.ota.conftest import action_row
from tests.e2e.ota.rollout_harness import finals, rollout_run
from tests.fleet_harness import quiet_devices


def retry(kind: str, retries: int, backoff_s: int = 0, factor: float | None = None) -> dict:
    return {"failure_kind": kind, "max_retries": retries, "backoff_s": backoff_s, "backoff_factor": factor}


def test_failed_devices_are_retried_after_a_growing_backoff_until_they_succeed(tmp_path):
    with rollout_run(tmp_path, quiet_devices(failed_attempts=2), count=3) as run:
        devices = [d.device_id for d in run.fleet.devices]
        run.create(action_row("r-1", device_ids=devices, retries=[retry("failed", 3, 60, 2.0)]))
        run.feed(lambda reports: finals(reports, "r-1", attempt=1) == 3)
        rows = run.executions("r-1")
        assert {(r["state"], r["attempt"]) for r in rows.values()} == {("QUEUED", 2)}
        assert {r["status_details"] for r in rows.values()} == {
            "retry 1 of 3 after attempt 1 FAILED: checksum mismatch"
        }
        assert run.summary("r-1")["action_state"] == "IN_PROGRESS"  # not complete while a retry may succeed

        run.tick_at(59)  # the backoff: nothing yet
        assert run.fleet.stats["retries_received"] == 0
        run.tick_at(60)
        run.feed(lambda reports: finals(reports, "r-1", attempt=2) == 3)
        assert {(r["state"], r["attempt"]) for r in run.executions("r-1").values()} == {("QUEUED", 3)}
        run.tick_at(60 + 119)  # the second backoff is twice the first
        run.tick_at(60 + 120)
        run.feed(lambda reports: finals(reports, "r-1", attempt=3) == 3)

        final = run.executions("r-1")
        assert {(r["state"], r["attempt"]) for r in final.values()} == {("SUCCEEDED", 3)}
        assert all(
            r["published_at"] == min(x["published_at"] for x in final.values()) for r in final.values()
        )
        summary = run.summary("r-1")
        assert (summary["action_state"], summary["succeeded_count"], summary["retries_count"]) == (
            "COMPLETED",
            3,
            6,
        )
        assert run.fleet.stats["retries_received"] == 6  # two retry notices for each of the three
        assert {d.firmware for d in run.fleet.devices} == {"2.0.0"}


def test_when_the_retries_run_out_the_failure_is_final(tmp_path):
    with rollout_run(tmp_path, quiet_devices(failure_rate=1.0), count=2) as run:
        devices = [d.device_id for d in run.fleet.devices]
        run.create(action_row("r-2", device_ids=devices, retries=[retry("any", 1)]))
        run.feed(lambda reports: finals(reports, "r-2", attempt=1) == 2)
        run.tick_at(0)  # no backoff: the retry goes at the next tick
        run.feed(lambda reports: finals(reports, "r-2", attempt=2) == 2)
        assert {(r["state"], r["attempt"]) for r in run.executions("r-2").values()} == {("FAILED", 2)}
        summary = run.summary("r-2")
        assert (summary["action_state"], summary["failed_count"], summary["retries_count"]) == (
            "COMPLETED",
            2,
            2,
        )
        run.tick_at(3600)
        assert run.fleet.stats["retries_received"] == 2  # one each, then nothing more


def test_a_device_that_timed_out_is_retried_and_its_earlier_attempt_no_longer_counts(tmp_path):
    with rollout_run(tmp_path, quiet_devices(silent_attempts=1), count=2) as run:
        devices = [d.device_id for d in run.fleet.devices]
        retries = [retry("timed_out", 2), retry("failed", 1)]
        run.create(action_row("r-3", device_ids=devices, timeout_s=60, retries=retries))
        run.feed(lambda reports: sum(r.state == "IN_PROGRESS" for r in reports) == 2)
        run.tick_after_reports(61)  # timed out and retried in one tick: the retry is due at once
        rows = run.executions("r-3")
        assert {(r["state"], r["attempt"], r["retry_at"]) for r in rows.values()} == {("QUEUED", 2, None)}
        assert all(
            r["status_details"].startswith("retry 1 of 2 after attempt 1 TIMED_OUT") for r in rows.values()
        )
        run.feed(lambda reports: finals(reports, "r-3", attempt=2) == 2)
        stale = [StatusReport("r-3", d, "FAILED", seq=99, ts=0, details="late", attempt=1) for d in devices]
        run.engine.on_reports(stale, "reports", 1000)  # from the attempt that timed out: ignored
        assert {(r["state"], r["attempt"]) for r in run.executions("r-3").values()} == {("SUCCEEDED", 2)}
        summary = run.summary("r-3")
        assert (summary["action_state"], summary["timed_out_count"], summary["retries_count"]) == (
            "COMPLETED",
            0,
            2,
        )
