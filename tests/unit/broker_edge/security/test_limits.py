"""Token buckets and connection admission with time handed in as numbers; the limits config and its checks."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import socket

import pytest

from broker_edge.config import ConfigError, load_dataclass
from broker_edge.security.limits import ConnectionAdmission, LimitsConfig, TokenBucket


def test_bucket_starts_full_then_refills_at_the_rate() -> None:
    bucket = TokenBucket(rate_per_s=2.0, burst=3)
    assert [bucket.try_acquire(100.0) for _ in range(4)] == [True, True, True, False]
    assert not bucket.try_acquire(100.4), "0.8 tokens so far"
    assert bucket.try_acquire(100.5)
    assert not bucket.try_acquire(100.5)
    assert bucket.available(110.0) == 3, "never more than the burst"


def test_bucket_multi_token_requests() -> None:
    bucket = TokenBucket(rate_per_s=10.0, burst=5)
    assert bucket.try_acquire(0.0, tokens=5)
    assert not bucket.try_acquire(0.0, tokens=1)
    assert bucket.seconds_until(0.0, tokens=3) == pytest.approx(0.3)
    assert bucket.seconds_until(0.0, tokens=6) == math.inf, "more than the burst never fits"
    assert not bucket.try_acquire(0.2, tokens=3)
    assert bucket.try_acquire(0.3, tokens=3)


def test_clock_stepping_back_grants_nothing() -> None:
    bucket = TokenBucket(rate_per_s=1.0, burst=1)
    assert bucket.try_acquire(1000.0)
    assert not bucket.try_acquire(10.0), "a clock that jumped back refills nothing"
    assert not bucket.try_acquire(10.5)
    assert bucket.try_acquire(11.0), "refill counts from the new time"


def test_zero_rate_bucket_is_a_fixed_allowance() -> None:
    bucket = TokenBucket(rate_per_s=0, burst=2)
    assert bucket.try_acquire(0) and bucket.try_acquire(1e9)
    assert not bucket.try_acquire(2e9)
    assert bucket.seconds_until(2e9) == math.inf


@pytest.mark.parametrize(("rate", "burst"), [(-1, 1), (1, 0)])
def test_bucket_rejects_nonsense(rate: float, burst: int) -> None:
    with pytest.raises(ValueError):
        TokenBucket(rate, burst)


def test_admission_caps_open_connections() -> None:
    admission = ConnectionAdmission(max_connections=2, new_per_second=0, burst=1)
    assert admission.admit(0.0) is None
    assert admission.admit(0.0) is None
    assert admission.admit(0.0) == "max_connections"
    assert admission.active == 2
    admission.release()
    assert admission.active == 1
    assert admission.admit(0.0) is None


def test_admission_limits_the_rate_of_new_connections() -> None:
    admission = ConnectionAdmission(max_connections=100, new_per_second=10.0, burst=3)
    assert [admission.admit(5.0) for _ in range(4)] == [None, None, None, "rate"]
    assert admission.active == 3, "a refused connection is not counted"
    assert admission.admit(5.2) is None


def test_admission_rate_is_per_source_address_within_the_overall_cap() -> None:
    admission = ConnectionAdmission(
        max_connections=100, new_per_second=1.0, burst=5, new_per_second_per_address=1.0, burst_per_address=2
    )
    flood = [admission.admit(0.0, "10.0.0.66") for _ in range(10)]
    assert flood == [None, None] + ["rate"] * 8, "the flooding address is held to its own bucket"
    assert [admission.admit(0.0, "10.0.0.1"), admission.admit(0.0, "10.0.0.2")] == [None, None]
    assert admission.admit(0.0, "10.0.0.3") is None
    assert admission.admit(0.0, "10.0.0.4") == "rate", "the overall bucket still caps all addresses"


def test_admission_forgets_the_least_recently_seen_address_when_full() -> None:
    admission = ConnectionAdmission(
        max_connections=100, new_per_second=0, burst=1, new_per_second_per_address=0.001, max_addresses=2
    )
    assert admission.admit(0.0, "a") is None
    assert admission.admit(0.0, "b") is None
    assert admission.admit(0.0, "a") == "rate"  # "a" is now the most recently seen
    assert admission.admit(0.0, "c") is None  # forgets "b"
    assert admission.tracked_addresses == 2
    assert admission.admit(0.0, "a") == "rate"
    assert admission.admit(0.0, "b") is None, "a forgotten address starts with a full bucket"


def test_overall_rate_zero_turns_the_per_address_bound_off_too() -> None:
    admission = LimitsConfig(
        new_connections_per_second=0, new_connections_burst_per_address=1
    ).connection_admission()
    assert [admission.admit(0.0, "10.0.0.1") for _ in range(50)] == [None] * 50


def test_full_broker_does_not_spend_rate_tokens() -> None:
    admission = ConnectionAdmission(max_connections=1, new_per_second=1.0, burst=1)
    assert admission.admit(0.0) is None
    for _ in range(5):
        assert admission.admit(0.0) == "max_connections"
    admission.release()
    assert admission.admit(1.0) is None


def test_release_without_admit_is_a_bug() -> None:
    with pytest.raises(RuntimeError):
        ConnectionAdmission(1, 0, 1).release()


def test_limits_defaults_are_valid_and_build_the_limiters() -> None:
    limits = load_dataclass(LimitsConfig, {})
    assert limits == LimitsConfig()
    assert limits.receive_maximum <= 65_535
    admission = limits.connection_admission()
    assert admission.max_connections == limits.max_connections
    bucket = limits.client_message_bucket(None)
    assert bucket is not None and bucket.burst == limits.messages_burst_per_client
    assert LimitsConfig(messages_per_second_per_client=0).client_message_bucket(None) is None
    assert LimitsConfig(exempt_users=["gateway"]).client_message_bucket("gateway") is None
    assert LimitsConfig(exempt_users=["gateway"]).client_message_bucket("device") is not None


def test_every_limit_field_is_documented() -> None:
    import inspect

    source = inspect.getsource(LimitsConfig)
    for field in dataclasses.fields(LimitsConfig):
        line_after = source.split(f"    {field.name}:", 1)[1].splitlines()[1].strip()
        assert line_after.startswith('"""'), f"{field.name} has no docstring line"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_connections", 0, "must be >= 1"),
        ("new_connections_per_second", -1, "must be >= 0"),
        ("new_connections_per_second_per_address", -1, "must be >= 0"),
        ("new_connections_burst_per_address", 0, "must be >= 1"),
        ("new_connections_tracked_addresses", 0, "must be >= 1"),
        ("connect_timeout_s", 0, "must be > 0"),
        ("max_packet_size", 300_000_000, "between 64 and 268435455"),
        ("receive_maximum", 0, "between 1 and 65535"),
        ("receive_maximum", 70_000, "between 1 and 65535"),
        ("max_inflight_out", 0, "between 1 and 65535"),
        ("max_client_id_length", 10, "between 23 and 65535"),
        ("max_topic_levels", 0, "must be >= 1"),
        ("outgoing_buffer_bytes", 10, "between 1024 and 2147483647"),
        ("outgoing_buffer_bytes", 2**31, "between 1024 and 2147483647"),
        ("outgoing_buffer_bytes", 2**63, "between 1024 and 2147483647"),
        ("slow_subscriber_policy", "ignore", "expected one of"),
        ("max_keepalive_s", 0, "between 1 and 65535"),
        ("messages_burst_per_client", 0, "must be >= 1"),
        ("max_topics_per_client", -5, "must be >= 0"),
    ],
)
def test_out_of_range_values_name_the_field(field: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=rf"^limits\.{field}: .*{message}"):
        load_dataclass(LimitsConfig, {field: value}, "limits")


def test_the_largest_outgoing_buffer_is_one_the_event_loop_takes() -> None:
    """uvloop keeps a transport's write-buffer limits in C ints: one past ``outgoing_buffer_bytes``'s bound
    raised ``OverflowError`` on every connection, the bound itself is taken."""
    uvloop = pytest.importorskip("uvloop")
    high = LimitsConfig(outgoing_buffer_bytes=2**31 - 1).outgoing_buffer_bytes

    async def limits_taken() -> tuple[int, int]:
        ours, theirs = socket.socketpair()
        with theirs:
            transport, _ = await asyncio.get_running_loop().connect_accepted_socket(asyncio.Protocol, ours)
            try:
                transport.set_write_buffer_limits(high=high, low=high // 2)
                return transport.get_write_buffer_limits()
            finally:
                transport.close()

    assert uvloop.run(limits_taken()) == (high // 2, high)
