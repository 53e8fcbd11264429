"""Authentication, ACL, TLS (with and without client certificates) and the anonymous-listener rule."""

from __future__ import annotations

import socket
import ssl

import pytest

from broker_edge.auth import PasswordFile
from broker_edge.config import ConfigError, load_dataclass
from broker_edge.config.broker import BrokerConfig
from broker_edge.protocol.codec import encode
from broker_edge.protocol.packets import Connect, PubAck, Publish
from tests.broker.broker_test_clients import PahoClient, RawClient
from tests.tls_certs import client_ssl_context, make_test_pki


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


def test_password_authentication(start_broker, password_file):
    broker = secured(start_broker, password_file)
    assert RawClient(broker.port, 5).connect("a", username="alice", password=b"s3cret").reason_code == 0
    assert RawClient(broker.port, 5).connect("b", username="alice", password=b"wrong").reason_code == 0x86
    assert RawClient(broker.port, 4).connect("c", username="alice", password=b"wrong").reason_code == 0x04
    assert RawClient(broker.port, 5).connect("d", username="mallory", password=b"x").reason_code == 0x86
    assert RawClient(broker.port, 5).connect("e").reason_code == 0x87
    assert RawClient(broker.port, 4).connect("f").reason_code == 0x05
    assert broker.refused("bad_credentials") == 3
    assert broker.refused("anonymous") == 2


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
        {"permission": "allow", "action": "subscribe", "topic": "broadcast/#"},
    ]
}


def test_acl_publish_denied_v5_0x87_v3_acked_and_dropped(start_broker, password_file):
    broker = secured(start_broker, password_file, acl=ACL)
    watcher = PahoClient(broker.port, "w", username="bob", password="hunter2")
    watcher.subscribe("devices/bob/#", 1)
    raw = RawClient(broker.port, 5)
    raw.connect("alice5", username="alice", password=b"s3cret")
    raw.send_packet(Publish("devices/bob/cmd", b"x", 1, packet_id=1))
    ack = raw.recv()
    assert (ack.packet_id, ack.reason_code) == (1, 0x87)
    v3 = RawClient(broker.port, 4)
    v3.connect("alice3", username="alice", password=b"s3cret")
    v3.send_packet(Publish("devices/bob/cmd", b"y", 1, packet_id=2))
    ack3 = v3.recv()
    assert isinstance(ack3, PubAck) and ack3.packet_id == 2
    own = PahoClient(broker.port, "bobpub", username="bob", password="hunter2")
    own.publish("devices/bob/state", b"allowed", 1)
    assert [m.payload for m in watcher.expect(1)] == [b"allowed"]
    assert broker.drops("acl_denied") == 2


def test_acl_subscribe_denied(start_broker, password_file):
    broker = secured(start_broker, password_file, acl=ACL)
    v5 = PahoClient(broker.port, "a5", username="alice", password="s3cret")
    assert v5.subscribe("devices/bob/#", 1) == [0x87]
    assert v5.subscribe("devices/alice/+", 1) == [1]
    assert v5.subscribe("broadcast/#", 1) == [1]
    v3 = PahoClient(broker.port, "a3", version=4, username="alice", password="s3cret")
    assert v3.subscribe("#", 1) == [0x80]


def test_non_loopback_listener_needs_auth_or_explicit_anonymous():
    with pytest.raises(ConfigError) as error:
        load_dataclass(BrokerConfig, {"listeners": [{"name": "public", "host": "0.0.0.0", "port": 1883}]})
    assert "public" in str(error.value)
    config = load_dataclass(
        BrokerConfig,
        {"listeners": [{"name": "open", "host": "0.0.0.0", "port": 1883, "allow_anonymous": True}]},
    )
    assert config.listener_allows_anonymous(config.listeners[0])
    default = BrokerConfig()
    assert (default.listeners[0].host, default.listeners[0].port) == ("127.0.0.1", 1883)
    assert default.listener_allows_anonymous(default.listeners[0])


def test_unknown_config_key_names_the_dotted_path():
    with pytest.raises(ConfigError) as error:
        load_dataclass(BrokerConfig, {"limits": {"max_conections": 3}})
    assert error.value.path == "limits.max_conections"


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


def tls_client(port: int, context: ssl.SSLContext, client_id: str) -> PahoClient:
    client = PahoClient(port, client_id, connect=False)
    client.client.tls_set_context(context)
    client.connect()
    return client


def test_tls_listener_with_client_certificate_identity(start_broker, pki):
    broker = start_broker(listeners=[tls_listener(pki, True)])
    sub = tls_client(broker.port, client_ssl_context(pki), "tls-sub")
    assert sub.connack_result[1] == 0
    sub.subscribe("secure", 1)
    pub = tls_client(broker.port, client_ssl_context(pki), "tls-pub")
    pub.publish("secure", b"over tls", 1)
    assert sub.expect(1)[0].payload == b"over tls"
    assert broker.call(lambda: broker.broker.router.sessions["tls-sub"].username) == pki.client_common_name


def test_tls_listener_refuses_client_without_certificate(start_broker, pki):
    broker = start_broker(listeners=[tls_listener(pki, True)])
    context = client_ssl_context(pki, certificate=False)
    raw = socket.create_connection(("127.0.0.1", broker.port), timeout=5)
    with pytest.raises((ssl.SSLError, ConnectionError)):
        tls = context.wrap_socket(raw, server_hostname="localhost")
        tls.sendall(encode(Connect(protocol_version=5, client_id="nocert"), 5))
        if not tls.recv(100):  # TLS 1.3: the refusal arrives after the handshake
            raise ConnectionError("closed")
    ok = tls_client(broker.port, client_ssl_context(pki), "withcert")
    assert ok.connack_result[1] == 0


def test_tls_optional_client_cert_falls_back_to_password(start_broker, pki, password_file):
    broker = start_broker(listeners=[tls_listener(pki, False)], auth={"password_file": password_file})
    with_password = PahoClient(broker.port, "pw", connect=False, username="alice", password="s3cret")
    with_password.client.tls_set_context(client_ssl_context(pki, certificate=False))
    assert with_password.connect()[1] == 0
    anonymous = PahoClient(broker.port, "anon", connect=False)
    anonymous.client.tls_set_context(client_ssl_context(pki, certificate=False))
    assert anonymous.connect()[1] == 0x87
