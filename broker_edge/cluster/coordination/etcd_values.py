"""Every value a broker reads from etcd, checked before anything acts on it.

etcd is shared infrastructure: whoever can write the cluster's prefix (an operator's slip, a tool run
against the wrong prefix, someone who got etcd credentials) can put any bytes there. So no value is
believed as read: each kind of key has one parser here that checks its schema and its ranges (node ids of
the configured form, addresses that parse, epochs within int64 and never going back, partition numbers
and counts matching the configuration) and raises ``BadValue`` naming what is wrong. The caller logs it
through ``BadValues`` (rate-limited: a bad key re-read every second does not flood the log) and ignores
it, keeping what it held: a bad value never stops the controller, a failover or a publish.

Checking a value does not make it true: a well-formed record can still be a lie. What a forged record can
and cannot make the brokers do is in docs/security.md (threat model); the checks here keep lies that are
malformed or out of range from breaking anything.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from broker_edge import bounds
from broker_edge.placement import HANDOFF_NAME, Member, PartitionState
from broker_edge.settings.cluster import MAX_PARTITIONS, NODE_ID

__all__ = [
    "MAX_EPOCH",
    "MAX_REPLICAS",
    "NODE_ID",
    "BadValue",
    "BadValues",
    "StoredCluster",
    "check_progress",
    "load_json",
    "parse_config",
    "parse_controller",
    "parse_member",
    "parse_partition_state",
    "read_cluster",
]

log = logging.getLogger("broker_edge.cluster.etcd_values")

MAX_EPOCH = 2**62
"""Highest epoch accepted: within the int64 the replication wire carries, with room to count up for ever
(one election per second for longer than the universe has existed)."""
MAX_REPLICAS = 64
"""Most replicas a partition may list (a replication factor and a copy being moved fit many times)."""
MAX_VALUE_BYTES = 2 << 20
"""Larger than any value etcd stores by default (1.5 MiB): nothing legitimate is refused for its size."""


class BadValue(ValueError):
    """A value read from etcd that is not what its key must hold (the message says why)."""


def load_json(value: bytes, what: str) -> dict[str, Any]:
    """``value`` as a JSON object, or ``BadValue``: not UTF-8, not JSON, nested too deep, not an object."""
    if len(value) > MAX_VALUE_BYTES:
        raise BadValue(f"{what}: {len(value)} bytes, more than {MAX_VALUE_BYTES}")
    try:
        document = json.loads(value)
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError is a ValueError
        raise BadValue(f"{what}: not JSON ({type(error).__name__})") from None
    if not isinstance(document, dict):
        raise BadValue(f"{what}: expected a JSON object, got {type(document).__name__}")
    return document


def _string(document: dict[str, Any], name: str, what: str) -> str:
    value = document.get(name)
    if not isinstance(value, str):
        raise BadValue(f"{what}.{name}: expected a string, got {_shown(value)}")
    return value


def _integer(document: dict[str, Any], name: str, what: str, low: int, high: int) -> int:
    try:
        return bounds.integer(document.get(name), f"{what}.{name}", low, high)
    except bounds.OutOfBounds as error:
        raise BadValue(str(error)) from None


def _node_id(value: object, what: str) -> str:
    if not isinstance(value, str) or not NODE_ID.match(value):
        raise BadValue(f"{what}: expected a node id (letters, digits, '_.-'), got {_shown(value)}")
    return value


def _node_ids(document: dict[str, Any], name: str, what: str) -> tuple[str, ...]:
    value = document.get(name)
    if not isinstance(value, list) or len(value) > MAX_REPLICAS:
        expected = f"a list of at most {MAX_REPLICAS} node ids"
        raise BadValue(f"{what}.{name}: expected {expected}, got {_shown(value)}")
    nodes = tuple(_node_id(node, f"{what}.{name}[{index}]") for index, node in enumerate(value))
    if len(set(nodes)) != len(nodes):
        raise BadValue(f"{what}.{name}: a node is listed twice")
    return nodes


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _host_port(value: str, what: str) -> None:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isascii() or not port.isdigit() or not 0 < int(port) <= 65_535:
        raise BadValue(f"{what}: expected host:port, got {_shown(value)}")


def _base_url(value: str, what: str) -> None:
    parts = urlsplit(value)
    try:
        port = parts.port
    except ValueError:
        port = None
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or port is None
        or parts.username is not None
        or parts.query
        or parts.fragment
        or parts.path not in ("", "/")
    ):
        raise BadValue(f"{what}: expected http(s)://host:port, got {_shown(value)}")


def parse_member(node_id: str, value: bytes) -> Member:
    """The member record under ``<prefix>/members/<node_id>``: its own node id (the key's), the
    addresses devices, readers and members reach it at."""
    what = f"member {node_id!r}"
    document = load_json(value, what)
    named = _node_id(document.get("node_id"), f"{what}.node_id")
    if named != node_id:
        raise BadValue(f"{what}.node_id: names {named!r}, not the key's node")
    mqtt = _string(document, "mqtt", what)
    _host_port(mqtt, f"{what}.mqtt")
    offsets_api = _string(document, "offsets_api", what)
    _base_url(offsets_api, f"{what}.offsets_api")
    peer = _string(document, "peer", what)
    _base_url(peer, f"{what}.peer")
    handoff = None
    if document.get("handoff") is not None:
        handoff = _string(document, "handoff", what)
        if not HANDOFF_NAME.fullmatch(handoff):
            raise BadValue(f"{what}.handoff: expected a handoff socket's name, got {_shown(handoff)}")
    return Member(named, mqtt, offsets_api, peer, handoff)


def parse_partition_state(number: int, value: bytes, partitions: int) -> PartitionState:
    """The record of partition ``number`` of ``partitions``: its own number, a leader that is one of its
    in-sync replicas (or none: offline), in-sync replicas among its replicas, an epoch in range."""
    what = f"partition {number}"
    if not 0 <= number < partitions:
        raise BadValue(f"{what}: the cluster has {partitions} partitions")
    document = load_json(value, what)
    _integer(document, "partition", what, number, number)
    epoch = _integer(document, "epoch", what, 0, MAX_EPOCH)
    replicas = _node_ids(document, "replicas", what)
    isr = _node_ids(document, "isr", what)
    if not replicas:
        raise BadValue(f"{what}.replicas: empty")
    if not set(isr) <= set(replicas):
        raise BadValue(f"{what}.isr: lists nodes that are not replicas")
    raw_leader = document.get("leader")
    leader = None if raw_leader is None else _node_id(raw_leader, f"{what}.leader")
    if leader is not None and leader not in isr:
        raise BadValue(f"{what}.leader: {leader!r} is not one of its in-sync replicas")
    return PartitionState(number, leader, epoch, replicas, isr)


def check_progress(held: PartitionState | None, state: PartitionState) -> None:
    """``BadValue`` unless ``state`` can follow ``held``: epochs never go back, and an epoch names one
    leader (every change of leader counts the epoch up)."""
    if held is None:
        return
    if state.epoch < held.epoch:
        raise BadValue(f"partition {state.partition}: epoch {state.epoch} goes back from {held.epoch}")
    if state.epoch == held.epoch and state.leader != held.leader and held.leader is not None:
        raise BadValue(
            f"partition {state.partition}: leader {state.leader!r} under epoch {state.epoch}, which is "
            f"{held.leader!r}'s"
        )


def parse_config(value: bytes, configured: int | None) -> int:
    """The partition count stored at the cluster's creation: it must be the configured one (a count that
    differs would send every topic to another partition); ``configured`` None takes any count in range
    (a tool reading a cluster it has no configuration of)."""
    document = load_json(value, "config")
    stored = _integer(document, "partitions", "config", 1, MAX_PARTITIONS)
    if configured is not None and stored != configured:
        raise BadValue(
            f"config.partitions: {stored} stored, {configured} configured (cluster.partitions must be the "
            "count the cluster was created with, on every broker)"
        )
    return stored


def parse_controller(value: bytes) -> str:
    """The node id held under the controller key."""
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        raise BadValue("controller: not UTF-8") from None
    return _node_id(text, "controller")


class BadValues:
    """Logs bad etcd values at ERROR: the first time a key holds a given bad value, then at most once per
    ``interval_s`` for that key, so a value re-read at every pass is still seen but does not flood."""

    def __init__(self, interval_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._logged: dict[str, tuple[str, float]] = {}
        self.count = 0
        """Bad values met so far (every one, logged or not)."""

    def report(self, key: str, error: BadValue) -> None:
        self.count += 1
        message = str(error)
        now = self._clock()
        last = self._logged.get(key)
        if last is not None and last[0] == message and now - last[1] < self.interval_s:
            return
        if len(self._logged) > 10_000:
            self._logged.clear()
        self._logged[key] = (message, now)
        log.error("ignoring etcd key %s: %s", key, message)


@dataclass
class StoredCluster:
    """A cluster's keys as one read of etcd found them, every bad value left out (and reported)."""

    partitions: int | None = None
    """The stored partition count when it is readable and matches the configuration."""
    config_present: bool = False
    """Whether the config key exists at all (a bad one is not created again over)."""
    controller: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    states: dict[int, PartitionState] = field(default_factory=dict)
    revisions: dict[int, int] = field(default_factory=dict)
    """partition → mod_revision of its record (for compare-and-swap)."""
    unreadable: set[int] = field(default_factory=set)
    """Partitions whose record exists but is bad: never created again, nor written over blindly."""


def read_cluster(kvs: list[Any], keys: Any, partitions: int | None, bad: BadValues) -> StoredCluster:
    """The checked contents of one read of every key under the cluster's prefix (``Etcd.get_prefix``);
    ``keys`` is its ``ClusterKeys``, ``partitions`` the configured count (None: the stored one)."""
    stored = StoredCluster()
    if partitions is None:
        for kv in kvs:
            if kv.key == keys.config:
                with contextlib.suppress(BadValue):  # reported below
                    partitions = parse_config(kv.value, None)
        partitions = partitions or MAX_PARTITIONS
    for kv in kvs:
        try:
            if kv.key == keys.config:
                stored.config_present = True
                stored.partitions = parse_config(kv.value, partitions)
            elif kv.key == keys.controller:
                stored.controller = parse_controller(kv.value)
            elif kv.key.startswith(keys.members):
                member = parse_member(kv.key[len(keys.members) :], kv.value)
                stored.members[member.node_id] = member
            else:
                number = keys.partition_number(kv.key)
                if number is None:
                    continue
                try:
                    state = parse_partition_state(number, kv.value, partitions)
                except BadValue:
                    stored.unreadable.add(number)
                    raise
                stored.states[number] = state
                stored.revisions[number] = kv.mod_revision
        except BadValue as error:
            bad.report(kv.key, error)
    return stored
