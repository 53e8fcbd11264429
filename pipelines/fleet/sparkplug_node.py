"""A simulated Sparkplug B edge node with its devices, as the Sparkplug 3.0 specification has one behave.

On connecting it registers its death certificate (NDEATH, carrying the connection's ``bdSeq``) as its MQTT
will, QoS 1 and not retained; subscribes to its commands (NCMD, DCMD); then publishes its NBIRTH (sequence
number 0, ``bdSeq``, ``Node Control/Rebirth`` and its own metrics, each with a name, a datatype and an alias)
and one DBIRTH per device. From then on its devices send DDATA with each metric by alias alone, every
message of the node taking the next sequence number (modulo 256). An NCMD setting ``Node Control/Rebirth``
to true makes it publish its births again (same ``bdSeq``, sequence from 0). Dropped abruptly
(:meth:`SparkplugEdgeNode.go_offline`), the broker publishes its will; it comes back with ``bdSeq`` + 1. A
clean stop publishes the NDEATH itself before DISCONNECT. Every Sparkplug message is QoS 0, not retained.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass

from broker_edge.protocol import Will
from pipelines.fleet.client import Message, MqttClient
from pipelines.payloads.fields import PayloadError
from pipelines.payloads.sparkplug.encode import REBIRTH, MetricOut, bdseq_metric, encode, ndeath
from pipelines.payloads.sparkplug.messages import read_payload
from pipelines.payloads.sparkplug.session import SEQ_MODULO
from pipelines.payloads.sparkplug.topics import SparkplugTopic

#: Each device's metrics: name, datatype. Their aliases are numbered across the node, from 1.
DEVICE_METRICS = (
    ("Temperature", "Float"),
    ("Humidity", "Double"),
    ("Battery", "Double"),
    ("Status", "Int32"),
)
NODE_METRICS = (("Uptime", "Int64"),)


@dataclass
class SparkplugBehaviour:
    data_interval_s: float = 5.0
    keep_alive_s: int = 30


class SparkplugEdgeNode:
    """One edge node and its devices on one connection; lives until :meth:`stop`."""

    def __init__(
        self,
        group_id: str,
        edge_node_id: str,
        device_ids: list[str],
        broker: tuple[str, int],
        behaviour: SparkplugBehaviour,
        rng: random.Random,
        stats: Counter,
    ) -> None:
        self.group_id = group_id
        self.edge_node_id = edge_node_id
        self.device_ids = device_ids
        self.broker = broker
        self.behaviour = behaviour
        self.rng = rng
        self.stats = stats
        self.bdseq = -1
        """The current connection's birth/death sequence number (incremented on every connect)."""
        self.seq = 0
        self.client: MqttClient | None = None
        self.started_ms = int(time.time() * 1000)
        aliases = iter(range(1, 1 + len(NODE_METRICS) + len(DEVICE_METRICS) * len(device_ids)))
        self.node_aliases = {name: next(aliases) for name, _ in NODE_METRICS}
        self.device_aliases = {d: {name: next(aliases) for name, _ in DEVICE_METRICS} for d in device_ids}
        self._timer: asyncio.TimerHandle | None = None
        self._stopped = False

    def topic(self, message_type: str, device_id: str | None = None) -> str:
        return SparkplugTopic(self.group_id, message_type, self.edge_node_id, device_id).name

    # -- session ------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect with the NDEATH as will, subscribe to commands, publish the births."""
        self.bdseq = (self.bdseq + 1) % SEQ_MODULO
        host, port = self.broker
        will = Will(self.topic("NDEATH"), ndeath(self.bdseq), qos=1, retain=False)
        self.client = await MqttClient.connect(
            host,
            port,
            f"{self.group_id}.{self.edge_node_id}",
            on_message=self._on_command,
            keep_alive=self.behaviour.keep_alive_s,
            will=will,
        )
        await self.client.subscribe(self.topic("NCMD"), 1)
        await self.client.subscribe(f"{self.topic('DCMD')}/+", 1)
        self.stats["sparkplug_connects"] += 1
        self.publish_births()
        self._schedule_data()

    def publish_births(self) -> None:
        """The NBIRTH (sequence restarts at 0) and each device's DBIRTH, every metric named and aliased."""
        now = _now_ms()
        self.seq = 0
        node = [
            bdseq_metric(self.bdseq),
            MetricOut(False, "Boolean", name=REBIRTH),
            *[
                MetricOut(now - self.started_ms, t, name=n, alias=self.node_aliases[n])
                for n, t in NODE_METRICS
            ],
        ]
        self._publish(self.topic("NBIRTH"), encode(node, timestamp_ms=now, seq=self._next_seq()))
        for device_id in self.device_ids:
            aliases = self.device_aliases[device_id]
            metrics = [MetricOut(self._value(t), t, name=n, alias=aliases[n]) for n, t in DEVICE_METRICS]
            payload = encode(metrics, timestamp_ms=now, seq=self._next_seq())
            self._publish(self.topic("DBIRTH", device_id), payload)
        self.stats["sparkplug_births"] += 1

    def publish_data(self) -> None:
        """One DDATA per device, its metrics by alias alone (no name, no datatype)."""
        now = _now_ms()
        for device_id in self.device_ids:
            aliases = self.device_aliases[device_id]
            metrics = [
                MetricOut(self._value(t), t, alias=aliases[n], with_datatype=False) for n, t in DEVICE_METRICS
            ]
            self._publish(
                self.topic("DDATA", device_id), encode(metrics, timestamp_ms=now, seq=self._next_seq())
            )
            self.stats["sparkplug_data"] += 1

    def go_offline(self) -> None:
        """Drop the connection without DISCONNECT: the broker publishes the NDEATH will."""
        if self._timer:
            self._timer.cancel()
        if self.client and self.client.connected:
            self.client.abort()
            self.stats["sparkplug_dropped"] += 1

    async def stop(self) -> None:
        """Publish the NDEATH, then DISCONNECT (which discards the will)."""
        self._stopped = True
        if self._timer:
            self._timer.cancel()
        if self.client and self.client.connected:
            self._publish(self.topic("NDEATH"), ndeath(self.bdseq))
            await self.client.disconnect()

    # -- internals ----------------------------------------------------------------------------------------

    def _on_command(self, message: Message) -> None:
        if message.topic != self.topic("NCMD"):
            self.stats["sparkplug_device_commands"] += 1
            return
        try:
            metrics = read_payload(message.payload).metrics
        except PayloadError:
            self.stats["sparkplug_bad_commands"] += 1
            return
        if any(
            m.name == REBIRTH and m.value_field == "boolean_value" and m.message.boolean_value
            for m in metrics
        ):
            self.stats["sparkplug_rebirth_requests"] += 1
            self.publish_births()

    def _schedule_data(self) -> None:
        interval = self.behaviour.data_interval_s
        if interval > 0 and not self._stopped:
            delay = self.rng.uniform(0.5, 1.5) * interval
            self._timer = asyncio.get_running_loop().call_later(delay, self._tick)

    def _tick(self) -> None:
        if self.client is not None and self.client.connected:
            self.publish_data()
            self._schedule_data()

    def _publish(self, topic: str, payload: bytes) -> None:
        if self.client is not None:
            self.client.publish_nowait(topic, payload, qos=0)

    def _next_seq(self) -> int:
        seq, self.seq = self.seq, (self.seq + 1) % SEQ_MODULO
        return seq

    def _value(self, datatype: str) -> float | int:
        if datatype == "Int32":
            return self.rng.choice((0, 1, 1, 1, -1))
        if datatype == "Float":
            return round(self.rng.gauss(21.0, 3.0), 2)
        return round(self.rng.uniform(20.0, 100.0), 1)


def _now_ms() -> int:
    return int(time.time() * 1000)


class SparkplugFleet:
    """``count`` edge nodes of one group, each with ``devices_per_node`` devices, on the brokers in turn."""

    def __init__(
        self,
        brokers: list[tuple[str, int]],
        count: int,
        devices_per_node: int,
        group_id: str = "fleet",
        behaviour: SparkplugBehaviour | None = None,
        seed: int = 7,
    ) -> None:
        self.stats: Counter = Counter()
        rng = random.Random(seed)
        width = max(3, len(str(count)))
        self.nodes = [
            SparkplugEdgeNode(
                group_id,
                f"node-{n:0{width}d}",
                [f"dev-{d:02d}" for d in range(devices_per_node)],
                brokers[n % len(brokers)],
                behaviour or SparkplugBehaviour(),
                random.Random(rng.random()),
                self.stats,
            )
            for n in range(count)
        ]

    async def start(self) -> None:
        results = await asyncio.gather(*(node.start() for node in self.nodes), return_exceptions=True)
        self.stats["sparkplug_connect_failures"] += sum(isinstance(r, BaseException) for r in results)

    async def stop(self) -> None:
        await asyncio.gather(*(node.stop() for node in self.nodes), return_exceptions=True)

    def connected(self) -> int:
        return sum(1 for node in self.nodes if node.client is not None and node.client.connected)
