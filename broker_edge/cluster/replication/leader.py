"""The leader's side of the replicated log, its parts together: the PUBLISH path's ``Replication`` stage, the
server of its followers' fetches and pushes, the check of its in-sync replicas.

Each partition's truth is its ``cluster.partition.Partition`` (leadership, high watermark, inherited and
uncommitted ranges, the sessions serving it). The parts work on those: ``stage`` holds each durable batch
until the in-sync replicas hold it; ``fetch_server`` answers fetches from sessions (``sessions``) and moves
the partitions' high watermarks as followers report their positions; ``push_server`` serves the same sessions
over the peer links; ``isr_checker`` shrinks and expands the in-sync sets. ``LeaderReplication`` builds them
over one ``Partitions``, follows the view (a partition taken over, lost, or a newer epoch seen by a follower)
and starts and stops them.

Wiring (a cluster node): once the store is open and before MQTT listeners accept publishes, construct it
(the store's readers then see committed records only), set it as the PUBLISH path's ``replication``, add
``replica_fetch_route(leader.fetch)`` to the members' endpoint, and call ``start()`` on the loop; ``await
stop()`` before the store closes. While the view is fenced, every logged publish is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from broker_edge.cluster.partition import Partitions
from broker_edge.observe import path_trace

from .epochs import LeaderEpochs
from .fetch_server import FetchServer
from .isr_checker import IsrChanger, IsrChecker
from .push_server import PushServer
from .stage import LeaderConfig, NotLeader, ReplicationStage

if TYPE_CHECKING:
    from broker_edge.cluster.links.peer_link import PeerLinks
    from broker_edge.cluster.view import ClusterView
    from broker_edge.engine.ports import AppendedRun
    from broker_edge.storage.store import LogStore

    from .replica_fetch import FetchRequest, FetchResponse

__all__ = ["LeaderReplication"]

log = logging.getLogger(__name__)


class LeaderReplication:
    """The ``Replication`` stage of a cluster node and the server of its followers (see the module)."""

    def __init__(
        self,
        view: ClusterView,
        store: LogStore,
        isr_changer: IsrChanger,
        config: LeaderConfig | None = None,
        epochs: LeaderEpochs | None = None,
        clock: Callable[[], float] = time.monotonic,
        route_committed: Callable[[str, int, int], None] | None = None,
    ) -> None:
        """`route_committed(topic, start, end)` delivers records a follower appended before this node took
        the lead, once committed (the PUBLISH path routes only its own): `LocalDelivery.route_committed`."""
        self.view = view
        self.store = store
        self.config = config or LeaderConfig()
        self.epochs = epochs if epochs is not None else LeaderEpochs(store)
        self._clock = clock
        store.replicated_log.enable()  # from construction on: nothing appended is seen before it is committed
        if path_trace.ON:
            path_trace.set_node(view.node_id)
        self.partitions = Partitions(view, store, route_committed)
        self.stage = ReplicationStage(self.partitions, self.epochs, self.config, clock)
        self.fetches = FetchServer(
            self.partitions, self.epochs, self.stage.complete_ready, self._view_changed, clock
        )
        self.pushes = PushServer(self.fetches, self.stage.complete_ready, clock)
        self.isr = IsrChecker(self.partitions, self.fetches, isr_changer, self.config, clock)
        self._checker: asyncio.Task[None] | None = None
        self._started = False

    # -- lifecycle -----------------------------------------------------------------------------------

    def start(self) -> None:
        """Know the store's topics by partition, follow the view, check the followers' lag periodically."""
        if self._started:
            return
        self._started = self.fetches.serving = True
        self.partitions.learn_topics()
        self.view.on_change(self._view_changed)
        self._view_changed()
        self._checker = asyncio.get_running_loop().create_task(self._check_forever())

    async def stop(self) -> None:
        """Fail what is pending, answer parked fetches, stop the lag checks."""
        self._started = self.fetches.serving = False
        self.stage.fail_all(NotLeader("the broker is stopping"))
        self.fetches.wake_all()
        tasks = [task for task in (self._checker, *self.isr.tasks) if task is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- what the node and the PUBLISH path ask --------------------------------------------------------

    def leads(self, number: int) -> bool:
        """Whether this node leads partition ``number`` now."""
        return self.stage.leads(number)

    def refusal(self, topic: str) -> str | None:
        """Why a logged publish on ``topic`` would be refused now (None: it may be appended)."""
        return self.stage.refusal(topic)

    def when_replicated(
        self, runs: Sequence[AppendedRun], done: Callable[[], None], failed: Callable[[BaseException], None]
    ) -> None:
        """The ``Replication`` port: ``done`` once every in-sync replica holds ``runs`` (``stage``)."""
        self.stage.when_replicated(runs, done, failed)

    async def fetch(self, request: FetchRequest) -> FetchResponse:
        """Serve one replica fetch (``fetch_server``)."""
        return await self.fetches.fetch(request)

    def serve_pushes(self, links: PeerLinks) -> None:
        """Take followers' acknowledgements on the peer links and push their sessions (``push_server``)."""
        self.pushes.serve(links)

    def check_isr(self) -> None:
        """Shrink or expand the in-sync sets of the partitions led here now (``isr_checker``)."""
        self.isr.check()

    @property
    def fetches_served(self) -> int:
        """HTTP fetches answered (a steady state over the peer link answers none)."""
        return self.fetches.fetches_served

    @property
    def pushes_sent(self) -> int:
        """Pushes sent over peer links, keepalives excluded."""
        return self.pushes.pushes_sent

    @property
    def acks_received(self) -> int:
        return self.pushes.acks_received

    # -- the view -------------------------------------------------------------------------------------

    def _view_changed(self) -> None:
        """Partitions taken over, lost, or stepped down from: fail what cannot be acknowledged any more, drop
        the sessions of members that left or registered again, wake those a change broke, take the tails a
        new lead inherits, move what can be committed."""
        view = self.view
        partitions = self.partitions
        for number, state in view.states.items():
            partition = partitions.number(number)
            if partition.newer_epoch is not None and state.epoch >= partition.newer_epoch:
                partition.newer_epoch = None
        stage = self.stage
        if view.fenced:
            stage.fail_all(NotLeader("this broker is fenced (its etcd lease is not confirmed)"))
        elif stage.leadership_lost():
            stage.fail_all(NotLeader("partition leadership moved"))
        self.fetches.forget_departed()
        self.fetches.wake_broken()
        taken = [
            partitions.number(number)
            for number in view.states
            if partitions.number(number).led_since is None and partitions.number(number).leads()
        ]
        if taken:
            partitions.learn_topics()  # topics a follower created since the last look
        now = self._clock()
        for partition in taken:
            partition.take_lead(now)
        for partition in partitions:
            if partition.led_since is not None and not partition.leads():
                partition.led_since = None
        for partition in partitions:
            for topic in list(partition.uncommitted):
                partition.advance(topic)
        stage.complete_ready()

    async def _check_forever(self) -> None:
        interval = min(0.25, self.config.replica_lag_max_ms / 4000)
        while True:
            await asyncio.sleep(interval)
            try:
                self.isr.check()
                self.pushes.keep_alive()
            except Exception:
                log.exception("in-sync replica check failed")
