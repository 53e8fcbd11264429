"""Where a replay starts in logs this broker holds no copy of, asked of the brokers that hold them.

A device subscribing from an offset (``earliest``, a number, a time) on a broker that only observes some
of the partitions its filter can match needs, before its SUBACK, what a broker with a copy would read from
its own store: which topics of those partitions the filter matches, each log's start and committed end,
and the offset the start names (a time resolved to the first record appended at or after it). It asks the
partitions' leaders (a live replica while a partition has none) with one peer request per broker
(service ``LOGS_MATCHING``); every broker answers from its own store.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

from broker_edge import bounds
from broker_edge.cluster.links.peer_link import PeerLinkDown, PeerRequestFailed
from broker_edge.engine.cursors import start_offset
from broker_edge.protocol.topics import OffsetStart, OffsetStartKind, topic_matches
from broker_edge.storage.errors import StorageError, UnknownTopic

from .interest import is_wildcard

if TYPE_CHECKING:
    from broker_edge.cluster.links.peer_link import PeerLink, PeerLinks
    from broker_edge.cluster.view import ClusterView
    from broker_edge.log_info import LogInfo
    from broker_edge.storage.store import LogStore

__all__ = ["LOGS_MATCHING", "LogStart", "LogStarts"]

LOGS_MATCHING = 31
"""Peer service: the answering broker's logs of some partitions that a filter matches, one page by topic
order. Request: ``u8 start kind | i64 start value | u32 count | count x u32 partition | u16 filter length |
UTF-8 filter | UTF-8 topic the previous page ended with`` (empty: from the first). Reply: ``u8 more pages |
u32 logs | logs x (u16 topic length | UTF-8 topic | i64 start | i64 committed end | i64 offset asked)``."""

PAGE_LOGS = 4096
"""Logs in one answer page."""

_KINDS = (OffsetStartKind.OFFSET, OffsetStartKind.EARLIEST, OffsetStartKind.LATEST, OffsetStartKind.TIMESTAMP)
_HEAD = struct.Struct("<BqI")
_U32 = struct.Struct("<I")
_U16 = struct.Struct("<H")
_MORE = struct.Struct("<BI")
_BOUNDS = struct.Struct("<qqq")


@dataclass(frozen=True, slots=True)
class LogStart:
    """One log a replay reads: its start, its committed end, and the offset its start names (a time
    resolved; not clamped to the log, so the asker can tell a device it was outside)."""

    topic: str
    start: int
    end: int
    offset: int


def _encode_request(topic_filter: str, start: OffsetStart, partitions: set[int], after: str) -> bytes:
    parts = [_HEAD.pack(_KINDS.index(start.kind), start.value or 0, len(partitions))]
    parts += [_U32.pack(number) for number in sorted(partitions)]
    encoded = topic_filter.encode()
    parts += [_U16.pack(len(encoded)), encoded, after.encode()]
    return b"".join(parts)


def _decode_reply(reply: bytes) -> tuple[bool, list[LogStart]]:
    more, count = _MORE.unpack_from(reply, 0)
    position = _MORE.size
    found: list[LogStart] = []
    for _ in range(count):
        (length,) = _U16.unpack_from(reply, position)
        position += _U16.size
        topic = str(reply[position : position + length], "utf-8")
        position += length
        first, end, offset = _BOUNDS.unpack_from(reply, position)
        position += _BOUNDS.size
        for value, name in ((first, "start"), (end, "end"), (offset, "offset")):
            bounds.offset(value, f"{topic!r} {name}")  # OutOfBounds is a ValueError: a malformed answer
        found.append(LogStart(topic, first, end, offset))
    if position != len(reply):
        raise ValueError(f"{len(reply) - position} bytes after the logs")
    return bool(more), found


class LogStarts:
    """Serves ``LOGS_MATCHING`` from this broker's store, and asks it of others (``ask``)."""

    def __init__(
        self, store: LogStore, view: ClusterView, links: PeerLinks, request_timeout_s: float = 2.0
    ) -> None:
        self.store = store
        self.view = view
        self.links = links
        self.request_timeout_s = request_timeout_s
        self.asked = 0
        """Requests sent to other brokers."""
        links.serve_requests(LOGS_MATCHING, self._serve)

    def matching(self, topic_filter: str, partitions: set[int]) -> list[LogInfo]:
        """This broker's logs of ``partitions`` that ``topic_filter`` matches, by topic (a filter without
        wildcards is one lookup)."""
        store = self.store
        if not is_wildcard(topic_filter):
            try:
                infos = [store.log_info(topic_filter)]
            except UnknownTopic:
                return []
        else:
            infos = store.logs(pattern=topic_filter)
        partition_of = self.view.partition_of
        hides_system = topic_filter[:1] in ("+", "#")  # [MQTT-4.7.2-1]: $ topics only by their own name
        return [
            info
            for info in infos
            if partition_of(info.topic) in partitions
            and not (hides_system and info.topic.startswith("$"))
            and topic_matches(topic_filter, info.topic)
        ]

    async def _serve(self, link: PeerLink, body: memoryview) -> bytes:
        kind, value, count = _HEAD.unpack_from(body, 0)
        position = _HEAD.size
        partitions = {_U32.unpack_from(body, position + _U32.size * index)[0] for index in range(count)}
        position += _U32.size * count
        (length,) = _U16.unpack_from(body, position)
        position += _U16.size
        topic_filter = str(body[position : position + length], "utf-8")
        after = str(body[position + length :], "utf-8")
        start = OffsetStart(_KINDS[kind], value)
        page: list[bytes] = []
        infos = [info for info in self.matching(topic_filter, partitions) if info.topic > after]
        for info in infos[:PAGE_LOGS]:
            try:
                offset = start_offset(self.store, info, start)
            except StorageError:
                continue  # removed meanwhile
            topic = info.topic.encode()
            page += [_U16.pack(len(topic)), topic, _BOUNDS.pack(info.start_offset, info.end_offset, offset)]
        more = len(infos) > PAGE_LOGS
        return _MORE.pack(more, min(len(infos), PAGE_LOGS)) + b"".join(page)

    def readers(self, partitions: set[int]) -> tuple[dict[str, set[int]], set[int]]:
        """The broker to ask for each of ``partitions``: its leader, else a live replica (not this one);
        and the partitions no broker can be asked for."""
        view = self.view
        by_node: dict[str, set[int]] = {}
        unreachable: set[int] = set()
        for number in partitions:
            state = view.states.get(number)
            nodes = () if state is None else (state.leader, *state.replicas)
            node = next((n for n in nodes if n is not None and n != view.node_id and self.links.up(n)), None)
            if node is None:
                unreachable.add(number)
            else:
                by_node.setdefault(node, set()).add(number)
        return by_node, unreachable

    async def ask(
        self, node: str, topic_filter: str, start: OffsetStart, partitions: set[int]
    ) -> list[LogStart]:
        """``node``'s logs of ``partitions`` matching ``topic_filter``, with the offset ``start`` names in
        each. Raises ``PeerLinkDown``, ``PeerRequestFailed``, ``TimeoutError`` or ``ValueError``."""
        found: list[LogStart] = []
        after = ""
        more = True
        while more:
            if not self.links.up(node):
                raise PeerLinkDown(f"no peer link to {node}")
            self.asked += 1
            reply = await self.links.link(node).request(
                LOGS_MATCHING, _encode_request(topic_filter, start, partitions, after), self.request_timeout_s
            )
            try:
                more, page = _decode_reply(reply)
            except struct.error as error:
                raise ValueError(f"a malformed answer: {error}") from None
            found += page
            if page:
                after = page[-1].topic
        return found


ASK_ERRORS = (PeerLinkDown, PeerRequestFailed, TimeoutError, ValueError)
"""What ``LogStarts.ask`` raises when the broker asked does not answer usefully."""
