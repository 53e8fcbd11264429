"""Session bookkeeping of outgoing packet ids, without sockets: allocation, wrap-around, acks, resume."""

from __future__ import annotations

import time

import pytest

from broker_edge.engine.message import Message
from broker_edge.engine.routing.router import Router
from broker_edge.engine.sessions.session import RELEASED, Session
from broker_edge.security.limits import LimitsConfig
from tests.unit.broker_edge.engine.stand_ins import RecordingConnection


def session_with(connection: RecordingConnection) -> Session:
    session = Router(LimitsConfig()).session_type("device", expiry_interval=300)
    session.attach(connection)
    return session


@pytest.mark.mqtt311("MQTT-2.3.1-4", "MQTT-4.3.2-1")
@pytest.mark.mqtt5("MQTT-2.2.1-4", "MQTT-4.3.2-1", "MQTT-4.3.3-1")
def test_ids_count_up_and_skip_ids_still_in_flight_after_wrapping():
    connection = RecordingConnection()
    session = session_with(connection)
    session.deliver(Message("t", b"a", 1), 1, False)
    session.deliver(Message("t", b"b", 2), 2, False)
    assert session.inflight is not None
    session.inflight.next_id = 0xFFFF  # a long-lived session about to wrap
    for payload in (b"c", b"d", b"e"):
        session.deliver(Message("t", payload, 1), 1, False)
    assert [sent[2] for sent in connection.sent] == [1, 2, 0xFFFF, 3, 4]  # 1 and 2 are still in flight
    assert sorted(session.inflight) == [1, 2, 3, 4, 0xFFFF]


@pytest.mark.mqtt311("MQTT-4.3.2-1", "MQTT-4.3.3-1")
@pytest.mark.mqtt5("MQTT-4.3.2-3", "MQTT-4.3.3-3")
def test_acks_free_their_ids_and_only_the_right_ack_counts():
    connection = RecordingConnection()
    session = session_with(connection)
    session.deliver(Message("t", b"q1", 1), 1, False)
    session.deliver(Message("t", b"q2", 2), 2, False)
    assert session.on_pubcomp(1) is False  # a QoS 1 id is not completed by PUBCOMP
    assert session.on_puback(2) is False  # nor a QoS 2 id by PUBACK
    assert session.on_puback(1) is True
    assert session.on_puback(1) is False  # twice: unknown now
    assert session.on_pubrec(2, failed=False) is True
    assert session.inflight is not None and session.inflight[2] is RELEASED
    assert session.on_pubrec(2, failed=False) is True  # a repeated PUBREC gets PUBREL again
    assert session.on_pubcomp(2) is True
    assert not session.inflight


@pytest.mark.mqtt5("MQTT-4.4.0-2", "MQTT-4.8.2-6")
def test_a_failed_pubrec_ends_the_qos2_flow():
    connection = RecordingConnection()
    session = session_with(connection)
    session.deliver(Message("t", b"q2", 2), 2, False)
    assert session.on_pubrec(1, failed=True) is False
    assert not session.inflight


@pytest.mark.mqtt311("MQTT-4.6.0-5", "MQTT-4.6.0-6")
@pytest.mark.mqtt5("MQTT-3.3.4-9", "MQTT-4.6.0-5", "MQTT-4.6.0-6", "MQTT-4.9.0-2")
def test_window_full_queues_then_acks_drain_in_order():
    connection = RecordingConnection(send_quota=2)
    session = session_with(connection)
    for payload in (b"1", b"2", b"3", b"4"):
        session.deliver(Message("t", payload, 1), 1, False)
    assert [sent[0] for sent in connection.sent] == [b"1", b"2"]
    assert session.queue is not None and len(session.queue) == 2
    session.on_puback(1)
    session.on_puback(2)
    assert [sent[0] for sent in connection.sent] == [b"1", b"2", b"3", b"4"]
    assert session.queue is None


def test_held_deliveries_drain_in_order_with_free_ids_and_expired_ones_dropped():
    """Held deliveries go out in order [MQTT-4.6.0-6] as acknowledgements make room, each with the next id
    not in flight [MQTT-2.3.1-4]; one that expired while held is dropped, counted."""
    connection = RecordingConnection(send_quota=2)
    router = Router(LimitsConfig())
    drops: list[str] = []
    router.count_drop = lambda reason, count=1: drops.append(reason)
    session = router.session_type("device", expiry_interval=300)
    session.attach(connection)
    session.deliver(Message("t", b"1", 1), 1, False)
    assert session.inflight is not None
    session.inflight.next_id = 0xFFFF  # about to wrap, 1 still in flight
    session.deliver(Message("t", b"2", 1), 1, False)
    session.deliver(Message("t", b"3", 1, expires_at=time.monotonic() - 1), 1, False)  # expires while held
    session.deliver(Message("t", b"4", 1), 1, False)
    session.deliver(Message("t", b"5", 1), 1, False)
    assert session.on_puback(0xFFFF)
    assert session.on_puback(1)
    sent = [(payload, packet_id) for payload, _qos, packet_id, _dup in connection.sent]
    assert sent == [(b"1", 1), (b"2", 0xFFFF), (b"4", 2), (b"5", 3)]
    assert drops == ["expired"]
    assert session.queue is None and sorted(session.inflight) == [2, 3]


@pytest.mark.mqtt311("MQTT-3.3.1-1", "MQTT-4.4.0-1")
@pytest.mark.mqtt5("MQTT-4.4.0-1")
def test_resume_resends_unacknowledged_with_dup_and_pubrel_for_released():
    connection = RecordingConnection()
    session = session_with(connection)
    session.deliver(Message("t", b"q1", 1), 1, False)
    session.deliver(Message("t", b"q2", 2), 2, False)
    session.deliver(Message("t", b"q2b", 2), 2, False)
    session.on_pubrec(3, failed=False)
    session.detach()
    session.deliver(Message("t", b"offline", 1), 1, False)  # queued while away
    again = RecordingConnection()
    session.attach(again)
    assert again.sent == [
        (b"q1", 1, 1, True),
        (b"q2", 2, 2, True),
        ("PUBREL", 3),
        (b"offline", 1, 4, False),
    ]


def test_each_brokers_sessions_reach_its_router_through_their_class_not_a_slot_each():
    first, second = Router(LimitsConfig()), Router(LimitsConfig())
    mine, theirs = first.session_type("a"), second.session_type("a")
    assert mine.router is first and theirs.router is second
    assert isinstance(mine, Session) and type(mine) is first.session_type is not second.session_type
    assert "router" not in Session.__slots__ and first.session_type.__slots__ == ()


def test_an_idle_session_has_no_window_and_a_new_window_starts_its_ids_at_one():
    connection = RecordingConnection()
    session = session_with(connection)
    assert session.inflight is None
    session.deliver(Message("t", b"a", 1), 1, False)
    assert session.inflight is not None and session.inflight.next_id == 2
    session.clear_outgoing()
    session.deliver(Message("t", b"b", 1), 1, False)
    assert [sent[2] for sent in connection.sent] == [1, 1]
