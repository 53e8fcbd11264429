"""The bandwidth limit: a second's worth at once, then the rate (times handed in, no clock)."""

from __future__ import annotations

import pytest

from broker_edge.uplink.throttle import Throttle


def test_no_limit_never_waits() -> None:
    throttle = Throttle(None, now=0.0)
    assert [throttle.delay(10**9, 0.0) for _ in range(3)] == [0.0, 0.0, 0.0]


def test_a_burst_of_one_second_then_the_rate() -> None:
    throttle = Throttle(1000, now=0.0)
    assert throttle.delay(1000, 0.0) == 0.0
    assert throttle.delay(500, 0.0) == pytest.approx(0.5)
    assert throttle.delay(500, 0.5) == pytest.approx(0.5)  # the bucket refilled 500 meanwhile
    assert throttle.delay(100, 10.0) == 0.0  # idle time refills up to one second's worth only
    assert throttle.delay(1000, 10.0) == pytest.approx(0.1)


def test_a_message_larger_than_the_burst_is_paid_for_not_refused() -> None:
    throttle = Throttle(100, now=0.0)
    assert throttle.delay(1000, 0.0) == pytest.approx(9.0)
