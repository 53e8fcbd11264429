"""Log reads for the topics a broker holds no copy of: the backlog of sessions and devices, from a replica.

A broker that only observes a partition (it holds no copy: more brokers than ``replication_factor``) routes
its committed records to its subscribers from where its observation started, but has no log to read a
backlog from. A session resumed here (moved from another broker, or restored after its broker died) whose
position in such a topic is behind, or a device subscribing from an offset, reads it through
``RemoteReads``, which ``ReplayManager`` asks for those topics instead of the local store:

- ``live_end(topic)``: where this broker's routing of the topic stands (the observer's position: every
  record below it was routed here or came before the observation, every record from it on will be). A
  cursor is dropped only once it reaches it, so the switch to live delivery is exact, as on a single
  broker: records routed while the cursor was behind were held back for the session and are read too.
- ``read(topic, offset, ...)``: the committed records from ``offset``, from a window of records fetched
  from the partition's leader (or another replica while it has none) over its members' endpoint
  (``GET /v1/logs/{topic}/records?format=frames``, the records exactly as stored: offsets are the same on
  every replica). ``None`` while they are being fetched: the sessions that asked are pumped again once
  they are in. Windows are kept for the last few hundred topics read, shared by the sessions reading them.

Where a device's replay starts in such a topic (a filter's topics, the log's bounds, a time's offset) is
asked of the leader before the SUBACK (``remote_starts``); its cursors are then read here.

Nothing of this is on the path of a live message: only sessions behind on such a topic cause reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import urllib.parse
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import aiohttp
import yarl

from broker_edge import bounds
from broker_edge.offsets_api.formats import frames_records, topic_path_segment

if TYPE_CHECKING:
    from broker_edge.cluster.links.member_clients import MemberClients
    from broker_edge.cluster.view import ClusterView
    from broker_edge.engine.cursors import ReplayManager
    from broker_edge.engine.sessions.session import Session
    from broker_edge.storage.record import Record

__all__ = ["RemoteReads", "read_committed"]

log = logging.getLogger(__name__)

READ_RECORDS = 512
READ_BYTES = 1 << 20
WINDOWS = 256
"""Topics whose last fetched window is kept."""
RETRY_S = 0.1
"""Pause before asking again when the replica has nothing yet (a new leader catching up) or failed."""
ATTEMPTS = 50
"""Reads of one window before the sessions waiting for it are pumped anyway (those still connected ask
again)."""
TIMEOUT_S = 10.0
_MAX_FRAME_BODY = 1 << 28


class RoutingPositions(Protocol):
    """Where the routing of an observed topic stands here (``replication.follower.Followers`` is one)."""

    def routing_position(self, topic: str) -> int | None: ...


class RemoteReads:
    """``ReplayManager.remote`` of a cluster node (see the module docstring)."""

    def __init__(
        self,
        view: ClusterView,
        followers: RoutingPositions,
        log_here: Callable[[str], bool],
        replays: ReplayManager,
        clients: MemberClients,
    ) -> None:
        self.view = view
        self.followers = followers
        self._log_here = log_here
        self.replays = replays
        self.clients = clients
        self._windows: dict[str, tuple[int, list[Record]]] = {}
        """topic → (offset asked, the records fetched from it: the first may be later, after retention)."""
        self._fetching: dict[str, asyncio.Task[None]] = {}
        self._waiting: dict[str, set[Session]] = {}
        self.fetches = 0
        """Reads sent to other brokers."""

    def handles(self, topic: str) -> bool:
        """Whether ``topic`` is read here (this broker holds no copy of its partition)."""
        return not self._log_here(topic)

    def live_end(self, topic: str) -> int | None:
        return self.followers.routing_position(topic)

    def read(self, topic: str, offset: int, max_records: int, session: Session) -> list[Record] | None:
        """Committed records of ``topic`` from ``offset`` (the first may be later: retention removed the
        ones before), or None while they are fetched (``session`` is pumped again then)."""
        window = self._windows.get(topic)
        if window is not None:
            asked, records = window
            if records and asked <= offset < records[-1].offset + 1:
                index = max(0, offset - records[0].offset)
                return records[index : index + max_records]
        self._waiting.setdefault(topic, set()).add(session)
        if topic not in self._fetching:
            task = asyncio.get_running_loop().create_task(self._fetch(topic, offset))
            self._fetching[topic] = task
        return None

    def retry_later(self, session: Session) -> None:
        """``session`` waits for something not known yet (where routing stands): pump it again soon."""
        asyncio.get_running_loop().call_later(RETRY_S, self.replays.pump_soon, session)

    async def stop(self) -> None:
        for task in list(self._fetching.values()):
            task.cancel()
        for task in list(self._fetching.values()):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _fetch(self, topic: str, offset: int) -> None:
        try:
            for _ in range(ATTEMPTS):
                records = await self._fetch_once(topic, offset)
                if records:
                    windows = self._windows
                    windows.pop(topic, None)
                    windows[topic] = (offset, records)
                    while len(windows) > WINDOWS:
                        del windows[next(iter(windows))]
                    break
                await asyncio.sleep(RETRY_S)  # no replica answered, or the one asked has not committed it
        finally:
            self._fetching.pop(topic, None)
        for session in self._waiting.pop(topic, ()):
            self.replays.pump_soon(session)

    async def _fetch_once(self, topic: str, offset: int) -> list[Record]:
        self.fetches += 1
        return await read_committed(self.view, self.clients, topic, offset)


async def read_committed(
    view: ClusterView, clients: MemberClients, topic: str, offset: int, max_bytes: int = READ_BYTES
) -> list[Record]:
    """Committed records of ``topic`` from ``offset`` (from its start when retention removed ``offset``),
    exactly as stored, from the partition's leader, else a live replica (not this member); [] when none
    answered or it has nothing yet."""
    reader = _reader(view, topic)
    if reader is None:
        return []
    node, base = reader
    query = urllib.parse.urlencode(
        {"offset": offset, "max_records": READ_RECORDS, "max_bytes": max_bytes, "format": "frames"}
    )
    url = f"{base.rstrip('/')}/v1/logs/{topic_path_segment(topic)}/records?{query}"
    try:
        timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
        async with clients.session(node).get(yarl.URL(url, encoded=True), timeout=timeout) as answer:
            body = await answer.read()
            if answer.status == 416:  # below the log's start (retention): read on from its start
                start = bounds.offset(json.loads(body).get("start_offset", offset), "start_offset")
                return await read_committed(view, clients, topic, start, max_bytes) if start > offset else []
            if answer.status != 200:
                log.debug("reading %r from %s: HTTP %d", topic, base, answer.status)
                return []
            records, refused = frames_records(body, answer.headers, _MAX_FRAME_BODY)
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError, KeyError) as error:
        log.debug("reading %r from %s failed: %s", topic, base, error)
        return []
    if refused is not None:
        first_refused = records[-1].offset + 1 if records else offset
        log.error("%r from %s: frame %d refused (%s)", topic, base, first_refused, refused)
    return records


def _reader(view: ClusterView, topic: str) -> tuple[str, str] | None:
    """The partition's leader, else a live replica, and its members' endpoint (None: none known)."""
    state = view.state_of(topic)
    if state is None:
        return None
    for node in (state.leader, *state.replicas):
        member = view.members.get(node) if node is not None else None
        if member is not None and member.peer is not None and node != view.node_id:
            return member.node_id, member.peer
    return None
