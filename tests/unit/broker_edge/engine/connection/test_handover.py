"""What moves with a connection handed over to another member on this host, when it may move, and how the
member taking it in starts it: no CONNACK, the same client id, keep alive, will and MQTT 5 terms."""

from __future__ import annotations

import json
from typing import Any

import pytest

from broker_edge.engine.connection.handover import (
    MAX_WILL_PAYLOAD,
    BadRecord,
    claim_of,
    connect_of,
    may_move,
    record_of,
)
from broker_edge.engine.connection.states import HELD_FOR_ACKS, HELD_FOR_HANDOVER
from broker_edge.engine.handlers.connect import accept_handed_in
from broker_edge.engine.ports import MovedClaim
from broker_edge.protocol.packets import (
    MQTT_3_1_1,
    MQTT_5,
    PubAck,
    Publish,
    Subscribe,
    Subscription,
    Will,
)
from broker_edge.protocol.properties import Properties
from tests.unit.broker_edge.engine.handlers.wire import HandDrivenCore, WireClient, WireConnection, make_core


def _moved(core: HandDrivenCore, record: dict[str, Any], version: int) -> WireClient:
    """A new connection to ``core`` taken in with ``record`` (as it travels: through JSON)."""
    client = core.client(version)
    connect, username = connect_of(json.loads(json.dumps(record)))
    accept_handed_in(core, client.conn, connect, username, "w0")
    return client


def test_a_connection_whose_session_holds_nothing_moves_with_its_client_id_keepalive_and_will():
    core = make_core()
    device = core.client(MQTT_3_1_1)
    device.connect("d-1", keep_alive=30, will=Will("plant/d-1/status", b"\x00gone", 1, True))
    record = record_of(device.conn)
    assert record is not None
    assert (record["client_id"], record["version"], record["keepalive"]) == ("d-1", MQTT_3_1_1, 30)

    there = make_core()
    moved = _moved(there, record, MQTT_3_1_1)
    assert moved.read() == [], "no CONNACK: the client has had it"
    assert moved.connected and moved.conn.handed_in == "w0"
    session = there.router.sessions["d-1"]
    assert session.connection is moved.conn and session.expiry_interval == 0
    assert moved.conn.terms.keepalive == 30 and moved.conn.version == MQTT_3_1_1
    assert moved.conn.will == Will("plant/d-1/status", b"\x00gone", 1, True)
    assert moved.send(Publish("plant/d-1/telemetry", b"21.5", 1, packet_id=7)) == [PubAck(7)]
    assert record_of(moved.conn) is not None, "it moves on when its topic's leader moves"


def test_an_mqtt_5_connection_keeps_what_its_connect_settled():
    core = make_core()
    device = core.client(MQTT_5)
    properties = Properties(receive_maximum=8, topic_alias_maximum=4, maximum_packet_size=4096)
    properties.request_problem_information = 0
    properties.user_properties.append(("offsets", "on"))
    device.connect("d-5", keep_alive=0, properties=properties)
    record = record_of(device.conn)
    assert record is not None
    moved = _moved(make_core(), record, MQTT_5)
    terms, settled = moved.conn.terms, device.conn.terms
    assert moved.read() == []
    assert (terms.v5, terms.keepalive, terms.send_quota, terms.alias_max_out, terms.max_packet_out) == (
        True,
        settled.keepalive,
        8,
        settled.alias_max_out,
        4096,
    )
    assert terms.problem_information is False
    assert moved.conn.session is not None and moved.conn.session.log_offsets


def _subscribed(client: WireClient) -> None:
    client.send(Subscribe(1, [Subscription("plant/+/commands", 1)]))


def _publishing(client: WireClient) -> None:
    client.send(Publish("plant/d/telemetry", b"x", 1, packet_id=1))  # not yet durable: unanswered


@pytest.mark.parametrize(
    ("what", "connect", "then"),
    [
        ("a persistent session", {"properties": Properties(session_expiry_interval=60)}, None),
        ("a subscription", {}, _subscribed),
        ("a publish unanswered", {}, _publishing),
        (
            "a will with properties",
            {"will": Will("w", b"", 0, False, Properties(will_delay_interval=5))},
            None,
        ),
        ("a will too large to move", {"will": Will("w", b"x" * (MAX_WILL_PAYLOAD + 1))}, None),
    ],
)
def test_a_connection_whose_session_holds_something_stays(what, connect, then):
    from tests.unit.broker_edge.engine.stand_ins import MemoryLog

    core = make_core()
    core.publish_path.attach_store(MemoryLog(), None)
    device = core.client(MQTT_5)
    device.connect("d-2", **connect)
    if then is not None:
        then(device)
    assert record_of(device.conn) is None, what


def test_a_connection_with_publishes_unanswered_may_move_once_they_are():
    from tests.unit.broker_edge.engine.stand_ins import MemoryLog

    core = make_core()
    store = MemoryLog()
    core.publish_path.attach_store(store, None)
    device = core.client(MQTT_3_1_1)
    device.connect("d-6")
    device.send(Publish("plant/d-6/telemetry", b"x", 1, packet_id=1))
    assert may_move(device.conn) and record_of(device.conn) is None
    store.make_durable()
    assert device.read() == [PubAck(1)]
    assert record_of(device.conn) is not None


def test_a_connection_held_for_moving_handles_what_it_read_then_may_move():
    """An MQTT 3.1.1 client keeping its window full: publishes past ``limits.receive_maximum`` wait for the
    answers of those before them. Held for moving, it handles them once those answers come (nothing read
    is left behind), reads nothing more, and may move once they are all answered."""
    from tests.unit.broker_edge.engine.stand_ins import MemoryLog

    core = make_core(limits={"receive_maximum": 2})
    store = MemoryLog()
    core.publish_path.attach_store(store, None)
    device = core.client(MQTT_3_1_1)
    device.connect("d-7")
    device.send(*(Publish("plant/d-7/telemetry", b"%d" % n, 1, packet_id=n) for n in range(1, 6)))
    assert device.conn.held == HELD_FOR_ACKS and may_move(device.conn)
    device.conn.hold(HELD_FOR_HANDOVER)
    for answered in ([1, 2], [3, 4], [5]):
        assert record_of(device.conn) is None
        store.make_durable()
        assert device.read() == [PubAck(n) for n in answered]
    assert device.conn.held == HELD_FOR_HANDOVER and device.conn.backlog is None
    assert record_of(device.conn) is not None


def test_a_connection_not_yet_connected_stays():
    device = make_core().client(MQTT_3_1_1)
    assert record_of(device.conn) is None


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"client_id": 7}, "client_id"),
        ({"version": 6}, "version"),
        ({"keepalive": 70000}, "keepalive"),
        ({"username": ["x"]}, "username"),
        ({"will": "gone"}, "will"),
        ({"will": {"topic": "t", "payload": "not base64!", "qos": 0, "retain": False}}, "will.payload"),
        ({"will": {"topic": "t", "payload": "", "qos": 3, "retain": False}}, "will.qos"),
        ({"claim": [2, 9]}, "claim"),
        ({"claim": {"generation": "2", "revision": 9}}, "generation"),
        ({"claim": {"generation": 2, "revision": 0}}, "claim"),
    ],
)
def test_a_record_not_as_made_is_refused_naming_its_field(change, named):
    core = make_core()
    device = core.client(MQTT_3_1_1)
    device.connect("d-3")
    record = record_of(device.conn)
    assert record is not None
    with pytest.raises(BadRecord, match=f"^{named}"):
        changed = {**record, **change}
        connect_of(changed)
        claim_of(changed, "b")


def test_the_registry_record_a_connection_comes_with_names_the_member_it_left():
    """The claim on the member taking a connection in swaps the record the member it left wrote
    (``"claim"``), named by that member; a record without one is read there as for any CONNECT."""
    core = make_core()
    device = core.client(MQTT_3_1_1)
    device.connect("d-4")
    record = record_of(device.conn)
    assert record is not None and claim_of(record, "a") is None
    moved = claim_of({**record, "claim": {"generation": 2, "revision": 17}}, "a")
    assert moved == MovedClaim("a", 2, 17)


def test_a_connection_taken_in_over_a_limit_is_closed_without_a_connack():
    """A refusal of a connection taken in (here: its will's topic not allowed) closes it without a CONNACK:
    the client, connected already, connects again."""
    core = make_core()
    device = core.client(MQTT_3_1_1)
    device.connect("d-4", will=Will("plant/d-4/status", b"gone"))
    record = record_of(device.conn)
    assert record is not None
    there = make_core(
        acl={
            "rules": [{"permission": "allow", "action": "publish", "topic": "plant/+/telemetry"}],
            "default": "deny",
        }
    )
    moved = _moved(there, record, MQTT_3_1_1)
    assert moved.read() == [] and moved.closed
    assert "d-4" not in there.router.sessions


def test_a_connection_taken_in_spends_no_new_connections_rate_but_counts_against_the_maximum():
    """The member it left admitted it (and spent its rate tokens): a connection handed over is not refused
    for ``limits.new_connections_per_second``, while ``limits.max_connections`` still holds."""
    core = make_core(
        limits={"new_connections_per_second": 1, "new_connections_burst": 1, "max_connections": 2}
    )
    first = core.client(MQTT_3_1_1)
    assert first.conn.refused is None
    assert core.client(MQTT_3_1_1).conn.refused == "rate"
    moved = WireConnection(core, core.listener)
    moved.handed_in = "w0"
    moved.opened()
    assert moved.refused is None
    beyond = WireConnection(core, core.listener)
    beyond.handed_in = "w0"
    beyond.opened()
    assert beyond.refused == "max_connections"
