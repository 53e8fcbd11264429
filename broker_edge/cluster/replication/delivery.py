"""Committed records of the log routed to this node's subscribers, as the PUBLISH path routes its own.

Every member routes each partition's committed records to its local subscribers: a replica as it commits
them, an observer as its leader sends them, a new leader the records it inherited. ``LocalDelivery`` makes one
``Message`` per record, shared by all the subscribers, and hands the same messages to the log readers'
shared cache.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from broker_edge.engine.records import message_of_record
from broker_edge.observe import path_trace
from broker_edge.storage.errors import CorruptRecord

if TYPE_CHECKING:
    from broker_edge.engine.cursors import ReplayManager
    from broker_edge.engine.message import Message
    from broker_edge.storage.record import Record
    from broker_edge.storage.store import LogStore

__all__ = ["LocalDelivery", "Publish"]

_ROUTE_READ_BYTES = 4 << 20

Publish = Callable[["Message"], object]
"""Routes a message to local subscribers (`Router.publish`)."""


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
    ) -> None:
        self.store = store
        self.publish = publish
        self.replays = replays
        self.live_from_ms = live_from_ms
        """Records appended before this wall-clock time (ms) are not routed live (None: route all)."""
        self.routed: dict[str, int] = {}
        """topic → offset after the last record routed here (by this process)."""

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

    def route_committed(self, topic: str, offset: int, end: int) -> None:
        """Route the committed records of `topic` from `offset` to `end` to local subscribers."""
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
