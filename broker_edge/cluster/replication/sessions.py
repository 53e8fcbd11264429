"""A leader's fetch sessions: one per follower (or observer) of this node, over the partitions it fetches
from here, with its position in each topic and what is new for it.

A session is opened by a follower's first fetch (``replica_fetch``) and served over HTTP, or pushed over the
peer link once its acknowledgements come there (``PushStream``, ``replica_push``). The partitions it serves
hold it too (``cluster.partition.Partition.sessions``): their high watermark follows its positions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from broker_edge.cluster.links.peer_link import PeerLink

__all__ = ["FetchSession", "PushStream"]


@dataclass(slots=True, eq=False)
class FetchSession:
    """One follower's (or observer's) fetch session with this leader."""

    id: int
    replica: str
    observer: bool
    partitions: dict[int, int]
    """partition -> the epoch the session was opened under."""
    registration: int | None = None
    """The replica's registration (``ClusterView.registrations``) the leader knew when the session opened:
    the session speaks for that process of the member, not for one registered after it."""
    positions: dict[str, int] = field(default_factory=dict)
    known_hw: dict[str, int] = field(default_factory=dict)
    dirty: dict[str, None] = field(default_factory=dict)
    """Topics with something new for it (records, a higher watermark), oldest first."""
    behind: dict[str, float] = field(default_factory=dict)
    """topic -> since when it lacks records the leader has."""
    shown: dict[str, tuple[int, float]] = field(default_factory=dict)
    """topic -> (the leader's end the last answer reached, when)."""
    sent: dict[str, int] = field(default_factory=dict)
    """topic -> the end of the frames sent to it (the next ones start there)."""
    last_seen: float = 0.0
    waiter: asyncio.Future[None] | None = None
    max_bytes: int = 1 << 20
    max_topic_bytes: int = 1 << 20
    wait_s: float = 0.5
    push: PushStream | None = None
    """Set while the session is served over the peer link."""

    @property
    def key(self) -> tuple[str, bool]:
        """(replica, observer): a member holds at most one session of each kind with this leader."""
        return (self.replica, self.observer)

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        if self.push is not None:
            self.push.schedule()


@dataclass(slots=True, eq=False)
class PushStream:
    """A session's push side: its link, the numbers of both directions, the frames in flight."""

    link: PeerLink
    send: Callable[[], None]
    """Builds and sends the session's next push (called once per loop iteration at most, by the link just
    before its next message leaves, so that the push takes in everything new until then)."""
    sequence: int = 0
    acks: int = 0
    pushed_bytes: int = 0
    durable_bytes: int = 0
    last_push: float = 0.0
    scheduled: bool = False

    def schedule(self) -> None:
        if not self.scheduled:
            self.scheduled = True
            self.link.soon(self._run)

    def _run(self) -> None:
        self.scheduled = False
        self.send()
