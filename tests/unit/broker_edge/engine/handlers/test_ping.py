"""PINGREQ → PINGRESP, fed as bytes to a connection with no socket and no event loop."""

from broker_edge.protocol.packets import MQTT_3_1_1, PingReq, PingResp
from tests.unit.broker_edge.engine.handlers.wire import make_core


def test_pingreq_is_answered_with_the_two_bytes_of_pingresp_mqtt_3_12_4_1():
    """[MQTT-3.12.4-1] The Server MUST send a PINGRESP packet in response to a PINGREQ packet."""
    client = make_core().client(MQTT_3_1_1)
    client.connect()
    assert client.send_bytes(b"\xc0\x00") == [PingResp()]
    assert client.received == b"\xd0\x00"


def test_each_pingreq_of_one_read_gets_its_own_pingresp_in_one_write():
    client = make_core().client()
    client.connect()
    assert client.send(PingReq(), PingReq(), PingReq()) == [PingResp()] * 3
    assert client.received == b"\xd0\x00" * 3
