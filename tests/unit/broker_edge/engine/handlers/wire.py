"""Feed a broker connection bytes and read bytes back, with no socket and no event loop (h11 style).

``HandDrivenCore`` is the real ``BrokerCore`` (router, PUBLISH path, ACL, counters, admission) whose runtime
primitives are driven by the test: ``now`` is a number the test moves, ``call_soon`` queues callbacks that
``run_soon`` runs (which is when batched writes are ready for a transport), ``call_later`` keeps timers that
``advance`` fires. ``WireClient`` is one real ``Connection``, the sans-IO state machine, with no transport at
all: ``send`` feeds the encoded bytes of packets, runs what the broker queued and returns what the
connection put out (``take_output``), decoded by the same decoder clients use (``received`` keeps the raw
bytes too); whether it holds reading and whether it is closing are read off the machine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from broker_edge.config import load_dataclass
from broker_edge.engine.connection.connection import Connection
from broker_edge.engine.connection.states import CLOSED, CONNECTED
from broker_edge.engine.connection.terms import ListenerRuntime
from broker_edge.engine.core import BrokerCore
from broker_edge.observe.metrics import BrokerMetrics
from broker_edge.protocol import PacketDecoder
from broker_edge.protocol.codec import encode
from broker_edge.protocol.packets import MQTT_5, Connect, Packet
from broker_edge.settings.broker import BrokerConfig


class WireConnection(Connection):
    """A connection whose client is at a fixed address (what a socket would tell its transport adapter)."""

    __slots__ = ()

    def peer_address(self) -> tuple[str, int] | None:
        return ("127.0.0.1", 50000)


class HandDrivenCore(BrokerCore):
    """A ``BrokerCore`` whose clock, end-of-iteration callbacks and timers the test drives."""

    def __init__(self, config: BrokerConfig) -> None:
        super().__init__(config, BrokerMetrics())
        self.time = 1000.0
        self.soon: list[Callable[[], None]] = []
        self.timers: list[tuple[float, Callable[[], None]]] = []
        self.listener = ListenerRuntime(
            config.listeners[0],
            config.listener_allows_anonymous(config.listeners[0]),
            self.metrics.for_listener(config.listeners[0].name),
        )

    def now(self) -> float:
        return self.time

    def call_soon(self, callback: Callable[[], None]) -> None:
        self.soon.append(callback)

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        self.timers.append((self.time + delay, callback))

    def run_soon(self) -> None:
        """Run what was queued for the end of this iteration, and what that queued, until none is left."""
        while self.soon:
            batch, self.soon = self.soon, []
            for callback in batch:
                callback()

    def advance(self, seconds: float) -> None:
        """Move the clock; fire the timers now due; run the sweep's per-connection and router checks."""
        self.time += seconds
        due = [entry for entry in self.timers if entry[0] <= self.time]
        self.timers = [entry for entry in self.timers if entry[0] > self.time]
        for _, callback in due:
            callback()
        for conn in list(self.connections):
            conn.check_timers(self.time)
        self.router.tick(self.time)
        self.run_soon()

    def client(self, version: int = MQTT_5) -> WireClient:
        return WireClient(self, version)


def make_core(**sections: Any) -> HandDrivenCore:
    """A core configured from keyword sections the way YAML is read (``limits={...}``, ``acl={...}``)."""
    return HandDrivenCore(load_dataclass(BrokerConfig, sections))


class WireClient:
    """One client connection to ``core``, driven by bytes."""

    def __init__(self, core: HandDrivenCore, version: int = MQTT_5) -> None:
        self.core = core
        self.version = version
        self.conn = WireConnection(core, core.listener)
        self.conn.opened()
        self.received = b""
        """The raw bytes of the last ``send``'s answer."""

    def send_bytes(self, data: bytes) -> list[Packet]:
        """Feed ``data``, run what the broker queued, return the packets it wrote back (decoded)."""
        self.conn.receive(data)
        self.core.run_soon()
        return self.read()

    def send(self, *packets: Packet) -> list[Packet]:
        """Feed the encoded ``packets`` in one read."""
        return self.send_bytes(b"".join(encode(packet, self.version) for packet in packets))

    def read(self) -> list[Packet]:
        """What the broker wrote since the last read (for deliveries caused by another client)."""
        self.core.run_soon()
        self.received = b"".join(self.conn.take_output() or ())
        decoder = PacketDecoder(role="client", protocol_version=self.version)
        return decoder.feed(self.received)

    def connect(self, client_id: str = "device", **fields: Any) -> Packet:
        """CONNECT and return the CONNACK (the test asserts what it says)."""
        fields.setdefault("clean_start", True)
        answer = self.send(Connect(client_id=client_id, protocol_version=self.version, **fields))
        assert len(answer) == 1, answer
        return answer[0]

    @property
    def connected(self) -> bool:
        return self.conn.state == CONNECTED

    @property
    def closed(self) -> bool:
        return self.conn.state == CLOSED or bool(self.conn.closing)

    @property
    def reading_paused(self) -> bool:
        """Whether the connection holds reading (its transport would not read while it does)."""
        return bool(self.conn.held)
