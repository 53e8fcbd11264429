"""Replays from an offset of topics this broker holds no copy of: where each one starts, before the SUBACK.

A SUBSCRIBE from an offset (``earliest``, a number, ``time:<ms>``) whose filter can match topics of
partitions this broker only observes is positioned in those topics as a broker holding them would position
it: ``ReplayManager.start`` hands the filter here, which asks the partitions' leaders (``LogStarts``) for
the matching topics, their logs' bounds and the offset the start names, and sets the session's cursor in
each (clamped to the log; an offset outside it is reported as ``OffsetOutOfRange``, which the v5 SUBACK
tells). The SUBACK waits for the answers (``when_started``); ``RemoteReads`` then reads the logs from the
leaders up to where this broker's routing of each topic stands, after which live delivery goes on.

Until the answers are in, live messages of the topics the filter matches there are held back from the
session (``holding``), and the first offset held of each is noted: a topic the leader did not list (created
since) is read from its start, or from that first held offset for a time start. So nothing between the
leader's answer and live delivery is missed or delivered twice.

When a partition has no broker to ask (no leader and no live replica with a link up) or its broker does not
answer within ``wait_s``, its topics that this broker routes start at the offset asked (``earliest``: the
log's start, read as such when the leader answers), and a time start starts at the first message held
since the SUBSCRIBE; the SUBACK reports nothing for them (logged at WARNING).

A session restored from its saved state (``ClusterSessions``, after its holder's death) is positioned the
same way from ``earliest`` in the topics its state does not name (created since it was saved): those it
names (``keep``) are neither moved nor held back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from broker_edge.observe.refusal_log import LogSummary
from broker_edge.protocol.topics import OffsetStart, OffsetStartKind, topic_matches
from broker_edge.storage.errors import OffsetOutOfRange

from .interest import is_wildcard
from .log_starts import ASK_ERRORS, LogStart, LogStarts

if TYPE_CHECKING:
    from broker_edge.cluster.view import ClusterView
    from broker_edge.engine.sessions.session import Session
    from broker_edge.log_info import LogInfo

__all__ = ["RemoteStarts"]

log = logging.getLogger(__name__)

WAIT_S = 5.0
"""Longest a SUBACK waits for the brokers asked where a replay starts."""


@dataclass(slots=True)
class _Start:
    """One filter's replay being positioned in logs held elsewhere."""

    topic_filter: str
    start: OffsetStart
    held: dict[str, int] = field(default_factory=dict)
    """Topic → first offset held back from the session meanwhile."""
    outside: list[OffsetOutOfRange] = field(default_factory=list)
    done: bool = False
    claimed: bool = False
    """Whether a SUBACK reports its ``outside`` (the SUBSCRIBE's own; later SUBACKs only wait for it)."""
    keep: frozenset[str] = frozenset()
    """Topics the session already has a position in (a session restored from its saved state): neither
    moved nor held back."""


@dataclass(slots=True)
class _Waiter:
    """A SUBACK waiting for replays to be positioned: its SUBSCRIBE's own and the session's earlier ones."""

    entries: list[_Start]
    own: list[_Start]
    outside: list[OffsetOutOfRange]
    ready: Callable[[], None]


class RemoteStarts:
    """``ReplayManager.remote_starts`` of a cluster node (see the module docstring)."""

    def __init__(
        self,
        view: ClusterView,
        starts: LogStarts,
        copy_here: Callable[[int], bool],
        observed_logs: Callable[[str], list[LogInfo]],
        wait_s: float = WAIT_S,
    ) -> None:
        self.view = view
        self.starts = starts
        self._copy_here = copy_here
        """Whether this broker holds a complete copy of a partition (by number)."""
        self._observed_logs = observed_logs
        self.wait_s = wait_s
        self._pending: dict[Session, list[_Start]] = {}
        self._waiters: dict[Session, list[_Waiter]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._unanswered_log = LogSummary(log)
        """Replays nobody answered where to start (a fleet resuming while partitions are offline, or their
        leader slow): one line per interval and kind, not one per replay."""

    def partitions_elsewhere(self, topic_filter: str) -> set[int]:
        """The partitions ``topic_filter`` can match topics of that this broker holds no complete copy of."""
        view = self.view
        if not is_wildcard(topic_filter):
            number = view.partition_of(topic_filter)
            return set() if self._copy_here(number) else {number}
        copy_here = self._copy_here
        return {number for number in view.states if not copy_here(number)}

    def start(
        self, session: Session, topic_filter: str, start: OffsetStart, keep: frozenset[str] = frozenset()
    ) -> bool:
        """Position ``session``'s replay of ``topic_filter`` in the logs held elsewhere (asynchronously),
        but for the topics in ``keep``; False when the filter matches none (nothing to wait for)."""
        if start.kind is OffsetStartKind.LATEST:
            return False  # from the end: this broker's live routing is exactly that
        partitions = self.partitions_elsewhere(topic_filter)
        if not partitions:
            return False
        entry = _Start(topic_filter, start, keep=keep)
        self._pending.setdefault(session, []).append(entry)
        if session.cursors is None:
            session.cursors = {}  # so that the router asks ``holding`` meanwhile
        task = asyncio.get_running_loop().create_task(self._position(session, entry, partitions))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    def pending(self, session: Session) -> bool:
        """Whether replays of ``session`` are being positioned (its live messages may be held)."""
        return session in self._pending

    def holding(self, session: Session, topic: str, offset: int) -> bool:
        """Whether a live message of ``topic`` at ``offset`` waits for the session's replay to be
        positioned (it is read from the log then)."""
        entries = self._pending.get(session)
        if not entries or self._copy_here(self.view.partition_of(topic)):
            return False
        holding = False
        for entry in entries:
            if topic not in entry.keep and topic_matches(entry.topic_filter, topic):
                entry.held.setdefault(topic, offset)
                holding = True
        return holding

    def when_started(
        self, session: Session, outside: list[OffsetOutOfRange], ready: Callable[[], None]
    ) -> bool:
        """Whether ``session`` has replays being positioned; if so, ``ready()`` runs once they all are,
        after adding to ``outside`` the logs whose asked offset was outside them."""
        entries = self._pending.get(session)
        if not entries:
            return False
        own = [entry for entry in entries if not entry.claimed]
        for entry in own:
            entry.claimed = True
        self._waiters.setdefault(session, []).append(_Waiter(list(entries), own, outside, ready))
        return True

    def forget(self, session: Session) -> None:
        """The session ended: nothing waits for its replays any more."""
        self._pending.pop(session, None)
        self._waiters.pop(session, None)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _position(self, session: Session, entry: _Start, partitions: set[int]) -> None:
        found: list[LogStart] = []
        try:
            unreachable = await self._ask(entry, partitions, found)
        except Exception:
            log.exception("positioning the replay of %r", entry.topic_filter)
            unreachable = partitions
        if unreachable:
            self._unanswered_log.log(
                logging.WARNING,
                "unanswered",
                "replay of %r from %s: no broker answered for partitions %s, reading from the offset asked",
                entry.topic_filter,
                entry.start.kind.name.lower(),
                sorted(unreachable),
                extra={"client_id": session.client_id},
            )
        self._apply(session, entry, found, unreachable)

    async def _ask(self, entry: _Start, partitions: set[int], found: list[LogStart]) -> set[int]:
        """Ask every broker reading some of ``partitions`` at once; the partitions no answer covers."""
        by_node, unreachable = self.starts.readers(partitions)
        asks = {
            node: asyncio.ensure_future(self.starts.ask(node, entry.topic_filter, entry.start, led))
            for node, led in by_node.items()
        }
        if asks:
            await asyncio.wait(asks.values(), timeout=self.wait_s)
        for node, ask in asks.items():
            error: BaseException | None
            if not ask.done():
                ask.cancel()
                error = TimeoutError(f"no answer within {self.wait_s} s")
            else:
                error = ask.exception()
            if error is None:
                found += ask.result()
                continue
            if not isinstance(error, ASK_ERRORS):
                raise error
            self._unanswered_log.log(
                logging.WARNING,
                f"asked {node}",
                "where %r starts in partitions %s, asked of %s: %s",
                entry.topic_filter,
                sorted(by_node[node]),
                node,
                error,
            )
            unreachable |= by_node[node]
        return unreachable

    def _apply(self, session: Session, entry: _Start, found: list[LogStart], unreachable: set[int]) -> None:
        entries = self._pending.get(session)
        if entries is None or entry not in entries:
            return  # the session ended meanwhile
        entries.remove(entry)
        if not entries:
            del self._pending[session]
        cursors = session.cursors
        if cursors is None:
            cursors = session.cursors = {}
        start = entry.start
        asked = start.value if start.kind is OffsetStartKind.OFFSET and start.value is not None else 0
        placed: set[str] = set(entry.keep)
        for found_log in found:
            if found_log.topic in placed:
                continue
            offset = found_log.offset
            if not found_log.start <= offset <= found_log.end:
                entry.outside.append(
                    OffsetOutOfRange(found_log.topic, offset, found_log.start, found_log.end)
                )
                log.info(
                    "replay of %r from %d: outside [%d, %d] on its leader",
                    found_log.topic,
                    offset,
                    found_log.start,
                    found_log.end,
                    extra={"client_id": session.client_id},
                )
            cursors[found_log.topic] = min(max(offset, found_log.start), found_log.end)
            placed.add(found_log.topic)
        partition_of = self.view.partition_of
        if unreachable and start.kind is not OffsetStartKind.TIMESTAMP:
            if not is_wildcard(entry.topic_filter) and entry.topic_filter not in placed:
                cursors[entry.topic_filter] = asked  # read once a replica answers
                placed.add(entry.topic_filter)
            for info in self._observed_logs(entry.topic_filter):
                if info.topic not in placed and partition_of(info.topic) in unreachable:
                    cursors[info.topic] = asked
                    placed.add(info.topic)
        for topic, first_held in entry.held.items():
            if topic in placed:
                continue
            if start.kind is OffsetStartKind.TIMESTAMP:
                cursors[topic] = first_held  # not resolved: from the SUBSCRIBE on
            else:
                cursors[topic] = asked  # created since the leader answered (or not answered): from `asked`
        if not cursors and session not in self._pending:
            session.cursors = None
        entry.done = True
        self._release(session)

    def _release(self, session: Session) -> None:
        waiters = self._waiters.get(session)
        if not waiters:
            return
        ready = [waiter for waiter in waiters if all(entry.done for entry in waiter.entries)]
        if not ready:
            return
        remaining = [waiter for waiter in waiters if waiter not in ready]
        if remaining:
            self._waiters[session] = remaining
        else:
            del self._waiters[session]
        for waiter in ready:
            for entry in waiter.own:
                waiter.outside += entry.outside
            waiter.ready()
