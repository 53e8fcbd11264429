"""Brokers of one cluster in one process, without etcd: static partition states set by the test.

Every broker is a real `Broker` (MQTT listener, commitlog, offsets API on free ports) running on one
event loop in a background thread; each has its own `ClusterView`, the leader's `LeaderReplication` as its
PUBLISH path's replication stage, `Followers` fetching from the leaders' members' endpoints (mutual TLS
under one cluster CA, as in production), the replica fetch endpoint there, and (unless
`peer_links=False`) the peer links over which leaders push steady-state replication.
`StaticIsr` (``tests.static_isr``) changes the in-sync sets of this cluster, whose states only the test and
the leaders change.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from broker_edge.cluster.links.member_api import bind_members_endpoint, serve_members_endpoint
from broker_edge.cluster.links.member_clients import MemberClients
from broker_edge.cluster.links.member_identity import MemberTls
from broker_edge.cluster.links.peer_link import PeerLink, PeerLinks
from broker_edge.cluster.replication.delivery import LocalDelivery
from broker_edge.cluster.replication.fetcher import FollowerConfig
from broker_edge.cluster.replication.follower import Followers
from broker_edge.cluster.replication.leader import LeaderReplication
from broker_edge.cluster.replication.replica_fetch import replica_fetch_route
from broker_edge.cluster.replication.replica_push import PUSH
from broker_edge.cluster.replication.stage import LeaderConfig
from broker_edge.cluster.view import ClusterView
from broker_edge.config.loader import load_dataclass
from broker_edge.engine.message import Message
from broker_edge.placement import Member, PartitionState
from broker_edge.runtime.broker import Broker
from broker_edge.runtime.local_pki import LocalPki
from broker_edge.settings.broker import BrokerConfig
from broker_edge.settings.cluster import MemberListenConfig, MemberTlsConfig
from broker_edge.storage.store import LogStore
from tests.static_isr import StaticIsr

T = TypeVar("T")


class _NoPublishes:
    """The peer links' receiver in a cluster whose tests publish on each partition's leader only."""

    def forwarded(self, link: PeerLink, batch: int, messages: list[Message]) -> None:
        raise AssertionError("publishes are not forwarded in the in-process cluster")

    def unlogged(self, message: Message) -> None:
        raise AssertionError("publishes are not forwarded in the in-process cluster")


class Node:
    """One broker of the cluster and its replication parts."""

    def __init__(self, cluster: InProcessCluster, node_id: str, directory: Path, settings: dict[str, Any]):
        self.cluster = cluster
        self.node_id = node_id
        self.directory = directory
        self.settings = settings
        document: dict[str, Any] = {
            "listeners": [{"name": "tcp", "type": "tcp", "host": "127.0.0.1", "port": 0}],
            "admin_http": {"enabled": False},
            "offsets_api": {"host": "127.0.0.1", "port": 0, "token": "reader-token"},
            "sys_topics": {"enabled": False},
            "limits": {"messages_per_second_per_client": 0},
            "storage": {"directory": str(directory), "durability": "group", **settings.get("storage", {})},
        }
        self.config = load_dataclass(BrokerConfig, document)
        self.broker = Broker(self.config)
        self.view = ClusterView(node_id, cluster.partitions)
        self.leader: LeaderReplication | None = None
        self.followers: Followers | None = None
        self.links: PeerLinks | None = None
        member = cluster.pki.member(node_id)
        tls_config = MemberTlsConfig(str(member.cert), str(member.key), str(cluster.pki.ca.cert))
        self.tls = MemberTls(tls_config, node_id)
        self.clients = MemberClients(node_id, self.tls)
        self.members_sock = bind_members_endpoint("127.0.0.1", 0)
        self.members_runner: Any = None

    @property
    def store(self) -> LogStore:
        assert self.broker.store is not None
        return self.broker.store

    @property
    def port(self) -> int:
        return self.broker.ports["tcp"]

    @property
    def member(self) -> Member:
        members_port = self.members_sock.getsockname()[1]
        return Member(
            self.node_id,
            f"127.0.0.1:{self.port}",
            f"http://127.0.0.1:{self.broker.offsets_port}",
            f"https://127.0.0.1:{members_port}",
        )

    def start_replication(self) -> None:
        """Install the leader stage and the fetch endpoint, start the followers (on the loop)."""
        cluster = self.cluster
        self.delivery = LocalDelivery(self.store, self.broker.router.publish, self.broker.replays)
        self.leader = LeaderReplication(
            self.view,
            self.store,
            cluster.isr,
            cluster.leader_config,
            route_committed=self.delivery.route_committed,
        )
        routes = [replica_fetch_route(self.leader.fetch, pushes=cluster.peer_links)]
        if cluster.peer_links:
            links = self.links = PeerLinks(self.node_id, self.clients, _NoPublishes())
            routes.append(links.add_routes)
            self.leader.serve_pushes(links)
            links.on(PUSH, lambda link, body: self.followers.pushed(link, body) if self.followers else None)
            self.view.on_change(self._members_changed)
            self._members_changed()
        self.broker.publish_path.replication = self.leader
        self.leader.start()
        self.start_followers()

        async def serve() -> None:
            self.members_runner = await serve_members_endpoint(
                self.members_sock,
                self.store,
                self.view,
                self.tls,
                MemberListenConfig(port=0),
                routes,
                self.broker.http_budget,
            )

        asyncio.get_running_loop().create_task(serve())

    def _members_changed(self) -> None:
        if self.links is not None:
            self.links.update({node: str(member.peer) for node, member in self.view.members.items()})

    async def stop_links(self) -> None:
        if self.links is not None:
            await self.links.close()
        if self.members_runner is not None:
            await self.members_runner.cleanup()
        await self.clients.close()

    def start_followers(self) -> None:
        assert self.leader is not None
        self.followers = Followers(
            self.view,
            self.store,
            self.delivery,
            self.clients,
            self.cluster.follower_config,
            epochs=self.leader.epochs,
            links=self.links,
        )
        self.followers.start()

    async def stop_followers(self) -> None:
        if self.followers is not None:
            await self.followers.stop()
            self.followers = None

    def durable_end(self, topic: str) -> int:
        return self.cluster.call(lambda: self.store.durable_end(topic))

    def committed_end(self, topic: str) -> int:
        return self.cluster.call(lambda: self.store.committed_end(topic))

    def payloads(self, topic: str) -> list[tuple[int, bytes]]:
        """(offset, payload) of the committed records of `topic`."""

        def read() -> list[tuple[int, bytes]]:
            if topic not in self.store:
                return []
            return [(r.offset, r.payload) for r in self.store.read(topic, 0, 100_000, 1 << 30)]

        return self.cluster.call(read)

    def frames(self, topic: str) -> list[bytes]:
        """The stored frames of `topic`'s records, in offset order (after making everything durable): what
        the record format defines, whatever the other topics of its partition log are."""

        async def read() -> list[bytes]:
            await self.store.wait_durable()
            store = self.store
            offset, end = store.start_offset(topic), store.durable_end(topic)
            frames: list[bytes] = []
            while offset < end:
                batch, count = store.replicated_log.read_frames(topic, offset, 1 << 20)
                frames += [bytes(frame) for frame in batch]
                offset += count
            return frames

        return self.cluster.run(read())


class InProcessCluster:
    """`nodes` brokers sharing one loop; `set_state` assigns partitions; `close()` stops everything."""

    def __init__(
        self,
        directory: Path,
        node_ids: Iterable[str],
        partitions: int = 1,
        leader_config: LeaderConfig | None = None,
        follower_config: FollowerConfig | None = None,
        peer_links: bool = True,
        **settings: Any,
    ) -> None:
        self.partitions = partitions
        self.peer_links = peer_links
        self.pki = LocalPki(directory / "cluster-pki")
        self.isr = StaticIsr()
        self.leader_config = leader_config or LeaderConfig(min_insync_replicas=2, replica_lag_max_ms=10_000)
        self.follower_config = follower_config or FollowerConfig(wait_ms=500)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="cluster", daemon=True)
        self._thread.start()
        self.nodes = {node_id: Node(self, node_id, directory / node_id, settings) for node_id in node_ids}
        for node in self.nodes.values():
            self.run(node.broker.start())
        members = {node_id: node.member for node_id, node in self.nodes.items()}
        for node in self.nodes.values():
            node.view.members.update(members)
            node.view.fenced = False
            self.isr.views.append(node.view)

    def __getitem__(self, node_id: str) -> Node:
        return self.nodes[node_id]

    def start_replication(self, states: Iterable[PartitionState]) -> None:
        states = list(states)

        def start() -> None:
            for node in self.nodes.values():
                node.view.states.update({state.partition: state for state in states})
            for node in self.nodes.values():
                node.start_replication()

        self.call(start)

    def set_state(self, state: PartitionState) -> None:
        self.call(lambda: self.isr.set(state))

    def state(self, partition: int = 0) -> PartitionState:
        return self.call(lambda: next(iter(self.nodes.values())).view.states[partition])

    def run(self, coroutine: Awaitable[T], timeout: float = 20) -> T:
        async def wrapped() -> T:
            return await coroutine

        return asyncio.run_coroutine_threadsafe(wrapped(), self.loop).result(timeout)

    def call(self, function: Callable[[], T], timeout: float = 10) -> T:
        future: Future[T] = Future()

        def run() -> None:
            try:
                future.set_result(function())
            except BaseException as error:
                future.set_exception(error)

        self.loop.call_soon_threadsafe(run)
        return future.result(timeout)

    def stop_node(self, node_id: str) -> None:
        """Stop one broker (its followers, leader stage, listeners and store), as a process would end."""
        node = self.nodes[node_id]

        async def stop() -> None:
            await node.stop_followers()
            if node.leader is not None:
                await node.leader.stop()
            await node.stop_links()
            await node.broker.stop()

        self.run(stop())
        self.isr.views.remove(node.view)

    def restart_node(self, node_id: str) -> Node:
        """Start a stopped node again on the same directory (new ports, so every view learns its address)."""
        old = self.nodes[node_id]
        node = self.nodes[node_id] = Node(self, node_id, old.directory, old.settings)
        self.run(node.broker.start())

        def join() -> None:
            other = self.isr.views[0]
            node.view.members.update(other.members)
            node.view.states.update(other.states)
            node.view.fenced = False
            self.isr.views.append(node.view)
            registration = max(view.registrations.get(node_id, 0) for view in self.isr.views) + 1
            for view in self.isr.views:
                view.members[node_id] = node.member
                view.registrations[node_id] = registration  # a new process registers anew
                view.changed()
            node.start_replication()

        self.call(join)
        return node

    def close(self) -> None:
        async def stop_all() -> None:
            for node in self.nodes.values():
                await node.stop_followers()
            for node in self.nodes.values():
                if node.leader is not None:
                    await node.leader.stop()
                await node.stop_links()
                if not node.broker.stopped.is_set():
                    await node.broker.stop()

        try:
            self.run(stop_all(), timeout=30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
            self.loop.close()
