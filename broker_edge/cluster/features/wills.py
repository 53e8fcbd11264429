"""Wills cluster-wide: each published once, wherever its client was connected, even if that broker died.

A will is a publish like any other once it is sent: it takes the PUBLISH path (forwarded to its partition's
leader, replicated) and reaches subscribers on every broker. What needs the cluster is "once":

- the registry record of the client id (``sessions_records``) holds the will of its current connection
  until it is published or cancelled (a normal DISCONNECT, or a new connection within the Will Delay
  Interval: the new CONNECT's record replaces it);
- the broker holding the connection publishes the will as the standalone broker does (at once, or after
  its delay), but first takes it out of the record by compare-and-swap (``publish_will``, the router's will
  hook): if a survivor already took it, it is not published twice;
- when a member leaves (its lease expired), every survivor schedules the wills its records still hold, at
  their due time (the delay counts from when the survivors learned of the death, or from the connection's
  end if it ended before), and at that time the one whose compare-and-swap takes the will out of the record
  publishes it. A client that reconnected meanwhile replaced the record: nothing is published.

The compare-and-swap comes before the publish, so a broker that dies between the two loses that will
(at most once in that window); no will is ever published twice.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from broker_edge.cluster.coordination.etcd import EtcdError
from broker_edge.cluster.features.sessions_records import SessionRecord, will_message
from broker_edge.engine.sessions.session import NEVER_EXPIRES

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable

    from broker_edge.cluster.features.sessions import ClusterSessions
    from broker_edge.cluster.features.sessions_registry import BackgroundTasks, SessionRegistry
    from broker_edge.cluster.view import ClusterView
    from broker_edge.engine.message import Message

__all__ = ["ClusterWills"]

log = logging.getLogger("broker_edge.cluster.wills")


def _taken_out(record: SessionRecord) -> SessionRecord | None:
    """The record once its will is published: a non-persistent session's record goes with it."""
    return record.without_will() if record.persistent else None


def _unless_will(record: SessionRecord) -> SessionRecord | None:
    """Remove the record, unless it still holds a will to publish."""
    return record if record.will is not None else None


class ClusterWills:
    """Publishes wills once across the cluster (see the module docstring). ``publish`` is the PUBLISH path's
    entry (``PublishPath.publish``)."""

    def __init__(
        self,
        sessions: ClusterSessions,
        registry: SessionRegistry,
        view: ClusterView,
        publish: Callable[[Message], None],
        tasks: BackgroundTasks,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.sessions = sessions
        self.registry = registry
        self.view = view
        self.publish = publish
        self.tasks = tasks
        self.loop = loop
        self.node_id = view.node_id
        self._members: set[str] | None = None
        self._scheduled: set[tuple[str, str, int]] = set()

    # -- wills of connections held here -------------------------------------------------------------------

    def publish_will(self, message: Message) -> None:
        """The router's will hook: publish a will of a connection that was held here, unless a survivor
        (which thought this node dead) published it already."""
        client_id = message.origin
        generation = self.sessions.owned.get(client_id)
        if self.sessions.closed and generation is not None:
            return  # this node has left: the others publish the wills its records hold
        if generation is None:
            self.publish(message)  # no record of ours holds it: no one else can publish it
            return
        self.tasks.spawn(self._take_out_and_publish(client_id, generation, message), f"will of {client_id}")

    async def _take_out_and_publish(self, client_id: str, generation: int, message: Message) -> None:
        try:
            before = await self.registry.update_until_done(
                client_id, self.node_id, generation, _taken_out, lambda: self.sessions.closed
            )
        except EtcdError as exc:
            # this node leaves: the others publish the will from the record once its lease is gone
            log.warning("will of %r left to the other brokers (etcd unreachable: %s)", client_id, exc)
            return
        if before is not None and before.will is None:
            log.info("will of %r was published by another broker", client_id)
            return
        if before is not None and not before.persistent:
            self.sessions.owned.pop(client_id, None)
        self.publish(message)

    # -- wills of members that left ------------------------------------------------------------------------

    def view_changed(self) -> None:
        """Schedule the wills of members that left since the last call. At the first call once this node
        is a member: of every node that is not one (it may have died while no broker was running), and of
        this node's own records from before it restarted (a restart quicker than the lease's expiry is
        never seen as a departure by the others)."""
        if self.view.fenced:
            return
        members = set(self.view.members)
        if self.node_id not in members:
            return
        if self._members is None:
            self._members = members
            absent = lambda node: node not in members or node == self.node_id  # noqa: E731
            self.tasks.spawn(self._schedule_wills(absent), "wills of absent nodes")
            return
        gone = self._members - members
        self._members = members
        if gone:
            log.info("members %s left: scheduling the wills of their clients", sorted(gone))
            self.tasks.spawn(self._schedule_wills(gone.__contains__), f"wills of {sorted(gone)}")

    async def _schedule_wills(self, dead: Callable[[str], bool]) -> None:
        try:
            records = await self.registry.records()
        except EtcdError as exc:
            log.warning("wills of departed members not read: %s", exc)
            return
        noticed = time.time()
        for client_id, record, _ in records:
            if not dead(record.node) or self._current(client_id, record.node, record.generation):
                continue
            if record.expiry_interval != NEVER_EXPIRES:
                # its session ends with its broker, or once its expiry interval has passed since (unless its
                # client comes back first: the record is then the new connection's)
                self.loop.call_later(record.expiry_interval, self._end, client_id, record)
            if record.will is None:
                continue
            key = (client_id, record.node, record.generation)
            if key in self._scheduled:
                continue
            self._scheduled.add(key)
            delay = max(0.0, record.will.due(noticed) - noticed)
            self.loop.call_later(delay, self._due, client_id, record.node, record.generation)

    def _current(self, client_id: str, node: str, generation: int) -> bool:
        """Whether the record is one this node keeps for a CONNECT made since it started."""
        return node == self.node_id and self.sessions.owned.get(client_id) == generation

    def _due(self, client_id: str, node: str, generation: int) -> None:
        self.tasks.spawn(self._claim_and_publish(client_id, node, generation), f"will of {client_id}")

    async def _claim_and_publish(self, client_id: str, node: str, generation: int) -> None:
        self._scheduled.discard((client_id, node, generation))
        if self._current(client_id, node, generation):
            return
        try:
            async with self.registry.lock(client_id):
                before = await self.registry.update(client_id, node, generation, _taken_out)
        except EtcdError as exc:
            log.warning("will of %r not claimed (%s); retrying", client_id, exc)
            self.loop.call_later(1.0, self._due, client_id, node, generation)
            return
        if before is None or before.will is None:
            return  # the client reconnected, or another broker published it
        log.info("publishing the will of %r, whose broker %s left the cluster", client_id, node)
        self.publish(will_message(before.will, self.loop.time()))

    def _end(self, client_id: str, record: SessionRecord) -> None:
        if self._current(client_id, record.node, record.generation):
            return
        self.tasks.spawn(self._forget(client_id, record), f"session {client_id} of a dead node")

    async def _forget(self, client_id: str, record: SessionRecord) -> None:
        """Remove the record of a session that ended with its dead broker (once its will is published)."""
        try:
            async with self.registry.lock(client_id):
                before = await self.registry.update(client_id, record.node, record.generation, _unless_will)
        except EtcdError as exc:
            log.debug("record of %r not removed: %s", client_id, exc)
            return
        if before is not None and before.will is not None:
            self.loop.call_later(1.0, self._end, client_id, record)  # its will first
