"""AUTH: this broker offers no enhanced authentication, so an AUTH packet ends the connection (0x82)."""

from broker_edge.protocol.packets import Auth, Disconnect
from tests.unit.broker_edge.engine.handlers.wire import make_core


def test_auth_without_an_authentication_method_is_a_protocol_error_mqtt_4_12_0_1():
    """[MQTT-4.12.0-1] AUTH without an Authentication Method in CONNECT: DISCONNECT 0x82, then closed."""
    core = make_core()
    client = core.client()
    client.connect()
    answer = client.send(Auth(0x18))
    assert [type(packet) for packet in answer] == [Disconnect]
    assert answer[0].reason_code == 0x82
    assert client.closed
    assert core.counters.refusals("protocol_error") == 0  # a connected client is disconnected, not refused
