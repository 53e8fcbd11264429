"""A session belongs to the identity that created it: another user's CONNECT with its client id is refused.

Written as the attack: two real users in a real password file, user A allowed only ``a/#`` and user B only
``b/#``. A connects with B's client id and its own (valid) password, trying to resume B's session (its
subscriptions, its queued messages) or to kick B off; it gets CONNACK "not authorized" and nothing of B's.
"""

from __future__ import annotations

from typing import Any

import pytest

from broker_edge.protocol.packets import Disconnect, Publish
from broker_edge.protocol.properties import Properties
from broker_edge.security.acl import AccessControl, AclConfig, AclRule
from broker_edge.security.auth import PasswordFile
from tests.e2e.broker_clients import PahoClient, RawClient

ACL: dict[str, Any] = {
    "rules": [
        {"permission": "allow", "action": "all", "topic": "a/#", "users": ["userA"]},
        {"permission": "allow", "action": "all", "topic": "b/#", "users": ["userB"]},
    ]
}
NOT_AUTHORIZED = {5: 0x87, 4: 0x05}
PERSISTENT: dict[int, dict[str, Any]] = {
    5: {"clean_start": False, "properties": Properties(session_expiry_interval=600)},
    4: {},
}
"""A persistent session per version (v3.1.1: clean session 0 is the codec's default for clean_start)."""


@pytest.fixture
def two_users(tmp_path):
    path = tmp_path / "passwd"
    PasswordFile.set_password(path, "userA", "pw-a", create=True)
    PasswordFile.set_password(path, "userB", "pw-b")
    return str(path)


def secured(start_broker, password_file, acl=ACL):
    return start_broker(
        listeners=[{"name": "tcp", "host": "127.0.0.1", "port": 0, "allow_anonymous": False}],
        auth={"password_file": password_file},
        acl=acl,
    )


def connect(
    broker, version: int, user: str, password: bytes, client_id: str = "devB"
) -> tuple[RawClient, Any]:
    raw = RawClient(broker.port, version)
    fields: dict[str, Any] = {"clean_start": False} if version == 4 else PERSISTENT[5]
    return raw, raw.connect(client_id, username=user, password=password, **fields)


@pytest.mark.parametrize("version", [5, 4])
def test_another_user_cannot_resume_a_session_by_its_client_id_MQTT_3_1_4_3(start_broker, two_users, version):
    """[MQTT-3.1.4-3] applies within one identity: A's CONNECT as ``devB`` gets neither the session present
    flag, nor B's subscription, nor the message queued for B, nor later live ``b/`` messages."""
    broker = secured(start_broker, two_users)
    owner, ack = connect(broker, version, "userB", b"pw-b")
    assert ack.reason_code == 0
    assert owner.subscribe("b/#", 1).reason_codes == [1]
    owner.send_packet(Disconnect())
    assert owner.closed()
    PahoClient(broker.port, "pubB", username="userB", password="pw-b").publish("b/secret", b"for B only", 1)

    thief, refused = connect(broker, version, "userA", b"pw-a")
    assert refused.reason_code == NOT_AUTHORIZED[version]
    assert refused.session_present is False
    assert thief.closed()
    if version == 5:
        assert refused.properties.reason_string == "this client identifier's session belongs to another user"
    assert broker.refused("session_owner") == 1

    PahoClient(broker.port, "pubB2", username="userB", password="pw-b").publish("b/live", b"live", 1)
    owner, ack = connect(broker, version, "userB", b"pw-b")  # B's session is intact: both messages wait
    assert ack.reason_code == 0 and ack.session_present is True
    got = [owner.recv(), owner.recv()]
    assert [(p.topic, p.payload) for p in got] == [("b/secret", b"for B only"), ("b/live", b"live")]
    assert all(isinstance(p, Publish) for p in got)


@pytest.mark.parametrize("version", [5, 4])
def test_another_user_cannot_kick_the_online_owner(start_broker, two_users, version):
    """B stays connected and keeps receiving: no DISCONNECT 0x8E for a CONNECT that is not its own."""
    broker = secured(start_broker, two_users)
    owner, _ = connect(broker, version, "userB", b"pw-b")
    assert owner.subscribe("b/#", 1).reason_codes == [1]
    _, refused = connect(broker, version, "userA", b"pw-a")
    assert refused.reason_code == NOT_AUTHORIZED[version]
    thief_clean = RawClient(broker.port, version)  # a clean start does not discard it either
    assert (
        thief_clean.connect("devB", username="userA", password=b"pw-a").reason_code == NOT_AUTHORIZED[version]
    )
    PahoClient(broker.port, "pubB", username="userB", password="pw-b").publish("b/x", b"still mine", 1)
    delivered = owner.recv()
    assert isinstance(delivered, Publish) and delivered.payload == b"still mine"
    assert broker.disconnects("session_taken_over") == 0


def test_anonymous_client_cannot_take_an_authenticated_users_session(start_broker, two_users):
    broker = start_broker(
        listeners=[{"name": "tcp", "host": "127.0.0.1", "port": 0, "allow_anonymous": True}],
        auth={"password_file": two_users},
        acl={**ACL, "default": "allow"},
    )
    owner, _ = connect(broker, 5, "userB", b"pw-b")
    assert owner.subscribe("b/#", 1).reason_codes == [1]
    anonymous = RawClient(broker.port, 5)
    assert anonymous.connect("devB", clean_start=False).reason_code == 0x87
    assert broker.connected("devB")


@pytest.mark.parametrize("version", [5, 4])
def test_the_same_user_still_takes_over_its_own_session(start_broker, two_users, version):
    """The owner reconnecting from a new connection takes the session over as the spec requires."""
    broker = secured(start_broker, two_users)
    first, _ = connect(broker, version, "userB", b"pw-b")
    first.subscribe("b/#", 1)
    _, ack = connect(broker, version, "userB", b"pw-b")
    assert ack.reason_code == 0 and ack.session_present is True
    if version == 5:
        first.expect_disconnect(0x8E)
    else:
        assert first.closed()


@pytest.mark.parametrize("version", [5, 4])
def test_resumed_subscriptions_are_checked_against_the_acl_of_now(start_broker, two_users, version):
    """The rules change between two connections of the same user (a new ``AccessControl``): a subscription
    they no longer allow is gone from the resumed session (nothing is delivered through it), the allowed one
    stays."""
    acl = {"rules": [*ACL["rules"], {"permission": "allow", "action": "all", "topic": "shared/#"}]}
    broker = secured(start_broker, two_users, acl=acl)
    owner, _ = connect(broker, version, "userB", b"pw-b")
    assert owner.subscribe("shared/news", 1).reason_codes == [1]
    assert owner.subscribe("b/#", 1, packet_id=2).reason_codes == [1]
    owner.send_packet(Disconnect())
    assert owner.closed()
    narrower = AccessControl.from_config(AclConfig(rules=[AclRule(**rule) for rule in ACL["rules"]]))
    broker.call(lambda: setattr(broker.broker, "acl", narrower))
    owner, ack = connect(broker, version, "userB", b"pw-b")
    assert ack.session_present is True
    assert broker.call(lambda: sorted(broker.broker.router.sessions["devB"].subscriptions)) == ["b/#"]
    broker.call(lambda: broker.broker.publish("shared/news", b"not any more", 1))
    broker.call(lambda: broker.broker.publish("b/own", b"mine", 1))
    delivered = owner.recv()
    assert (delivered.topic, delivered.payload) == ("b/own", b"mine")
    owner.recv_none()
