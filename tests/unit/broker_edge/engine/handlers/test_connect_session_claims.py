"""CONNECT on a cluster node: the client id is claimed cluster-wide first (the ``sessions`` port),
then the standalone handling goes on; a refused claim is refused like the standalone refusals. Sans-IO:
the claim is completed by the test, as the cluster's etcd and peer link would complete it."""

from __future__ import annotations

import pytest

from broker_edge.engine.ports import ClaimDone, ClusterPorts, SessionClaim
from broker_edge.engine.sessions.session import Session
from broker_edge.protocol.packets import (
    MQTT_3_1_1,
    MQTT_5,
    ConnAck,
    Connect,
    PingReq,
    PingResp,
    SubAck,
    Subscribe,
    Subscription,
    Will,
)
from broker_edge.protocol.properties import Properties
from broker_edge.protocol.reason_codes import ReasonCode
from tests.unit.broker_edge.engine.handlers.wire import HandDrivenCore, make_core


class ClaimsInProgress:
    """``SessionClaims`` whose claims the test answers (``answer``), remembering what each was asked."""

    def __init__(self) -> None:
        self.asked: list[SessionClaim] = []
        self._done: list[ClaimDone] = []
        self.ended: list[tuple[str, Will | None]] = []

    def claim(self, claim: SessionClaim, done: ClaimDone) -> None:
        self.asked.append(claim)
        self._done.append(done)

    def answer(self, refusal: str | None = None, server_reference: str | None = None) -> None:
        self._done.pop(0)(refusal, server_reference)

    def connection_ended(self, session: Session, will: Will | None) -> None:
        self.ended.append((session.client_id, will))


def cluster_core() -> tuple[HandDrivenCore, ClaimsInProgress]:
    core = make_core()
    claims = ClaimsInProgress()
    core.join_cluster(ClusterPorts(sessions=claims))
    return core, claims


def test_connect_waits_for_its_claim_and_the_packets_behind_it_wait_in_order():
    core, claims = cluster_core()
    client = core.client(MQTT_5)
    will = Will("status/dev", b"gone", 1, False, Properties(will_delay_interval=30))
    connect = Connect(
        protocol_version=MQTT_5,
        client_id="dev",
        clean_start=False,
        username="alice",
        will=will,
        properties=Properties(session_expiry_interval=600),
    )

    assert client.send(connect, Subscribe(1, [Subscription("plant/#", 1)]), PingReq()) == []

    assert client.reading_paused  # the client's further packets wait in the socket
    assert claims.asked == [SessionClaim("dev", "alice", False, 600, will, 30)]
    claims.answer(None)
    answer = client.read()
    assert answer == [ConnAck(False, 0, answer[0].properties), SubAck(1, [1]), PingResp()]
    assert client.connected and not client.reading_paused
    assert "plant/#" in (core.router.sessions["dev"].subscriptions or {})


@pytest.mark.parametrize(
    ("refusal", "version", "code"),
    [
        ("session_owner", MQTT_5, ReasonCode.NOT_AUTHORIZED),
        ("session_owner", MQTT_3_1_1, 5),
        ("session_unavailable", MQTT_5, ReasonCode.SERVER_UNAVAILABLE),
        ("session_unavailable", MQTT_3_1_1, 3),
        ("use_another_server", MQTT_5, ReasonCode.USE_ANOTHER_SERVER),
        ("use_another_server", MQTT_3_1_1, 3),
    ],
)
def test_a_refused_claim_is_refused_with_its_code_and_closed(refusal, version, code):
    core, claims = cluster_core()
    client = core.client(version)
    client.send(Connect(protocol_version=version, client_id="dev", clean_start=True))

    claims.answer(refusal)

    [connack] = client.read()
    assert isinstance(connack, ConnAck) and connack.reason_code == code and not connack.session_present
    assert client.closed and "dev" not in core.router.sessions


def test_a_claim_sending_the_client_elsewhere_names_the_server_in_the_connack():
    """CONNACK 0x9C "use another server" with the member to connect to (MQTT 5 3.2.2.3.16, 4.11)."""
    core, claims = cluster_core()
    client = core.client(MQTT_5)
    client.send(Connect(protocol_version=MQTT_5, client_id="dev", clean_start=True))

    claims.answer("use_another_server", "127.0.0.1:18830")

    [connack] = client.read()
    assert isinstance(connack, ConnAck) and connack.reason_code == ReasonCode.USE_ANOTHER_SERVER
    assert connack.properties is not None and connack.properties.server_reference == "127.0.0.1:18830"
    assert connack.properties.reason_string and client.closed


def test_the_server_reference_is_kept_and_the_reason_string_left_out_when_both_do_not_fit_mqtt_3_2_2_19():
    """[MQTT-3.2.2-19]: no Reason String that would pass the client's Maximum Packet Size; the reference,
    which tells the client where to go, is the property kept."""
    core, claims = cluster_core()
    client = core.client(MQTT_5)
    small = Properties(maximum_packet_size=40)
    client.send(Connect(protocol_version=MQTT_5, client_id="dev", clean_start=True, properties=small))

    claims.answer("use_another_server", "127.0.0.1:18830")

    [connack] = client.read()
    assert isinstance(connack, ConnAck) and connack.reason_code == ReasonCode.USE_ANOTHER_SERVER
    assert connack.properties is not None and connack.properties.server_reference == "127.0.0.1:18830"
    assert connack.properties.reason_string is None and len(client.received) <= 40


def test_a_fenced_broker_answers_a_connect_under_way_and_leaves_one_not_yet_sent_open():
    """Sending its clients elsewhere, a broker answers a CONNECT still being claimed (CONNACK 0x9C with a
    reference, the v5 clients each the next one; 3.1.1: return code 3) instead of cutting it without a
    CONNACK; a connection that has sent no CONNECT yet stays open (the claim of its CONNECT answers it the
    same way)."""
    core, claims = cluster_core()
    first, v3, second, silent = (core.client(v) for v in (MQTT_5, MQTT_3_1_1, MQTT_5, MQTT_5))
    for index, client in enumerate((first, v3, second)):
        client.send(Connect(protocol_version=client.version, client_id=f"dev-{index}", clean_start=True))

    assert core.send_clients_elsewhere(["127.0.0.1:18831", "127.0.0.1:18832"], "fenced") == 4

    references = []
    for client in (first, second):
        [connack] = client.read()
        assert connack.reason_code == ReasonCode.USE_ANOTHER_SERVER
        references.append(connack.properties.server_reference)
    assert references == ["127.0.0.1:18831", "127.0.0.1:18832"]  # the 3.1.1 client took none
    [connack_3] = v3.read()
    assert isinstance(connack_3, ConnAck) and connack_3.reason_code == 3
    assert first.closed and v3.closed and second.closed and not silent.closed
    for _ in range(3):
        claims.answer(None)  # the claims end later: nothing more is written to the closed connections
    assert first.read() == [] and v3.read() == [] and not core.router.sessions


def test_a_connection_that_closes_during_its_claim_is_not_connected_by_the_answer():
    core, claims = cluster_core()
    client = core.client(MQTT_5)
    client.send(Connect(protocol_version=MQTT_5, client_id="dev", clean_start=True))
    client.conn.transport_closed(None)

    claims.answer(None)

    assert client.read() == [] and not client.connected and "dev" not in core.router.sessions


def test_the_cluster_hears_of_a_connection_end_before_its_will_is_handled():
    core, claims = cluster_core()
    client = core.client(MQTT_5)
    will = Will("status/dev", b"gone", 0, False)
    client.send(Connect(protocol_version=MQTT_5, client_id="dev", clean_start=True, will=will))
    claims.answer(None)
    client.read()

    client.conn.transport_closed(None)

    assert claims.ended == [("dev", will)]


def test_a_broker_alone_claims_nothing():
    core = make_core()
    assert core.cluster.sessions is None
    assert core.client(MQTT_5).connect("dev").reason_code == 0
