"""``$SYS/broker/...`` topic names and payloads, from a real metrics snapshot."""

from __future__ import annotations

import pytest

from broker_edge.config import ConfigError, load_dataclass
from broker_edge.observe.metrics import BrokerMetrics
from broker_edge.observe.sys_topics import SysTopicsConfig, sys_topic_messages
from broker_edge.protocol.topics import topic_matches


def test_topics_and_payloads_from_a_snapshot() -> None:
    metrics = BrokerMetrics()
    tcp = metrics.for_listener("tcp")
    tcp.connected()
    tcp.connected()
    tcp.received[0].inc(10)
    tcp.sent[1].inc(4)
    tcp.bytes_received.inc(2048)
    metrics.sessions_online.set(2)
    metrics.sessions_offline.set(3)
    metrics.subscriptions.set(6)
    metrics.retained_messages.set(1)
    metrics.dropped("queue_full").inc()

    messages = sys_topic_messages(metrics.snapshot(), "0.1.0", started_at=1000.0, now=1125.9)

    assert messages["$SYS/broker/version"] == b"timestone 0.1.0"
    assert messages["$SYS/broker/uptime"] == b"125 seconds"
    assert messages["$SYS/broker/clients/connected"] == b"2"
    assert messages["$SYS/broker/clients/disconnected"] == b"3"
    assert messages["$SYS/broker/clients/total"] == b"5"
    assert messages["$SYS/broker/messages/received"] == b"10"
    assert messages["$SYS/broker/messages/sent"] == b"4"
    assert messages["$SYS/broker/bytes/received"] == b"2048"
    assert messages["$SYS/broker/bytes/sent"] == b"0"
    assert messages["$SYS/broker/subscriptions/count"] == b"6"
    assert messages["$SYS/broker/retained messages/count"] == b"1"
    assert messages["$SYS/broker/publish/messages/dropped"] == b"1"


def test_every_name_is_a_valid_sys_topic() -> None:
    messages = sys_topic_messages({}, "x", 0.0, 0.0)
    assert len(messages) >= 15
    for topic, payload in messages.items():
        assert topic.startswith("$SYS/broker/")
        assert not set(topic) & {"+", "#", "\0"}
        assert isinstance(payload, bytes)
        assert topic_matches("$SYS/broker/#", topic)
        assert not topic_matches("#", topic), "plain '#' subscribers must not receive $SYS"


def test_missing_or_odd_figures_are_zero_and_clock_skew_is_not_negative() -> None:
    messages = sys_topic_messages({"messages_sent": "n/a"}, "x", started_at=50.0, now=10.0)
    assert messages["$SYS/broker/messages/sent"] == b"0"
    assert messages["$SYS/broker/uptime"] == b"0 seconds"


def test_config() -> None:
    assert load_dataclass(SysTopicsConfig, {}) == SysTopicsConfig(True, 10.0)
    assert load_dataclass(SysTopicsConfig, {"interval_s": 30}).interval_s == 30.0
    with pytest.raises(ConfigError, match=r"^sys_topics\.interval_s: must be >= 1"):
        load_dataclass(SysTopicsConfig, {"interval_s": 0.1}, "sys_topics")
