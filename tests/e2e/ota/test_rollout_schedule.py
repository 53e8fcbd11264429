"""Time rules with a simulated fleet on a real broker: a scheduled start, maintenance windows in a time zone
outside which nothing new is sent, and a scheduled end that stops what was not sent (and, when asked, what
devices are doing)."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from tests.e2e.ota.conftest import action_row
from tests.e2e.ota.rollout_harness import finals, rollout_run
from tests.fleet_harness import quiet_devices

DAY_S = 86_400
NEW_YORK = ZoneInfo("America/New_York")


def at(clock, seconds: float) -> datetime:
    return datetime.fromtimestamp(clock.at(seconds) / 1000, UTC)


def test_nothing_goes_out_before_the_start_then_the_group_gets_one_broadcast(tmp_path):
    with rollout_run(tmp_path, quiet_devices(), count=5) as run:
        schedule = {"start_at": at(run.clock, 2 * DAY_S), "end_at": None, "end_behavior": None}
        run.create(action_row("s-1", group="g", schedule=schedule))
        run.tick_at(DAY_S)
        assert run.summary("s-1")["action_state"] == "SCHEDULED"
        assert set(run.published("s-1").values()) == {None} and run.logged() == {}
        run.tick_at(2 * DAY_S)
        assert set(run.published("s-1").values()) == {2 * DAY_S}
        assert run.logged() == {"actions/groups/g": 1}  # one message for the group, not one per device
        run.feed(lambda reports: finals(reports, "s-1") == 5)
        assert run.summary("s-1")["action_state"] == "COMPLETED"


def test_a_paced_rollout_sends_only_inside_its_window_and_resumes_without_a_burst(tmp_path):
    evening = datetime(2026, 11, 25, 21, 59, tzinfo=NEW_YORK)  # a minute before the window
    start_ms = int(evening.timestamp() * 1000)
    window = {"days": None, "start": "22:00", "duration_min": 1, "time_zone": "America/New_York"}
    with rollout_run(tmp_path, quiet_devices(), count=20, start_ms=start_ms) as run:
        run.create(action_row("w-1", group="g", max_per_minute=6, maintenance_windows=[window]))
        sent = []
        for seconds in (30, 60, 110, 120, 3600, DAY_S + 30, DAY_S + 90):
            run.tick_at(seconds)
            sent.append(sum(1 for t in run.published("w-1").values() if t is not None))
        # closed, opens (the first at once), 6/min while open, closed from 22:01 until the next evening;
        # at 22:00:30 then, 90 s of open time in all: 10 devices, not the 24 hours worth
        assert sent == [0, 1, 6, 6, 6, 6, 10]
        for when in (t for t in run.published("w-1").values() if t is not None):
            local = datetime.fromtimestamp((start_ms / 1000) + when, NEW_YORK)
            assert (local.hour, local.minute) == (22, 0)


@pytest.mark.parametrize(
    ("behavior", "delay_s", "outcome"), [("stop", 0.05, "SUCCEEDED"), ("cancel", 60.0, "CANCELED")]
)
def test_at_its_end_what_was_not_sent_is_canceled(tmp_path, behavior, delay_s, outcome):
    with rollout_run(tmp_path, quiet_devices(download_delay_s=(delay_s, delay_s)), count=10) as run:
        schedule = {"start_at": None, "end_at": at(run.clock, 3), "end_behavior": behavior}
        run.create(action_row("end-1", group="g", max_per_minute=60, schedule=schedule))
        run.tick_at(1)
        run.tick_at(2)
        run.feed(lambda reports: sum(1 for r in reports if r.state == "IN_PROGRESS") == 3)
        run.tick_at(3)
        run.tick_at(60)
        run.feed(lambda reports: finals(reports, "end-1") == 3)
        rows = run.executions("end-1")
        sent = {d for d, r in rows.items() if r["published_at"] is not None}
        assert len(sent) == 3 and run.received("end-1") == sent
        assert Counter(rows[d]["state"] for d in sent) == Counter({outcome: 3})
        unsent = [r for d, r in rows.items() if d not in sent]
        ended = f"schedule.end_at {schedule['end_at']:%Y-%m-%d %H:%M:%S} UTC passed"
        assert {(r["state"], r["status_details"]) for r in unsent} == {("CANCELED", ended)}
        summary = run.summary("end-1")
        canceled = 10 if outcome == "CANCELED" else 7
        assert summary["action_state"] == "COMPLETED"
        assert summary["reason"] == f"{ended}: {canceled} devices canceled"


def test_a_retry_due_outside_the_weekly_window_waits_for_the_next_one(tmp_path):
    saturday = datetime(2026, 11, 28, 10, 0, tzinfo=ZoneInfo("Asia/Tokyo"))
    window = {"days": ["sat"], "start": "10:00", "duration_min": 60, "time_zone": "Asia/Tokyo"}
    retry = {"failure_kind": "failed", "max_retries": 1, "backoff_s": 7200, "backoff_factor": None}
    with rollout_run(
        tmp_path, quiet_devices(failed_attempts=1), count=2, start_ms=int(saturday.timestamp() * 1000)
    ) as run:
        devices = [d.device_id for d in run.fleet.devices]
        run.create(action_row("wk-1", device_ids=devices, maintenance_windows=[window], retries=[retry]))
        run.feed(
            lambda reports: finals(reports, "wk-1", attempt=1) == 2
        )  # failed at 10:00: retry due at 12:00
        for seconds in (7200, 6 * DAY_S):  # due, but Saturday noon and Friday are outside the window
            run.tick_at(seconds)
            assert run.fleet.stats["retries_received"] == 0
            assert {(r["state"], r["attempt"]) for r in run.executions("wk-1").values()} == {("QUEUED", 2)}
        run.tick_at(7 * DAY_S)  # the next Saturday, 10:00 in Tokyo
        run.feed(lambda reports: finals(reports, "wk-1", attempt=2) == 2)
        assert {(r["state"], r["attempt"], r["retry_at"]) for r in run.executions("wk-1").values()} == {
            ("SUCCEEDED", 2, None)
        }
        assert run.summary("wk-1")["action_state"] == "COMPLETED"


NO_DEVICE = (
    "no device to send it to: the devices table had no device in group 'nobody' when the job read the "
    "action, and a device registered later is not queued (write a new action, or a continuous one)"
)


def test_a_staged_or_scheduled_action_for_a_group_without_devices_completes_saying_so(tmp_path):
    """Rows written by a notebook for a group no device is registered in (a typo): a phased rollout, a paced
    one and a broadcast scheduled for later target the group as it was, so nothing will ever be sent. Before,
    each stayed IN_PROGRESS (or SCHEDULED) for ever with 0 devices and no reason; now each completes at once,
    its reason saying why. A continuous action, which devices joining the group will reach, stays open."""
    phases = [
        {"percent": 10.0, "devices": None, "wait_s": None, "success_pct": None},
        {"percent": None, "devices": None, "wait_s": None, "success_pct": None},
    ]
    with rollout_run(tmp_path, quiet_devices(), count=2) as run:
        later = {"start_at": at(run.clock, DAY_S), "end_at": None, "end_behavior": None}
        run.create(action_row("e-phased", group="nobody", phases=phases))
        run.create(action_row("e-paced", group="nobody", max_per_minute=10))
        run.create(action_row("e-later", group="nobody", schedule=later))
        run.create(action_row("e-continuous", group="nobody", continuous=True, max_per_minute=10))
        run.tick_at(2 * DAY_S)
        for action_id in ("e-phased", "e-paced", "e-later"):
            summary = run.summary(action_id)
            assert (summary["action_state"], summary["reason"], summary["total_count"]) == (
                "COMPLETED",
                NO_DEVICE,
                0,
            ), action_id
        assert run.summary("e-continuous")["action_state"] == "IN_PROGRESS"
        assert run.logged() == {}
