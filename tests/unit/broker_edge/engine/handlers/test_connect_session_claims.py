"""CONNECT on a cluster node: the client id is claimed cluster-wide first (the ``sessions`` port),
then the standalone handling goes on; a refused claim is refused like the standalone refusals. Sans-IO:
the claim is completed by the test, as the cluster's etcd and peer link would complete it."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from broker_edge.engine.ports import ClusterPorts, SessionClaim
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
        self._done: list[Callable[[str | None], None]] = []
        self.ended: list[tuple[str, Will | None]] = []

    def claim(self, claim: SessionClaim, done: Callable[[str | None], None]) -> None:
        self.asked.append(claim)
        self._done.append(done)

    def answer(self, refusal: str | None = None) -> None:
        self._done.pop(0)(refusal)

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
