"""Authentication, ACL, TLS (with and without client certificates) and the anonymous-listener rule."""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys

import pytest

from broker_edge.config import ConfigError, load_dataclass
from broker_edge.protocol.codec import encode
from broker_edge.protocol.packets import Connect, PubAck, Publish, SubAck, Subscribe, Subscription
from broker_edge.protocol.properties import Properties
from broker_edge.security.auth import PasswordFile
from broker_edge.settings.broker import BrokerConfig
from tests.e2e.broker_clients import TIMEOUT, PahoClient, RawClient, wait_for
from tests.tls_certs import client_ssl_context, make_test_pki

TIMESTONE = [sys.executable, "-m", "pipelines.cli"]
"""The ``timestone`` command, as the console script runs it (``pipelines.cli:main``)."""


@pytest.fixture
def password_file(tmp_path):
    path = tmp_path / "passwd"
    PasswordFile.set_password(path, "alice", "s3cret", create=True)
    PasswordFile.set_password(path, "bob", "hunter2")
    return str(path)


def secured(start_broker, password_file, **extra):
    return start_broker(
        listeners=[{"name": "tcp", "host": "127.0.0.1", "port": 0, "allow_anonymous": False}],
        auth={"password_file": password_file},
        **extra,
    )


@pytest.mark.mqtt5("MQTT-3.1.4-2")
def test_password_authentication(start_broker, password_file):
    broker = secured(start_broker, password_file)
    assert RawClient(broker.port, 5).connect("a", username="alice", password=b"s3cret").reason_code == 0
    assert RawClient(broker.port, 5).connect("b", username="alice", password=b"wrong").reason_code == 0x86
    assert RawClient(broker.port, 4).connect("c", username="alice", password=b"wrong").reason_code == 0x04
    assert RawClient(broker.port, 5).connect("d", username="mallory", password=b"x").reason_code == 0x86
    refused = RawClient(broker.port, 5).connect("e")
    assert refused.reason_code == 0x87
    assert refused.properties.reason_string == "this listener requires a user name"
    assert RawClient(broker.port, 4).connect("f").reason_code == 0x05
    assert broker.refused("bad_credentials") == 3
    assert broker.refused("anonymous") == 2


def test_timestone_passwd_command_writes_salted_hashes_the_broker_accepts(start_broker, tmp_path):
    path = tmp_path / "etc" / "passwd"
    path.parent.mkdir()
    for user in ("gateway-7", "dashboard"):
        done = subprocess.run(
            [*TIMESTONE, "passwd", "-c", str(path), user, "--password", "same-password"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 0, done.stderr
    lines = dict(line.split(":", 1) for line in path.read_text().splitlines() if not line.startswith("#"))
    assert set(lines) == {"gateway-7", "dashboard"}
    assert all(stored.startswith("$scrypt$") for stored in lines.values())
    assert lines["gateway-7"] != lines["dashboard"]  # same password, different salt
    assert "same-password" not in path.read_text()
    assert path.stat().st_mode & 0o777 == 0o600

    broker = secured(start_broker, str(path))
    ok = RawClient(broker.port, 4).connect("g", username="gateway-7", password=b"same-password")
    assert ok.reason_code == 0
    bad = RawClient(broker.port, 4).connect("h", username="gateway-7", password=b"other")
    assert bad.reason_code == 0x04


def test_packets_sent_during_password_check_are_handled_after_it(start_broker, password_file):
    broker = secured(start_broker, password_file)
    sub = PahoClient(broker.port, "sub", username="bob", password="hunter2")
    sub.subscribe("pipelined", 1)
    raw = RawClient(broker.port, 5)
    raw.send(
        encode(Connect(protocol_version=5, client_id="fast", username="alice", password=b"s3cret"), 5)
        + encode(Publish("pipelined", b"early", 1, packet_id=1), 5)
    )
    assert raw.recv().reason_code == 0
    assert isinstance(raw.recv(), PubAck)
    assert sub.expect(1)[0].payload == b"early"


ACL = {
    "rules": [
        {"permission": "allow", "action": "all", "topic": "devices/%u/#"},
        {"permission": "allow", "action": "publish", "topic": "clients/%c/status"},
        {"permission": "allow", "action": "subscribe", "topic": "clients/+/status", "users": ["bob"]},
        {"permission": "allow", "action": "subscribe", "topic": "broadcast/#"},
    ]
}


@pytest.mark.mqtt311("MQTT-3.3.5-2")
@pytest.mark.mqtt5("MQTT-3.4.2-1", "MQTT-3.5.2-1")
def test_acl_publish_denied_v5_0x87_v3_acked_and_dropped(start_broker, password_file):
    broker = secured(start_broker, password_file, acl=ACL)
    watcher = PahoClient(broker.port, "w", username="bob", password="hunter2")
    watcher.subscribe("devices/bob/#", 1)
    raw = RawClient(broker.port, 5)
    raw.connect("alice5", username="alice", password=b"s3cret")
    raw.send_packet(Publish("devices/bob/cmd", b"x", 1, packet_id=1))
    ack = raw.recv()
    assert (ack.packet_id, ack.reason_code) == (1, 0x87)
    raw.send_packet(Publish("devices/bob/cmd", b"x2", 2, packet_id=2))
    rec = raw.recv()
    assert (type(rec).__name__, rec.packet_id, rec.reason_code) == ("PubRec", 2, 0x87)
    v3 = RawClient(broker.port, 4)
    v3.connect("alice3", username="alice", password=b"s3cret")
    v3.send_packet(Publish("devices/bob/cmd", b"y", 1, packet_id=2))
    ack3 = v3.recv()
    assert isinstance(ack3, PubAck) and ack3.packet_id == 2
    own = PahoClient(broker.port, "bobpub", username="bob", password="hunter2")
    own.publish("devices/bob/state", b"allowed", 1)
    assert [m.payload for m in watcher.expect(1)] == [b"allowed"]  # none of the denied ones came first
    assert broker.drops("acl_denied") == 3


@pytest.mark.parametrize("version", [4, 5])
def test_a_refused_publish_is_answered_in_its_turn_behind_the_publishes_before_it(
    start_broker, password_file, version
):
    """[MQTT-4.6.0-2] [MQTT-4.6.0-3] as the server keeps them (a client's rules): publishes read together, a
    denied one among them, are answered in the order of the publishes, where the refusal was answered at
    once, ahead of the logged publishes read before it."""
    broker = secured(start_broker, password_file, acl=ACL)
    raw = RawClient(broker.port, version)
    raw.connect("alice-pipelined", username="alice", password=b"s3cret")
    sent = [("devices/alice/a", 1), ("devices/alice/b", 1), ("devices/bob/cmd", 1), ("devices/alice/c", 2)]
    raw.send(b"".join(encode(Publish(t, b"x", q, packet_id=n + 1), version) for n, (t, q) in enumerate(sent)))
    answers = [raw.recv() for _ in sent]
    assert [(type(a).__name__, a.packet_id) for a in answers] == [
        ("PubAck", 1),
        ("PubAck", 2),
        ("PubAck", 3),
        ("PubRec", 4),
    ]
    if version == 5:
        assert [a.reason_code for a in answers] == [0x10, 0x10, 0x87, 0x10]


def test_acl_client_id_pattern(start_broker, password_file):
    broker = secured(start_broker, password_file, acl=ACL)
    watcher = PahoClient(broker.port, "w", username="bob", password="hunter2")
    assert watcher.subscribe("clients/+/status", 1) == [1]
    sensor = RawClient(broker.port, 5)
    sensor.connect("sensor-9", username="alice", password=b"s3cret")
    sensor.send_packet(Publish("clients/sensor-2/status", b"impersonated", 1, packet_id=1))
    assert sensor.recv().reason_code == 0x87
    sensor.send_packet(Publish("clients/sensor-9/status", b"online", 1, packet_id=2))
    assert sensor.recv().reason_code == 0
    [message] = watcher.expect(1)
    assert (message.topic, message.payload) == ("clients/sensor-9/status", b"online")


def test_acl_subscribe_denied(start_broker, password_file):
    broker = secured(start_broker, password_file, acl=ACL)
    v5 = PahoClient(broker.port, "a5", username="alice", password="s3cret")
    assert v5.subscribe("devices/bob/#", 1) == [0x87]
    assert v5.subscribe("devices/alice/+", 1) == [1]
    assert v5.subscribe("broadcast/#", 1) == [1]
    assert v5.subscribe("clients/+/status", 1) == [0x87]  # bob's rule only
    v3 = PahoClient(broker.port, "a3", version=4, username="alice", password="s3cret")
    assert v3.subscribe("#", 1) == [0x80]
    raw = RawClient(broker.port, 5)
    raw.connect("mixed", username="alice", password=b"s3cret")
    raw.send_packet(Subscribe(7, [Subscription("devices/alice/#", 2), Subscription("devices/+/x", 0)]))
    ack = raw.recv()
    assert isinstance(ack, SubAck) and ack.reason_codes == [2, 0x87]
    assert broker.drops("subscribe_denied") == 4


def test_non_loopback_listener_needs_auth_or_explicit_anonymous():
    with pytest.raises(ConfigError) as error:
        load_dataclass(BrokerConfig, {"listeners": [{"name": "public", "host": "0.0.0.0", "port": 1883}]})
    assert "public" in str(error.value)
    config = load_dataclass(
        BrokerConfig,
        {"listeners": [{"name": "open", "host": "0.0.0.0", "port": 1883, "allow_anonymous": True}]},
    )
    assert config.listener_allows_anonymous(config.listeners[0])
    with_passwords = load_dataclass(
        BrokerConfig,
        {
            "listeners": [{"name": "lan", "host": "0.0.0.0", "port": 1883}],
            "auth": {"password_file": "/etc/timestone/passwd"},
        },
    )
    assert not with_passwords.listener_allows_anonymous(with_passwords.listeners[0])
    default = BrokerConfig()
    assert (default.listeners[0].host, default.listeners[0].port) == ("127.0.0.1", 1883)
    assert default.listener_allows_anonymous(default.listeners[0])


def test_listener_on_another_address_refuses_anonymous_clients(start_broker, password_file):
    """Bound to every interface (reached here over loopback): anonymous refused, passwords accepted."""
    broker = start_broker(
        listeners=[{"name": "lan", "host": "0.0.0.0", "port": 0}], auth={"password_file": password_file}
    )
    assert RawClient(broker.port, 5).connect("anon").reason_code == 0x87
    assert RawClient(broker.port, 5).connect("bob", username="bob", password=b"hunter2").reason_code == 0


@pytest.fixture
def pki(tmp_path):
    return make_test_pki(tmp_path / "pki")


def tls_listener(pki, require: bool) -> dict:
    return {
        "name": "tls",
        "type": "tls",
        "host": "127.0.0.1",
        "port": 0,
        "allow_anonymous": False,
        "tls": {
            "certfile": str(pki.server_cert),
            "keyfile": str(pki.server_key),
            "cafile": str(pki.ca_cert),
            "require_client_cert": require,
        },
    }


def tls_refused(port: int, context: ssl.SSLContext) -> bool:
    """Whether the broker refuses this TLS client: during the handshake, or (TLS 1.3, where the client
    finishes first) by closing right after it. Every step has a timeout; a timeout fails the test."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as raw:
        try:
            with context.wrap_socket(raw, server_hostname="localhost") as tls:
                tls.sendall(encode(Connect(protocol_version=5, client_id="nocert"), 5))
                return tls.recv(100) == b""
        except (ssl.SSLError, ConnectionError):
            return True


def test_tls_listener_with_client_certificate_identity(start_broker, pki):
    broker = start_broker(listeners=[tls_listener(pki, True)])
    sub = PahoClient(broker.port, "tls-sub", tls_context=client_ssl_context(pki))
    assert sub.connack_result[1] == 0
    sub.subscribe("secure", 1)
    pub = PahoClient(broker.port, "tls-pub", tls_context=client_ssl_context(pki))
    pub.publish("secure", b"over tls", 1)
    assert sub.expect(1)[0].payload == b"over tls"
    assert broker.call(lambda: broker.broker.router.sessions["tls-sub"].username) == pki.client_common_name


def test_tls_listener_refuses_client_without_certificate(start_broker, pki):
    broker = start_broker(listeners=[tls_listener(pki, True)])
    assert tls_refused(broker.port, client_ssl_context(pki, certificate=False))
    other_ca = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(pki.ca_cert))
    other_ca.load_cert_chain(str(pki.other_client_cert), str(pki.other_client_key))
    assert tls_refused(broker.port, other_ca)
    assert wait_for(lambda: broker.refused("tls_error") == 2)
    ok = PahoClient(broker.port, "withcert", tls_context=client_ssl_context(pki))
    assert ok.connack_result[1] == 0


def test_tls_optional_client_cert_falls_back_to_password(start_broker, pki, password_file):
    broker = start_broker(listeners=[tls_listener(pki, False)], auth={"password_file": password_file})
    context = client_ssl_context(pki, certificate=False)
    with_password = PahoClient(broker.port, "pw", username="alice", password="s3cret", tls_context=context)
    assert with_password.connack_result[1] == 0
    anonymous = PahoClient(broker.port, "anon", connect=False, tls_context=context)
    assert anonymous.connect()[1] == 0x87
    certified = PahoClient(broker.port, "cert", tls_context=client_ssl_context(pki))
    assert certified.connack_result[1] == 0
    assert broker.call(lambda: broker.broker.router.sessions["cert"].username) == pki.client_common_name


def test_plain_tcp_to_a_tls_listener_is_refused(start_broker, pki):
    broker = start_broker(listeners=[tls_listener(pki, True)])
    raw = RawClient(broker.port, 5)
    raw.send(encode(Connect(protocol_version=5, client_id="plain"), 5))
    assert raw.closed()
    assert wait_for(lambda: broker.refused("tls_error") == 1)


def test_secure_websocket_listener(start_broker, pki):
    wss = {**tls_listener(pki, True), "name": "wss", "type": "wss", "path": "/mqtt"}
    broker = start_broker(listeners=[wss])
    client = PahoClient(
        broker.port,
        "wss-client",
        transport="websockets",
        ws_path="/mqtt",
        tls_context=client_ssl_context(pki),
    )
    assert client.connack_result[1] == 0
    client.subscribe("wss/t", 1)
    client.publish("wss/t", b"over wss", 1)
    assert client.expect(1)[0].payload == b"over wss"
    assert broker.call(lambda: broker.broker.router.sessions["wss-client"].username) == pki.client_common_name
    assert tls_refused(broker.port, client_ssl_context(pki, certificate=False))


@pytest.mark.mqtt5("MQTT-4.12.0-1", "MQTT-4.12.0-4")
def test_enhanced_authentication_is_not_offered(broker):
    raw = RawClient(broker.port, 5)
    ack = raw.connect("scram", properties=Properties(authentication_method="SCRAM-SHA-256"))
    assert ack.reason_code == 0x8C and ack.properties.reason_string
    assert raw.closed()
