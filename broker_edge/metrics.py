"""The broker's Prometheus metrics, in a registry of its own.

Each ``BrokerMetrics`` owns a ``CollectorRegistry`` instead of using prometheus-client's global one, so tests
can run several brokers in one process and each admin endpoint exposes only its broker's figures.

Handlers run once per packet, so label lookups (``.labels(...)`` hashes the label values and takes a lock)
are done once: ``for_listener(name)`` returns an object whose counters are already bound to that listener
and to each QoS, ``dropped(reason)`` and ``refused(reason)`` return cached children.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.metrics import MetricWrapperBase

__all__ = ["DISCONNECT_REASONS", "DROP_REASONS", "REFUSAL_REASONS", "BrokerMetrics", "ListenerMetrics"]

PREFIX = "timestone_broker"

DROP_REASONS = (
    "slow_subscriber",
    "queue_full",
    "expired",
    "acl_denied",
    "too_large",
    "no_subscribers",
)
"""Reasons pre-bound at start so they show (as 0) before the first drop; other reasons are allowed too."""

REFUSAL_REASONS = (
    "max_connections",
    "rate",
    "bad_credentials",
    "not_authorized",
    "anonymous",
    "protocol_error",
    "connect_timeout",
    "client_id_invalid",
    "tls_error",
)
"""Connection refusal reasons pre-bound at start; others are allowed."""

DISCONNECT_REASONS = ("slow_subscriber", "keep_alive_timeout", "protocol_error", "session_taken_over")
"""Reasons the broker closes a connected client, pre-bound at start: ``slow_subscriber`` or the lowercased
name of the v5 reason code of the DISCONNECT (sent to v5 clients; v3 clients are just closed)."""


class ListenerMetrics:
    """Counters of one listener, bound once: ``received[qos].inc()`` costs no label lookup."""

    __slots__ = (
        "bytes_received",
        "bytes_sent",
        "connections",
        "connections_total",
        "name",
        "received",
        "sent",
    )

    def __init__(self, metrics: BrokerMetrics, name: str) -> None:
        self.name = name
        self.connections = metrics.connections.labels(listener=name)
        self.connections_total = metrics.connections_total.labels(listener=name)
        self.received = tuple(metrics.messages_received_total.labels(name, str(q)) for q in range(3))
        """Indexed by QoS 0, 1, 2."""
        self.sent = tuple(metrics.messages_sent_total.labels(name, str(q)) for q in range(3))
        """Indexed by QoS 0, 1, 2."""
        self.bytes_received = metrics.bytes_received_total.labels(listener=name)
        self.bytes_sent = metrics.bytes_sent_total.labels(listener=name)

    def connected(self) -> None:
        """A client completed CONNECT on this listener."""
        self.connections.inc()
        self.connections_total.inc()

    def disconnected(self) -> None:
        """A client that had ``connected()`` went away."""
        self.connections.dec()


class BrokerMetrics:
    """All metrics of one broker; the attributes are the prometheus-client metric families."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.connections = Gauge(
            f"{PREFIX}_connections", "Client connections currently open.", ["listener"], registry=r
        )
        self.connections_total = Counter(
            f"{PREFIX}_connections_accepted",
            "Client connections accepted (CONNECT succeeded).",
            ["listener"],
            registry=r,
        )
        self.connections_refused_total = Counter(
            f"{PREFIX}_connections_refused", "Connections refused, by reason.", ["reason"], registry=r
        )
        self.disconnects_total = Counter(
            f"{PREFIX}_disconnects",
            "Connected clients the broker disconnected, by reason.",
            ["reason"],
            registry=r,
        )
        self.messages_received_total = Counter(
            f"{PREFIX}_messages_received",
            "PUBLISH packets received from clients.",
            ["listener", "qos"],
            registry=r,
        )
        self.messages_sent_total = Counter(
            f"{PREFIX}_messages_sent", "PUBLISH packets sent to clients.", ["listener", "qos"], registry=r
        )
        self.bytes_received_total = Counter(
            f"{PREFIX}_bytes_received", "Bytes read from client connections.", ["listener"], registry=r
        )
        self.bytes_sent_total = Counter(
            f"{PREFIX}_bytes_sent", "Bytes written to client connections.", ["listener"], registry=r
        )
        self.messages_dropped_total = Counter(
            f"{PREFIX}_messages_dropped",
            "Messages not delivered or not accepted, by reason.",
            ["reason"],
            registry=r,
        )
        self.inflight = Gauge(
            f"{PREFIX}_inflight_messages", "QoS 1/2 messages sent and not yet acknowledged.", registry=r
        )
        self.subscriptions = Gauge(
            f"{PREFIX}_subscriptions", "Topic filters subscribed, all sessions.", registry=r
        )
        self.retained_messages = Gauge(f"{PREFIX}_retained_messages", "Retained messages held.", registry=r)
        self.sessions = Gauge(
            f"{PREFIX}_sessions", "Sessions, by state (online/offline).", ["state"], registry=r
        )
        self.log_appends_total = Counter(
            f"{PREFIX}_log_appends", "Records appended to topic logs.", registry=r
        )
        self.log_bytes_total = Counter(f"{PREFIX}_log_bytes", "Bytes appended to topic logs.", registry=r)

        self.sessions_online = self.sessions.labels(state="online")
        self.sessions_offline = self.sessions.labels(state="offline")
        self._listeners: dict[str, ListenerMetrics] = {}
        self._dropped: dict[str, Counter] = {}
        self._refused: dict[str, Counter] = {}
        self._disconnected: dict[str, Counter] = {}
        for reason in DROP_REASONS:
            self.dropped(reason)
        for reason in REFUSAL_REASONS:
            self.refused(reason)
        for reason in DISCONNECT_REASONS:
            self.disconnected(reason)

    def for_listener(self, name: str) -> ListenerMetrics:
        """The bound counters of listener ``name`` (created on first use, then the same object)."""
        bound = self._listeners.get(name)
        if bound is None:
            bound = self._listeners[name] = ListenerMetrics(self, name)
        return bound

    def dropped(self, reason: str) -> Counter:
        """The ``messages_dropped_total`` child for ``reason``; call ``.inc()`` on it."""
        return _child(self._dropped, self.messages_dropped_total, reason)

    def refused(self, reason: str) -> Counter:
        """The ``connections_refused_total`` child for ``reason`` (see ``ConnectionAdmission.admit``)."""
        return _child(self._refused, self.connections_refused_total, reason)

    def disconnected(self, reason: str) -> Counter:
        """The ``disconnects_total`` child for ``reason``; call ``.inc()`` on it."""
        return _child(self._disconnected, self.disconnects_total, reason)

    def snapshot(self) -> dict[str, float]:
        """Key figures, summed over labels, for ``$SYS`` topics and the health endpoint.

        Keys: clients_connected, connections_total, connections_refused, messages_received, messages_sent,
        bytes_received, bytes_sent, messages_dropped, inflight, subscriptions, retained_messages,
        sessions_online, sessions_offline, log_appends, log_bytes. Reads every sample: not for the hot path.
        """
        return {
            "clients_connected": _sum(self.connections),
            "connections_total": _sum(self.connections_total),
            "connections_refused": _sum(self.connections_refused_total),
            "messages_received": _sum(self.messages_received_total),
            "messages_sent": _sum(self.messages_sent_total),
            "bytes_received": _sum(self.bytes_received_total),
            "bytes_sent": _sum(self.bytes_sent_total),
            "messages_dropped": _sum(self.messages_dropped_total),
            "inflight": _sum(self.inflight),
            "subscriptions": _sum(self.subscriptions),
            "retained_messages": _sum(self.retained_messages),
            "sessions_online": _sum(self.sessions, state="online"),
            "sessions_offline": _sum(self.sessions, state="offline"),
            "log_appends": _sum(self.log_appends_total),
            "log_bytes": _sum(self.log_bytes_total),
        }


def _child(cache: dict[str, Counter], family: Counter, reason: str) -> Counter:
    """The child of ``family`` labelled ``reason``, created once and kept in ``cache``."""
    child = cache.get(reason)
    if child is None:
        child = cache[reason] = family.labels(reason=reason)
    return child


def _sum(metric: MetricWrapperBase, **labels: str) -> float:
    """Sum of a family's main samples (``_total`` for counters, not ``_created``), optionally filtered."""
    total = 0.0
    for family in metric.collect():
        wanted = {family.name, f"{family.name}_total"}
        for sample in family.samples:
            if sample.name in wanted and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total
