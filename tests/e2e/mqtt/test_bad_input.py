"""Malformed and forbidden input over a raw socket: only the offending connection closes, with the right code.

Every test keeps a second, well-behaved subscriber connected and checks it still gets its messages after the
bad client was thrown out.
"""

from __future__ import annotations

import contextlib
import re
import socket

import pytest

from broker_edge.protocol.codec import encode
from broker_edge.protocol.packets import Connect, PingReq, PingResp, Publish, Subscribe, Subscription
from broker_edge.protocol.properties import Properties
from broker_edge.protocol.reason_codes import ReasonCode
from broker_edge.protocol.wire import encode_varint
from tests.e2e.broker_clients import PahoClient, RawClient, wait_for


@pytest.fixture
def bystander(broker):
    """A subscriber and a publisher that must keep working whatever the bad client does."""
    sub = PahoClient(broker.port, "bystander-sub")
    sub.subscribe("ok/#", 1)
    pub = PahoClient(broker.port, "bystander-pub", version=4)

    def still_served(tag: str) -> None:
        pub.publish(f"ok/{tag}", tag.encode(), 1)
        [message] = sub.expect(1)
        assert message.payload == tag.encode()

    still_served("before")
    return still_served


def connected(broker, version=5) -> RawClient:
    raw = RawClient(broker.port, version)
    assert raw.connect("bad").reason_code == 0
    return raw


@pytest.mark.mqtt5(
    "MQTT-1.5.4-1",
    "MQTT-3.1.0-2",
    "MQTT-3.2.0-2",
    "MQTT-3.3.2-2",
    "MQTT-3.3.4-6",
    "MQTT-3.8.3-1",
    "MQTT-3.14.2-1",
    "MQTT-3.14.4-1",
    "MQTT-3.14.4-2",
    "MQTT-4.7.0-1",
    "MQTT-4.13.1-1",
    "MQTT-4.13.2-1",
)
@pytest.mark.parametrize(
    ("name", "data", "code"),
    [
        ("reserved flags on PUBACK", b"\x42\x02\x00\x01", 0x81),
        ("reserved flags on SUBSCRIBE", b"\x80\x06\x00\x01\x00\x01a\x00", 0x81),
        ("reserved packet type 0", b"\x00\x00", 0x81),
        ("remaining length of five bytes", b"\x30\xff\xff\xff\xff\x01", 0x81),
        ("oversized remaining length", b"\x30\xff\xff\xff\x7f", 0x95),
        ("truncated: topic length past the end", b"\x30\x03\x00\x05a", 0x81),
        ("truncated: packet id missing", b"\x32\x03\x00\x01a", 0x81),
        ("truncated: SUBSCRIBE without its options byte", b"\x82\x06\x00\x01\x00\x00\x01a", 0x81),
        ("qos 3 publish", b"\x36\x05\x00\x01a\x00\x01", 0x81),
        ("invalid utf-8 topic", b"\x30\x05\x00\x02\xc3\x28\x00", 0x81),
        ("invalid utf-8 filter", b"\x82\x07\x00\x01\x00\x00\x01\xff\x00", 0x81),
        ("wildcard # in publish topic", b"\x30\x06\x00\x03a/#\x00", 0x90),
        ("wildcard + in publish topic", b"\x30\x06\x00\x03+/a\x00", 0x90),
        ("second CONNECT", None, 0x82),
        ("duplicated property", b"\x30\x08\x00\x01a\x04\x01\x01\x01\x01", 0x82),
        ("AUTH without a method", b"\xf0\x00", 0x82),
        ("subscription identifier on a client PUBLISH", b"\x30\x06\x00\x01a\x02\x0b\x01", 0x82),
    ],
)
def test_bad_packet_closes_only_that_connection_v5(broker, bystander, name, data, code):
    raw = connected(broker)
    if data is None:
        data = encode(Connect(protocol_version=5), 5)
    raw.send(data)
    raw.expect_disconnect(code)
    bystander(re.sub(r"[^a-z0-9]+", "-", name))
    assert broker.disconnects(ReasonCode(code).name.lower()) == 1


@pytest.mark.mqtt311(
    "MQTT-1.5.3-1",
    "MQTT-2.2.2-1",
    "MQTT-2.2.2-2",
    "MQTT-3.1.0-2",
    "MQTT-3.3.2-2",
    "MQTT-4.7.1-1",
    "MQTT-4.8.0-1",
)
@pytest.mark.mqtt5("MQTT-2.1.3-1", "MQTT-4.13.1-1")
@pytest.mark.parametrize(
    "data",
    [
        b"\x42\x02\x00\x01",  # reserved flags
        b"\x30\x05\x00\x02\xc3\x28\x00",  # invalid UTF-8
        b"\x30\x05\x00\x03a/+\x00",  # wildcard in topic
        b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00",  # second CONNECT
        b"\x30\xff\xff\xff\x7f",  # larger than the maximum packet size
    ],
)
def test_bad_packet_v3_just_closes(broker, bystander, data):
    raw = connected(broker, version=4)
    raw.send(data)
    assert raw.closed()
    bystander("v3")


@pytest.mark.mqtt311("MQTT-3.1.0-1")
@pytest.mark.mqtt5("MQTT-3.1.0-1")
@pytest.mark.parametrize("version", [4, 5])
@pytest.mark.parametrize(
    "packet", [PingReq(), Publish("a", b"x", 1, packet_id=1), Subscribe(1, [Subscription("a")])]
)
def test_packet_before_connect_closes(broker, bystander, version, packet):
    raw = RawClient(broker.port, version)
    raw.send_packet(packet)
    assert raw.closed()
    bystander("before-connect")


@pytest.mark.mqtt311("MQTT-1.5.3-1", "MQTT-3.1.3-4")
@pytest.mark.mqtt5("MQTT-1.5.4-1", "MQTT-3.1.3-4")
@pytest.mark.parametrize("version", [4, 5])
def test_invalid_utf8_client_id_closes(broker, bystander, version):
    raw = RawClient(broker.port, version)
    frame = bytearray(encode(Connect(protocol_version=version, client_id="abc"), version))
    frame[frame.index(b"abc") : frame.index(b"abc") + 3] = b"a\xffc"
    raw.send(bytes(frame))
    assert raw.closed()
    assert broker.refused("protocol_error") == 1
    bystander("utf8-client-id")


def test_half_a_packet_then_a_dropped_socket(broker, bystander):
    raw = connected(broker)
    raw.send(b"\x30\x40\x00\x03a/b")  # announces 64 bytes, sends 5
    bystander("while-half-a-packet-waits")
    raw.close()
    assert wait_for(lambda: not broker.connected("bad"))
    bystander("after-the-drop")


def test_many_bad_clients_at_once_leave_the_broker_serving(broker, bystander):
    garbage = [b"\x00\x00", b"\x30\xff\xff\xff\xff\x01", b"\x30\x05\x00\x02\xc3\x28\x00", b"\xf0\x00"]
    clients = [connected(broker) for _ in garbage]
    for raw, data in zip(clients, garbage, strict=True):
        raw.send(data)
    assert all(raw.closed() for raw in clients)
    bystander("after-many")
    assert RawClient(broker.port, 5).connect("newcomer").reason_code == 0


@pytest.mark.mqtt311("MQTT-3.1.4-1")
@pytest.mark.mqtt5("MQTT-3.1.4-1")
def test_garbage_instead_of_connect_closes(broker, bystander):
    raw = RawClient(broker.port, 4)
    raw.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert raw.closed()
    bystander("http")


@pytest.mark.mqtt311("MQTT-3.1.2-2")
@pytest.mark.mqtt5("MQTT-3.1.2-1", "MQTT-3.1.2-2")
def test_unsupported_protocol_level_gets_connack_0x01(broker, bystander):
    raw = RawClient(broker.port, 4)
    raw.send(b"\x10\x0c\x00\x04MQTT\x07\x02\x00\x3c\x00\x00")
    packet = raw.recv()
    assert packet.reason_code == 0x01
    assert raw.closed()
    bystander("level")


@pytest.mark.mqtt5("MQTT-3.3.2-12")
def test_topic_alias_above_maximum_is_0x94(broker, bystander):
    raw = connected(broker)
    raw.send_packet(Publish("t", b"x", properties=Properties(topic_alias=60000)))
    raw.expect_disconnect(0x94)
    bystander("alias")


@pytest.mark.mqtt5("MQTT-3.14.4-1")
def test_publishes_read_after_one_that_closes_the_connection_are_not_taken(broker):
    """A PUBLISH that closes its connection (an alias above the maximum, 0x94) ends what the broker takes from
    it: the valid PUBLISHes that came in the same read after it reach no subscriber and no log, for they are
    never acknowledged and the client sends them again on its next connection."""
    watcher = PahoClient(broker.port, "watcher")
    watcher.subscribe("after/#", 1)
    raw = connected(broker)
    closing = encode(Publish("t", b"x", 1, packet_id=1, properties=Properties(topic_alias=60000)), 5)
    after = [encode(Publish(f"after/{n % 2}", b"%d" % n, 1, packet_id=n + 2), 5) for n in range(10)]
    raw.send(closing + b"".join(after))
    raw.expect_disconnect(0x94)
    PahoClient(broker.port, "marker").publish("after/marker", b"marker", 1)
    assert [message.payload for message in watcher.expect(1)] == [b"marker"]


def test_unknown_topic_alias_is_protocol_error(broker, bystander):
    raw = connected(broker)
    raw.send_packet(Publish("", b"x", properties=Properties(topic_alias=3)))
    raw.expect_disconnect(0x82)
    bystander("unknown-alias")


@pytest.mark.mqtt5("MQTT-4.12.0-7")
def test_auth_packet_without_method_is_protocol_error(broker, bystander):
    raw = connected(broker)
    raw.send(b"\xf0\x00")
    raw.expect_disconnect(0x82)
    bystander("auth")


@pytest.mark.mqtt311("MQTT-4.8.0-2")
def test_a_handler_that_raises_closes_only_its_connection(broker, bystander, monkeypatch):
    """The safety net for broker bugs: logged, that client gets 0x83, everyone else goes on."""
    import broker_edge.engine.handlers

    def broken(ctx, conn, session, packet):
        raise RuntimeError("a bug")

    monkeypatch.setattr(broker_edge.engine.handlers, "handle_pingreq", broken)
    raw = connected(broker)
    raw.send_packet(PingReq())
    raw.expect_disconnect(0x83)
    bystander("after-a-bug")
    assert broker.disconnects("implementation_specific_error") == 1


LONG = "\x01" * 20_000
"""20,000 bytes a client may send in a topic or a property; quoted in a message (``repr``) each is 4 bytes."""


def _frame(first: int, body: bytes) -> bytes:
    return bytes((first,)) + encode_varint(len(body)) + body


def _string(text: str) -> bytes:
    data = text.encode()
    return len(data).to_bytes(2, "big") + data


@pytest.mark.mqtt5("MQTT-3.3.2-2", "MQTT-4.13.1-1")
@pytest.mark.parametrize(
    ("data", "code"),
    [
        pytest.param(_frame(0x30, _string("a/+" + LONG) + b"\x00"), 0x90, id="wildcard-in-topic"),
        pytest.param(_frame(0x82, b"\x00\x01\x00" + _string(LONG) + b"\x30"), 0x82, id="retain-handling-3"),
        pytest.param(
            _frame(0x30, _string("a") + encode_varint(20_004) + b"\x08" + _string("#" + LONG)),
            0x82,
            id="wildcard-in-response-topic",
        ),
    ],
)
def test_a_bad_packet_quoting_a_long_string_still_gets_its_disconnect(broker, bystander, data, code):
    """The DISCONNECT's reason string quotes what was wrong; quoting 20,000 control characters passed the
    65,535 bytes a string may have, the DISCONNECT could not be written and the client was dropped without
    its reason code (a traceback in the broker's log)."""
    raw = connected(broker)
    raw.send(data)
    packet = raw.expect_disconnect(code)
    assert len(packet.properties.reason_string) < 1_000
    bystander("long-string")


@pytest.mark.mqtt5("MQTT-3.8.4-1", "MQTT-3.8.4-6")
@pytest.mark.parametrize(
    ("topic_filter", "offset"), [("a+" + LONG, None), ("x/#", "earliest" + LONG)], ids=["filter", "offset"]
)
def test_a_long_invalid_filter_is_answered_0x8f_in_the_suback(broker, bystander, topic_filter, offset):
    """An invalid filter (or ``offset`` user property) of 20,000 control characters gets SUBACK 0x8F with a
    reason string, as a short one does; the reason string quoting it was too long to write, and the client
    got DISCONNECT 0x83 (internal error) instead."""
    raw = connected(broker)
    properties = Properties(user_properties=[("offset", offset)]) if offset is not None else None
    suback = raw.subscribe(topic_filter, 1, properties=properties)
    assert suback.reason_codes == [0x8F]
    assert 0 < len(suback.properties.reason_string) < 1_000
    raw.send_packet(PingReq())
    assert isinstance(raw.recv(), PingResp)
    bystander("long-filter")


@pytest.mark.mqtt5("MQTT-4.13.1-1")
@pytest.mark.parametrize(
    ("version", "answer"), [(5, b"\x20\x03\x00\x95\x00"), (4, b"")], ids=["v5", "v3.1.1"]
)
def test_a_connect_declaring_more_than_max_connect_packet_size(broker, bystander, version, answer):
    """Refused from its fixed header and protocol level, before the body is read: an MQTT 5 client is told
    (CONNACK 0x95, as docs/broker.md says), an MQTT 3.1.1 one, which has no such code, is closed. The
    client had been closed without a word whatever its level, the level not being decoded yet."""
    level = bytes((version,))
    header = b"\x10" + encode_varint(200_000) + b"\x00\x04MQTT" + level + b"\x02\x00\x3c"
    with socket.create_connection(("127.0.0.1", broker.port), timeout=5) as sock:
        sock.sendall(header)
        received = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                received += chunk
    assert received == answer
    assert broker.refused("connect_too_large") == 1
    bystander("connect-too-large")
