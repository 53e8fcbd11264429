"""``auth.client_id_must_match_login``: a client connects only under its own login as client id.

Written as the attack: dev-b, logged in as itself (password, or the CN of its client certificate), connects
with client id ``dev-a`` and a persistent session while dev-a is offline. Without the setting the session
is dev-b's, and dev-a's own CONNECT is refused for as long as it lives ("session belongs to another user"):
one device keeps another off the broker. With it, dev-b's CONNECT is refused as an invalid client
identifier (MQTT 5 CONNACK 0x85, 3.1.1 return code 2) and dev-a connects. An empty client id gets the login.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from broker_edge.observe.refusal_log import LINES_PER_WINDOW
from broker_edge.runtime.local_pki import LocalPki
from broker_edge.security.auth import PasswordFile
from tests.e2e.broker_clients import PahoClient, RawClient
from tests.e2e.security.certificate_devices import certificate_holder, certificate_listener

NOT_VALID = 0x85
"""Client Identifier not valid: what paho reports for the v5 code and for 3.1.1's return code 2."""


@pytest.fixture
def devices(tmp_path):
    path = tmp_path / "passwd"
    PasswordFile.set_password(path, "dev-a", "pw-dev-a", create=True)
    PasswordFile.set_password(path, "dev-b", "pw-dev-b")
    return str(path)


def _secured(start_broker, password_file: str, **auth: Any):
    listener = {"name": "tcp", "host": "127.0.0.1", "port": 0, "allow_anonymous": False}
    return start_broker(listeners=[listener], auth={"password_file": password_file, **auth})


def _device(port: int, login: str, client_id: str, version: int = 5) -> PahoClient:
    persistent: dict[str, Any] = {"session_expiry": 3600} if version == 5 else {}
    return PahoClient(
        port, client_id, version, clean=False, username=login, password=f"pw-{login}", **persistent
    )


@pytest.mark.parametrize("version", [5, 4])
def test_by_default_another_login_keeps_a_device_off_by_its_client_id(start_broker, devices, version):
    """The default (off) keeps the behaviour the setting is for: dev-b's session under ``dev-a`` refuses
    dev-a (not authorized) until it expires."""
    broker = _secured(start_broker, devices)
    _device(broker.port, "dev-b", "dev-a", version).disconnect()
    assert _device(broker.port, "dev-a", "dev-a", version).connack_result[1] == 0x87
    assert broker.refused("session_owner") == 1


@pytest.mark.parametrize("version", [5, 4])
def test_a_client_id_other_than_the_login_is_refused(start_broker, devices, version):
    """dev-b as ``dev-a`` gets "Client Identifier not valid" and no session, so dev-a connects after it."""
    broker = _secured(start_broker, devices, client_id_must_match_login=True)
    impostor = _device(broker.port, "dev-b", "dev-a", version)
    assert impostor.connack_result[1] == NOT_VALID
    assert broker.refused("client_id_not_login") == 1
    assert _device(broker.port, "dev-a", "dev-a", version).connack_result[1] == 0
    assert _device(broker.port, "dev-b", "dev-b", version).connack_result[1] == 0


@pytest.mark.mqtt5("MQTT-3.1.3-8")
@pytest.mark.mqtt311("MQTT-3.1.3-9")
@pytest.mark.parametrize(("version", "code"), [(5, NOT_VALID), (4, 0x02)])
def test_a_refused_client_id_gets_0x85_or_return_code_2_and_is_closed(
    start_broker, devices, caplog, version, code
):
    """A client id the Server rejects: v5 CONNACK 0x85 with its reason string, then the connection closes
    [MQTT-3.1.3-8]; 3.1.1 return code 2 (identifier rejected), then it closes [MQTT-3.1.3-9]. A WARNING
    line per refusal names the client id and the user name, at most ``LINES_PER_WINDOW`` in a window."""
    caplog.set_level(logging.INFO)
    broker = _secured(start_broker, devices, client_id_must_match_login=True)
    for _ in range(LINES_PER_WINDOW + 1):
        raw = RawClient(broker.port, version)
        ack = raw.connect("dev-a", username="dev-b", password=b"pw-dev-b")
        assert ack.reason_code == code
        assert raw.closed()
    if version == 5:
        assert ack.properties.reason_string == "the client identifier must be the login (user name or CN)"
    assert broker.refused("client_id_not_login") == LINES_PER_WINDOW + 1
    lines = [r for r in caplog.records if getattr(r, "reason", None) == "client_id_not_login"]
    assert len(lines) == LINES_PER_WINDOW  # the last refusal of the burst is counted, not written
    line = lines[0]
    assert (line.levelno, line.client_id, line.username) == (logging.WARNING, "dev-a", "dev-b")
    assert line.getMessage() == "connection refused: client_id_not_login"


def test_an_empty_client_id_gets_the_login(start_broker, devices):
    """A v5 client sending no client id is assigned its login (CONNACK Assigned Client Identifier); a
    3.1.1 client (clean session 1) is connected under it as well."""
    broker = _secured(start_broker, devices, client_id_must_match_login=True)
    v5 = PahoClient(broker.port, "", username="dev-a", password="pw-dev-a")
    assert v5.connack_result[1] == 0
    assert v5.connack_result[2].AssignedClientIdentifier == "dev-a"
    v3 = PahoClient(broker.port, "", 4, username="dev-b", password="pw-dev-b")
    assert v3.connack_result[1] == 0
    assert broker.connected("dev-a") and broker.connected("dev-b")


def test_with_client_certificates_the_cn_is_the_login(start_broker, tmp_path):
    """A client certificate's subject CN is the login when no user name is sent: dev-b's certificate as
    ``dev-a`` is refused, as ``dev-b`` or with an empty client id it connects as ``dev-b``."""
    pki = LocalPki(tmp_path / "pki", name="fleet-ca")
    broker = start_broker(listeners=[certificate_listener(pki)], auth={"client_id_must_match_login": True})

    def holder_of(device_id: str, client_id: str) -> PahoClient:
        return certificate_holder(pki, broker.port, device_id, client_id)

    assert holder_of("dev-b", "dev-a").connack_result[1] == NOT_VALID
    assert holder_of("dev-a", "dev-a").connack_result[1] == 0
    assigned = holder_of("dev-b", "")
    assert assigned.connack_result[1] == 0
    assert assigned.connack_result[2].AssignedClientIdentifier == "dev-b"


def test_free_logins_pick_their_client_ids(start_broker, devices, tmp_path):
    """A login in ``client_id_free_logins`` (a job opening several connections) is not bound; the others
    still are."""
    PasswordFile.set_password(devices, "ops", "pw-ops")
    broker = _secured(start_broker, devices, client_id_must_match_login=True, client_id_free_logins=["ops"])
    for client_id in ("timestone-actions-0", "timestone-actions-1"):
        assert _device(broker.port, "ops", client_id).connack_result[1] == 0
    assert _device(broker.port, "dev-b", "dev-a").connack_result[1] == NOT_VALID


def test_a_certificate_holder_cannot_name_itself_by_a_user_name(start_broker, tmp_path):
    """Without a password file a user name proves nothing, so on a listener that requires client
    certificates the CN is the login: dev-b's certificate with user name ``dev-a`` is refused (bad user
    name or password) instead of becoming ``dev-a`` for the ACL; the CN itself as user name is accepted."""
    pki = LocalPki(tmp_path / "pki", name="fleet-ca")
    acl = {"rules": [{"permission": "allow", "action": "publish", "topic": "r", "client_is_user": True}]}
    broker = start_broker(listeners=[certificate_listener(pki)], acl=acl)

    def holder_of(device_id: str, username: str, version: int = 5) -> PahoClient:
        return certificate_holder(pki, broker.port, device_id, username, version=version, username=username)

    assert holder_of("dev-b", "dev-a").connack_result[1] == 0x86
    assert holder_of("dev-b", "dev-a", 4).connack_result[1] == 0x86  # 3.1.1 return code 4, as paho says it
    holder_of("dev-b", "dev-b").publish("r", b"own", qos=1)


def test_the_devices_listener_binds_client_ids_and_the_jobs_listener_leaves_them_free(start_broker, tmp_path):
    """``listeners[].client_id_must_match_login`` overrides ``auth.client_id_must_match_login`` for its
    listener: the devices' TLS listener binds each certificate's client id to its CN, the jobs' listener
    (passwords, many connections under one login) leaves client ids free; and the other way round, the
    broker-wide key on and one listener set to false."""
    pki = LocalPki(tmp_path / "pki", name="fleet-ca")
    path = tmp_path / "passwd"
    PasswordFile.set_password(path, "ops", "pw-ops", create=True)
    PasswordFile.set_password(path, "dev-b", "pw-dev-b")
    devices = {**certificate_listener(pki), "client_id_must_match_login": True}
    jobs = {"name": "jobs", "host": "127.0.0.1", "port": 0, "allow_anonymous": False}
    broker = start_broker(listeners=[devices, jobs], auth={"password_file": str(path)})
    assert certificate_holder(pki, broker.port, "dev-b", "dev-a").connack_result[1] == NOT_VALID
    assert certificate_holder(pki, broker.port, "dev-b", "dev-b").connack_result[1] == 0
    for client_id in ("timestone-actions-0", "timestone-actions-1"):
        assert _device(broker.port_of("jobs"), "ops", client_id).connack_result[1] == 0

    jobs_free = {**jobs, "client_id_must_match_login": False}
    bound = start_broker(
        listeners=[{**jobs, "name": "devices"}, jobs_free],
        auth={"password_file": str(path), "client_id_must_match_login": True},
    )
    assert _device(bound.port_of("devices"), "dev-b", "dev-a").connack_result[1] == NOT_VALID
    assert _device(bound.port_of("jobs"), "ops", "timestone-actions-2").connack_result[1] == 0
