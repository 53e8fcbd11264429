"""What CONNECT settles is shared by value (``broker_edge.engine.connection.terms``); the client id is the
session's."""

from __future__ import annotations

from broker_edge.engine.connection.states import CLOSED, CONNECTED, NEW, NO_LIMIT
from broker_edge.protocol.packets import MQTT_3_1_1, MQTT_5, Disconnect
from broker_edge.protocol.properties import Properties
from tests.unit.broker_edge.engine.handlers.wire import make_core


def test_connections_that_settled_the_same_share_their_terms():
    core = make_core()
    first, second, other = core.client(MQTT_3_1_1), core.client(MQTT_3_1_1), core.client(MQTT_3_1_1)
    first.connect("first", keep_alive=60)
    second.connect("second", keep_alive=60)
    other.connect("other", keep_alive=30)
    assert first.conn.terms is second.conn.terms
    assert other.conn.terms is not first.conn.terms and other.conn.terms.keepalive == 30
    assert (
        first.conn.terms.keepalive == 60 and not first.conn.v5 and first.conn.terms.max_packet_out == NO_LIMIT
    )
    assert first.conn.terms.listener is core.listener and first.conn.terms.host is core


def test_a_v5_clients_limits_are_its_own_terms():
    core = make_core()
    client = core.client(MQTT_5)
    client.connect(
        "limited",
        keep_alive=20,
        properties=Properties(receive_maximum=5, maximum_packet_size=4096, request_problem_information=0),
    )
    terms = client.conn.terms
    assert (terms.v5, terms.keepalive, terms.send_quota, terms.max_packet_out) == (True, 20, 5, 4096)
    assert terms.problem_information is False


def test_paused_writing_swaps_the_terms_for_their_paused_twin_and_back():
    core = make_core()
    client = core.client(MQTT_5)
    client.connect("slow")
    settled = client.conn.terms
    client.conn.writing_paused()
    assert client.conn.terms.paused and client.conn.terms.keepalive == settled.keepalive
    client.conn.writing_resumed()
    assert client.conn.terms is settled and not client.conn.terms.paused


def test_the_state_of_a_connection_is_one_of_its_terms_shared_until_it_changes():
    core = make_core()
    first, second = core.client(MQTT_3_1_1), core.client(MQTT_3_1_1)
    assert first.conn.state == NEW and first.conn.terms is second.conn.terms
    first.connect("first", keep_alive=60)
    second.connect("second", keep_alive=60)
    assert first.conn.state == second.conn.state == CONNECTED and first.conn.terms is second.conn.terms
    first.send(Disconnect())
    first.conn.transport_closed(None)  # the transport closed
    assert first.conn.state == CLOSED and second.conn.state == CONNECTED
    assert first.conn.terms.keepalive == 60, "closing changed the state and nothing else"
    assert first.conn.terms is not second.conn.terms


def test_the_client_id_is_the_sessions_and_stays_once_the_connection_lets_go_of_it():
    core = make_core()
    old, new = core.client(MQTT_3_1_1), core.client(MQTT_3_1_1)
    old.connect("device-7")
    assert old.conn.client_id == "device-7" and old.conn._rare is None, "no side object for its id"
    new.connect("device-7")
    assert old.conn.session is None and old.conn.client_id == "device-7"
