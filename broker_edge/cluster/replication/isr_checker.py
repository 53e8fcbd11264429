"""The leader's check of its in-sync replicas, a few times a second.

A follower is out of sync when a record of one of the partition's topics has waited for it more than
``replica_lag_max_ms`` (it is "behind" a topic from the time the leader had records it had not fetched, or
since the previous answer it caught up to, or since its position of the topic diverged from the leader's
log, until it reports one that does not: a replica that will not truncate is out of sync, not a partition
that waits for it), or when it has not fetched for that long. The leader then asks
the ISR changer (the coordination side, compare-and-swap in etcd) to shrink the ISR, and to expand it again
once the follower is behind nothing. A partition just taken over gives its followers ``replica_lag_max_ms``
to show up.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from broker_edge.cluster.coordination.etcd import EtcdError

if TYPE_CHECKING:
    from broker_edge.cluster.partition import Partitions

    from .fetch_server import FetchServer
    from .stage import LeaderConfig

__all__ = ["IsrChanger", "IsrChecker"]

log = logging.getLogger("broker_edge.cluster.replication.leader")


class IsrChanger(Protocol):
    """Changes a partition's in-sync set by compare-and-swap on its epoch (the coordination side)."""

    async def shrink_isr(self, partition: int, expected_epoch: int, node: str) -> bool: ...

    async def expand_isr(self, partition: int, expected_epoch: int, node: str) -> bool: ...


class IsrChecker:
    """Shrinks and expands the ISR of the partitions led here (see the module docstring)."""

    def __init__(
        self,
        partitions: Partitions,
        fetches: FetchServer,
        changer: IsrChanger,
        config: LeaderConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.partitions = partitions
        self.fetches = fetches
        self.changer = changer
        self.config = config
        self._clock = clock
        self._calls: set[tuple[int, str]] = set()
        self.tasks: set[asyncio.Task[None]] = set()

    def check(self) -> None:
        """Shrink the ISR of the partitions led here by followers lagging too long; expand it by those
        caught up (run periodically; the changes go through the ISR changer)."""
        view = self.partitions.view
        if view.fenced:  # no change could be written: none is tried (and logged)
            return
        now = self._clock()
        lag_max = self.config.replica_lag_max_ms / 1000
        me = view.node_id
        lagging_since = self.lagging_since()
        sessions = self.fetches.sessions
        speaks_for_member = self.fetches.speaks_for_member
        for number, state in view.states.items():
            partition = self.partitions.number(number)
            led_since = partition.led_since
            if led_since is None or not partition.leads():
                continue
            for replica in state.replicas:
                if replica == me:
                    continue
                session = sessions.get((replica, False))
                serving = session is not None and number in session.partitions
                contact = float("-inf")
                if session is not None and serving:
                    contact = now if session.waiter is not None else session.last_seen
                alive = now - max(contact, led_since) <= lag_max
                since = lagging_since.get((replica, number))
                too_far = since is not None and now - max(since, led_since) > lag_max
                if replica in state.isr and (not alive or too_far):
                    self._change(number, state.epoch, replica, shrink=True)
                elif (
                    replica not in state.isr
                    and session is not None
                    and serving
                    # of a live member's current registration: one whose lease ended is never added back
                    # (the controller's), nor one back before a session of its own shows its log (the
                    # view's listener, which ends the session of its former process, may not have run)
                    and speaks_for_member(session)
                    and now - contact <= lag_max
                    and since is None
                ):
                    self._change(number, state.epoch, replica, shrink=False)

    def lagging_since(self) -> dict[tuple[str, int], float]:
        """(replica, partition) -> the oldest time it has been behind a topic of the partition, or has held
        a position of it that diverges from this log."""
        result: dict[tuple[str, int], float] = {}
        known = self.partitions.known

        def behind(replica: str, topic: str, since: float) -> None:
            partition = known(topic)
            key = (replica, partition.number if partition is not None else -1)
            if since < result.get(key, float("inf")):
                result[key] = since

        for session in self.fetches.sessions.values():
            if session.observer:
                continue
            for topic, since in session.behind.items():
                behind(session.replica, topic, since)
        for (replica, topic), since in self.fetches.diverged.items():
            behind(replica, topic, since)
        return result

    def _change(self, partition: int, epoch: int, replica: str, shrink: bool) -> None:
        key = (partition, replica)
        if key in self._calls:
            return
        self._calls.add(key)

        async def change() -> None:
            change = "removed from" if shrink else "added to"
            try:
                if shrink:
                    changed = await self.changer.shrink_isr(partition, epoch, replica)
                else:
                    changed = await self.changer.expand_isr(partition, epoch, replica)
            except EtcdError as exc:  # etcd out of reach: a later check tries again
                log.info(
                    "%s not %s the in-sync replicas of partition %d: %s; tried again at a later check",
                    replica,
                    change,
                    partition,
                    exc,
                )
            else:
                if changed:
                    (log.warning if shrink else log.info)(
                        "%s %s the in-sync replicas of partition %d", replica, change, partition
                    )
                else:
                    log.debug(
                        "%s not %s the in-sync replicas of partition %d: %s",
                        replica,
                        change,
                        partition,
                        self._why_not_changed(partition, epoch, replica),
                    )
            finally:
                self._calls.discard(key)

        task = asyncio.get_running_loop().create_task(change())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _why_not_changed(self, partition: int, epoch: int, replica: str) -> str:
        view = self.partitions.view
        if view.fenced:
            return "this broker is fenced"
        if replica not in view.members:
            return f"{replica} is not a live member"
        state = view.states.get(partition)
        if state is None or state.leader != view.node_id or state.epoch != epoch:
            return "the partition's leader or epoch changed"
        return "its state changed meanwhile"
