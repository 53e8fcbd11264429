"""What a host application keeps of one edge node: its births' aliases, its sequence, who is online.

:class:`EdgeNodeSession` takes the node's messages in order and turns them into rows: one per metric of
each birth and data message (name and datatype resolved from the birth when the message carries only the
alias), one per message that cannot be used (quarantined with the reason), and one per change of the node's
or a device's online state. Its state is what a host must carry from one message to the next, and from one
micro-batch to the next (:meth:`EdgeNodeSession.to_bytes`): the telemetry job keeps it in Spark's state
store, keyed by edge node (docs/payload-formats.md).

The rules (Sparkplug 3.0): an NBIRTH starts a session, defines the node's metrics and aliases, resets the
sequence number and voids every device's birth; a DBIRTH does the same for one device (its aliases unique
across the node's births in force: :mod:`.aliases`); NDATA and DDATA
refer to metrics by alias (or name) that the birth in force defines; every message but NDEATH carries the
node's next sequence number, 0 to 255, so a number that does not follow the last one is a gap (a message
lost or reordered: the rows are kept and flagged), while a message delivered again (a copy of the last one
of its number) is a duplicate, read by nothing; an NDEATH whose ``bdSeq`` matches the birth's ends the
session (any other is a stale will of an earlier connection and is ignored); a DDEATH ends a device's.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from ..fields import PayloadError
from .aliases import NodeAliases
from .messages import Metric, Payload, bdseq, metric_value, read_payload
from .topics import SparkplugTopic, parse_topic

#: Why a message went to quarantine (``telemetry_quarantine.reason``).
REASON_MALFORMED = "unparseable_payload"
REASON_UNKNOWN_ALIAS = "sparkplug_unknown_alias"

#: Row kinds (``kind``): a metric's value, a message quarantined, an online state that changed, a message
#: delivered again (no table's: counted only).
METRIC, REJECTED, PRESENCE, DUPLICATE = "metric", "rejected", "presence", "duplicate"

SEQ_MODULO = 256
#: Bytes of the digest of a message kept per sequence number, to tell one delivered again.
_DIGEST_SIZE = 4
#: The messages that carry the node's sequence number (all an edge node sends but its NDEATH).
SEQUENCED = ("NBIRTH", "NDATA", "DBIRTH", "DDATA", "DDEATH")
#: Why an empty payload on one of them is quarantined (protobuf would read it as a message of no fields).
EMPTY = "sparkplug_b: an empty payload: no Sparkplug B message (a retained message cleared?)"


@dataclass(frozen=True)
class Record:
    """A broker record on one of the edge node's topics."""

    broker: str
    topic: str
    offset: int
    timestamp_ms: int
    payload: bytes | None


#: The columns of every row :meth:`EdgeNodeSession.process` returns, whatever its kind (unused ones None). A
#: metric row is identified by its record (broker, topic, offset) and ``metric_index``, its place in the
#: payload (a payload may carry one metric several times: historical values). A rejected row keeps the
#: record's ``payload`` (for quarantine); the others leave it None.
ROW_COLUMNS = (
    "kind",
    "broker",
    "topic",
    "offset",
    "timestamp_ms",
    "group_id",
    "edge_node_id",
    "device_id",
    "message_type",
    "seq",
    "seq_gap",
    "metric_index",
    "metric",
    "alias",
    "datatype",
    "metric_time_ms",
    "is_null",
    "is_historical",
    "value_long",
    "value_double",
    "value_boolean",
    "value_string",
    "value_bytes",
    "reason",
    "detail",
    "online",
    "birth_time_ms",
    "payload",
    "is_transient",
)


@dataclass
class Birth:
    """What a birth in force declared: each metric's datatype by name, and the names of the aliases."""

    time_ms: int
    datatypes: dict[str, str] = field(default_factory=dict)
    aliases: dict[int, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"t": self.time_ms, "d": self.datatypes, "a": {str(k): v for k, v in self.aliases.items()}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Birth:
        return cls(data["t"], dict(data["d"]), {int(k): v for k, v in data["a"].items()})


@dataclass
class EdgeNodeSession:
    """One edge node's state, as a host keeps it; feed it the node's records with :meth:`process`."""

    birth: Birth | None = None
    bdseq: int | None = None
    last_seq: int | None = None
    devices: dict[str, Birth] = field(default_factory=dict)
    """The devices whose birth is in force (online)."""
    after_birth: bool = False
    """Whether the last message with a sequence number was a birth (how :func:`in_order` goes on)."""
    seen: bytearray = field(default_factory=lambda: bytearray(SEQ_MODULO * _DIGEST_SIZE))
    """The digest of the last message taken with each sequence number (:meth:`_repeats`)."""
    _aliases: NodeAliases | None = field(default=None, repr=False, compare=False)
    """Which birth in force gives each alias (built from the births when first needed, not stored)."""

    # -- state across micro-batches ------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        data = {
            "birth": self.birth.to_json() if self.birth else None,
            "bdseq": self.bdseq,
            "seq": self.last_seq,
            "devices": {name: birth.to_json() for name, birth in self.devices.items()},
            "after_birth": self.after_birth,
            "seen": base64.b64encode(self.seen).decode(),
        }
        return json.dumps(data, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> EdgeNodeSession:
        state = json.loads(data)
        return cls(
            birth=Birth.from_json(state["birth"]) if state["birth"] else None,
            bdseq=state["bdseq"],
            last_seq=state["seq"],
            devices={name: Birth.from_json(birth) for name, birth in state["devices"].items()},
            after_birth=state.get("after_birth", False),  # not in a state written before it
            seen=bytearray(base64.b64decode(state["seen"])) if "seen" in state else cls().seen,
        )

    # -- messages --------------------------------------------------------------------------------------------

    def process(self, records: Iterable[Record]) -> list[dict[str, Any]]:
        """The rows of ``records`` (one edge node's, in any order: they are put in order first)."""
        rows: list[dict[str, Any]] = []
        messages = in_order((read(record) for record in records), self.last_seq, self.after_birth)
        for message in messages:
            digest = self._repeats(message)
            if digest is None:
                rows.append(_row(message.record, message.topic, DUPLICATE, seq=_seq_of(message)))
                continue
            rows.extend(self._message(message))
            seq = _seq_of(message)
            if seq is not None:
                self.after_birth = _kind_of(message) in ("NBIRTH", "DBIRTH")
                if digest:
                    self.seen[seq * _DIGEST_SIZE : (seq + 1) * _DIGEST_SIZE] = digest
        return rows

    def _repeats(self, message: Message) -> bytes | None:
        """None when ``message`` is one taken already, delivered again (an MQTT client sending a QoS 0
        message again, a bridge or two brokers passing it on twice): its topic and payload are byte for
        byte those of the last message of its sequence number, which is not the number expected next (the
        message of that number one lap of the sequence later may well be the same bytes). Else its digest,
        to remember (empty when it carries no sequence number)."""
        seq, topic = _seq_of(message), message.topic
        if seq is None or topic is None or topic.message_type not in SEQUENCED:
            return b""
        digest = hashlib.blake2b(
            message.record.topic.encode() + b"\0" + (message.record.payload or b""), digest_size=_DIGEST_SIZE
        ).digest()
        expected = None if self.last_seq is None else (self.last_seq + 1) % SEQ_MODULO
        if seq != expected and self.seen[seq * _DIGEST_SIZE : (seq + 1) * _DIGEST_SIZE] == digest:
            return None
        return digest

    def _message(self, message: Message) -> list[dict[str, Any]]:
        record, topic, payload = message.record, message.topic, message.payload
        if message.error is not None or topic is None or payload is None:
            rejected = _rejected(record, topic, REASON_MALFORMED, message.error or "no payload")
            return [*self._unreadable(record, topic), rejected]
        if topic.message_type in ("NCMD", "DCMD"):
            return []  # a host's command to the node: no reading
        handle = {
            "NBIRTH": self._nbirth,
            "NDEATH": self._ndeath,
            "DBIRTH": self._dbirth,
            "DDEATH": self._ddeath,
        }.get(topic.message_type, self._data)
        try:
            return handle(record, topic, payload)
        except PayloadError as exc:
            return [_rejected(record, topic, REASON_MALFORMED, str(exc))]

    def _nbirth(self, record: Record, topic: SparkplugTopic, payload: Payload) -> list[dict[str, Any]]:
        """A new session; one that cannot be read is none, and still ends the session before it."""
        try:
            birth = _birth(payload, record)
            metrics = self._metric_rows(record, topic, payload, birth, seq_gap=False)
        except PayloadError as exc:
            return [*self._end(record, topic), _rejected(record, topic, REASON_MALFORMED, str(exc))]
        rows = [_presence(record, topic, device, False) for device in sorted(self.devices)]
        self.birth, self.bdseq, self.devices, self._aliases = birth, bdseq(payload), {}, None
        self.last_seq = payload.seq
        rows.append(_presence(record, topic, None, True, birth.time_ms))
        return rows + metrics

    def _unreadable(self, record: Record, topic: SparkplugTopic | None) -> list[dict[str, Any]]:
        """A birth that cannot be read puts none in force, and ends the one before it (node or device)."""
        if topic is None or topic.message_type not in ("NBIRTH", "DBIRTH"):
            return []
        if topic.message_type == "NBIRTH":
            return self._end(record, topic)
        assert topic.device_id is not None
        ended = self.birth is not None and self._drop_device(topic.device_id)
        return [_presence(record, topic, topic.device_id, False)] if ended else []

    def _ndeath(self, record: Record, topic: SparkplugTopic, payload: Payload) -> list[dict[str, Any]]:
        death = bdseq(payload)
        if death is not None and self.bdseq is not None and death != self.bdseq:
            return []  # the will of an earlier connection: nothing ends
        return self._end(record, topic)

    def _end(self, record: Record, topic: SparkplugTopic) -> list[dict[str, Any]]:
        """The session in force ended: its devices and the node offline (nothing when none is in force)."""
        if self.birth is None:
            return []
        rows = [_presence(record, topic, device, False) for device in sorted(self.devices)]
        rows.append(_presence(record, topic, None, False))
        self.birth, self.devices, self.last_seq, self._aliases = None, {}, None, None
        return rows

    def _dbirth(self, record: Record, topic: SparkplugTopic, payload: Payload) -> list[dict[str, Any]]:
        if self.birth is None:
            return [self._no_birth(record, topic, payload)]
        gap = self._next_seq(payload)
        assert topic.device_id is not None
        try:
            birth = _birth(payload, record)
            self._check_aliases(topic, payload, birth)
            metrics = self._metric_rows(record, topic, payload, birth, gap)
        except PayloadError as exc:  # no birth in force for the device, the one before it ended
            ended = self._drop_device(topic.device_id)
            rows = [_presence(record, topic, topic.device_id, False)] if ended else []
            return [*rows, _rejected(record, topic, REASON_MALFORMED, str(exc), payload.seq)]
        self._node_aliases().put(
            topic.device_id, birth.aliases, _aliases_of(self.devices.get(topic.device_id))
        )
        self.devices[topic.device_id] = birth
        return [_presence(record, topic, topic.device_id, True, birth.time_ms), *metrics]

    def _check_aliases(self, topic: SparkplugTopic, payload: Payload, birth: Birth) -> None:
        """A DBIRTH giving an alias that the NBIRTH or another device's DBIRTH in force gives is none: which
        metric the node means by it is unknown (Sparkplug 3.0 [tck-id-payloads-alias-uniqueness])."""
        assert topic.device_id is not None
        taken = self._node_aliases().taken(topic.device_id, birth.aliases)
        if taken is not None:
            metric = next(metric for metric in payload.metrics if metric.alias == taken.alias)
            node = f"{topic.group_id}/{topic.edge_node_id}"
            raise PayloadError(f"sparkplug_b: {metric.where()}: {taken.describe(node)}")

    def _node_aliases(self) -> NodeAliases:
        if self._aliases is None:
            devices = {device: birth.aliases for device, birth in self.devices.items()}
            self._aliases = NodeAliases.of(_aliases_of(self.birth), devices)
        return self._aliases

    def _drop_device(self, device_id: str) -> bool:
        """The device's birth no longer in force; whether it had one."""
        birth = self.devices.pop(device_id, None)
        if birth is None:
            return False
        self._node_aliases().drop(device_id, birth.aliases)
        return True

    def _ddeath(self, record: Record, topic: SparkplugTopic, payload: Payload) -> list[dict[str, Any]]:
        if self.birth is None:
            return [self._no_birth(record, topic, payload)]
        self._next_seq(payload)
        assert topic.device_id is not None
        if not self._drop_device(topic.device_id):
            return []  # not online: nothing changes
        return [_presence(record, topic, topic.device_id, False)]

    def _data(self, record: Record, topic: SparkplugTopic, payload: Payload) -> list[dict[str, Any]]:
        birth = self.birth if topic.device_id is None else self.devices.get(topic.device_id)
        if birth is None:
            return [self._no_birth(record, topic, payload)]
        gap = self._next_seq(payload)
        for metric in payload.metrics:
            if _resolve(metric, birth) is None:
                label = f"alias {metric.alias}" if metric.name is None else f"name {metric.name!r}"
                detail = f"{metric.where()}: {label} is not defined by the birth of {_path(topic)}"
                return [_rejected(record, topic, REASON_UNKNOWN_ALIAS, detail, payload.seq)]
        return self._metric_rows(record, topic, payload, birth, gap)

    def _no_birth(self, record: Record, topic: SparkplugTopic, payload: Payload) -> dict[str, Any]:
        """A message of a node or device with no birth in force: its aliases mean nothing yet."""
        if self.birth is not None:
            self._next_seq(payload)
            whose = f"device {_path(topic)} has had no DBIRTH since the edge node's NBIRTH"
        else:
            whose = f"edge node {topic.group_id}/{topic.edge_node_id} has no NBIRTH in force"
        detail = f"{topic.message_type}: {whose}"
        return _rejected(record, topic, REASON_UNKNOWN_ALIAS, detail, payload.seq)

    def _next_seq(self, payload: Payload) -> bool | None:
        """Whether the message's sequence number is not the one after the last (None: it has none)."""
        if payload.seq is None:
            return None
        expected = None if self.last_seq is None else (self.last_seq + 1) % SEQ_MODULO
        self.last_seq = payload.seq
        return expected is not None and payload.seq != expected

    def _metric_rows(
        self, record: Record, topic: SparkplugTopic, payload: Payload, birth: Birth, seq_gap: bool | None
    ) -> list[dict[str, Any]]:
        rows = []
        sent_ms = payload.timestamp if payload.timestamp is not None else record.timestamp_ms
        for metric in payload.metrics:
            resolved = _resolve(metric, birth)
            assert resolved is not None, "births resolve their own metrics; data messages were checked"
            name, datatype = resolved
            value = metric_value(metric, datatype)
            row = _row(record, topic, METRIC, seq=payload.seq, seq_gap=seq_gap)
            row["metric_index"] = metric.index
            row["metric"] = name
            row["alias"] = metric.alias
            row["datatype"] = datatype
            row["metric_time_ms"] = metric.timestamp if metric.timestamp is not None else sent_ms
            row["is_null"] = metric.is_null
            row["is_historical"] = metric.is_historical
            row["is_transient"] = metric.is_transient
            row["value_long"] = value.long
            row["value_double"] = value.double
            row["value_boolean"] = value.boolean
            row["value_string"] = value.string
            row["value_bytes"] = value.raw
            rows.append(row)
        return rows


@dataclass(frozen=True)
class Message:
    """A record read: its topic's parts and its payload, or why either cannot be read."""

    record: Record
    topic: SparkplugTopic | None = None
    payload: Payload | None = None
    error: str | None = None


def read(record: Record) -> Message:
    try:
        topic = parse_topic(record.topic)
    except ValueError as exc:
        return Message(record, error=str(exc))
    if not record.payload and topic.message_type in SEQUENCED:  # an NDEATH without bdSeq still ends
        return Message(record, topic, error=EMPTY)
    try:
        payload = read_payload(record.payload or b"")
    except PayloadError as exc:
        return Message(record, topic, error=str(exc))
    if payload.seq is None and topic.message_type in SEQUENCED:
        payload = replace(payload, seq=0)  # a proto3 encoder leaves a 0 out: it has no presence there
    return Message(record, topic, payload)


def in_order(
    messages: Iterable[Message], last_seq: int | None = None, after_birth: bool = False
) -> list[Message]:
    """One edge node's messages in the order it sent them (``last_seq``: the number of the one before,
    ``after_birth``: whether that one was a birth).

    Its messages travel on several topics, whose offsets are counted apart, so the order is the broker's
    append time (milliseconds); within one millisecond, each topic's messages keep their offsets' order (the
    order they were sent in) and the topics' are merged by sequence number: next the message whose number
    follows the last one's (data before an NBIRTH of that number), then a number soon after it (one lost),
    then an NBIRTH (a birth starts the sequence again). A DBIRTH comes after a birth: while an NBIRTH of the
    millisecond waits after data, after that NBIRTH (a gateway births its devices right after itself). With
    no number before, an NBIRTH first, else the lowest number (unwrapped when the millisecond's numbers
    straddle 255 -> 0). A message with no number that cannot be read or lacks it is taken as its topic
    reaches it, but an NBIRTH, which comes where a birth comes; an NDEATH (sent by the broker once the
    connection is gone) after its millisecond's others.
    """
    by_time: dict[int, list[Message]] = {}
    for message in messages:
        by_time.setdefault(message.record.timestamp_ms, []).append(message)
    ordered: list[Message] = []
    expected = None if last_seq is None else (last_seq + 1) % SEQ_MODULO
    for time_ms in sorted(by_time):
        merge = _Merge(by_time[time_ms])
        while merge.chains:
            message = merge.pop(expected, after_birth)
            ordered.append(message)
            seq = _seq_of(message)
            if seq is not None:
                expected = (seq + 1) % SEQ_MODULO
                after_birth = _kind_of(message) in ("NBIRTH", "DBIRTH")
    return ordered


class _Merge:
    """One millisecond's messages as a chain per topic (in offset order), merged by :func:`_rank`. The
    heads are indexed by sequence number, so that the usual pick, the number expected, costs no scan."""

    def __init__(self, group: list[Message]) -> None:
        self.chains: dict[tuple[str, str], deque[Message]] = {}
        for message in sorted(group, key=lambda message: message.record.offset):
            self.chains.setdefault((message.record.broker, message.record.topic), deque()).append(message)
        self.place = {key: place for place, key in enumerate(self.chains)}
        """Each chain's place, breaking ties of offsets as a scan of the chains would (not a set's order)."""
        self.first = _first_without_order(group)
        self.by_seq: dict[int, set[tuple[str, str]]] = {}
        self.free: set[tuple[str, str]] = set()
        """Chains whose head has no number and is no NDEATH: taken as soon as they come up."""
        self.births: set[tuple[str, str]] = set()
        """Chains whose head is an NBIRTH."""
        for key in self.chains:
            self._index(key)

    def pop(self, expected: int | None, after_birth: bool) -> Message:
        """The next message, ``expected`` the number following the last one's (``after_birth``: a birth's).

        A DBIRTH comes after a birth; while an NBIRTH of the millisecond waits after data, its number is
        the DBIRTHs' that follow that NBIRTH (a gateway births its devices right after itself)."""
        chains = self.chains
        hold = bool(self.births) and not after_birth
        candidates = self.free or self._following(expected, hold)
        if candidates:  # an NBIRTH last: data of the number expected continue the session before it
            key = min(
                candidates,
                key=lambda key: (key in self.births, chains[key][0].record.offset, self.place[key]),
            )
        else:
            rank = _rank(expected, self.first, hold)
            key = min(chains, key=lambda key: rank(chains[key][0]))
        self._unindex(key)
        message = chains[key].popleft()
        if chains[key]:
            self._index(key)
        else:
            del chains[key]
        return message

    def _following(self, expected: int | None, hold: bool) -> list[tuple[str, str]]:
        """The chains whose head has the number expected (no DBIRTH when DBIRTHs are held)."""
        if expected is None:
            return []
        keys = self.by_seq.get(expected, ())
        if not hold:
            return list(keys)
        return [key for key in keys if _kind_of(self.chains[key][0]) != "DBIRTH"]

    def _index(self, key: tuple[str, str]) -> None:
        head = self.chains[key][0]
        seq, kind = _seq_of(head), _kind_of(head)
        if kind == "NBIRTH":
            self.births.add(key)
        if seq is not None:
            self.by_seq.setdefault(seq, set()).add(key)
        elif kind not in ("NDEATH", "NBIRTH"):  # an NBIRTH that cannot be read comes where a birth comes
            self.free.add(key)

    def _unindex(self, key: tuple[str, str]) -> None:
        head = self.chains[key][0]
        self.births.discard(key)
        seq = _seq_of(head)
        if seq is None:
            self.free.discard(key)
        else:
            self.by_seq[seq].discard(key)


def _first_without_order(group: list[Message]) -> Callable[[int], int]:
    """With no number before: a millisecond's lowest number first, unwrapped when its numbers straddle
    255 -> 0 (a seq below half the range then counts as past 255)."""
    seqs = [seq for seq in map(_seq_of, group) if seq is not None]
    wraps = bool(seqs) and max(seqs) - min(seqs) > SEQ_MODULO // 2
    return lambda seq: seq + SEQ_MODULO if wraps and seq < SEQ_MODULO // 2 else seq


def _rank(
    expected: int | None, first: Callable[[int], int], hold: bool
) -> Callable[[Message], tuple[int, int, int]]:
    """How soon a chain's head comes: no number (not an NDEATH or an NBIRTH) at once; else the number
    expected, then a number soon after it, then an NBIRTH (one that cannot be read too); a DBIRTH held
    (:meth:`_Merge.pop`) after it; an NDEATH last."""

    def rank(message: Message) -> tuple[int, int, int]:
        seq, offset, kind = _seq_of(message), message.record.offset, _kind_of(message)
        if seq is None and kind == "NBIRTH":  # one that cannot be read: after the numbers soon after
            return (1, -1 if expected is None else SEQ_MODULO // 2, offset)
        if seq is None:
            return (2 if kind == "NDEATH" else 0, 0, offset)
        if kind == "DBIRTH" and hold:
            return (1, 2 * SEQ_MODULO, offset)
        if expected is None:
            return (1, -1 if kind == "NBIRTH" else first(seq), offset)
        ahead = (seq - expected) % SEQ_MODULO
        return (1, max(min(ahead, SEQ_MODULO // 2), 1) if kind == "NBIRTH" else ahead, offset)

    return rank


def _kind_of(message: Message) -> str | None:
    return message.topic.message_type if message.topic is not None else None


def _seq_of(message: Message) -> int | None:
    return message.payload.seq if message.payload is not None else None


def _birth(payload: Payload, record: Record) -> Birth:
    birth = Birth(payload.timestamp if payload.timestamp is not None else record.timestamp_ms)
    for metric in payload.metrics:
        if metric.name is None or metric.datatype is None:
            missing = "name" if metric.name is None else "datatype"
            raise PayloadError(f"sparkplug_b: {metric.where()}: a birth's metric must have a {missing}")
        birth.datatypes[metric.name] = metric.datatype
        if metric.alias is not None:
            taken = birth.aliases.get(metric.alias)
            if taken is not None and taken != metric.name:
                raise PayloadError(f"sparkplug_b: {metric.where()}: alias {metric.alias} is {taken!r}'s too")
            birth.aliases[metric.alias] = metric.name
    return birth


def _aliases_of(birth: Birth | None) -> dict[int, str] | None:
    return None if birth is None else birth.aliases


def birth_of(payload: bytes) -> Birth | None:
    """What a birth's payload declares, or None when the session quarantines it (no birth in force)."""
    if not payload:
        return None  # EMPTY
    try:
        message = read_payload(payload)
        birth = _birth(message, Record("", "", 0, 0, payload))
        for metric in message.metrics:
            metric_value(metric, birth.datatypes[metric.name or ""])
    except PayloadError:
        return None
    return birth


def undefined_metric(payload: bytes, birth: Birth) -> bool:
    """Whether a data message names a metric (by alias, or by name) that ``birth`` does not define: the
    session quarantines it as ``sparkplug_unknown_alias``. A payload that cannot be read is not that."""
    try:
        metrics = read_payload(payload).metrics
    except PayloadError:
        return False
    return any(_resolve(metric, birth) is None for metric in metrics)


def _resolve(metric: Metric, birth: Birth) -> tuple[str, str] | None:
    """The metric's name and datatype by the birth (its alias first, as a host reads it), or None."""
    name = birth.aliases.get(metric.alias) if metric.alias is not None else metric.name
    if name is None:
        return None
    datatype = birth.datatypes.get(name)
    if datatype is None:
        return None
    return name, datatype


def _path(topic: SparkplugTopic) -> str:
    parts = [topic.group_id, topic.edge_node_id] + ([topic.device_id] if topic.device_id else [])
    return "/".join(parts)


_EMPTY_ROW: dict[str, Any] = dict.fromkeys(ROW_COLUMNS)


def _row(record: Record, topic: SparkplugTopic | None, kind: str, **values: Any) -> dict[str, Any]:
    row = _EMPTY_ROW.copy()
    row["kind"] = kind
    row["broker"] = record.broker
    row["topic"] = record.topic
    row["offset"] = record.offset
    row["timestamp_ms"] = record.timestamp_ms
    if topic is not None:
        row["group_id"] = topic.group_id
        row["edge_node_id"] = topic.edge_node_id
        row["device_id"] = topic.device_id
        row["message_type"] = topic.message_type
    row.update(values)
    return row


def _rejected(
    record: Record, topic: SparkplugTopic | None, reason: str, detail: str, seq: int | None = None
) -> dict[str, Any]:
    return _row(record, topic, REJECTED, reason=reason, detail=detail, seq=seq, payload=record.payload)


def _presence(
    record: Record, topic: SparkplugTopic, device_id: str | None, online: bool, birth_ms: int | None = None
) -> dict[str, Any]:
    """A change of the node's (``device_id`` None) or a device's online state, at the record's time."""
    row = _row(record, topic, PRESENCE, online=online, birth_time_ms=birth_ms)
    row["device_id"] = device_id
    return row
