"""The leader's pushes over the peer link (``replica_push``): a follower's acknowledgements take the place of
its fetches, and what a parked fetch would have been answered with is pushed instead, once per loop turn.

Both transports share the session and its answers (``fetch_server``). A follower's first acknowledgement on
the link moves its session there; anything out of order (a lost acknowledgement, another link, a session
that changed) is answered ``UNKNOWN_SESSION`` and the follower starts over over HTTP.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .fetch_server import FetchServer, positions_of
from .replica_fetch import NOT_LEADER, OK, UNKNOWN_SESSION, FetchResponse, PartitionData, WireError
from .replica_push import ACK, PUSH, Push, decode_ack, encode_push
from .sessions import FetchSession, PushStream

if TYPE_CHECKING:
    from broker_edge.cluster.links.peer_link import PeerLink, PeerLinks

__all__ = ["PushServer"]

log = logging.getLogger("broker_edge.cluster.replication.leader")


class PushServer:
    """Serves followers' sessions by pushing over the peer links (see the module docstring)."""

    def __init__(
        self, fetches: FetchServer, settle: Callable[[], None], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.fetches = fetches
        self._settle = settle
        self._clock = clock
        self.pushes_sent = 0
        """Pushes sent over peer links, keepalives excluded."""
        self.acks_received = 0

    def serve(self, links: PeerLinks) -> None:
        """Take followers' acknowledgements on the peer links, and serve their sessions by pushing."""
        links.on(ACK, self._acknowledged)

    def _acknowledged(self, link: PeerLink, body: memoryview) -> None:
        """A follower's acknowledgement: its first one moves its session onto the link."""
        try:
            ack = decode_ack(body)
        except WireError as error:
            log.error("replica acknowledgement from %s refused: %s", link.peer, error)
            return
        self.acks_received += 1
        fetches = self.fetches
        request = ack.request
        session = fetches.sessions.get((link.peer, False))
        partitions, errors = fetches.check_partitions(request)
        stream = session.push if session is not None else None
        if (
            not fetches.serving
            or request.observer
            or request.replica != link.peer
            or session is None
            or session.id != request.session
            or session.partitions != partitions
            or (stream is None and ack.sequence != 1)
            or (stream is not None and (stream.link is not link or ack.sequence != stream.acks + 1))
        ):
            link.send(PUSH, encode_push(Push(0, FetchResponse(request.session, UNKNOWN_SESSION))))
            if session is not None and session.id == request.session:
                session.push = None  # an acknowledgement was lost: the follower starts over over HTTP
            return
        if stream is None:
            pushed = session
            stream = session.push = PushStream(link, lambda: self.push(pushed))
        stream.acks = ack.sequence
        stream.durable_bytes = max(stream.durable_bytes, ack.durable_bytes)
        now = self._clock()
        session.last_seen = now
        answers = fetches.answers(session, errors)
        fetches.take_positions(session, positions_of(request), answers, now)
        self._settle()
        if any(answer.error != OK or answer.topics for answer in answers.values()):
            self.push(session, answers)  # errors and divergences go out now (the follower then reopens)
        else:
            stream.schedule()  # the window may have opened

    def push(self, session: FetchSession, answers: dict[int, PartitionData] | None = None) -> None:
        """Push what the session has new (records within the window, watermarks), if anything."""
        stream = session.push
        fetches = self.fetches
        if stream is None or fetches.sessions.get((session.replica, session.observer)) is not session:
            return
        if not stream.link.up or not fetches.serving:
            session.push = None  # pushes would be lost: the follower notices and reopens over HTTP
            return
        if answers is None:
            answers = fetches.answers(session, {})
        broken = False
        for number in session.partitions:
            if fetches.session_broken(session, number):
                answers[number] = PartitionData(number, NOT_LEADER, fetches.epoch_of(number))
                broken = True
        window = session.max_bytes - (stream.pushed_bytes - stream.durable_bytes)
        if not fetches.answer(session, answers, window) and not broken:
            return
        stream.pushed_bytes += sum(
            len(frames) for answer in answers.values() for data in answer.topics for frames in data.frames
        )
        stream.sequence += 1
        stream.last_push = self._clock()
        self.pushes_sent += 1
        news = [answer for answer in answers.values() if answer.topics or answer.error != OK]
        stream.link.send(PUSH, encode_push(Push(stream.sequence, FetchResponse(session.id, OK, news))))
        if broken:
            session.push = None

    def keep_alive(self) -> None:
        """Tell idle push sessions' followers the number of the last push (a lost one shows)."""
        now = self._clock()
        for session in list(self.fetches.sessions.values()):
            stream = session.push
            if stream is not None and now - stream.last_push >= session.wait_s:
                if not stream.link.up:
                    session.push = None
                    continue
                stream.last_push = now
                keepalive = Push(stream.sequence, FetchResponse(session.id, OK))
                stream.link.send(PUSH, encode_push(keepalive))
