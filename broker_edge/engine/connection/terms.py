"""What a connection's CONNECT settled, one object shared by every connection that settled the same.

A connection's protocol level, keep alive, the in-flight window and largest packet its client accepts, its
outgoing topic aliases and problem information rule change only at CONNECT, and most clients of a fleet
settle the same ones: rather than a slot each on every ``Connection``, they are one ``Terms`` per distinct
combination, found again by value (``settle``). Whether the connection's transport has asked it to stop
writing (``paused``) is one more term: a slow subscriber swaps its terms for their paused twin and back. So
is where the connection is in its life (``state``: ``states.NEW`` to ``CLOSED``), which changes a few times
per connection and is the same for nearly all of them.
The broker and the listener (and its counters) come with the terms, so a connection reaches them with no slot
of its own. ``Terms`` is generic in the broker's type (the connection's ``ConnectionHost``), which this module
need not know.

The listener is here too: ``ListenerRuntime``, a listener as its connections see it (config, counters, TLS
context, whether anonymous clients may in), which keeps the terms its connections start from.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, TypeVar

from broker_edge.engine.connection.certificate_ends import CertificateEnds
from broker_edge.engine.connection.states import NEW, NO_LIMIT
from broker_edge.security.tls import ServerContexts, server_ssl_context

if TYPE_CHECKING:
    import ssl

    from broker_edge.observe.metrics import ListenerMetrics
    from broker_edge.settings.broker import ListenerConfig

__all__ = ["ListenerRuntime", "ListenerStats", "Terms"]

H = TypeVar("H")
"""The broker a connection belongs to (``engine.connection.connection.ConnectionHost``)."""

_MAX_VARIANTS = 1024
"""Combinations remembered per listener; past it the table starts again (a connection keeps its own)."""

_Key = tuple[bool, int, int, int, int, bool, bool, int]


class Terms(Generic[H]):
    """One combination of settled terms on one listener (immutable: ``settle`` finds or makes another)."""

    __slots__ = (
        "_variants",
        "alias_max_out",
        "host",
        "keepalive",
        "listener",
        "max_packet_out",
        "paused",
        "problem_information",
        "send_quota",
        "state",
        "stats",
        "v5",
    )

    _variants: dict[_Key, Terms[H]]
    """Every combination found on this listener so far, by value (shared by all of them)."""
    host: H
    """The broker the connection belongs to."""
    listener: ListenerRuntime
    stats: ListenerStats
    """The listener's counters (``listener.stats``), one attribute read from the connection."""
    v5: bool
    keepalive: int
    """Seconds (0: none)."""
    send_quota: int
    """QoS 1/2 messages in flight towards the client at most (its Receive Maximum, capped)."""
    max_packet_out: int
    """The largest packet the client accepts (``NO_LIMIT``: it stated none)."""
    alias_max_out: int
    """Outgoing topic aliases this client accepts (0: the broker sends it none)."""
    problem_information: bool
    """v5 Request Problem Information: False forbids reason strings and user properties on acks."""
    paused: bool
    """The transport's write buffer is full (``Connection.pause_writing``)."""
    state: int
    """``states.NEW``, ``AUTHENTICATING``, ``CONNECTED`` or ``CLOSED`` (``Connection.state``)."""

    @classmethod
    def initial(cls, host: H, listener: ListenerRuntime, send_quota: int) -> Terms[H]:
        """The terms of a connection to ``host`` on ``listener`` before its CONNECT (shared by them all)."""
        terms: Terms[H] | None = listener.terms
        if terms is None or terms.host is not host or terms.send_quota != send_quota:
            key: _Key = (False, 0, send_quota, NO_LIMIT, 0, True, False, NEW)
            terms = listener.terms = cls._make(host, listener, key, {})
        return terms

    @classmethod
    def _make(cls, host: H, listener: ListenerRuntime, key: _Key, variants: dict[_Key, Terms[H]]) -> Terms[H]:
        terms = cls.__new__(cls)
        terms.host = host
        terms.listener = listener
        terms.stats = listener.stats
        (
            terms.v5,
            terms.keepalive,
            terms.send_quota,
            terms.max_packet_out,
            terms.alias_max_out,
            terms.problem_information,
            terms.paused,
            terms.state,
        ) = key
        terms._variants = variants
        if len(variants) >= _MAX_VARIANTS:
            variants.clear()
        variants[key] = terms
        return terms

    def settle(
        self,
        *,
        v5: bool | None = None,
        keepalive: int | None = None,
        send_quota: int | None = None,
        max_packet_out: int | None = None,
        alias_max_out: int | None = None,
        problem_information: bool | None = None,
        paused: bool | None = None,
        state: int | None = None,
    ) -> Terms[H]:
        """These terms with the given ones changed (the shared object holding them)."""
        key: _Key = (
            self.v5 if v5 is None else v5,
            self.keepalive if keepalive is None else keepalive,
            self.send_quota if send_quota is None else send_quota,
            self.max_packet_out if max_packet_out is None else max_packet_out,
            self.alias_max_out if alias_max_out is None else alias_max_out,
            self.problem_information if problem_information is None else problem_information,
            self.paused if paused is None else paused,
            self.state if state is None else state,
        )
        found = self._variants.get(key)
        return found if found is not None else self._make(self.host, self.listener, key, self._variants)

    def __repr__(self) -> str:
        return (
            f"Terms(v5={self.v5}, keepalive={self.keepalive}, send_quota={self.send_quota}, "
            f"max_packet_out={self.max_packet_out}, alias_max_out={self.alias_max_out}, "
            f"problem_information={self.problem_information}, paused={self.paused}, state={self.state})"
        )


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
        "certificate_ends",
        "checks_crl",
        "config",
        "metrics",
        "name",
        "port",
        "ssl_context",
        "stats",
        "terms",
        "tls",
        "tls_contexts",
    )

    def __init__(self, config: ListenerConfig, allow_anonymous: bool, metrics: ListenerMetrics) -> None:
        self.config = config
        self.name = config.name
        self.allow_anonymous = allow_anonymous
        self.metrics = metrics
        self.stats = ListenerStats()
        self.tls = config.tls is not None
        tls = config.tls
        self.checks_crl = tls is not None and tls.crlfile is not None
        """Client certificates are checked against CRLs: connections note theirs (``peer_certificate``)."""
        self.certificate_ends = CertificateEnds() if tls is not None and tls.cafile else None
        """Client certificates are verified: their connections are closed when their chain ends, and noted
        for the CAs it needs (``peer_trust``)."""
        self.tls_contexts = (
            ServerContexts(lambda: server_ssl_context(tls), tls, f"listener {config.name}")
            if tls is not None
            else None
        )
        """Its certificate, key and CAs, which SIGHUP reads again (``reload``: new connections get them)."""
        self.ssl_context: ssl.SSLContext | None = self.tls_contexts.context if self.tls_contexts else None
        self.port = config.port
        self.terms: Terms[Any] | None = None
        """What its connections start from before CONNECT (``Terms.initial``)."""
