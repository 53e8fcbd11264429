"""An actions job started again in the middle of a rollout, before its reports stream has read what the
devices said while no job ran.

The ticker's decisions (the rate's next turn, an abort rule, a phase gate, a timeout) are taken from the
executions; the reports of the devices sent the last turn before the stop are still unread in the brokers'
logs. Before, the first ticks of the job started again sent the rate's whole catch-up at once, past an abort
rule the unread failures had already crossed, timed out devices whose success was unread, and took a
phase's devices that had succeeded for silent, aborting a good build. The ticker now sends nothing until
the reports stream has caught up (``tick``'s ``reports_read_until`` above 0), and times out and judges
silence only up to the time the reports were read until.
"""

from __future__ import annotations

import logging

from pipelines.actions.engine import REPORTS_WAIT_WARNING_S, ActionsEngine
from pipelines.actions.states import CANCELED, FAILED, IN_PROGRESS, SUCCEEDED
from tests.e2e.ota.conftest import action_row
from tests.e2e.ota.rollout_harness import RolloutRun, finals, rollout_run
from tests.e2e.ota.test_rollout_aborts import rule
from tests.fleet_harness import quiet_devices

DEVICES = 40
"""Devices of the rollout: the rate's catch-up after a minute without a job would send them all."""
PER_MINUTE = 60
"""One device a second."""


def sent(run: RolloutRun, action_id: str) -> set[str]:
    """The devices the executions say were sent the action."""
    return {device_id for device_id, at in run.published(action_id).items() if at is not None}


def engine_started_again(run: RolloutRun) -> None:
    """A new engine on the same tables, publisher and clock: the job started again (nothing of the stopped
    one's memory)."""
    run.engine = ActionsEngine(run.store, run.engine.publisher, clock=run.clock, compliance_interval_s=0)


def test_a_rollout_started_again_sends_nothing_before_the_failures_it_missed_are_read(tmp_path):
    """A build every device fails, one device a second, aborted at 50 % failed of 2 finished. Two devices
    are sent it; they fail while no job runs; the job starts again a minute later. Its ticks before the
    reports stream caught up send nothing (before: the minute's catch-up, every other device); once the
    failures are read the rule fires, and only the two devices ever had the build."""
    with rollout_run(tmp_path, quiet_devices(failure_rate=1.0), count=DEVICES) as run:
        devices = sorted(d.device_id for d in run.fleet.devices)
        row = action_row(
            "rs-1", device_ids=devices, max_per_minute=PER_MINUTE, abort_rules=[rule("failed", 50.0, 2)]
        )
        run.create(row)
        run.tick_at(1)
        run.harness.wait_until(lambda: finals(list(run.harness.reports), "rs-1") == 2)

        engine_started_again(run)
        run.clock.now = run.clock.at(60)
        run.engine.tick(reports_read_until=0)
        run.clock.now = run.clock.at(61)
        run.engine.tick(reports_read_until=0)
        assert len(sent(run, "rs-1")) == 2

        run.feed(lambda reports: finals(reports, "rs-1") == 2)
        run.clock.now = run.clock.at(62)
        run.engine.tick(reports_read_until=run.clock.now)
        summary = run.summary("rs-1")
        assert (summary["action_state"], summary["aborted_by"]) == ("ABORTED", "abort_rules[0]"), summary
        assert (run.states("rs-1")[FAILED], run.states("rs-1")[CANCELED]) == (2, DEVICES - 2)
        assert sent(run, "rs-1") == run.received("rs-1")


def test_a_job_started_after_a_timeout_passed_does_not_time_out_a_device_whose_success_is_unread(tmp_path):
    """A device reports IN_PROGRESS, which the job reads, then SUCCEEDED well within the action's 10 s
    timeout; the job stops before it reads the success and starts again a minute later. Its ticks before
    the reports stream caught up time nothing out; once read, the device has SUCCEEDED. Before, its first
    tick timed the device out, and the success read afterwards changed nothing: a device that installed the
    build counted as timed out, towards the abort rules."""
    with rollout_run(tmp_path, quiet_devices(), count=1) as run:
        (device,) = [d.device_id for d in run.fleet.devices]
        run.create(action_row("rt-1", device_ids=[device], timeout_s=10))
        run.harness.wait_until(lambda: finals(list(run.harness.reports), "rt-1") == 1)
        reports = run.harness.take_reports()
        run.engine.on_reports([r for r in reports if r.state == IN_PROGRESS], "reports", 0)
        assert run.states("rt-1") == {IN_PROGRESS: 1}

        engine_started_again(run)
        run.clock.now = run.clock.at(60)
        run.engine.tick(reports_read_until=0)
        assert run.states("rt-1") == {IN_PROGRESS: 1}
        run.engine.on_reports([r for r in reports if r.state != IN_PROGRESS], "reports", 1)
        run.engine.tick(reports_read_until=run.clock.now)
        assert run.states("rt-1") == {SUCCEEDED: 1}
        assert run.summary("rt-1")["action_state"] == "COMPLETED"


def test_a_job_started_again_does_not_abort_a_phase_whose_successes_it_has_not_read(tmp_path):
    """Two phases, the first of one device needing 100 % successes, a 10 s timeout. The first phase's
    device installs the build while no job runs; the job starts again a minute later. Before its reports
    stream caught up the phase holds; once the success is read the second phase goes out. Before, its first
    tick found the device silent past the timeout, the gate lost, and aborted the rollout of a good build."""
    phases = [
        {"percent": None, "devices": 1, "wait_s": 0, "success_pct": 100.0},
        {"percent": None, "devices": None, "wait_s": None, "success_pct": None},
    ]
    with rollout_run(tmp_path, quiet_devices(), count=2) as run:
        devices = sorted(d.device_id for d in run.fleet.devices)
        run.create(action_row("rp-1", device_ids=devices, timeout_s=10, phases=phases))
        run.harness.wait_until(lambda: finals(list(run.harness.reports), "rp-1") == 1)

        engine_started_again(run)
        run.clock.now = run.clock.at(60)
        run.engine.tick(reports_read_until=0)
        assert run.summary("rp-1")["action_state"] == "IN_PROGRESS", run.summary("rp-1")["reason"]
        run.feed(lambda reports: finals(reports, "rp-1") == 1)
        run.clock.now = run.clock.at(61)
        run.engine.tick(reports_read_until=run.clock.now)
        assert run.summary("rp-1")["action_state"] == "IN_PROGRESS", run.summary("rp-1")["reason"]
        assert sent(run, "rp-1") == set(devices)


def test_a_ticker_waiting_long_for_its_reports_stream_says_so_at_warning(tmp_path, caplog):
    """A reports stream that does not catch up (a broker it reads down) holds every action: the wait is said
    at INFO when it starts, at WARNING once it has lasted ``REPORTS_WAIT_WARNING_S`` (once), and sending
    again at INFO once the stream caught up; before, one INFO line at the start said it, however long it
    lasted."""
    caplog.set_level(logging.INFO, logger="pipelines.actions.engine")
    with rollout_run(tmp_path, quiet_devices(), count=2) as run:
        devices = sorted(d.device_id for d in run.fleet.devices)
        run.create(action_row("rw-1", device_ids=devices[:1]))
        engine_started_again(run)
        waits = [1, REPORTS_WAIT_WARNING_S / 2, REPORTS_WAIT_WARNING_S + 1, REPORTS_WAIT_WARNING_S + 30]
        for second in waits:
            run.clock.now = run.clock.at(second)
            run.engine.tick(reports_read_until=0)
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "reports stream has not caught up" in warnings[0], warnings
        run.clock.now = run.clock.at(REPORTS_WAIT_WARNING_S + 31)
        run.engine.tick(reports_read_until=run.clock.now)
        assert any("sending again" in r.getMessage() for r in caplog.records)
