"""The slow-subscriber policy (``SlowSubscribers``) with a clock the test moves: publishers held while a
subscriber's buffer is full, let go when it drains, closes or stays stuck; drops counted and said."""

from __future__ import annotations

import logging
from collections.abc import Callable

from broker_edge.config import load_dataclass
from broker_edge.engine.connection.states import CLOSED, CONNECTED, HELD_FOR_SUBSCRIBERS
from broker_edge.engine.message import Message
from broker_edge.engine.slow_subscribers import SlowSubscribers
from broker_edge.observe.counters import BrokerCounters
from broker_edge.observe.logs import connection_logger
from broker_edge.security.limits import LimitsConfig


class Client:
    """A connection as the policy sees it: holds by reason, a log, an abort."""

    def __init__(self, client_id: str) -> None:
        self.client_id = client_id
        self.state = CONNECTED
        self.held = 0
        self.aborted = False

    def hold(self, reason: int) -> None:
        self.held |= reason

    def release(self, reason: int) -> None:
        self.held &= ~reason

    def log(self) -> logging.LoggerAdapter:
        return connection_logger(self.client_id, "tcp", "127.0.0.1:1")

    def abort(self) -> None:
        self.aborted = True


class Policy:
    def __init__(self, **limits: object) -> None:
        self.now = 100.0
        self.soon: list[Callable[[], None]] = []
        self.clients = {name: Client(name) for name in ("sub", "p1", "p2")}
        self.counters = BrokerCounters()
        self.slow = SlowSubscribers(
            load_dataclass(LimitsConfig, limits, "limits"),
            self.counters,
            lambda: self.now,
            self.soon.append,
            self.clients.get,
        )

    def message(self, origin: str) -> Message:
        return Message("t", b"x", 0, False, None, origin, None, None)


def test_backpressure_holds_each_publisher_once_until_the_subscriber_drains():
    p = Policy()
    sub, p1, p2 = p.clients["sub"], p.clients["p1"], p.clients["p2"]
    p.slow.paused(sub)
    assert p.slow.deliver(sub, p.message("p1"))  # written all the same
    assert p.slow.deliver(sub, p.message("p1"))
    assert p.slow.deliver(sub, p.message("p2"))
    assert p.slow.deliver(sub, p.message("gone"))  # its publisher is not a client here: nothing to hold
    assert p1.held == p2.held == HELD_FOR_SUBSCRIBERS
    assert (p.slow.paused_count, p.slow.held_count) == (1, 2)
    p.slow.resumed(sub)
    assert p1.held == p2.held == 0
    assert (p.slow.paused_count, p.slow.held_count) == (0, 0)
    assert p.counters.drops("slow_subscriber") == 0


def test_a_publisher_held_by_two_slow_subscribers_reads_again_once_both_drained():
    p = Policy()
    p.clients["sub2"] = Client("sub2")
    sub, sub2, p1 = p.clients["sub"], p.clients["sub2"], p.clients["p1"]
    for subscriber in (sub, sub2):
        p.slow.paused(subscriber)
        p.slow.deliver(subscriber, p.message("p1"))
    p.slow.resumed(sub)
    assert p1.held == HELD_FOR_SUBSCRIBERS
    p.slow.resumed(sub2)
    assert p1.held == 0


def test_a_stuck_subscriber_lets_its_publishers_go_and_its_messages_are_dropped_and_said(caplog):
    p = Policy(slow_subscriber_hold_s=5)
    sub, p1 = p.clients["sub"], p.clients["p1"]
    p.slow.paused(sub)
    p.slow.deliver(sub, p.message("p1"))
    p.now += 4.9
    p.slow.tick(p.now)
    assert p1.held == HELD_FOR_SUBSCRIBERS
    p.now += 0.2
    with caplog.at_level(logging.WARNING):
        p.slow.tick(p.now)
        assert p1.held == 0
        assert not p.slow.deliver(sub, p.message("p1"))
        assert not p.slow.deliver(sub, p.message("p1"))
    assert p1.held == 0
    assert p.counters.drops("slow_subscriber") == 2
    said = [r for r in caplog.records if r.name == "broker_edge.connection"]
    assert "not reading for 5 s" in said[0].getMessage()
    assert "subscriber 'sub' is not reading" in said[1].getMessage()
    assert said[1].__dict__["reason"] == "slow_subscriber" and said[1].__dict__["topic"] == "t"


def test_drop_qos0_drops_at_once_and_says_so_at_a_bounded_rate(caplog):
    p = Policy(slow_subscriber_policy="drop_qos0")
    sub, p1 = p.clients["sub"], p.clients["p1"]
    p.slow.paused(sub)
    with caplog.at_level(logging.WARNING):
        for _ in range(100):
            assert not p.slow.deliver(sub, p.message("p1"))
    assert p1.held == 0
    assert p.counters.drops("slow_subscriber") == 100
    lines = [r for r in caplog.records if r.__dict__.get("reason") == "slow_subscriber"]
    assert 1 <= len(lines) <= 20


def test_disconnect_aborts_the_subscriber_when_it_pauses():
    p = Policy(slow_subscriber_policy="disconnect")
    sub = p.clients["sub"]
    p.slow.paused(sub)
    for callback in p.soon:
        callback()
    assert sub.aborted


def test_a_subscriber_that_closes_lets_its_publishers_go():
    p = Policy()
    sub, p1 = p.clients["sub"], p.clients["p1"]
    p.slow.paused(sub)
    p.slow.deliver(sub, p.message("p1"))
    sub.state = CLOSED
    p.slow.resumed(sub)
    assert p1.held == 0
