"""Subscribers that cannot keep up: what becomes of the QoS 0 messages routed to a connection whose write
buffer is full (its transport called ``pause_writing``, past ``limits.outgoing_buffer_bytes``).

``limits.slow_subscriber_policy``:

- ``backpressure`` (the default): the message is written all the same, and the connection of its publisher
  (a client of this broker) is not read until the subscriber's buffer is back under its low-water mark. The
  publisher's socket then fills and TCP slows it down: nothing is lost, and the broker holds at most what
  its publishers' reads in progress bring. A subscriber still paused ``limits.slow_subscriber_hold_s``
  after it paused lets its publishers go (it is stuck, and must not stop everyone publishing to it): its
  QoS 0 messages are then dropped until it drains, each counted and said as ``drop_qos0`` says them.
- ``drop_qos0``: the message is dropped at once.
- ``disconnect``: the subscriber is disconnected when it pauses (counted as a ``slow_subscriber``
  disconnect).

A dropped message is counted (``messages_dropped_total{reason="slow_subscriber"}``) and said in a WARNING
naming the subscriber, at a bounded rate (``BrokerCounters.drop_for``). QoS 1/2 messages never come here:
they wait in the subscriber's session (``engine.sessions.session``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from broker_edge.engine.connection.states import CLOSED, HELD_FOR_SUBSCRIBERS

if TYPE_CHECKING:
    from broker_edge.engine.message import Message
    from broker_edge.observe.counters import BrokerCounters
    from broker_edge.security.limits import LimitsConfig

__all__ = ["HeldPublisher", "SlowSubscriber", "SlowSubscribers"]


class HeldPublisher(Protocol):
    """A publisher's connection, as far as it is held for a slow subscriber."""

    def hold(self, reason: int) -> None: ...

    def release(self, reason: int) -> None: ...


class SlowSubscriber(Protocol):
    """A subscriber's connection (``Connection``), as far as the policy needs it."""

    @property
    def client_id(self) -> str: ...

    @property
    def state(self) -> int: ...

    def log(self) -> logging.LoggerAdapter: ...

    def abort(self) -> None: ...


class _Paused:
    """One paused subscriber: since when, and the publishers held for it."""

    __slots__ = ("held", "since", "stuck")

    def __init__(self, since: float) -> None:
        self.since = since
        self.held: list[HeldPublisher] = []
        self.stuck = False
        """Paused longer than ``slow_subscriber_hold_s``: its publishers went, its QoS 0 messages are
        dropped."""


class SlowSubscribers:
    """The slow-subscriber policy of one broker (see the module docstring)."""

    __slots__ = ("_call_soon", "_clock", "_holds", "_paused", "_publisher_of", "counters", "hold_s", "policy")

    def __init__(
        self,
        limits: LimitsConfig,
        counters: BrokerCounters,
        clock: Callable[[], float],
        call_soon: Callable[[Callable[[], None]], None],
        publisher_of: Callable[[str], HeldPublisher | None],
    ) -> None:
        self.policy = limits.slow_subscriber_policy
        self.hold_s = limits.slow_subscriber_hold_s
        self.counters = counters
        self._clock = clock
        self._call_soon = call_soon
        self._publisher_of = publisher_of
        """The connection of the client with this id on this broker (None: none, or not a client)."""
        self._paused: dict[SlowSubscriber, _Paused] = {}
        self._holds: dict[HeldPublisher, int] = {}
        """How many paused subscribers hold each publisher."""

    @property
    def paused_count(self) -> int:
        """Subscribers whose write buffer is full now."""
        return len(self._paused)

    @property
    def held_count(self) -> int:
        """Publishers not read now because a subscriber of theirs is slow."""
        return len(self._holds)

    def paused(self, subscriber: SlowSubscriber) -> None:
        """``subscriber``'s write buffer passed its high-water mark."""
        if self.policy == "disconnect":
            subscriber.log().warning("slow subscriber disconnected (outgoing buffer full)")
            self.counters.disconnect("slow_subscriber")
            self._call_soon(subscriber.abort)
            return
        if subscriber not in self._paused:
            self._paused[subscriber] = _Paused(self._clock())

    def resumed(self, subscriber: SlowSubscriber) -> None:
        """``subscriber``'s buffer drained (or it closed): its publishers are read again."""
        paused = self._paused.pop(subscriber, None)
        if paused is not None:
            self._let_go(paused)

    def deliver(self, subscriber: SlowSubscriber, message: Message) -> bool:
        """A QoS 0 message for ``subscriber``, whose buffer is full: True to write it (its publisher is held
        meanwhile), False when it is dropped (counted and said)."""
        paused = self._paused.get(subscriber)
        if self.policy == "backpressure" and paused is not None and not paused.stuck:
            if self._clock() - paused.since < self.hold_s:
                self._hold(paused, message.origin)
                return True
            self._give_up(subscriber, paused)
        self.counters.drop_for(
            "slow_subscriber",
            self._clock(),
            subscriber.log,
            f"QoS 0 message dropped: subscriber {subscriber.client_id!r} is not reading "
            "(its outgoing buffer is full)",
            topic=message.topic,
            policy=self.policy,
        )
        return False

    def tick(self, now: float) -> None:
        """Let go of the publishers held by subscribers paused longer than ``slow_subscriber_hold_s`` (the
        broker's sweep calls it about once a second)."""
        for subscriber, paused in list(self._paused.items()):
            if not paused.stuck and now - paused.since >= self.hold_s:
                self._give_up(subscriber, paused)

    def _hold(self, paused: _Paused, origin: str) -> None:
        publisher = self._publisher_of(origin) if origin else None
        if publisher is None or publisher in paused.held:
            return
        paused.held.append(publisher)
        holds = self._holds
        count = holds.get(publisher, 0)
        holds[publisher] = count + 1
        if not count:
            publisher.hold(HELD_FOR_SUBSCRIBERS)

    def _give_up(self, subscriber: SlowSubscriber, paused: _Paused) -> None:
        paused.stuck = True
        if subscriber.state != CLOSED:
            subscriber.log().warning(
                "slow subscriber: not reading for %.0f s (limits.slow_subscriber_hold_s); its %d publishers "
                "are read again and its QoS 0 messages are dropped until it reads",
                self.hold_s,
                len(paused.held),
            )
        self._let_go(paused)

    def _let_go(self, paused: _Paused) -> None:
        held, paused.held = paused.held, []
        holds = self._holds
        for publisher in held:
            count = holds.pop(publisher, 1) - 1
            if count:
                holds[publisher] = count
            else:
                publisher.release(HELD_FOR_SUBSCRIBERS)
