"""DISCONNECT from the client: the will is discarded (or kept with v5 0x04); the session expiry may change."""

from broker_edge.protocol.packets import (
    MQTT_3_1_1,
    Disconnect,
    Publish,
    Subscribe,
    Subscription,
    Will,
)
from broker_edge.protocol.properties import Properties
from tests.unit.broker_edge.engine.handlers.wire import make_core


def _watcher(core):
    watcher = core.client()
    watcher.connect("watcher")
    watcher.send(Subscribe(1, [Subscription("wills/#", 0)]))
    return watcher


def test_a_normal_disconnect_discards_the_will_mqtt_3_14_4_3():
    """[MQTT-3.14.4-3] On receipt of DISCONNECT with 0x00 the Server MUST discard the Will Message."""
    core = make_core()
    watcher = _watcher(core)
    device = core.client(MQTT_3_1_1)
    device.connect("device", will=Will("wills/device", b"gone"))
    assert device.send(Disconnect()) == []
    assert device.closed
    device.conn.transport_closed(None)
    assert watcher.read() == []


def test_disconnect_with_will_message_0x04_sends_the_will():
    core = make_core()
    watcher = _watcher(core)
    device = core.client()
    device.connect("device", will=Will("wills/device", b"gone"))
    device.send(Disconnect(0x04))
    device.conn.transport_closed(None)
    assert watcher.read() == [Publish("wills/device", b"gone")]


def test_setting_a_session_expiry_when_connect_had_0_is_a_protocol_error_mqtt_3_14_2_2():
    """[MQTT-3.14.2-2] Session Expiry Interval set on DISCONNECT when CONNECT had 0: protocol error."""
    device = make_core().client()
    device.connect("device")
    answer = device.send(Disconnect(0, Properties(session_expiry_interval=60)))
    reason = answer[0].properties.reason_string
    assert answer == [Disconnect(0x82, Properties(reason_string=reason))]
    assert reason is not None and "session expiry" in reason


def test_disconnect_may_shorten_the_session_expiry_within_the_broker_maximum():
    core = make_core(sessions={"max_session_expiry_s": 100})
    device = core.client()
    device.connect("device", clean_start=False, properties=Properties(session_expiry_interval=50))
    device.send(Disconnect(0, Properties(session_expiry_interval=1000)))
    assert core.router.sessions["device"].expiry_interval == 100
