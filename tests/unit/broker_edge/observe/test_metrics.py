"""Broker metrics: one registry per broker, bound hot-path counters, a parseable exposition, the snapshot."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from broker_edge.observe.metrics import DROP_REASONS, BrokerMetrics


def samples(metrics: BrokerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The exposition as the Prometheus parser reads it: (sample name, sorted labels) -> value."""
    text = generate_latest(metrics.registry).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def exercise(metrics: BrokerMetrics) -> None:
    tcp = metrics.for_listener("tcp")
    tls = metrics.for_listener("tls")
    tcp.connected()
    tcp.connected()
    tls.connected()
    tcp.disconnected()
    tcp.received[0].inc()
    tcp.received[1].inc(2)
    tls.sent[2].inc()
    tcp.bytes_received.inc(100)
    tls.bytes_sent.inc(40)
    metrics.dropped("slow_subscriber").inc()
    metrics.dropped("something_new").inc(2)
    metrics.refused("rate").inc()
    metrics.sessions_online.set(2)
    metrics.sessions_offline.set(5)
    metrics.subscriptions.set(7)
    metrics.retained_messages.set(3)
    metrics.inflight.inc(4)
    metrics.log_appends_total.inc(3)
    metrics.log_bytes_total.inc(300)


def test_exposition_parses_and_carries_the_labels() -> None:
    metrics = BrokerMetrics()
    exercise(metrics)
    got = samples(metrics)
    assert got[("timestone_broker_connections", (("listener", "tcp"),))] == 1
    assert got[("timestone_broker_connections", (("listener", "tls"),))] == 1
    assert got[("timestone_broker_connections_accepted_total", (("listener", "tcp"),))] == 2
    assert got[("timestone_broker_messages_received_total", (("listener", "tcp"), ("qos", "1")))] == 2
    assert got[("timestone_broker_messages_sent_total", (("listener", "tls"), ("qos", "2")))] == 1
    assert got[("timestone_broker_bytes_received_total", (("listener", "tcp"),))] == 100
    assert got[("timestone_broker_messages_dropped_total", (("reason", "something_new"),))] == 2
    assert got[("timestone_broker_connections_refused_total", (("reason", "rate"),))] == 1
    assert got[("timestone_broker_sessions", (("state", "offline"),))] == 5
    assert got[("timestone_broker_inflight_messages", ())] == 4
    assert got[("timestone_broker_log_bytes_total", ())] == 300
    assert got[("timestone_broker_log_bytes_created", ())] > 1.7e9, "counters carry their _created series"


def test_figures_counted_before_the_registry_is_made_are_in_the_first_scrape() -> None:
    metrics = BrokerMetrics()
    metrics.for_listener("tcp").received[1].inc(3)
    assert metrics._registry is None, "nothing has asked for the registry yet"
    assert (
        samples(metrics)[("timestone_broker_messages_received_total", (("listener", "tcp"), ("qos", "1")))]
        == 3
    )
    metrics.for_listener("tcp").received[1].inc()
    assert (
        metrics.registry.get_sample_value(
            "timestone_broker_messages_received_total", {"listener": "tcp", "qos": "1"}
        )
        == 4
    )


def test_known_drop_reasons_are_exposed_before_the_first_drop() -> None:
    got = samples(BrokerMetrics())
    for reason in DROP_REASONS:
        assert got[("timestone_broker_messages_dropped_total", (("reason", reason),))] == 0


def test_two_brokers_in_one_process_have_separate_figures() -> None:
    first, second = BrokerMetrics(), BrokerMetrics()
    first.for_listener("tcp").received[0].inc(5)
    assert first.snapshot()["messages_received"] == 5
    assert second.snapshot()["messages_received"] == 0
    assert first.registry is not second.registry


def test_bound_children_are_created_once() -> None:
    metrics = BrokerMetrics()
    assert metrics.for_listener("tcp") is metrics.for_listener("tcp")
    assert metrics.dropped("expired") is metrics.dropped("expired")
    assert metrics.refused("brand_new") is metrics.refused("brand_new")
    assert metrics.for_listener("tcp").received[1] is metrics.messages_received_total.labels("tcp", "1")


def test_snapshot_sums_over_labels() -> None:
    metrics = BrokerMetrics()
    exercise(metrics)
    assert metrics.snapshot() == {
        "clients_connected": 2,
        "connections_total": 3,
        "connections_refused": 1,
        "messages_received": 3,
        "messages_sent": 1,
        "bytes_received": 100,
        "bytes_sent": 40,
        "messages_dropped": 3,
        "inflight": 4,
        "subscriptions": 7,
        "retained_messages": 3,
        "sessions_online": 2,
        "sessions_offline": 5,
        "log_appends": 3,
        "log_bytes": 300,
    }
