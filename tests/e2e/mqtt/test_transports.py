"""Plain TCP listeners on the broker's own transport (the default) or the loop's (``transport: asyncio``).

The rest of the broker suite runs on the default; these tests check the choice itself and what a transport
must get right with real clients: a peer's reset, a peer's end of stream with answers still to write.
"""

from __future__ import annotations

import socket
import struct

import pytest

from broker_edge.protocol.packets import ConnAck, Connect, SubAck, Subscribe, Subscription, Will
from broker_edge.runtime.transports.native import NativeTransport
from tests.e2e.broker_clients import PahoClient, RawClient, wait_for

TWO_LISTENERS = [
    {"name": "own", "type": "tcp", "host": "127.0.0.1", "port": 0, "transport": "native"},
    {"name": "loop", "type": "tcp", "host": "127.0.0.1", "port": 0, "transport": "asyncio"},
]


def test_each_listener_runs_on_the_transport_it_names_and_both_carry_messages(start_broker):
    broker = start_broker(listeners=TWO_LISTENERS)
    on_own = PahoClient(broker.port_of("own"), client_id="on-own", version=5)
    on_loop = PahoClient(broker.port_of("loop"), client_id="on-loop", version=4)
    on_own.subscribe("t/#", qos=1)
    on_loop.subscribe("t/#", qos=1)
    on_own.publish("t/from-own", b"a", qos=1)
    on_loop.publish("t/from-loop", b"b", qos=1)
    assert sorted(m.topic for m in on_own.expect(2)) == ["t/from-loop", "t/from-own"]
    assert sorted(m.topic for m in on_loop.expect(2)) == ["t/from-loop", "t/from-own"]

    def transports() -> dict[str, bool]:
        return {c.client_id: isinstance(c.transport, NativeTransport) for c in broker.broker.connections}

    assert broker.call(transports) == {"on-own": True, "on-loop": False}


@pytest.mark.parametrize("transport", ["native", "asyncio"])
def test_a_reset_connection_is_gone_and_its_will_is_sent(start_broker, transport):
    broker = start_broker(listeners=[{**TWO_LISTENERS[0], "transport": transport}])
    watcher = PahoClient(broker.port, client_id="watcher", version=5)
    watcher.subscribe("wills/#")
    device = RawClient(broker.port, version=5)
    will = Will(topic="wills/device", payload=b"gone")
    assert isinstance(device.connect("device", will=will), ConnAck)
    device.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    device.sock.close()
    assert [m.payload for m in watcher.expect(1)] == [b"gone"]
    assert wait_for(lambda: not broker.connected("device"))


@pytest.mark.parametrize("transport", ["native", "asyncio"])
def test_a_client_that_ends_its_stream_still_gets_the_answers_to_what_it_sent(start_broker, transport):
    broker = start_broker(listeners=[{**TWO_LISTENERS[0], "transport": transport}])
    device = RawClient(broker.port, version=4)
    device.send_packet(Connect(protocol_version=4, client_id="half", keep_alive=60))
    filters = [Subscription(f"half/{n}", 1) for n in range(200)]
    device.send_packet(Subscribe(1, filters))
    device.sock.shutdown(socket.SHUT_WR)
    assert isinstance(device.recv(), ConnAck)
    suback = device.recv()
    assert isinstance(suback, SubAck) and len(suback.reason_codes) == 200
    assert device.recv() is None  # then the broker closes
    assert wait_for(lambda: not broker.connected("half"))
