"""The broker's Prometheus metrics: plain numbers while it runs, a registry of its own once scraped.

Metric families here are plain Python values (``Family``: counters and gauges, with labels;
``HistogramFamily``: a ``histogram.Histogram`` kept by the part that observes it); prometheus-client
is imported only when something reads ``BrokerMetrics.registry`` (the first scrape of ``/metrics``), which
then exposes these values through one collector. A broker that is never scraped never loads it, and one that
is keeps the figures it counted before. Each ``BrokerMetrics`` has its own registry, so tests can run several
brokers in one process and each admin endpoint exposes only its broker's figures.

Handlers run once per packet, so label lookups are done once: ``for_listener(name)`` returns an object whose
counters are already bound to that listener and to each QoS, ``dropped(reason)`` and ``refused(reason)``
return cached children.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Literal, TypeVar

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

    from broker_edge.observe.histogram import Histogram

__all__ = [
    "DISCONNECT_REASONS",
    "DROP_REASONS",
    "REFUSAL_REASONS",
    "BrokerMetrics",
    "Family",
    "HistogramFamily",
    "ListenerMetrics",
    "Value",
]

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
    "connect_too_large",
    "connect_timeout",
    "client_id_invalid",
    "tls_error",
)
"""Connection refusal reasons pre-bound at start; others are allowed."""

DISCONNECT_REASONS = ("slow_subscriber", "keep_alive_timeout", "protocol_error", "session_taken_over")
"""Reasons the broker closes a connected client, pre-bound at start: ``slow_subscriber`` or the lowercased
name of the v5 reason code of the DISCONNECT (sent to v5 clients; v3 clients are just closed)."""


_F = TypeVar("_F", "Family", "HistogramFamily")


class Value:
    """One series: a number to ``inc``/``dec``/``set``, or a function read when collected."""

    __slots__ = ("_function", "created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self._function: Callable[[], float] | None = None
        self.created = time.time()
        """When the series began (Unix time): counters expose it as their ``_created`` series."""

    def inc(self, amount: float = 1) -> None:
        self.value += amount

    def dec(self, amount: float = 1) -> None:
        self.value -= amount

    def set(self, value: float) -> None:
        self.value = float(value)

    def set_function(self, function: Callable[[], float]) -> None:
        """Report ``function()`` instead of the stored value (a gauge of something counted elsewhere)."""
        self._function = function

    def get(self) -> float:
        function = self._function
        return float(function()) if function is not None else self.value


class Family:
    """A counter or gauge family: its series by label values (one unlabelled series when it has no labels)."""

    __slots__ = ("_unlabelled", "children", "documentation", "kind", "labelnames", "name")

    def __init__(
        self,
        kind: Literal["counter", "gauge"],
        name: str,
        documentation: str,
        labelnames: tuple[str, ...] = (),
    ) -> None:
        self.kind = kind
        self.name = name
        self.documentation = documentation
        self.labelnames = labelnames
        self.children: dict[tuple[str, ...], Value] = {}
        self._unlabelled: Value | None = None
        if not labelnames:
            self._unlabelled = self.children[()] = Value()

    def labels(self, *values: str, **named: str) -> Value:
        """The series of these label values (positional, in ``labelnames`` order, or by name), made once."""
        key = tuple(named[label] for label in self.labelnames) if named else tuple(values)
        if len(key) != len(self.labelnames):
            raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {key}")
        child = self.children.get(key)
        if child is None:
            child = self.children[key] = Value()
        return child

    def _series(self) -> Value:
        if self._unlabelled is None:
            raise ValueError(f"{self.name} has labels {self.labelnames}: use .labels(...)")
        return self._unlabelled

    def inc(self, amount: float = 1) -> None:
        self._series().inc(amount)

    def dec(self, amount: float = 1) -> None:
        self._series().dec(amount)

    def set(self, value: float) -> None:
        self._series().set(value)

    def set_function(self, function: Callable[[], float]) -> None:
        self._series().set_function(function)

    def total(self, **labels: str) -> float:
        """Sum of the series whose labels include ``labels``."""
        wanted = [(self.labelnames.index(name), value) for name, value in labels.items()]
        return sum(
            child.get()
            for key, child in self.children.items()
            if all(key[index] == value for index, value in wanted)
        )

    def to_prometheus(self) -> Metric:
        """The family as prometheus-client's ``Metric`` (imported here: only a scrape gets this far)."""
        from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily

        if self.kind == "gauge":
            gauge = GaugeMetricFamily(self.name, self.documentation, labels=list(self.labelnames))
            for key, child in list(self.children.items()):
                gauge.add_metric(list(key), child.get())
            return gauge
        counter = CounterMetricFamily(self.name, self.documentation, labels=list(self.labelnames))
        for key, child in list(self.children.items()):
            counter.add_metric(list(key), child.get(), created=child.created)
        return counter


class HistogramFamily:
    """A histogram without labels, exposed from a ``Histogram`` that another part keeps and observes."""

    __slots__ = ("documentation", "histogram", "name")

    def __init__(self, name: str, documentation: str, histogram: Histogram) -> None:
        self.name = name
        self.documentation = documentation
        self.histogram = histogram

    def total(self) -> float:
        """The number of observations (the histogram's ``_count``)."""
        return self.histogram.count

    def to_prometheus(self) -> Metric:
        from prometheus_client.metrics_core import HistogramMetricFamily

        histogram = self.histogram
        return HistogramMetricFamily(
            self.name, self.documentation, buckets=histogram.cumulative(), sum_value=histogram.sum
        )


class _Exposition:
    """The collector of a broker's registry: runs the hooks, then yields every family."""

    def __init__(self, metrics: BrokerMetrics) -> None:
        self._metrics = metrics

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        for hook in self._metrics.before_collect:
            hook()
        for family in self._metrics.families:
            yield family.to_prometheus()


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
    """All metrics of one broker; the attributes are its families (``Family``)."""

    def __init__(self, before_collect: Callable[[], None] | None = None) -> None:
        self.families: list[Family | HistogramFamily] = []
        """Every family, in the order the exposition lists them."""
        self.before_collect: list[Callable[[], None]] = [before_collect] if before_collect else []
        """Called before each collection (e.g. to add counts gathered elsewhere)."""
        self._registry: CollectorRegistry | None = None
        counter, gauge = self.counter, self.gauge
        self.connections = gauge("connections", "Client connections currently open.", ["listener"])
        self.connections_total = counter(
            "connections_accepted",
            "Client connections accepted (CONNECT succeeded).",
            ["listener"],
        )
        self.connections_refused_total = counter(
            "connections_refused", "Connections refused, by reason.", ["reason"]
        )
        self.tls_handshake_failures_total = counter(
            "tls_handshake_failures",
            "TLS handshakes that failed, by listener and reason (timeout, closed, OpenSSL's reason).",
            ["listener", "reason"],
        )
        self.https_certificate_refusals_total = counter(
            "https_certificate_refusals",
            "Requests on kept-alive HTTPS connections refused because their client certificate expired, or "
            "a reload no longer trusts or revokes it, and peer links and uplinks closed because the "
            "certificate of their other end did, by endpoint and reason.",
            ["endpoint", "reason"],
        )
        self.disconnects_total = counter(
            "disconnects",
            "Connected clients the broker disconnected, by reason.",
            ["reason"],
        )
        self.messages_received_total = counter(
            "messages_received",
            "PUBLISH packets received from clients.",
            ["listener", "qos"],
        )
        self.messages_sent_total = counter(
            "messages_sent", "PUBLISH packets sent to clients.", ["listener", "qos"]
        )
        self.bytes_received_total = counter(
            "bytes_received", "Bytes read from client connections.", ["listener"]
        )
        self.bytes_sent_total = counter("bytes_sent", "Bytes written to client connections.", ["listener"])
        self.messages_dropped_total = counter(
            "messages_dropped",
            "Messages not delivered or not accepted, by reason.",
            ["reason"],
        )
        self.inflight = gauge("inflight_messages", "QoS 1/2 messages sent and not yet acknowledged.")
        self.subscriptions = gauge("subscriptions", "Topic filters subscribed, all sessions.")
        self.retained_messages = gauge("retained_messages", "Retained messages held.")
        self.sessions = gauge("sessions", "Sessions, by state (online/offline).", ["state"])
        self.log_appends_total = counter("log_appends", "Records appended to topic logs.")
        self.log_bytes_total = counter("log_bytes", "Bytes appended to topic logs.")
        self.metrics_pages_built_total = counter(
            "metrics_pages_built", "Pages of /metrics built (one answers every request that waited for it)."
        )
        self.metrics_page_build_seconds_total = counter(
            "metrics_page_build_seconds", "Seconds the event loop spent building pages of /metrics."
        )

        self.sessions_online = self.sessions.labels(state="online")
        self.sessions_offline = self.sessions.labels(state="offline")
        self._listeners: dict[str, ListenerMetrics] = {}
        self._dropped: dict[str, Value] = {}
        self._refused: dict[str, Value] = {}
        self._disconnected: dict[str, Value] = {}
        for reason in DROP_REASONS:
            self.dropped(reason)
        for reason in REFUSAL_REASONS:
            self.refused(reason)
        for reason in DISCONNECT_REASONS:
            self.disconnected(reason)

    def counter(self, name: str, documentation: str, labelnames: list[str] | None = None) -> Family:
        """A new counter family ``timestone_broker_<name>`` (exposed as ``..._total``)."""
        return self._add(Family("counter", f"{PREFIX}_{name}", documentation, tuple(labelnames or ())))

    def gauge(self, name: str, documentation: str, labelnames: list[str] | None = None) -> Family:
        """A new gauge family ``timestone_broker_<name>``."""
        return self._add(Family("gauge", f"{PREFIX}_{name}", documentation, tuple(labelnames or ())))

    def histogram(self, name: str, documentation: str, histogram: Histogram) -> HistogramFamily:
        """A histogram family ``timestone_broker_<name>`` exposing ``histogram`` (observed elsewhere)."""
        return self._add(HistogramFamily(f"{PREFIX}_{name}", documentation, histogram))

    def _add(self, family: _F) -> _F:
        self.families.append(family)
        return family

    @property
    def registry(self) -> CollectorRegistry:
        """The prometheus-client registry exposing these metrics (made, the library loaded, on first use)."""
        if self._registry is None:
            from prometheus_client import CollectorRegistry

            self._registry = CollectorRegistry()
            self._registry.register(_Exposition(self))
        return self._registry

    def for_listener(self, name: str) -> ListenerMetrics:
        """The bound counters of listener ``name`` (created on first use, then the same object)."""
        bound = self._listeners.get(name)
        if bound is None:
            bound = self._listeners[name] = ListenerMetrics(self, name)
        return bound

    def dropped(self, reason: str) -> Value:
        """The ``messages_dropped_total`` child for ``reason``; call ``.inc()`` on it."""
        return _child(self._dropped, self.messages_dropped_total, reason)

    def refused(self, reason: str) -> Value:
        """The ``connections_refused_total`` child for ``reason`` (see ``ConnectionAdmission.admit``)."""
        return _child(self._refused, self.connections_refused_total, reason)

    def disconnected(self, reason: str) -> Value:
        """The ``disconnects_total`` child for ``reason``; call ``.inc()`` on it."""
        return _child(self._disconnected, self.disconnects_total, reason)

    def snapshot(self) -> dict[str, float]:
        """Key figures, summed over labels, for ``$SYS`` topics and the health endpoint.

        Keys: clients_connected, connections_total, connections_refused, messages_received, messages_sent,
        bytes_received, bytes_sent, messages_dropped, inflight, subscriptions, retained_messages,
        sessions_online, sessions_offline, log_appends, log_bytes. Reads every sample: not for the hot path.
        """
        return {
            "clients_connected": self.connections.total(),
            "connections_total": self.connections_total.total(),
            "connections_refused": self.connections_refused_total.total(),
            "messages_received": self.messages_received_total.total(),
            "messages_sent": self.messages_sent_total.total(),
            "bytes_received": self.bytes_received_total.total(),
            "bytes_sent": self.bytes_sent_total.total(),
            "messages_dropped": self.messages_dropped_total.total(),
            "inflight": self.inflight.total(),
            "subscriptions": self.subscriptions.total(),
            "retained_messages": self.retained_messages.total(),
            "sessions_online": self.sessions.total(state="online"),
            "sessions_offline": self.sessions.total(state="offline"),
            "log_appends": self.log_appends_total.total(),
            "log_bytes": self.log_bytes_total.total(),
        }


def _child(cache: dict[str, Value], family: Family, reason: str) -> Value:
    """The series of ``family`` labelled ``reason``, created once and kept in ``cache``."""
    child = cache.get(reason)
    if child is None:
        child = cache[reason] = family.labels(reason=reason)
    return child
