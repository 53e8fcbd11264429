"""What ``timestone ota status`` prints of an action's rollout settings and progress."""

from __future__ import annotations

from datetime import UTC, datetime

from pipelines.actions.operator import NewAction
from pipelines.actions.status import ActionStatus, describe, describe_list

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def test_status_shows_the_rollout_shape_time_rules_and_what_fired():
    row = NewAction(
        action_id="a-1",
        group="fleet",
        version="2.1.0",
        url="https://fw.example/f",
        sha256="0" * 64,
        max_per_minute=600,
        exponential_rate={"base_per_minute": 50, "increment_factor": 2.0, "succeeded_devices": 100},
        phases=[{"percent": 5.0, "wait_s": 86_400, "success_pct": 95.0}, {"devices": 500}, {}],
        abort_rules=[{"failure_kind": "failed", "threshold_pct": 10.0, "min_executed": 20}],
        retries=[{"failure_kind": "timed_out", "max_retries": 2, "backoff_s": 600, "backoff_factor": 2.0}],
        rollback={"version": "2.0.0", "url": "https://fw.example/g", "sha256": "1" * 64},
        start_at=NOW,
        maintenance_windows=[
            {"days": ["sat"], "start": "22:00", "duration_min": 120, "time_zone": "Europe/Berlin"}
        ],
        continuous=True,
    ).row(NOW)
    summary = {
        **{
            f"{s}_count": 0
            for s in ("queued", "in_progress", "succeeded", "failed", "timed_out", "rejected", "canceled")
        },
        "total_count": 0,
        "action_state": "ABORTED",
        "updated_at": NOW,
        "reason": "abort_rules[0] (failed) 10 % reached: ...",
        "aborted_by": "abort_rules[0]",
        "rollback_action_id": "a-1-rollback",
        "phase": 1,
        "retries_count": 3,
    }
    text = describe(ActionStatus("a-1", row, summary), "")
    assert (
        "rollout   from 50 devices/min, x2 every 100 succeeded up to 600; "
        "phases 5 % (wait 86400 s, 95 % succeeded), 500, rest; abort at 10 % failed after 20 finished; "
        "retry timed_out up to 2x after 600 s (x2); rollback to 2.0.0 on abort"
    ) in text
    assert (
        "when      from 2026-11-25 12:00:00 UTC; window sat 22:00 for 120 min Europe/Berlin; "
        "continuous (devices joining the group get it too)"
    ) in text
    assert "progress  phase 1 of 3, 3 retries, aborted by abort_rules[0], rollback a-1-rollback" in text


def in_progress(row: dict, queued: int) -> ActionStatus:
    counts = {
        f"{s}_count": 0 for s in ("in_progress", "succeeded", "failed", "timed_out", "rejected", "canceled")
    }
    summary = {**counts, "queued_count": queued, "total_count": queued, "action_state": "IN_PROGRESS"}
    return ActionStatus("a-2", row, {**summary, "updated_at": NOW, "phase": None, "retries_count": 0})


def test_status_says_an_action_waits_for_its_maintenance_window_and_until_when():
    window = {"days": ["sat"], "start": "22:00", "duration_min": 120, "time_zone": "Europe/Berlin"}
    row = NewAction(
        action_id="a-2", group="fleet", version="2.1.0", url="https://fw.example/f", sha256="0" * 64,
        maintenance_windows=[window],
    ).row(NOW)  # fmt: skip
    now_ms = int(NOW.timestamp() * 1000)  # a Wednesday, 12:00 UTC
    text = describe(in_progress(row, 40), "", now_ms)
    assert (  # Saturday 22:00 in Berlin (CET) is 21:00 UTC
        "waiting   for its maintenance window: nothing new goes out until 2026-11-28 21:00:00 UTC, "
        "when the next opens"
    ) in text
    inside = int(datetime(2026, 11, 28, 21, 30, tzinfo=UTC).timestamp() * 1000)
    assert "waiting" not in describe(in_progress(row, 40), "", inside)
    assert "waiting" not in describe(in_progress(row, 40), "")  # no time given: nothing said of it


def test_status_says_an_action_waits_for_its_start():
    start = datetime(2026, 12, 1, 6, 0, tzinfo=UTC)
    row = NewAction(
        action_id="a-3", group="fleet", version="2.1.0", url="https://fw.example/f", sha256="0" * 64,
        start_at=start,
    ).row(NOW)  # fmt: skip
    text = describe(in_progress(row, 40), "", int(NOW.timestamp() * 1000))
    assert "waiting   for its start: nothing goes out before 2026-12-01 06:00:00 UTC" in text


def test_status_shows_what_a_device_reported_escaped_one_line_per_device():
    """A device's report details (and its id) holding a newline or ANSI escapes cannot forge a line of
    `timestone ota status` nor colour or clear the operator's terminal: they are shown escaped."""
    row = NewAction(
        action_id="a-4", group="fleet", version="2.1.0", url="https://fw.example/f", sha256="0" * 64
    ).row(NOW)  # fmt: skip
    status = in_progress(row, 2)
    forged = "flashing\n          dev-9 SUCCEEDED since 2026-11-25\x1b[2J\x1b[32m ok"
    status.open_devices = [
        {"device_id": "dev-1", "state": "IN_PROGRESS", "status_details": forged, "started_at": NOW},
        {"device_id": "dev-\x1b[31m2", "state": "QUEUED", "queued_at": NOW},
    ]
    status.open_count = 2
    lines = describe(status, "").splitlines()
    shown = [line for line in lines if line.startswith("          dev-")]
    assert len(shown) == 2, lines
    assert all(c.isprintable() for line in lines for c in line), lines
    assert "(flashing\\n          dev-9 SUCCEEDED since 2026-11-25\\x1b[2J\\x1b[32m ok)" in shown[0]
    assert shown[1].startswith("          dev-\\x1b[31m2 QUEUED")


def test_rows_written_by_hand_are_shown_escaped_in_the_action_and_in_the_list():
    """An actions row another tool wrote (an id holding a newline and a forged line, a group with a carriage
    return, a creator and a version with ANSI escapes) forged lines of ``timestone ota status`` and cleared
    the operator's screen: only what devices sent was escaped."""
    row = NewAction(
        action_id="a-5\nok2  ota  COMPLETED", group="g\rOVERWRITE", version="2\x1b[0m",
        url="https://fw.example/f", sha256="0" * 64, created_by="nb\x1b[2J",
    ).row(NOW)  # fmt: skip
    status = in_progress(row, 1)
    status.action_id = row["id"]
    for text in (describe(status, "job line"), describe_list([status], "job line")):
        lines = text.splitlines()
        assert all(c.isprintable() for line in lines for c in line), lines
        assert lines[-1] == "job line"
        assert not any(line.startswith("ok2") for line in lines), lines
    detail = describe(status, "job line")
    assert "action    a-5\\nok2  ota  COMPLETED" in detail and "group g\\rOVERWRITE" in detail
    assert "by nb\\x1b[2J" in detail and "firmware 2\\x1b[0m from" in detail
    listed = describe_list([status], "job line").splitlines()
    assert len(listed) == 3 and listed[1].startswith("a-5\\nok2  ota  COMPLETED ")


def test_status_shows_the_payload_the_job_sends_when_the_row_was_changed_in_place():
    """A row whose payload another tool rewrote after the job took the action in: status showed the row's
    new firmware as what the action does, while the job sends the one it started with and refuses the
    change. It shows what is sent, and the refusal."""
    row = NewAction(
        action_id="a-2", group="fleet", version="9.9.9", url="https://fw.example/9", sha256="0" * 64
    )
    status = in_progress(row.row(NOW), queued=3)
    assert status.summary is not None
    refused = "payload changed in place after the action started (payload.url, payload.version): refused, ..."
    status.summary |= {
        "accepted_payload": '{"kind":"ota","sha256":"'
        + "0" * 64
        + '","url":"https://fw.example/2","version":"2.0.0"}',
        "payload_change": refused,
    }
    text = describe(status, "")
    assert "what      firmware 2.0.0 from https://fw.example/2" in text
    assert f"refused   {refused}" in text
