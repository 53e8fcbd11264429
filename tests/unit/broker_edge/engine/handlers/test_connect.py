"""CONNECT: CONNACK, refusals (each with its code, always followed by close), takeover, limits in CONNACK."""

import pytest

from broker_edge.protocol.codec import encode
from broker_edge.protocol.packets import (
    MQTT_3_1_1,
    MQTT_5,
    ConnAck,
    Connect,
    Disconnect,
    PingReq,
    PingResp,
    Will,
)
from broker_edge.protocol.properties import Properties
from broker_edge.security.auth import hash_password
from tests.unit.broker_edge.engine.handlers.wire import make_core


@pytest.fixture
def passwords(tmp_path):
    """A password file with one user, alice, password ``secret``."""
    path = tmp_path / "passwd"
    path.write_text(f"alice:{hash_password('secret', 'pbkdf2-sha512')}\n")
    path.chmod(0o600)
    return path


def test_connack_0_for_a_v3_client_is_its_four_bytes_mqtt_3_2_0_1():
    """[MQTT-3.2.0-1] The first packet sent from the Server to the Client MUST be a CONNACK."""
    core = make_core()
    client = core.client(MQTT_3_1_1)
    assert client.connect("device") == ConnAck(False, 0)
    assert client.received == b"\x20\x02\x00\x00"
    assert client.connected
    assert core.router.sessions["device"].connection is client.conn


def test_v5_connack_states_the_broker_limits():
    core = make_core(limits={"receive_maximum": 10, "max_packet_size": 4096})
    ack = core.client().connect("device")
    assert ack.reason_code == 0
    assert ack.properties.receive_maximum == 10
    assert ack.properties.maximum_packet_size == 4096


def test_an_empty_client_id_gets_one_assigned_mqtt_3_2_2_16():
    """[MQTT-3.2.2-16] A v5 server assigning a client id returns it as Assigned Client Identifier."""
    core = make_core()
    ack = core.client().connect("")
    assigned = ack.properties.assigned_client_identifier
    assert assigned.startswith("auto-")
    assert assigned in core.router.sessions


def test_v3_empty_client_id_without_clean_session_is_refused_0x02_mqtt_3_1_3_8():
    """[MQTT-3.1.3-8] Zero-byte ClientId with CleanSession 0: CONNACK 0x02, then close."""
    core = make_core()
    client = core.client(MQTT_3_1_1)
    assert client.connect("", clean_start=False) == ConnAck(False, 0x02)
    assert client.closed
    assert core.counters.refusals("client_id_invalid") == 1


def test_a_v5_refusal_carries_its_reason_string_unless_the_client_limits_the_size():
    core = make_core()
    client = core.client()
    ack = client.connect("device", properties=Properties(authentication_method="SCRAM"))
    assert ack.reason_code == 0x8C
    assert ack.properties.reason_string == "enhanced authentication not offered"
    small = core.client()
    props = Properties(authentication_method="SCRAM", maximum_packet_size=8)
    assert small.connect("device", properties=props) == ConnAck(False, 0x8C)
    assert small.closed


def test_a_listener_requiring_a_user_name_refuses_anonymous_clients_0x87(passwords):
    core = make_core(auth={"allow_anonymous": False, "password_file": str(passwords)})
    client = core.client()
    assert client.connect("device").reason_code == 0x87
    assert client.closed
    assert core.counters.refusals("anonymous") == 1


def test_a_will_on_a_dollar_topic_is_refused():
    client = make_core().client(MQTT_3_1_1)
    assert client.connect("device", will=Will("$SYS/x", b"")) == ConnAck(False, 0x05)
    assert client.closed


def test_password_check_pauses_reading_and_handles_what_arrived_meanwhile(passwords):
    """Packets after CONNECT wait while the password is checked, then are handled in order."""
    core = make_core(auth={"password_file": str(passwords)})
    client = core.client()
    answer = client.send_bytes(_connect_bytes("alice", b"secret") + b"\xc0\x00")  # CONNECT + PINGREQ
    assert [type(p) for p in answer] == [ConnAck, PingResp]
    assert answer[0].reason_code == 0
    assert not client.reading_paused


def test_a_wrong_password_is_refused_0x86_and_what_followed_is_never_handled(passwords):
    core = make_core(auth={"password_file": str(passwords)})
    client = core.client()
    answer = client.send_bytes(_connect_bytes("alice", b"wrong") + b"\xc0\x00")
    assert answer == [ConnAck(False, 0x86, answer[0].properties)]
    assert client.closed
    assert core.counters.refusals("bad_credentials") == 1


def test_a_second_connection_with_the_same_client_id_takes_the_session_over_mqtt_3_1_4_3():
    """[MQTT-3.1.4-3] The existing connection is closed (v5: DISCONNECT 0x8E) and the new one gets it."""
    core = make_core()
    first = core.client()
    first.connect("device")
    second = core.client()
    assert second.connect("device").reason_code == 0
    told = first.read()
    assert [(type(p), p.reason_code) for p in told] == [(Disconnect, 0x8E)]
    assert first.closed
    assert core.router.sessions["device"].connection is second.conn
    assert second.send(PingReq()) == [PingResp()]


def test_a_client_sending_no_connect_in_time_is_dropped():
    core = make_core(limits={"connect_timeout_s": 5})
    client = core.client()
    core.advance(6)
    assert client.closed
    assert core.counters.refusals("connect_timeout") == 1


def test_an_unsupported_protocol_version_gets_connack_0x01_in_v3_mqtt_3_1_2_2():
    """[MQTT-3.1.2-2] Unsupported protocol level: CONNACK 0x01, then close."""
    client = make_core().client(MQTT_3_1_1)
    answer = client.send_bytes(b"\x10\x0c\x00\x04MQTT\x09\x02\x00\x3c\x00\x00")
    assert answer == [ConnAck(False, 0x01)]
    assert client.closed


def _connect_bytes(username: str, password: bytes) -> bytes:
    connect = Connect(protocol_version=MQTT_5, client_id="device", username=username, password=password)
    return encode(connect, MQTT_5)
