"""Plain-integer counters the packet path bumps, added into Prometheus once a second (no lock per packet).

Reasons are free-form labels (``metrics.DROP_REASONS`` and friends are only pre-bound so they show as 0).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from broker_edge.observe.refusal_log import Logger, RefusalLog

if TYPE_CHECKING:
    from broker_edge.observe.metrics import BrokerMetrics

__all__ = ["BrokerCounters"]


class BrokerCounters:
    """Messages dropped, connections refused, clients disconnected by the broker, reads throttled."""

    __slots__ = (
        "_disconnects",
        "_drops",
        "_refused",
        "_tls_failures",
        "drop_log",
        "held_for_acks",
        "offsets_left_out",
        "refusal_log",
        "throttled",
    )

    def __init__(self) -> None:
        self.refusal_log = RefusalLog()
        """The log lines of refusals (ACL, logins, TLS), limited per reason."""
        self.drop_log = RefusalLog()
        """The log lines of messages dropped for a subscriber (``drop_for``), limited per reason."""
        self._drops: dict[str, int] = {}
        self._refused: dict[str, int] = {}
        self._disconnects: dict[str, int] = {}
        self._tls_failures: dict[tuple[str, str], int] = {}
        self.throttled = 0
        """Times a client's reading was paused for its message rate since the last ``flush_into``."""
        self.held_for_acks = 0
        """Times a client's reading was paused for its publishes not yet answered (``limits.receive_maximum``)
        since the server last took the count."""
        self.offsets_left_out = 0
        """Deliveries sent without the broker's ``offset`` user property, which alone made them larger than
        the client's Maximum Packet Size, since the server last took the count."""

    def drop(self, reason: str, count: int = 1) -> None:
        """``count`` messages were not delivered (or not accepted) for ``reason``."""
        self._drops[reason] = self._drops.get(reason, 0) + count

    def drop_for(
        self, reason: str, now: float, log: Logger | Callable[[], Logger], message: str, **fields: Any
    ) -> None:
        """A message was not delivered to a subscriber for ``reason``: counted, and said in a WARNING on
        ``log`` (the subscriber's: it names it), at most ``refusal_log.LINES_PER_WINDOW`` per window and
        reason, the lines held back counted in the next one."""
        self._drops[reason] = self._drops.get(reason, 0) + 1
        self.drop_log.write(log, now, reason, message, action="deliver", **fields)

    def refused(self, reason: str) -> None:
        """A connection was refused before it was connected."""
        self._refused[reason] = self._refused.get(reason, 0) + 1

    def disconnect(self, reason: str) -> None:
        """The broker closed a connected client (keep alive, protocol error, slow subscriber, ...)."""
        self._disconnects[reason] = self._disconnects.get(reason, 0) + 1

    def tls_failed(self, listener: str, reason: str) -> None:
        """A TLS handshake on ``listener`` failed for ``reason`` (``http.tls_accept.failure_reason``);
        counted as a ``tls_error`` refusal too, unless it was a port check (``probe``)."""
        if reason != "probe":
            self.refused("tls_error")
        key = (listener, reason)
        self._tls_failures[key] = self._tls_failures.get(key, 0) + 1

    def drops(self, reason: str) -> int:
        """Drops for ``reason`` not yet added into Prometheus (for tests of one packet's effect)."""
        return self._drops.get(reason, 0)

    def refusals(self, reason: str) -> int:
        """Refusals for ``reason`` not yet added into Prometheus."""
        return self._refused.get(reason, 0)

    def flush_into(self, metrics: BrokerMetrics) -> int:
        """Add every count into ``metrics`` and start again from zero; returns the throttled count taken."""
        if self._drops:
            drops, self._drops = self._drops, {}
            for reason, count in drops.items():
                metrics.dropped(reason).inc(count)
        if self._refused:
            refused, self._refused = self._refused, {}
            for reason, count in refused.items():
                metrics.refused(reason).inc(count)
        if self._disconnects:
            disconnects, self._disconnects = self._disconnects, {}
            for reason, count in disconnects.items():
                metrics.disconnected(reason).inc(count)
        if self._tls_failures:
            failures, self._tls_failures = self._tls_failures, {}
            for (listener, reason), count in failures.items():
                metrics.tls_handshake_failures_total.labels(listener, reason).inc(count)
        throttled, self.throttled = self.throttled, 0
        return throttled
