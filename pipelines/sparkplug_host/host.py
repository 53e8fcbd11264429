"""A Sparkplug B host application on one MQTT server: its STATE, and rebirth requests to unborn nodes.

Edge nodes configured with a primary host application publish their births only once its STATE says it is
online. This client is that host (Sparkplug 3.0, 5.3 and 6.4.18): it connects with a clean session and its
death certificate as will (``spBv1.0/STATE/<host_id>``, JSON ``{"online": false, "timestamp": T}``, QoS 1,
retained), subscribes to its own STATE topic and to the Sparkplug namespace, then publishes its birth (the
same JSON with ``online`` true and the same ``T``, QoS 1, retained). Should a STATE saying it is offline
reach it once its birth is out (a stray publisher, an old instance's will), it publishes its birth again.
Stopping, it publishes the death itself before DISCONNECT. A lost connection is made again (:meth:`run`).

It also watches the edge nodes: data, a DBIRTH or a DDEATH from an edge node whose NBIRTH it has not seen on
this connection (or whose NDEATH followed it: an NDEATH whose ``bdSeq`` is not the NBIRTH's is an earlier
connection's will, and ends nothing; a copy of the NBIRTH in force, the same bytes, is no new birth)
means its aliases are unknown here, and so does a DDATA from a device not born since its node's last NBIRTH
(no DBIRTH seen since, or a DDEATH after it; a birth the telemetry job quarantines as unreadable is none),
and so does data naming a metric its birth does not define; so does a
birth it cannot take (one giving an alias to two metrics, or a DBIRTH giving an alias its node's NBIRTH or
another device's DBIRTH in force gives, [tck-id-payloads-alias-uniqueness], or otherwise unreadable, as the
telemetry job quarantines it), at once; and so does a born node's sequence number that
skips some or came already, when the ``reorder_timeout_s`` window it opens (:mod:`.reorder`, Sparkplug 3.0,
5.8) elapses before the numbers skipped arrive. It asks that node for a rebirth (an NCMD setting ``Node
Control/Rebirth``, QoS 0, not retained: the node births itself and every device again), at most once per
``rebirth_interval_s`` per node. The telemetry job reads the births from the brokers' logs; the rebirth brings
a birth into the log when the one a node sent has been deleted by retention or was never received.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from broker_edge.protocol import ReasonCode, Will
from pipelines.fleet.client import Message, MqttClient
from pipelines.payloads.fields import PayloadError
from pipelines.payloads.sparkplug.aliases import NodeAliases
from pipelines.payloads.sparkplug.encode import rebirth_request
from pipelines.payloads.sparkplug.messages import bdseq, read_payload
from pipelines.payloads.sparkplug.session import Birth, birth_of, undefined_metric
from pipelines.payloads.sparkplug.topics import (
    NAMESPACE,
    TOPIC_FILTER,
    SparkplugTopic,
    parse_topic,
    state_topic,
)
from pipelines.sparkplug_host.reorder import Sequence

log = logging.getLogger("pipelines.sparkplug_host")
#: The messages of a born edge node that carry its next sequence number (not commands: a host's have none).
NUMBERED = ("NDATA", "DBIRTH", "DDATA", "DDEATH")


#: A STATE is one flat object: a payload opening more brackets than this is not parsed (the JSON reader
#: recurses once per level, and finalisers run meanwhile would find the stack all but spent).
STATE_MAX_BRACKETS = 32


def says_online(payload: bytes) -> bool:
    """Whether a STATE's payload is a JSON object with ``online`` true; anything else says it is not."""
    if payload.count(b"[") + payload.count(b"{") > STATE_MAX_BRACKETS:
        return False
    try:
        return json.loads(payload).get("online") is True
    except (ValueError, AttributeError):  # not JSON or not UTF-8; not an object
        return False


def state_payload(online: bool, timestamp_ms: int) -> bytes:
    """A STATE birth (``online`` true) or death: UTF-8 JSON with the keys ``online`` and ``timestamp``."""
    return json.dumps({"online": online, "timestamp": timestamp_ms}).encode()


@dataclass
class HostState:
    """What the host knows of the edge nodes on this connection: which have been born, and when it last
    asked each for a rebirth."""

    born: dict[tuple[str, str], int | None] = field(default_factory=dict)
    """The edge nodes born on this connection, with their NBIRTH's ``bdSeq`` (None when it has none)."""
    births: dict[tuple[str, str], Birth] = field(default_factory=dict)
    """What each born edge node's NBIRTH declares (its aliases and names)."""
    birth_payloads: dict[tuple[str, str], bytes] = field(default_factory=dict)
    """Each born edge node's NBIRTH as sent: a copy of it (the same bytes) is no new birth."""
    devices: dict[tuple[str, str], dict[str, Birth]] = field(default_factory=dict)
    """The devices of each born edge node born since its last NBIRTH (by DBIRTH, not dead since), with
    what their DBIRTH declares."""
    aliases: dict[tuple[str, str], NodeAliases] = field(default_factory=dict)
    """Which of each born edge node's births in force gives each alias (its NBIRTH, a device's DBIRTH)."""
    asked_at: dict[tuple[str, str], float] = field(default_factory=dict)
    sequences: dict[tuple[str, str], Sequence] = field(default_factory=dict)
    """Each born edge node's sequence numbers since its NBIRTH (its Reorder Timeout window)."""

    def close(self) -> None:
        """End every Reorder Timeout window (its timer): the connection they were opened on is gone."""
        for sequence in self.sequences.values():
            sequence.close()


class SparkplugHost:
    """The host application ``host_id`` on the broker at ``host:port``; :meth:`start`, then :meth:`stop`."""

    def __init__(
        self,
        host: str,
        port: int,
        host_id: str,
        *,
        rebirth_interval_s: float = 30.0,
        reorder_timeout_s: float = 2.0,
        keep_alive_s: int = 30,
        retry_s: float = 1.0,
        username: str | None = None,
        password: bytes | None = None,
        ssl_context: ssl.SSLContext | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.address = (host, port)
        self.login = (username, password)
        """The user name and password it connects with (none: anonymous)."""
        self.ssl_context = ssl_context
        """MQTT over TLS (None: plain MQTT)."""
        self.host_id = host_id
        self.topic = state_topic(host_id)
        self.rebirth_interval_s = rebirth_interval_s
        self.reorder_timeout_s = reorder_timeout_s
        """Seconds the numbers a born node's sequence skipped may take to arrive before a rebirth request."""
        self.keep_alive_s = keep_alive_s
        self.retry_s = retry_s
        """Seconds between two attempts to connect again once the connection is lost (:meth:`run`)."""
        self.clock = clock
        self.stats: Counter = Counter()
        self.state = HostState()
        self.client: MqttClient | None = None
        self.connected_ms = 0
        """The ``timestamp`` of this connection's will and births."""
        self.born = False
        """Whether this connection's birth is out (a STATE saying offline is answered only after it)."""
        self.stopping = False
        """Set by :meth:`stop`: no birth may follow the death."""
        self._answers: set[asyncio.Task[None]] = set()
        """Births in answer to an offline STATE, still publishing (:meth:`stop` waits for them)."""
        self._lost = asyncio.Event()
        """Set when this connection closes (the broker restarted or dropped it)."""

    async def start(self) -> None:
        """Connect (clean session, the death as will), subscribe, then publish the birth."""
        self.connected_ms = int(self.clock() * 1000)
        self.state.close()
        self.state = HostState()
        self.born = False
        self.stopping = False
        host, port = self.address
        will = Will(self.topic, state_payload(False, self.connected_ms), qos=1, retain=True)
        self.client = await MqttClient.connect(
            host,
            port,
            f"sparkplug-host-{self.host_id}",
            on_message=self._on_message,
            clean_start=True,
            session_expiry_s=0,
            keep_alive=self.keep_alive_s,
            will=will,
            username=self.login[0],
            password=self.login[1],
            ssl_context=self.ssl_context,
        )
        self._lost = asyncio.Event()
        self.client.on_disconnect = lambda _: self._lost.set()
        if not self.client.connected:
            self._lost.set()
        await self.client.subscribe(self.topic, 1)
        await self.client.subscribe(TOPIC_FILTER, 0)
        await self._publish_birth()

    async def run(self, stop: asyncio.Event) -> bool:
        """Once :meth:`start` has connected: stay online until ``stop`` is set, then :meth:`stop` (True). A
        lost connection (the broker restarted, or dropped it) is made again every ``retry_s`` seconds, each
        a new session with its own timestamp, will and birth; edge nodes are watched afresh on it. A
        connection taken over by another client with this host's client id (a second host with the same
        id) is not made again: False, the other host stays online."""
        stopped = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                lost = asyncio.ensure_future(self._lost.wait())
                await asyncio.wait({stopped, lost}, return_when=asyncio.FIRST_COMPLETED)
                lost.cancel()
                if self.client is not None and self.client.closed_with == ReasonCode.SESSION_TAKEN_OVER:
                    return False
                if not stop.is_set() and self._lost.is_set():
                    await self._reconnect(stop, stopped)
        finally:
            stopped.cancel()
        await self.stop()
        return True

    async def _reconnect(self, stop: asyncio.Event, stopped: asyncio.Future[Any]) -> None:
        """Connect again every ``retry_s`` seconds until connected or stopped; said at WARNING when the
        connection is lost and when the first attempt fails (the others at DEBUG), at INFO once back."""
        where = f"{self.address[0]}:{self.address[1]}"
        closed = self.client.closed_with if self.client is not None else None
        reason = f" (the broker's DISCONNECT: 0x{closed:02x})" if closed is not None else ""
        log.warning("connection to %s lost%s: offline, connecting again", where, reason)
        attempts = 0
        while not stop.is_set() and self._lost.is_set():
            await asyncio.wait({stopped}, timeout=self.retry_s)
            if stop.is_set():
                return
            attempts += 1
            try:
                await self.start()
            except (OSError, TimeoutError) as error:  # refused, unreachable or silent: try again
                if self.client is not None:
                    self.client.abort()
                self._lost.set()
                level = logging.WARNING if attempts == 1 else logging.DEBUG
                log.log(level, "cannot connect again to %s (attempt %d): %s", where, attempts, error)
            else:
                self.stats["reconnections"] += 1
                log.info(
                    "connected again to %s after %d attempts: birth published (timestamp %d)",
                    where,
                    attempts,
                    self.connected_ms,
                )

    async def stop(self) -> None:
        """Publish the death (the will's payload), then DISCONNECT. A birth answering a stray STATE that
        is still publishing ends first, and none starts after: the death is the last STATE retained."""
        self.stopping = True
        self.born = False  # its own death comes back to it: not a stray STATE to answer
        self.state.close()
        await asyncio.gather(*self._answers, return_exceptions=True)
        if self.client is not None and self.client.connected:
            await self.client.publish(self.topic, state_payload(False, self.connected_ms), 1, retain=True)
            await self.client.disconnect()

    async def _publish_birth(self) -> None:
        assert self.client is not None
        if self.stopping:
            return
        await self.client.publish(self.topic, state_payload(True, self.connected_ms), 1, retain=True)
        self.born = not self.stopping  # a PUBACK arriving after stop() began must not re-arm the answer
        self.stats["births"] += 1

    def _on_message(self, message: Message) -> None:
        if message.topic == self.topic:
            self._own_state(message.payload)
        elif message.topic.startswith(f"{NAMESPACE}/"):
            self._edge_message(message.topic, message.payload)

    def _own_state(self, payload: bytes) -> None:
        """A STATE on its own id saying it is offline (an old will, a stray publisher): it is online."""
        if not says_online(payload) and self.born and self.client is not None and self.client.connected:
            self.stats["offline_states_answered"] += 1
            answer = asyncio.get_running_loop().create_task(self._publish_birth())
            self._answers.add(answer)
            answer.add_done_callback(self._answers.discard)

    def _edge_message(self, topic_name: str, payload: bytes) -> None:
        try:
            topic = parse_topic(topic_name)
        except ValueError:
            return  # STATE of another host, or not an edge node's message
        node = (topic.group_id, topic.edge_node_id)
        kind = topic.message_type
        state = self.state
        if kind == "NBIRTH":
            if node in state.born and state.birth_payloads.get(node) == payload:
                self.stats["birth_copies"] += 1  # delivered again (a bridge): changes nothing
                return
            birth = birth_of(payload)
            if birth is not None:
                self._forget(node)
                state.born[node], state.births[node] = _bdseq(payload), birth
                state.birth_payloads[node] = payload
                state.devices[node] = {}  # its devices are born again after it
                state.aliases[node] = NodeAliases.of(birth.aliases, {})
                state.sequences[node] = Sequence.after_birth(_seq(payload) or 0)
            else:  # the telemetry job quarantines it: no birth in force, the one before ended
                self._forget(node)
                self._ask_rebirth(topic, node)
        elif kind == "NDEATH":
            if node in state.born:
                born, death = state.born[node], _bdseq(payload)
                if born is None or death is None or born == death:
                    self._forget(node)  # any other is an earlier connection's will, late
        elif node not in state.born:
            if kind in ("NDATA", "DBIRTH", "DDATA", "DDEATH"):
                self._ask_rebirth(topic, node)
        else:
            if kind in NUMBERED:
                self._follow_sequence(topic, node, payload)
            if kind == "NDATA":
                if undefined_metric(payload, state.births[node]):
                    self._ask_rebirth(topic, node)
            elif kind in ("DBIRTH", "DDEATH", "DDATA") and topic.device_id is not None:
                self._device_message(topic, node, payload)

    def _follow_sequence(self, topic: SparkplugTopic, node: tuple[str, str], payload: bytes) -> None:
        """A born node's message with a sequence number: one out of order opens a Reorder Timeout window
        (its timer), one that makes the sequence whole again closes it (the timer ends)."""
        sequence = self.state.sequences.get(node)
        seq = _seq(payload)
        if sequence is None or seq is None:
            return
        whole = sequence.take(seq)
        if whole and sequence.timer is not None:
            sequence.close()
            self.stats["reordered"] += 1
        elif not whole and sequence.timer is None:
            self.stats["out_of_order"] += 1
            loop = asyncio.get_running_loop()
            sequence.timer = loop.call_later(self.reorder_timeout_s, self._reorder_timeout, topic, node)

    def _reorder_timeout(self, topic: SparkplugTopic, node: tuple[str, str]) -> None:
        """The Reorder Timeout elapsed with numbers still missing, or after one that came twice."""
        sequence = self.state.sequences.get(node)
        if sequence is None or sequence.whole:
            return
        sequence.close()
        self.stats["reorder_timeouts"] += 1
        log.debug("edge node %s/%s: sequence numbers out of order past the reorder timeout", *node)
        self._ask_rebirth(topic, node)

    def _device_message(self, topic: SparkplugTopic, node: tuple[str, str], payload: bytes) -> None:
        """A born node's device: born by a DBIRTH the job takes (one it quarantines is none: one giving an
        alias the NBIRTH or another device's DBIRTH in force gives too), ended by a DDEATH; its data ask a
        rebirth when it is not born, or name a metric its DBIRTH does not define."""
        device = topic.device_id
        assert device is not None
        devices = self.state.devices.setdefault(node, {})
        aliases = self.state.aliases[node]  # set with its NBIRTH, as its births
        if topic.message_type == "DBIRTH":
            birth = birth_of(payload)
            if birth is not None and aliases.taken(device, birth.aliases) is None:
                before = devices.get(device)
                aliases.put(device, birth.aliases, before.aliases if before is not None else None)
                devices[device] = birth
            else:  # quarantined: no birth in force for the device; a rebirth births it again
                self._end_device(node, device)
                self._ask_rebirth(topic, node)
        elif topic.message_type == "DDEATH":
            self._end_device(node, device)
        else:
            birth = devices.get(device)
            if birth is None or undefined_metric(payload, birth):
                self._ask_rebirth(topic, node)

    def _end_device(self, node: tuple[str, str], device: str) -> None:
        """The device's birth no longer in force, nor its aliases."""
        birth = self.state.devices.get(node, {}).pop(device, None)
        if birth is not None and node in self.state.aliases:
            self.state.aliases[node].drop(device, birth.aliases)

    def _forget(self, node: tuple[str, str]) -> None:
        """The node's birth, and its devices', no longer in force."""
        self.state.born.pop(node, None)
        self.state.births.pop(node, None)
        self.state.birth_payloads.pop(node, None)
        self.state.devices.pop(node, None)
        self.state.aliases.pop(node, None)
        sequence = self.state.sequences.pop(node, None)
        if sequence is not None:
            sequence.close()

    def _ask_rebirth(self, topic: SparkplugTopic, node: tuple[str, str]) -> None:
        now = self.clock()
        asked = self.state.asked_at.get(node)
        if asked is not None and now - asked < self.rebirth_interval_s:
            return
        self.state.asked_at[node] = now
        command = SparkplugTopic(topic.group_id, "NCMD", topic.edge_node_id).name
        log.debug("asking edge node %s/%s for a rebirth (%s)", node[0], node[1], topic.name)
        if self.client is not None and self.client.publish_nowait(
            command, rebirth_request(int(now * 1000)), 0
        ):
            self.stats["rebirth_requests"] += 1


def _seq(payload: bytes) -> int | None:
    """The sequence number of an edge node's message (0 when left out, as a proto3 encoder leaves a 0 out);
    None when it is empty (a retained message cleared: no message of the node's) or does not parse."""
    if not payload:
        return None
    try:
        seq = read_payload(payload).seq
    except PayloadError:
        return None
    return 0 if seq is None else seq


def _bdseq(payload: bytes) -> int | None:
    """The ``bdSeq`` of an NBIRTH or NDEATH payload; None when it has none or does not parse."""
    try:
        return bdseq(read_payload(payload))
    except PayloadError:
        return None
