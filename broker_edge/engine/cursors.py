"""Log cursors: subscribers that read a topic from its commitlog until they have caught up with live traffic.

A session has a cursor on a logged topic (``Session.cursors[topic] = next offset to deliver``) when

* it subscribed from an offset (a replay: the v5 user property ``offset`` or the v3 filter form
  ``$offset/<start>/<filter>``);
* a message for it arrived while it was offline, or while its in-flight window was full: instead of copying
  the message into a queue, the session remembers the offset (the log *is* the offline queue).

While a cursor exists the router does not hand that session live copies of the topic (``holds``): the pump
reads the log from the cursor, in order, as fast as the session's in-flight window and write buffer allow
(``pump``, called again on every ack and when writing resumes). The switch to live delivery is exact: a live
message whose offset equals the cursor is delivered directly and advances it; one below the cursor was
already delivered from the log; one above it is still to be read. Live messages are routed only once they are
durable, in offset order, and the log serves only durable records, so the two paths see the same sequence.
When the cursor reaches the log's end it is dropped and the session is live again.

Reads are shared: a small cache of decoded messages by (topic, offset), fed by reads and, while sessions read
logs (a pump in the last ``KEEP_LIVE_S``), by live routing, means many sessions catching up on the same topic
share the record and its encodings (the store's tail cache already spares the disk for recent records). While
no session reads, live messages are not kept: nobody would take them, and keeping them was a logged publish's
CPU spent for no reader (bench/results/ingest.md); the first read after a quiet spell decodes what it reads,
and the sessions behind it share that.

Positioning a replay and forgetting cursors cost time in the number of logs a filter matches and of cursors a
session holds; they run in bounded slices (``TURN_BUDGET_S`` per turn of the loop, all sessions together, in
turns): what fits runs at once, the rest waits for the next turns, the client's SUBACK or UNSUBACK with it
(its reading is held meanwhile, ``when_started`` / ``when_forgotten``). While a replay is being positioned,
live messages of the logs it matches are held back from the session (read from the log after the SUBACK),
so what is replayed, in which order and from which offset is the same as if it had been positioned at once.

An offset below the log start (retention removed it) starts at the log start; an offset past the end starts at
the end. Never silently: the broker log says so, and a v5 client finds it in the SUBACK (a reason string and a
user property ``offset_out_of_range`` per log, with the log's current start and end).

A message whose v5 Message Expiry Interval has passed (the log keeps the interval with the record's time)
is not delivered from the log: the cursor steps over it (counted as the drop ``expired``)
[MQTT-3.3.2-5]; the others go out with what remains of their interval [MQTT-3.3.2-6].

A record that fails its checksum is never delivered: the cursor steps over it (logged, counted as the drop
``log_corrupt``) so one damaged record cannot stall a replay.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from broker_edge.engine.message import Message
from broker_edge.engine.recent_messages import RecentMessages
from broker_edge.engine.records import message_of_record
from broker_edge.engine.routing.subscriptions import NoLocal, OwnTerms, merge_options
from broker_edge.observe.refusal_log import LogSummary
from broker_edge.protocol.properties import Properties
from broker_edge.protocol.topics import OffsetStart, OffsetStartKind, topic_matches
from broker_edge.storage.errors import CorruptRecord, OffsetOutOfRange, StorageError, UnknownTopic

if TYPE_CHECKING:
    import asyncio

    from broker_edge.engine.ports import AppendedRun, ClusterPorts, RemoteLogs, RemoteStarts
    from broker_edge.engine.sessions.session import Outlet, Session
    from broker_edge.log_info import LogInfo
    from broker_edge.storage.record import Record
    from broker_edge.storage.store import LogStore

__all__ = ["ReplayManager", "start_offset"]

Terms = tuple[int, NoLocal, bool, tuple[int, ...]]
"""A session's subscriptions matching a topic, merged (``merge_options``)."""

log = logging.getLogger(__name__)

PUMP_BATCH_RECORDS = 512
"""Records one pump call delivers to one session before yielding the loop to others."""
READ_MAX_BYTES = 1 << 20
SHARED_MESSAGES = 8192
KEEP_LIVE_S = 5.0
UNREADABLE_RETRY_S = 1.0  # a replay whose log could not be read (OSError) waits this long to read again
"""Live routing feeds the shared messages for this long after a session last read a log (``pump``)."""
TURN_BUDGET_S = 0.002
"""Time per loop turn that positioning replays and forgetting cursors take, all sessions together (one
step past it at most: a log positioned, a cursor checked, or one chunk of the sorted topic names listed)."""


@dataclass(slots=True, eq=False)
class _Positioning:
    """One replay filter being positioned in this broker's logs, in the sorted order of their topics."""

    topic_filter: str
    start: OffsetStart
    logs: Iterator[list[LogInfo]] | None = None
    """The store's listing (made by the first step)."""
    batch: list[LogInfo] = field(default_factory=list)
    index: int = 0
    held: dict[str, int] = field(default_factory=dict)
    """Topic → first live offset of a matching topic held back from the session meanwhile: the replay
    reads it from the log (a log positioned later ends there; one not listed starts there)."""


@dataclass(slots=True, eq=False)
class _Forgetting:
    """Dropping the cursors no subscription of the session matches any more (after UNSUBSCRIBE)."""

    topics: list[str] | None = None
    """The cursors' topics when it started (taken by the first step)."""
    index: int = 0


@dataclass(slots=True, eq=False)
class _Work:
    """A session's replays being positioned and cursors being forgotten, in the order they were asked."""

    items: deque[_Positioning | _Forgetting] = field(default_factory=deque)
    outside: list[OffsetOutOfRange] = field(default_factory=list)
    """What the finished positionings found outside their logs, for the SUBACK waiting (``when_started``)."""
    ready: list[Callable[[], None]] = field(default_factory=list)
    """Run once nothing is left (the SUBACK, the UNSUBACK)."""

    def positioning(self) -> bool:
        return any(type(item) is _Positioning for item in self.items)


class ReplayManager:
    """Cursor bookkeeping and log reads for every session (one per broker, owned by the router).

    ``count_drop(reason, count=1)`` counts messages not delivered (the router's); ``loop`` runs the deferred
    pumps and the positioning and forgetting left for later turns (None: all of it runs at once)."""

    def __init__(
        self, store: LogStore, loop: asyncio.AbstractEventLoop | None, count_drop: Callable[..., None]
    ) -> None:
        self.store = store
        self.loop = loop
        self.count_drop = count_drop
        self._said = LogSummary(log)
        """Lines about messages lost to retention, one per interval (``_skip_retention``)."""
        self._messages = RecentMessages(SHARED_MESSAGES)
        self._keep_live_until = 0.0
        """``time.monotonic()`` until which live messages are kept for readers (``KEEP_LIVE_S``)."""
        self._scheduled: set[Session] = set()
        self._retrying: set[Session] = set()  # replays waiting out a log that could not be read
        self._work: dict[Session, _Work] = {}
        """Sessions with replays being positioned or cursors being forgotten, in turn order."""
        self._used = 0.0
        """Seconds of this loop turn spent on that work (``TURN_BUDGET_S``)."""
        self._turn_scheduled = False
        self.remote: RemoteLogs | None = None
        """Reads the topics a cluster node holds no complete copy of from another broker (None: none)."""
        self.remote_starts: RemoteStarts | None = None
        """Positions replays in the topics a cluster node holds no complete copy of, asking the brokers
        that hold them (None: none)."""

    def join_cluster(self, ports: ClusterPorts) -> None:
        """Read the logs this broker holds no complete copy of through ``ports``
        (``BrokerCore.join_cluster``)."""
        self.remote = ports.remote_logs
        self.remote_starts = ports.remote_starts

    # -- live routing ---------------------------------------------------------------------------------------

    def holds(self, session: Session, message: Message, qos: int) -> bool:
        """True if the live copy must not be delivered because the session reads this topic from the log."""
        offset = message.offset
        if offset is None:
            return False
        cursors = session.cursors
        cursor = cursors.get(message.topic) if cursors else None
        work = self._work.get(session) if self._work else None
        if cursor is None:
            if work is not None and self._held(work, message.topic, offset):
                return True
            starts = self.remote_starts
            return starts is not None and starts.holding(session, message.topic, offset)
        if offset < cursor:
            return True  # already delivered from the log
        if work is not None and work.positioning():
            self._held(work, message.topic, offset)
            return True  # read from the log after the SUBACK
        if offset == cursor and session.connection is not None and (qos == 0 or session.window_open()):
            self._advance(session, message.topic, offset + 1)
            return False
        return True

    def appended(self, topic: str, first_offset: int, messages: Sequence[Message]) -> None:
        """Logged messages of `topic` from `first_offset` on were routed: keep them for sessions about to
        read the same offsets, while sessions read logs."""
        if time.monotonic() < self._keep_live_until:
            self._messages.add(topic, first_offset, messages)

    def appended_runs(self, runs: Iterable[AppendedRun]) -> None:
        """`appended` of each run of a loop turn (the shared messages' bound applied once)."""
        if time.monotonic() < self._keep_live_until:
            self._messages.add_runs(runs)

    # -- replays ------------------------------------------------------------------------------------------

    def start(self, session: Session, topic_filter: str, start: OffsetStart) -> list[OffsetOutOfRange]:
        """Position the session on every existing log its filter matches (reading starts with ``pump``).

        Returns the logs where the asked offset is outside the log, each as the ``OffsetOutOfRange`` a
        reader of the log would get: below the start (retention removed it) the replay starts at the
        start, past the end at the end. The SUBACK tells a v5 client (``out_of_range_properties``). What
        does not fit in this loop turn (``TURN_BUDGET_S``) is positioned in the next ones, and the logs it
        finds outside are added by ``when_started``. On a cluster node, the logs it holds no copy of are
        positioned by asking the brokers holding them (``remote_starts``); ``when_started`` says when that
        is done too.
        """
        if session.cursors is None:
            session.cursors = {}  # so that the router asks ``holds`` meanwhile
        starts = self.remote_starts
        if starts is not None:
            starts.start(session, topic_filter, start)
        work = self._queue(session, _Positioning(topic_filter, start))
        if work.items:
            return []  # ``when_started`` adds what it finds outside
        outside, work.outside = work.outside, []
        self._finish(session, work, later=False)
        return outside

    def when_started(
        self, session: Session, outside: list[OffsetOutOfRange], ready: Callable[[], None]
    ) -> bool:
        """Whether ``session``'s replays are still being positioned (in this broker's logs, or in logs held
        by other brokers); if so, ``ready()`` runs once they are, after adding to ``outside`` those whose
        offset was outside them."""
        starts = self.remote_starts
        work = self._work.get(session)
        if work is None or not work.positioning():
            return starts is not None and starts.when_started(session, outside, ready)
        remote: list[OffsetOutOfRange] = []
        parts = [1]

        def part_done() -> None:
            parts[0] -= 1
            if not parts[0]:
                outside.extend(remote)
                ready()

        def here_done() -> None:
            outside.extend(work.outside)
            work.outside = []
            part_done()

        if starts is not None and starts.when_started(session, remote, part_done):
            parts[0] += 1
        work.ready.append(here_done)
        return True

    def when_forgotten(self, session: Session, ready: Callable[[], None]) -> bool:
        """Whether ``session``'s cursors are still being forgotten (``forget_filter``); if so, ``ready()``
        runs once they are."""
        work = self._work.get(session)
        if work is None:
            return False
        work.ready.append(ready)
        return True

    @staticmethod
    def out_of_range_properties(outside: list[OffsetOutOfRange]) -> Properties:
        """v5 SUBACK properties telling a device where its replay really starts: a reason string and one
        user property ``offset_out_of_range`` per log, whose JSON value has the fields of the offsets
        API's 416 answer (topic, offset, start_offset, end_offset)."""
        first = outside[0]
        more = f" (and {len(outside) - 1} more logs)" if len(outside) > 1 else ""
        reason = f"{first}: replaying from {min(max(first.offset, first.start), first.end)}{more}"
        return Properties(
            reason_string=reason,
            user_properties=[
                (
                    "offset_out_of_range",
                    json.dumps(
                        {"topic": o.topic, "offset": o.offset, "start_offset": o.start, "end_offset": o.end}
                    ),
                )
                for o in outside
            ],
        )

    # -- reading ------------------------------------------------------------------------------------------

    def _skip_retention(self, session: Session, topic: str, cursor: int, start: int) -> None:
        """The records from ``cursor`` to ``start`` went by retention before ``session`` read them: they
        are messages it never gets, counted (drop ``retention``, one each) and said at WARNING, one line per
        ``LogSummary`` interval (a fleet back after retention would write one per device and topic)."""
        self.count_drop("retention", start - cursor)
        self._said.log(
            logging.WARNING,
            "retention",
            "log of %r starts at %d, after the cursor %d: %d messages went by retention before this "
            "session read them; continuing at %d",
            topic,
            start,
            cursor,
            start - cursor,
            start,
            extra={"client_id": session.client_id},
        )

    def pump(self, session: Session) -> None:
        """Deliver from the log to ``session`` while its window and buffer allow; drop caught-up cursors."""
        cursors = session.cursors
        conn = session.connection
        if not cursors or conn is None:
            return
        if self._work and (work := self._work.get(session)) is not None and work.positioning():
            return  # read after the SUBACK (``_finish``)
        self._keep_live_until = time.monotonic() + KEEP_LIVE_S
        store = self.store
        budget = PUMP_BATCH_RECORDS
        for topic in list(cursors):
            if budget <= 0:
                self.pump_soon(session)
                return
            entry = self._subscription(session, topic)
            if entry is None:
                del cursors[topic]
                budget -= 1  # a log looked at counts as a record, read or not
                continue
            sub_qos = entry[0]
            cursor = cursors[topic]
            remote = self.remote
            if remote is not None and remote.handles(topic):
                budget = self._pump_remote(session, conn, topic, entry, budget, remote)
                if budget < 0:
                    return
                continue
            while True:
                if budget <= 0:
                    self.pump_soon(session)
                    return
                if conn.terms.paused or session.queue or session.connection is not conn:
                    return
                room = budget
                if sub_qos:
                    room = min(room, conn.terms.send_quota - session.inflight_count())
                    if room <= 0:
                        return  # the next ack calls drain(), which pumps again
                try:
                    records = store.read(topic, cursor, room, READ_MAX_BYTES)
                except OffsetOutOfRange as exc:
                    if cursor < exc.start:
                        self._skip_retention(session, topic, cursor, exc.start)
                        cursor = cursors[topic] = exc.start
                        continue
                    records = []
                except CorruptRecord as exc:
                    log.error(
                        "skipping records %d to %d of %r for the replay: %s",
                        exc.offset,
                        exc.next_offset - 1,
                        topic,
                        exc,
                        extra={"client_id": session.client_id},
                    )
                    self.count_drop("log_corrupt")
                    cursor = cursors[topic] = exc.next_offset
                    continue
                except UnknownTopic:
                    records = []
                except OSError as exc:
                    self._unreadable(session, topic, cursor, exc)
                    break  # this log waits, at its cursor; the session's other topics go on
                if not records:
                    del cursors[topic]  # caught up: live delivery from here on
                    budget -= 1
                    break
                for record in records:
                    self._replay_record(session, conn, topic, record, entry)
                    cursor = record.offset + 1
                    budget -= 1
                cursors[topic] = cursor
        self._drop_cursors_if_none(session)

    def _pump_remote(
        self,
        session: Session,
        conn: Outlet,
        topic: str,
        entry: Terms,
        budget: int,
        remote: RemoteLogs,
    ) -> int:
        """``pump`` for a topic this broker holds no copy of: read it from another broker up to where
        this broker's routing of it stands, then drop the cursor (live delivery goes on from there).
        Returns the budget left, or -1 when the pump must stop (window full, more to come later)."""
        cursors = session.cursors
        assert cursors is not None
        sub_qos = entry[0]
        cursor = cursors[topic]
        while True:
            end = remote.live_end(topic)
            if end is None:
                remote.retry_later(session)  # the observation has not told where its routing starts yet
                return budget
            if cursor >= end:
                if cursor == end:
                    del cursors[topic]  # caught up: live delivery from here on
                # else: routing has not reached the cursor yet; live delivery takes over there (``holds``)
                return budget
            if budget <= 0:
                self.pump_soon(session)
                return -1
            if conn.terms.paused or session.queue or session.connection is not conn:
                return -1
            room = min(budget, end - cursor)
            if sub_qos:
                room = min(room, conn.terms.send_quota - session.inflight_count())
                if room <= 0:
                    return -1  # the next ack calls drain(), which pumps again
            records = remote.read(topic, cursor, room, session)
            if records is None:
                return budget  # being fetched: this session is pumped again once it is in
            for record in records[:room]:
                if record.offset >= end:
                    break
                self._replay_record(session, conn, topic, record, entry)
                cursor = record.offset + 1
                budget -= 1
            cursors[topic] = cursor

    def _replay_record(
        self,
        session: Session,
        conn: Outlet,
        topic: str,
        record: Record,
        entry: Terms,
    ) -> None:
        """Send one logged record to a session catching up, under its subscription ``entry``: not when it
        expired, nor a record of the session's own client under No Local."""
        sub_qos, no_local, retain_as_published, subscription_ids = entry
        message = self._message(topic, record)
        if no_local and record.client_id == session.client_id:
            if not isinstance(no_local, OwnTerms):
                return
            sub_qos, retain_as_published, subscription_ids = no_local
        if message.expires_at is not None and message.expired():
            self.count_drop("expired")
        else:
            qos = sub_qos if sub_qos < record.qos else record.qos
            retain = retain_as_published and record.retain
            if qos == 0:
                conn.send_message(message, 0, retain, subscription_ids, None)
            else:
                session._send(conn, message, qos, retain, subscription_ids)

    def _advance(self, session: Session, topic: str, offset: int) -> None:
        cursors = session.cursors
        if cursors is None:
            return
        remote = self.remote
        if remote is not None and remote.handles(topic):
            end = remote.live_end(topic)
            if end is None:
                end = offset + 1
        else:
            try:
                end = self.store.log_info(topic).end_offset
            except StorageError:
                end = offset
        if offset >= end:
            del cursors[topic]
            self._drop_cursors_if_none(session)
        else:
            cursors[topic] = offset

    def _unreadable(self, session: Session, topic: str, cursor: int, error: OSError) -> None:
        """``topic``'s log could not be read at ``cursor``: said at ERROR (once per interval) and read again
        later, never a reason to close the connection (the client would reconnect into the same read)."""
        what = f"the log of {topic!r} cannot be read from offset {cursor} for a replay ({error})"
        self._said.log(logging.ERROR, "unreadable", "%s: tried again every %.0f s", what, UNREADABLE_RETRY_S)
        if self.loop is not None and session not in self._retrying:
            self._retrying.add(session)
            self.loop.call_later(UNREADABLE_RETRY_S, self._retry, session)

    def _retry(self, session: Session) -> None:
        self._retrying.discard(session)
        if session.connection is not None:
            self.pump(session)

    def pump_soon(self, session: Session) -> None:
        """Pump ``session`` once at the end of this loop iteration, however often it is asked.

        Acks arrive many per socket read; pumping after each would read the log once per ack for one
        record each time. Deferred, the acks of one read make room together and one read fills it.
        """
        if self.loop is None:
            self.pump(session)
            return
        if session in self._scheduled:
            return
        self._scheduled.add(session)

        def again() -> None:
            self._scheduled.discard(session)
            if not session.queue:
                self.pump(session)

        self.loop.call_soon(again)

    def _message(self, topic: str, record: Record) -> Message:
        message = self._messages.get(topic, record.offset)
        if message is not None:
            return message
        message = message_of_record(topic, record)
        self._messages.add(topic, record.offset, (message,))
        return message

    @staticmethod
    def _subscription(session: Session, topic: str) -> Terms | None:
        """The session's own (non-shared) subscriptions matching ``topic``, merged like the trie does."""
        options = [
            entry.options
            for entry in (session.subscriptions or {}).values()
            if entry.group is None and topic_matches(entry.topic_filter, topic)
        ]
        return merge_options(options) if options else None

    # -- cleanup ------------------------------------------------------------------------------------------

    def forget_filter(self, session: Session, topic_filter: str) -> None:
        """After UNSUBSCRIBE: drop cursors no remaining subscription of the session matches (what does
        not fit in this loop turn, in the next ones: ``when_forgotten``). A replay of ``topic_filter``
        still being positioned stops there."""
        work = self._work.get(session)
        if work is not None:
            for item in list(work.items):
                if type(item) is _Positioning and item.topic_filter == topic_filter:
                    work.items.remove(item)
                    self._settle_held(session, item)
        elif not session.cursors:
            return
        work = self._queue(session, _Forgetting())
        if not work.items:
            self._finish(session, work, later=False)

    def _drop_cursors_if_none(self, session: Session) -> None:
        """No cursor left: the router hands the session live copies again without asking ``holds``
        (unless a replay is being positioned, here or in logs held elsewhere, whose live messages wait)."""
        if session.cursors:
            return
        starts = self.remote_starts
        if starts is not None and starts.pending(session):
            return
        work = self._work.get(session)
        if work is None or not work.positioning():
            session.cursors = None

    def forget_session(self, session: Session) -> None:
        session.cursors = None
        self._scheduled.discard(session)
        self._work.pop(session, None)
        if self.remote_starts is not None:
            self.remote_starts.forget(session)

    # -- positioning and forgetting in slices ---------------------------------------------------------------

    def _queue(self, session: Session, item: _Positioning | _Forgetting) -> _Work:
        """Queue ``item`` after what the session asked before; with nothing before it, do what this loop
        turn's budget allows of it now (all of it without a loop). Returns the session's work: done when
        no item is left (the caller then calls ``_finish``)."""
        work = self._work.get(session)
        if work is None:
            work = self._work[session] = _Work()
        items = work.items
        if (
            type(item) is _Forgetting
            and items
            and type(last := items[-1]) is _Forgetting
            and last.topics is None
        ):
            return work  # one not started yet looks at every cursor
        items.append(item)
        if len(items) > 1:
            return work
        if self.loop is None:
            self._work_on(session, work, float("inf"))
            return work
        left = TURN_BUDGET_S - self._used
        if left > 0:
            began = time.perf_counter()
            self._work_on(session, work, began + left)
            self._spend(time.perf_counter() - began)
        if items:
            self._schedule_turn()
        return work

    def _spend(self, seconds: float) -> None:
        """Count ``seconds`` of work into this loop turn (the count starts again in the next)."""
        self._used += seconds
        self._schedule_turn()

    def _schedule_turn(self) -> None:
        if not self._turn_scheduled and self.loop is not None:
            self._turn_scheduled = True
            self.loop.call_soon(self._next_turn)

    def _next_turn(self) -> None:
        """A new loop turn: the sessions with work left take turns until its budget is spent."""
        self._turn_scheduled = False
        self._used = 0.0
        pending = self._work
        clock = time.perf_counter
        while pending:  # (a step at least, whatever the budget)
            session = next(iter(pending))
            work = pending.pop(session)
            began = clock()
            done = self._work_on(session, work, began + TURN_BUDGET_S - self._used)
            self._spend(clock() - began)
            if done:
                self._finish(session, work, later=True)
            else:
                pending[session] = work  # the others first next time
            if self._used >= TURN_BUDGET_S:
                break
        if pending:
            self._schedule_turn()

    def _work_on(self, session: Session, work: _Work, deadline: float) -> bool:
        """Do the session's work in order until ``time.perf_counter()`` passes ``deadline``; whether all is
        done."""
        items = work.items
        while items:
            item = items[0]
            if isinstance(item, _Positioning):
                finished = self._position(session, work, item, deadline)
            else:
                finished = self._forget(session, item, deadline)
            if not finished:
                return False
            items.popleft()
            if items and time.perf_counter() >= deadline:
                return False
        return True

    def _finish(self, session: Session, work: _Work, later: bool) -> None:
        """Nothing is left of the session's work: what waited for it runs (the SUBACK, the UNSUBACK); done
        in a later turn (``later``), the session's cursors are read."""
        if self._work.get(session) is work:
            del self._work[session]
        self._drop_cursors_if_none(session)
        ready, work.ready = work.ready, []
        for callback in ready:
            callback()
        starts = self.remote_starts
        if later and session.cursors and not (starts is not None and starts.pending(session)):
            self.pump_soon(session)

    def _position(self, session: Session, work: _Work, item: _Positioning, deadline: float) -> bool:
        """Position ``item``'s replay on the logs it matches, in topic order, until ``deadline``; whether
        it is done."""
        cursors = session.cursors
        if cursors is None:
            cursors = session.cursors = {}
        remote = self.remote
        wildcard_first = item.topic_filter[:1] in ("+", "#")
        clock = time.perf_counter
        while True:
            batch, index, held = item.batch, item.index, item.held
            while index < len(batch):
                info = batch[index]
                index += 1
                topic = info.topic
                first_held = held.pop(topic, None) if held else None
                if topic.startswith("$") and wildcard_first:
                    continue
                if remote is not None and remote.handles(topic):
                    continue  # not a copy: an older part of the log, or nothing (``remote_starts``)
                # (a log gone since it was listed has nothing to replay)
                with contextlib.suppress(StorageError):
                    self._place(session, cursors, work.outside, info, item.start, first_held)
                if clock() >= deadline:
                    item.index = index
                    return False
            if item.logs is None:
                item.logs = self.store.iter_logs(item.topic_filter, every_scan=True)
            try:
                item.batch = next(item.logs)
            except StopIteration:
                self._settle_held(session, item)
                return True
            except (StorageError, ValueError) as exc:
                log.warning(
                    "replay of %r not started: %s",
                    item.topic_filter,
                    exc,
                    extra={"client_id": session.client_id},
                )
                self._settle_held(session, item)
                return True
            item.index = 0
            if clock() >= deadline:
                return False

    def _place(
        self,
        session: Session,
        cursors: dict[str, int],
        outside: list[OffsetOutOfRange],
        info: LogInfo,
        start: OffsetStart,
        first_held: int | None,
    ) -> None:
        """Set the session's cursor on the log ``info`` describes where ``start`` names (adding it to
        ``outside`` if that is outside the log); the log ends at the first live message held back from the
        session (``first_held``) if one was, as it did when the SUBSCRIBE arrived."""
        end = info.end_offset
        offset = start_offset(self.store, info, start)
        if first_held is not None and first_held < end:
            end = first_held
            if start.kind is not OffsetStartKind.OFFSET:
                offset = min(offset, end)
        log_start = min(info.start_offset, end)
        if not log_start <= offset <= end:
            outside.append(OffsetOutOfRange(info.topic, offset, log_start, end))
            log.info(
                "replay of %r from %d: outside [%d, %d], starting at %d",
                info.topic,
                offset,
                log_start,
                end,
                min(max(offset, log_start), end),
                extra={"client_id": session.client_id},
            )
        cursors[info.topic] = min(max(offset, log_start), end)

    def _settle_held(self, session: Session, item: _Positioning) -> None:
        """The live messages held back for ``item`` of logs it did not position (created meanwhile, or
        positioned before they came) are read from the log, from the first one held (or the cursor)."""
        if not item.held:
            return
        cursors = session.cursors
        if cursors is None:
            cursors = session.cursors = {}
        for topic, first_held in item.held.items():
            cursor = cursors.get(topic)
            cursors[topic] = first_held if cursor is None else min(cursor, first_held)
        item.held = {}

    def _held(self, work: _Work, topic: str, offset: int) -> bool:
        """Whether a live message of ``topic`` at ``offset`` waits for a replay being positioned whose filter
        matches ``topic`` (it is read from the log after the SUBACK)."""
        remote = self.remote
        held = False
        for item in work.items:
            if type(item) is not _Positioning:
                continue
            topic_filter = item.topic_filter
            if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
                continue
            if remote is not None and remote.handles(topic):
                continue
            if topic_matches(topic_filter, topic):
                item.held.setdefault(topic, offset)
                held = True
        return held

    def _forget(self, session: Session, item: _Forgetting, deadline: float) -> bool:
        """Drop the cursors no subscription matches any more, until ``deadline``; whether it is done."""
        cursors = session.cursors
        if not cursors:
            return True
        if item.topics is None:
            item.topics = list(cursors)
        topics, index = item.topics, item.index
        clock = time.perf_counter
        while index < len(topics):
            topic = topics[index]
            index += 1
            if topic in cursors and self._subscription(session, topic) is None:
                del cursors[topic]
            if clock() >= deadline:
                break
        item.index = index
        return index >= len(topics)


def start_offset(store: LogStore, info: LogInfo, start: OffsetStart) -> int:
    """The offset ``start`` names in the log ``info`` describes, before it is clamped to the log (a time:
    the first record appended at or after it, else the committed end)."""
    kind = start.kind
    if kind is OffsetStartKind.EARLIEST:
        return info.start_offset
    if kind is OffsetStartKind.LATEST:
        return info.end_offset
    value = start.value
    assert value is not None, "an offset or timestamp start carries its value"
    if kind is OffsetStartKind.TIMESTAMP:
        return min(store.offset_for_timestamp(info.topic, value), info.end_offset)
    return value
