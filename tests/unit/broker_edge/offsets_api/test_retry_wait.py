"""The wait before a retry of a request to a broker (the offsets API client, the Spark source's rounds)."""

from __future__ import annotations

from broker_edge.offsets_api.client import MAX_RETRY_WAIT_S, retry_wait_s


def test_the_wait_doubles_from_the_backoff_before_each_further_retry() -> None:
    assert [retry_wait_s(0.5, attempt) for attempt in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 4.0]


def test_many_retries_wait_at_most_the_cap_not_days() -> None:
    """fetchRetries=20 with the default retryBackoffMs of 1 s doubled each time would wait 2^19 s (six days)
    before its last try, and an attempt far along would overflow a float's exponent."""
    assert retry_wait_s(1.0, 20) == MAX_RETRY_WAIT_S == 30.0
    assert retry_wait_s(1.0, 5000) == MAX_RETRY_WAIT_S
    assert retry_wait_s(60.0, 1) == 60.0  # a first wait set longer than the cap is the user's own choice


def test_no_backoff_waits_nothing() -> None:
    assert retry_wait_s(0.0, 30) == 0.0
