"""A listener as its connections see it: config, counters, TLS context, whether anonymous clients may in."""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker_edge.security.tls import server_ssl_context

if TYPE_CHECKING:
    import ssl

    from broker_edge.engine.connection.terms import Terms
    from broker_edge.observe.metrics import ListenerMetrics
    from broker_edge.settings.broker import ListenerConfig

__all__ = ["ListenerRuntime", "ListenerStats"]


class ListenerStats:
    """Plain-integer counters of one listener, added into Prometheus once a second (no lock per packet)."""

    __slots__ = ("bytes_in", "bytes_out", "received", "sent")

    def __init__(self) -> None:
        self.received = [0, 0, 0]
        self.sent = [0, 0, 0]
        self.bytes_in = 0
        self.bytes_out = 0

    def flush_into(self, bound: ListenerMetrics) -> None:
        """Add the counts into the listener's Prometheus counters and start again from zero."""
        for qos in range(3):
            if self.received[qos]:
                bound.received[qos].inc(self.received[qos])
                self.received[qos] = 0
            if self.sent[qos]:
                bound.sent[qos].inc(self.sent[qos])
                self.sent[qos] = 0
        if self.bytes_in:
            bound.bytes_received.inc(self.bytes_in)
            self.bytes_in = 0
        if self.bytes_out:
            bound.bytes_sent.inc(self.bytes_out)
            self.bytes_out = 0


class ListenerRuntime:
    """A listener's config with what connections need at hand: its counters, TLS context, anonymous rule."""

    __slots__ = (
        "allow_anonymous",
        "config",
        "metrics",
        "name",
        "port",
        "ssl_context",
        "stats",
        "terms",
        "tls",
    )

    def __init__(self, config: ListenerConfig, allow_anonymous: bool, metrics: ListenerMetrics) -> None:
        self.config = config
        self.name = config.name
        self.allow_anonymous = allow_anonymous
        self.metrics = metrics
        self.stats = ListenerStats()
        self.tls = config.tls is not None
        self.ssl_context: ssl.SSLContext | None = server_ssl_context(config.tls) if config.tls else None
        self.port = config.port
        self.terms: Terms | None = None
        """What its connections start from before CONNECT (``Terms.initial``)."""
