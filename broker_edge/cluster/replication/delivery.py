"""Committed records of the log routed to this node's subscribers, as the PUBLISH path routes its own.

Every member routes each partition's committed records to its local subscribers: a replica as it commits
them, an observer as its leader sends them, a new leader the records it inherited. ``LocalDelivery`` makes one
``Message`` per record, shared by all the subscribers, and hands the same messages to the log readers'
shared cache.

A record of a topic that no subscription here can match (``wants``: an ordinary subscription, a shared group
with members here, or anywhere while this member may assign its records) is passed over: neither read back
nor decoded, only its offset counted as routed. A retained one is still routed, since every member keeps the
whole retained set: the RETAIN flag is read from the frame's flags byte (a replica's when it appends the
frames, an observer's as they come), and only those frames are decoded. Nothing a later subscriber gets
depends on the routing of earlier records: it gets the retained messages, the records committed once it is
subscribed, and, replaying or resuming a session, reads the log.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING

from broker_edge.engine.records import message_of_record
from broker_edge.observe import path_trace
from broker_edge.storage.errors import CorruptRecord, OffsetOutOfRange
from broker_edge.storage.record import (
    FLAG_RETAIN,
    PREFIX_SIZE,
    QOS_AT,
    FrameError,
    decode_frame,
    decode_frames,
)

if TYPE_CHECKING:
    from broker_edge.engine.cursors import ReplayManager
    from broker_edge.engine.message import Message
    from broker_edge.storage.record import Record
    from broker_edge.storage.store import LogStore

__all__ = ["LocalDelivery", "Publish", "Wants", "retained_frames"]

log = logging.getLogger(__name__)

_ROUTE_READ_BYTES = 4 << 20
_MAX_FRAME_BODY = 1 << 28
_FLAGS_AT = QOS_AT + 1
_LENGTH = struct.Struct("<I")

Publish = Callable[["Message"], object]
"""Routes a message to local subscribers (`Router.publish`)."""

Wants = Callable[[str], bool]
"""Whether a subscription here can match a topic (then its records are routed, else passed over)."""


def retained_frames(frames: bytes | memoryview, first: int) -> tuple[int, list[tuple[int, int, int]]]:
    """How many whole frames `frames` holds (from offset `first` on), and (offset, start, end) of each one
    carrying the RETAIN flag: read from the length prefixes and flags bytes, nothing decoded or checked."""
    size = len(frames)
    unpack = _LENGTH.unpack_from
    found: list[tuple[int, int, int]] = []
    position = 0
    count = 0
    while position + _FLAGS_AT < size:
        end = position + PREFIX_SIZE + unpack(frames, position)[0]
        if end > size:
            break
        if frames[position + _FLAGS_AT] & FLAG_RETAIN:
            found.append((first + count, position, end))
        position = end
        count += 1
    return count, found


class LocalDelivery:
    """Routes committed records of the log to this node's subscribers: one `Message` per record, shared
    by all of them, and handed to the log readers' shared cache (as the PUBLISH path does).

    It remembers, per topic, the end of what it routed, and never routes a record below it again: a node
    that observed a partition and then becomes its replica copies the log from its start, and one whose
    replica is moved away observes from where its copy had been routed (see `_Fetcher`).

    Records appended (by their leader's clock) before ``live_from_ms`` are history, not news: a broker that
    starts, restarts or joins catches up on what was published while it was away without sending it to the
    subscribers that connect meanwhile (they subscribed after those publishes). Log readers (replays,
    persistent sessions' cursors) still get every record."""

    def __init__(
        self,
        store: LogStore,
        publish: Publish,
        replays: ReplayManager | None,
        live_from_ms: int | None = None,
        wants: Wants | None = None,
    ) -> None:
        self.store = store
        self.publish = publish
        self.replays = replays
        self.live_from_ms = live_from_ms
        """Records appended before this wall-clock time (ms) are not routed live (None: route all)."""
        self.wants = wants
        """Whether a topic has a subscription here (None: every topic's records are routed)."""
        self.routed: dict[str, int] = {}
        """topic → offset after the last record routed here (by this process)."""
        self.records_routed = 0
        """Records decoded and handed to the router."""
        self.records_passed_over = 0
        """Records of topics no subscription here matched: not decoded."""
        self._retained: dict[str, list[int]] = {}
        """topic → offsets of the RETAIN records appended here (`appended`) and not committed yet."""

    def route(self, topic: str, first: int, records: list[Record]) -> None:
        """Deliver committed records of `topic` (from offset `first`) to local subscribers, but for those
        already routed."""
        done = self.routed.get(topic, 0)
        if records and records[0].offset < done:
            records = [record for record in records if record.offset >= done]
            if not records:
                return
            first = records[0].offset
        if records:
            self.routed[topic] = records[-1].offset + 1
            self.records_routed += len(records)
            if path_trace.ON:
                path_trace.mark("routed", topic, records[0].offset, records[-1].offset + 1)
        messages = [message_of_record(topic, record) for record in records]
        publish = self.publish
        live_from = self.live_from_ms
        if live_from is None or not records or records[0].timestamp_ms >= live_from:
            for message in messages:
                publish(message)
        else:
            for record, message in zip(records, messages, strict=True):
                if record.timestamp_ms >= live_from:
                    publish(message)
        if self.replays is not None and messages:
            self.replays.appended(topic, first, messages)

    def commit_and_route(self, topic: str, high_watermark: int) -> int:
        """Commit `topic` up to the leader's watermark (capped at what is durable here), route what that
        made visible. Returns the committed end (the watermark itself for a topic without a log here)."""
        store = self.store
        if topic not in store:
            return high_watermark
        offset = store.committed_end(topic)
        committed = store.replicated_log.commit_to(topic, high_watermark)
        self.route_committed(topic, offset, committed)
        return committed

    def appended(self, topic: str, first: int, frames: bytes | memoryview) -> None:
        """A replica appended `frames` to `topic` from offset `first`: the retained ones among them are
        routed when committed even if nothing here subscribes to `topic`."""
        _count, found = retained_frames(frames, first)
        if found:
            self._retained.setdefault(topic, []).extend(offset for offset, _, _ in found)

    def route_frames(self, topic: str, first: int, frames: bytes, source: str) -> int:
        """Route committed `frames` of `topic` from offset `first` (an observer's, not logged here); returns
        how many records they hold up to the first damaged one (logged, naming `source`)."""
        if self.wants is not None and not self.wants(topic):
            return self._pass_over_frames(topic, first, frames)
        records, error = decode_frames(frames, first, _MAX_FRAME_BODY)
        if error is not None:
            log.error("%r from %s: frame %d refused (%s)", topic, source, first + len(records), error)
        self.route(topic, first, records)
        return len(records)

    def _pass_over_frames(self, topic: str, first: int, frames: bytes) -> int:
        count, found = retained_frames(frames, first)
        done = self.routed.get(topic, 0)
        for offset, start, end in found:
            if offset >= done:
                try:
                    record = decode_frame(frames[start:end], offset, _MAX_FRAME_BODY)
                except FrameError as error:
                    log.error("%r: retained record %d refused (%s)", topic, offset, error)
                    continue
                self.route(topic, offset, [record])
        self._passed_over(topic, max(first, done), first + count, len(found))
        return count

    def _passed_over(self, topic: str, offset: int, end: int, routed: int) -> None:
        """Records of `topic` from `offset` to `end` (`routed` of them retained ones) count as routed."""
        if end > offset:
            self.records_passed_over += end - offset - routed
            self.routed[topic] = end
            if path_trace.ON:
                path_trace.mark("routed", topic, offset, end)

    def route_committed(self, topic: str, offset: int, end: int) -> None:
        """Route the committed records of `topic` from `offset` to `end` to local subscribers."""
        if offset >= end:
            return
        retained = self._retained.pop(topic, None) if self._retained else None
        if retained is not None:
            later = [at for at in retained if at >= end]
            if later:
                self._retained[topic] = later
        if self.wants is not None and not self.wants(topic):
            self._pass_over_committed(topic, offset, end, retained or [])
            return
        store = self.store
        while offset < end:
            try:
                records = store.read(topic, offset, end - offset, _ROUTE_READ_BYTES)
            except CorruptRecord as missing:  # no record there (a mirror's gap): nothing to route
                offset = max(offset + 1, missing.next_offset)
                continue
            if not records:
                break
            self.route(topic, offset, records)
            offset = records[-1].offset + 1

    def _pass_over_committed(self, topic: str, offset: int, end: int, retained: list[int]) -> None:
        """Route only the retained records of `topic` between `offset` and `end`, each read alone."""
        offset = max(offset, self.routed.get(topic, 0))
        routed = 0
        max_body = self.store.config.max_record_bytes
        for at in sorted({at for at in retained if offset <= at < end}):
            try:
                frames, _count = self.store.replicated_log.read_frames(topic, at, 1, at + 1)
                record = decode_frame(bytes(frames[0]), at, max_body) if frames else None
            except OffsetOutOfRange:
                continue  # retention removed it meanwhile
            except FrameError as error:
                log.error("record %d of %r is damaged (%s)", at, topic, error.reason)
                continue
            if record is not None:
                self.route(topic, at, [record])
                routed += 1
        self._passed_over(topic, offset, end, routed)
