"""Execution rows only move forward; stale and duplicate reports change nothing."""

from collections import Counter

import pytest

from pipelines.actions.abort import AbortRule
from pipelines.actions.rollout import Pace
from pipelines.actions.states import (
    CANCELED,
    FAILED,
    IN_PROGRESS,
    QUEUED,
    SUCCEEDED,
    TIMED_OUT,
    Execution,
    StatusReport,
    apply_report,
    apply_reports,
    is_legal_transition,
    platform_transition,
    queued,
)
from pipelines.actions.summary import (
    ACTION_ABORTED,
    ACTION_CANCELED,
    ACTION_COMPLETED,
    ACTION_IN_PROGRESS,
    action_state,
    state_counts,
)


def report(state: str, seq: int, ts: int = 1_000) -> StatusReport:
    return StatusReport("a1", "d1", state, seq, ts, state.lower())


def applied(row: Execution | None, report: StatusReport) -> Execution:
    """The row after ``report``, which the test expects to change it."""
    changed = apply_report(row, report)
    assert changed is not None
    return changed


def test_queued_to_in_progress_to_succeeded_bumps_version_and_times():
    row = queued("a1", "d1", 500)
    row = applied(row, report(IN_PROGRESS, 1, 1_000))
    assert (row.state, row.version, row.started_at, row.finished_at) == (IN_PROGRESS, 2, 1_000, None)
    row = applied(row, report(SUCCEEDED, 2, 2_000))
    assert (row.state, row.version, row.started_at, row.finished_at) == (SUCCEEDED, 3, 1_000, 2_000)


def test_a_rows_times_are_when_reports_were_received_not_the_devices_ts():
    """A device's clock may be anywhere; the row is timed on the platform's (received_at), and a late joiner's
    row is queued when its first report arrived."""
    started = StatusReport("a1", "d1", IN_PROGRESS, 1, 1, "downloading", received_at=5_000)
    row = applied(None, started)
    assert (row.queued_at, row.started_at, row.updated_at) == (5_000, 5_000, 5_000)
    done = StatusReport("a1", "d1", SUCCEEDED, 2, 2, "installed", received_at=9_000)
    row = applied(row, done)
    assert (row.started_at, row.finished_at, row.updated_at) == (5_000, 9_000, 9_000)


def test_stale_duplicate_and_backward_reports_change_nothing():
    row = apply_reports(queued("a1", "d1", 0), [report(IN_PROGRESS, 1), report(SUCCEEDED, 2)])
    assert row.state == SUCCEEDED
    assert apply_report(row, report(SUCCEEDED, 2)) is None  # duplicate
    assert apply_report(row, report(IN_PROGRESS, 1)) is None  # stale
    assert apply_report(row, report(FAILED, 3)) is None  # terminal rows never move


def test_reports_out_of_order_in_one_batch_fold_by_sequence():
    row = apply_reports(queued("a1", "d1", 0), [report(SUCCEEDED, 2, 20), report(IN_PROGRESS, 1, 10)])
    assert (row.state, row.report_seq, row.started_at, row.finished_at) == (SUCCEEDED, 2, 10, 20)


def test_late_joiner_report_creates_the_row():
    row = apply_report(None, report(IN_PROGRESS, 1, 1_234))
    assert (row.state, row.version, row.queued_at) == (IN_PROGRESS, 1, 1_234)


def test_platform_transitions_only_from_unfinished_rows():
    row = applied(queued("a1", "d1", 0), report(IN_PROGRESS, 1))
    timed_out = platform_transition(row, TIMED_OUT, "no report within 60 s", 9_000)
    assert timed_out is not None
    assert (timed_out.state, timed_out.version, timed_out.finished_at) == (TIMED_OUT, row.version + 1, 9_000)
    assert platform_transition(timed_out, CANCELED, "canceled", 9_500) is None
    assert platform_transition(row, QUEUED, "back", 1) is None


@pytest.mark.parametrize(
    ("current", "new", "legal"),
    [(QUEUED, SUCCEEDED, True), (IN_PROGRESS, QUEUED, False), (SUCCEEDED, IN_PROGRESS, False)],
)
def test_transition_table(current, new, legal):
    assert is_legal_transition(current, new) is legal


def test_action_state_completes_aborts_and_cancels():
    criteria = (AbortRule("abort_criteria", "failed_or_timed_out", 50.0, 4),)
    assert action_state(None, state_counts([SUCCEEDED, IN_PROGRESS]), False, criteria) == ACTION_IN_PROGRESS
    assert action_state(None, state_counts([SUCCEEDED, SUCCEEDED]), False, criteria) == ACTION_COMPLETED
    three_failed = state_counts([FAILED, FAILED, FAILED, QUEUED])
    assert action_state(None, three_failed, False, criteria) == ACTION_IN_PROGRESS  # 3 < min_executed
    two_of_four = state_counts([FAILED, TIMED_OUT, SUCCEEDED, SUCCEEDED, QUEUED])
    assert action_state(None, two_of_four, False, criteria) == ACTION_ABORTED
    assert action_state(ACTION_ABORTED, state_counts([SUCCEEDED]), False, criteria) == ACTION_ABORTED
    assert action_state(None, Counter({QUEUED: 3}), True, criteria) == ACTION_CANCELED


def test_a_constant_rate_is_a_straight_line_from_the_start():
    pace = Pace(max_per_minute=60)

    def allowed(now_ms: int) -> int:
        return pace.allowed(0, now_ms, lambda start, end: end - start, sent_before=0, limit=1_000)

    assert allowed(0) == 1
    assert allowed(10_000) == 11
    assert Pace(max_per_minute=600).allowed(0, 60_000, lambda a, b: b - a, 0, 10_000) == 601
    assert pace.allowed(0, 600_000, lambda a, b: b - a, 0, limit=20) == 20
    assert Pace().allowed(0, 0, lambda a, b: b - a, 0, limit=500) == 500  # unpaced: everyone at once
