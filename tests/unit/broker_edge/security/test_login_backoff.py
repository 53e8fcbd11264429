"""Failed-login backoff, sans-IO: per address, per user name, and never a lock-out of a user's own address."""

from __future__ import annotations

import pytest

from broker_edge.config import ConfigError
from broker_edge.security.login_backoff import LoginBackoff, LoginBackoffConfig

CONFIG = LoginBackoffConfig(threshold=3, backoff_s=1.0, max_backoff_s=8.0, forget_s=100.0, max_tracked=1000)


def test_an_address_waits_after_threshold_failures_and_the_wait_doubles_up_to_the_maximum():
    backoff = LoginBackoff(CONFIG)
    assert all(backoff.admit("10.0.0.9", None, 0.0) for _ in range(3))  # 3 checked, all failed
    assert not backoff.admit("10.0.0.9", None, 0.5)
    waits = []
    now = 0.0
    for _ in range(6):  # one check per backoff, each failure doubling it
        start = now
        while not backoff.admit("10.0.0.9", None, now):
            now += 0.25
        waits.append(now - start)
    assert waits == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert backoff.admit("10.0.0.10", None, now)  # another address is not affected


def test_parallel_attempts_cannot_all_slip_through_before_the_first_fails():
    backoff = LoginBackoff(CONFIG)
    admitted = [backoff.admit("10.0.0.9", "alice", 0.0) for _ in range(30)]  # none answered yet
    assert admitted.count(True) == 3


def test_a_user_name_under_attack_from_many_addresses_waits_but_not_from_its_own_address():
    backoff = LoginBackoff(CONFIG)
    assert backoff.admit("10.0.0.1", "alice", 0.0)
    backoff.succeeded("10.0.0.1", "alice")  # alice's own device
    for n in range(3):
        assert backoff.admit(f"10.9.0.{n}", "alice", 1.0)  # one guess per address: under its threshold
    assert not backoff.admit("10.9.0.200", "alice", 1.5)  # the user name now waits for new addresses
    assert backoff.admit("10.0.0.1", "alice", 1.5)  # but not from where alice logs in
    assert backoff.admit("10.9.0.201", "bob", 1.5)  # nor for another user


def test_a_success_clears_its_address_and_failures_are_forgotten():
    backoff = LoginBackoff(CONFIG)
    assert all(backoff.admit("10.0.0.9", "alice", 0.0) for _ in range(3))  # the third one logs in
    backoff.succeeded("10.0.0.9", "alice")
    assert backoff.admit("10.0.0.9", None, 0.1)  # its address starts afresh

    assert all(backoff.admit("10.0.0.8", None, 0.0) for _ in range(3))
    assert not backoff.admit("10.0.0.8", None, 0.5)
    assert all(backoff.admit("10.0.0.8", None, 200.0) for _ in range(3))  # forgotten: a full threshold again


def test_tables_are_bounded():
    backoff = LoginBackoff(LoginBackoffConfig(threshold=1, max_tracked=10))
    for n in range(1000):
        backoff.admit(f"10.1.{n // 256}.{n % 256}", f"user{n}", 0.0)
    assert len(backoff._addresses) == 10 and len(backoff._users) == 10


def test_threshold_zero_turns_it_off():
    backoff = LoginBackoff(LoginBackoffConfig(threshold=0))
    assert all(backoff.admit("10.0.0.9", "alice", 0.0) for _ in range(100))


@pytest.mark.parametrize(
    ("field", "value"), [("threshold", -1), ("backoff_s", 0), ("max_backoff_s", 0.5), ("max_tracked", 1.5)]
)
def test_bad_values_name_the_field(field, value):
    with pytest.raises(ConfigError) as error:
        LoginBackoffConfig(**{field: value})
    assert error.value.path == field
