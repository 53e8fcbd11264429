"""Retries by failure kind with a limit and backoff, and abort rules per failure kind."""

from __future__ import annotations

from dataclasses import replace

from pipelines.actions.abort import abort_rules, first_fired
from pipelines.actions.retries import RetryRule, retry
from pipelines.actions.states import (
    EXPIRED,
    FAILED,
    IN_PROGRESS,
    QUEUED,
    REJECTED,
    SUCCEEDED,
    TIMED_OUT,
    StatusReport,
    apply_report,
    queued,
)
from pipelines.actions.summary import state_counts

RULES = (RetryRule("failed", 2, backoff_s=30, backoff_factor=2.0), RetryRule("timed_out", 1))


def failed(attempt: int = 1, state: str = FAILED):
    row = replace(queued("a", "d1", 0, published_at=0), attempt=attempt, report_seq=2, version=3)
    return replace(row, state=state, status_details="checksum mismatch", finished_at=5_000)


def test_a_failure_is_queued_again_with_its_next_attempt_after_the_backoff():
    first = retry(failed(), RULES, 10_000)
    assert (first.state, first.attempt, first.retry_at, first.finished_at) == (QUEUED, 2, 40_000, None)
    assert first.status_details == "retry 1 of 2 after attempt 1 FAILED: checksum mismatch"
    assert first.version == 4 and first.published_at == 0  # the first send stays recorded
    second = retry(failed(attempt=2), RULES, 10_000)
    assert (second.attempt, second.retry_at) == (3, 70_000)  # 30 s doubled
    assert retry(failed(attempt=3), RULES, 10_000) is None  # two retries: the limit


def test_only_the_kinds_a_rule_names_are_retried():
    assert retry(failed(state=TIMED_OUT), RULES, 0).attempt == 2
    assert retry(failed(attempt=2, state=TIMED_OUT), RULES, 0) is None
    assert retry(failed(state=REJECTED), RULES, 0) is None
    assert retry(failed(), (RetryRule("timed_out", 5),), 0) is None
    assert retry(failed(state=TIMED_OUT), (RetryRule("any", 1),), 0).attempt == 2


def test_a_report_from_an_attempt_that_was_retried_changes_nothing():
    retried = retry(failed(), RULES, 0)
    assert retried is not None
    waiting = replace(retried, retry_at=None)
    late = StatusReport("a", "d1", FAILED, seq=3, ts=1, details="late", attempt=1)
    assert apply_report(waiting, late) is None
    fresh = apply_report(waiting, StatusReport("a", "d1", IN_PROGRESS, seq=3, ts=2, attempt=2))
    assert (fresh.state, fresh.attempt, fresh.started_at) == (IN_PROGRESS, 2, 2)


def test_abort_rules_count_their_own_kind_and_the_first_that_fires_is_named():
    row = {
        "abort_criteria": {"failure_pct": None, "min_executed": 1},
        "abort_rules": [
            {"failure_kind": "rejected", "threshold_pct": 50.0, "min_executed": 4},
            {"failure_kind": "timed_out", "threshold_pct": 20.0, "min_executed": 4},
        ],
    }
    rules = abort_rules(row)
    counts = state_counts([SUCCEEDED, SUCCEEDED, TIMED_OUT, FAILED, QUEUED])
    fired = first_fired(rules, counts)
    assert fired.field == "abort_rules[1]"
    assert fired.reason(counts) == (
        "abort_rules[1] (timed_out) 20 % reached: 1 of 4 finished devices timed out "
        "(25.0 %; abort_rules[1].min_executed 4)"
    )
    assert first_fired(rules, state_counts([SUCCEEDED, TIMED_OUT, QUEUED])) is None  # 2 < min_executed
    anything = abort_rules({"abort_rules": [{"failure_kind": "any", "threshold_pct": 60.0}]})
    assert first_fired(anything, state_counts([FAILED, REJECTED, TIMED_OUT, SUCCEEDED])) is not None


def test_a_device_whose_message_expired_is_neither_a_failure_nor_finished_for_the_abort_rules():
    rules = abort_rules({"abort_rules": [{"failure_kind": "any", "threshold_pct": 10.0, "min_executed": 3}]})
    online_succeeded = state_counts([SUCCEEDED, SUCCEEDED, *[EXPIRED] * 10])
    assert first_fired(rules, online_succeeded) is None  # 2 finished, below min_executed: no failure either
    one_failed = state_counts([SUCCEEDED, SUCCEEDED, SUCCEEDED, FAILED, *[EXPIRED] * 100])
    fired = first_fired(rules, one_failed)
    assert fired is not None and "1 of 4 finished devices" in fired.reason(one_failed)  # not 1 of 104


def test_the_earlier_abort_criteria_is_a_rule_of_failures_and_timeouts():
    rules = abort_rules({"abort_criteria": {"failure_pct": 50.0, "min_executed": 2}})
    counts = state_counts([FAILED, TIMED_OUT, REJECTED, SUCCEEDED])
    assert first_fired(rules, counts).reason(counts) == (
        "abort_criteria.failure_pct 50 % reached: 2 of 4 finished devices failed or timed out "
        "(50.0 %; abort_criteria.min_executed 2)"
    )
