"""A broker's part in its cluster: ``ClusterNode`` builds the cluster's parts and lets them into the engine.

The node sees its broker through ``BrokerHandle`` (the engine's router, PUBLISH path and cursors, the store,
the loop, the offsets API's routes, the HTTP memory budget) and enters the engine through its ports only: it
builds a ``ClusterPorts`` (``broker_edge.engine.ports``) from its parts and registers it once, when it starts.
What a broker alone runs is the engine without those ports; what a cluster adds is listed there, one port
each.

``Broker.start`` creates the node once its listeners and offsets API are bound (so the advertised addresses
default to the bound ports) and starts it; ``Broker.stop`` stops it before anything else closes. The node

- serves the members' endpoint (``member_api``: ``/v1/peer``, ``/v1/replica/fetch`` and the reads members
  make of each other, for members that prove their node id only) on its own port, and adds
  ``/v1/cluster`` to the readers' offsets API;
- keeps this node's ``ClusterView`` current: membership under an etcd lease (fencing when it cannot be
  renewed), the coordinator's watches, the controller campaign;
- makes the PUBLISH path a cluster member's: the leader's ``replication`` port (acks=all with
  ``min_insync_replicas``), the followers' fetchers (which route what becomes committed), and the
  ``forwarding`` port with the peer links for publishes on partitions led elsewhere and unlogged ones;
- makes sessions and wills cluster-wide (``sessions``, ``wills``): every CONNECT claims its client id in
  etcd first, taking the session over from the broker that holds it; wills are published once;
- fences: while ``view.fenced`` nothing is acknowledged (placement never appends here, the leader stage
  fails what it holds); once the fence is more than a blip (``fenced_clients``) MQTT clients are sent
  elsewhere (``BrokerCore.send_clients_elsewhere``: v5 DISCONNECT 0x9C "use another server" with the
  Server Reference of a member that answered it is a member now, the members in turn), never to a member as
  fenced as this one: while none answers so, they stay and CONNECTs are refused server unavailable.

Only a broker with a ``cluster:`` section imports this module. Given a ``view``, the node runs on it as is
(no etcd, no replication: forwarding and the peer links alone), which is how the data side is tested.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from broker_edge.cluster.cluster_info import cluster_info_route
from broker_edge.cluster.features.retained_sync import RetainedSync
from broker_edge.cluster.features.shared_directory import SharedDirectory
from broker_edge.cluster.features.shared_groups import SharedGroups, log_reader
from broker_edge.cluster.features.shared_registry import SharedRegistry
from broker_edge.cluster.fenced_clients import FencedClients, members_now
from broker_edge.cluster.forwarding import ClusterForwarding
from broker_edge.cluster.links.handoff import ConnectionHandoff
from broker_edge.cluster.links.member_api import bind_members_endpoint, serve_members_endpoint
from broker_edge.cluster.links.member_clients import MemberClients
from broker_edge.cluster.links.member_identity import MemberTls
from broker_edge.cluster.links.member_proofs import MemberProofs
from broker_edge.cluster.links.peer_link import PeerLinks
from broker_edge.cluster.partition_health import register_partition_metrics
from broker_edge.cluster.view import ClusterView
from broker_edge.config import ConfigError
from broker_edge.engine.ports import LOCAL_ONLY, AppendedRun, ClusterPorts, PublishRefused
from broker_edge.placement import Member

if TYPE_CHECKING:
    import socket

    from aiohttp import web

    from broker_edge.cluster.coordination.controller import Controller
    from broker_edge.cluster.coordination.coordinator import Coordinator
    from broker_edge.cluster.coordination.etcd import Etcd
    from broker_edge.cluster.coordination.link_holder import LinkHolder
    from broker_edge.cluster.coordination.membership import Membership
    from broker_edge.cluster.features.sessions import ClusterSessions
    from broker_edge.cluster.features.wills import ClusterWills
    from broker_edge.cluster.mirror_logs import ClusterMirrorLogs
    from broker_edge.cluster.reads.interest import LocalInterest
    from broker_edge.cluster.reads.log_starts import LogStarts
    from broker_edge.cluster.reads.remote_reads import RemoteReads
    from broker_edge.cluster.reads.remote_starts import RemoteStarts
    from broker_edge.cluster.replication.epochs import LeaderEpochs
    from broker_edge.cluster.replication.follower import Followers
    from broker_edge.cluster.replication.leader import LeaderReplication
    from broker_edge.engine.cursors import ReplayManager
    from broker_edge.engine.publish import PublishPath
    from broker_edge.engine.routing.router import Router
    from broker_edge.http.guard import GuardedRunner
    from broker_edge.observe.metrics import BrokerMetrics
    from broker_edge.security.acl import AccessControl
    from broker_edge.security.http_budget import MemoryBudget
    from broker_edge.settings.broker import BrokerConfig
    from broker_edge.settings.cluster import ClusterConfig
    from broker_edge.storage.store import LogStore

__all__ = ["BrokerHandle", "ClusterNode", "RefusingReplication", "advertised_member"]

log = logging.getLogger("broker_edge.cluster.node")

DIALED_MEMBERS = "members dialed"
"""The ``endpoint`` label of ``https_certificate_refusals_total`` for the connections this node dialed to
other members (peer links, kept-alive connections), closed for the certificate their member served."""
ETCD_TIMEOUT_S = 2.0
"""Bound of every etcd call (a lease renewal is bounded by its interval instead)."""


def _now_ms() -> int:
    """Wall-clock milliseconds, the clock of the records' timestamps."""
    return int(time.time() * 1000)


def _subscribed_here(router: Router, shared: SharedGroups) -> Callable[[str], bool]:
    """Whether a topic has a subscription on this member (an ordinary one, a shared group's member), or a
    shared group with members on any member whose records this member may assign (it leads the topic's
    partition, or led it: ``SharedGroups.may_assign``): both tries cache their answers per topic."""
    match, groups, may_assign = router.trie.match, shared.directory.match, shared.may_assign
    return lambda topic: bool(match(topic)) or (bool(groups(topic)) and may_assign(topic))


class BrokerHandle(Protocol):
    """The broker as its cluster node sees it (``runtime.broker.Broker`` is one): the engine's parts the
    cluster's parts work with, the runtime's store and loop, the bound ports it advertises, the offsets
    API it adds endpoints to, the memory budget its members' endpoint shares with the broker's other HTTP
    endpoints, and the two calls into the engine's core (joining, sending clients away)."""

    @property
    def config(self) -> BrokerConfig: ...

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    @property
    def store(self) -> LogStore | None: ...

    @property
    def router(self) -> Router: ...

    @property
    def publish_path(self) -> PublishPath: ...

    @property
    def replays(self) -> ReplayManager | None: ...

    @property
    def metrics(self) -> BrokerMetrics: ...

    @property
    def acl(self) -> AccessControl | None: ...

    @property
    def ports(self) -> dict[str, int]:
        """Listener name → bound port."""

    @property
    def offsets_port(self) -> int | None: ...

    @property
    def http_budget(self) -> MemoryBudget: ...

    def route_logged(self, topic: str, start: int, end: int) -> None:
        """Route committed records another broker wrote into the log (a site's downlink)."""

    def now(self) -> float: ...

    def add_offsets_api_routes(self, add: Callable[[web.Application], None]) -> None: ...

    def join_cluster(self, ports: ClusterPorts) -> None: ...

    def send_clients_elsewhere(self, server_references: Sequence[str], reason: str) -> int: ...

    def adopt_connection(self, record: dict[str, Any], sock: socket.socket, origin: str) -> None:
        """Take in a client's connection member ``origin`` on this host handed over
        (``cluster.links.handoff.Adopt``)."""


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def advertised_member(
    broker: BrokerHandle, cluster: ClusterConfig, members_port: int = 0, handoff: str | None = None
) -> Member:
    """This node's ``Member``: the advertised addresses, else the first listener's, the offsets API's and
    the members' endpoint's (bound to ``members_port``) bound addresses; ``handoff``: the name of its
    handoff socket."""
    config = broker.config
    mqtt = cluster.advertise.mqtt
    if mqtt is None:
        listener = config.listeners[0]
        mqtt = f"{_host(listener.host)}:{broker.ports[listener.name]}"
    offsets_api = cluster.advertise.offsets_api
    if offsets_api is None:
        api = config.offsets_api
        scheme = "https" if api.tls is not None else "http"
        offsets_api = f"{scheme}://{_host(api.host)}:{broker.offsets_port}"
    peer = cluster.advertise.peer
    if peer is None:
        scheme = "https" if cluster.tls is not None else "http"
        peer = f"{scheme}://{_host(broker.config.members_host(cluster))}:{members_port}"
    return Member(cluster.node_id, mqtt, offsets_api, peer, handoff)


class RefusingReplication:
    """The leader's ``Replication`` stage as the PUBLISH path sees it (the ``replication`` port): a batch
    the leader cannot commit (too few in-sync replicas, leadership lost, fenced) is a refusal (v5 0x83 with
    the reason), not a failure of the broker."""

    def __init__(self, leader: LeaderReplication) -> None:
        self.leader = leader

    def when_replicated(
        self, runs: Sequence[AppendedRun], done: Callable[[], None], failed: Callable[[BaseException], None]
    ) -> None:
        from broker_edge.cluster.replication.stage import ReplicationRefused

        def refuse(exc: BaseException) -> None:
            failed(PublishRefused(str(exc)) if isinstance(exc, ReplicationRefused) else exc)

        self.leader.when_replicated(runs, done, refuse)


class ClusterNode:
    """Everything of one broker that is about its cluster (see the module docstring)."""

    def __init__(self, broker: BrokerHandle, cluster: ClusterConfig, view: ClusterView | None = None) -> None:
        self.broker = broker
        self.cluster = cluster
        self.static = view is not None
        self.view = view if view is not None else ClusterView(cluster.node_id, cluster.partitions)
        self.member_tls = MemberTls(cluster.tls, cluster.node_id) if cluster.tls is not None else None
        self.clients = MemberClients(cluster.node_id, self.member_tls, self._dialed_certificate_refused)
        self.proofs = MemberProofs(self.view, max(5.0, 2.0 * cluster.lease_ttl_s))
        host = broker.config.members_host(cluster)
        try:
            self.members_sock = bind_members_endpoint(host, cluster.listen.port)
        except OSError as error:  # name the endpoint: several brokers on one host collide here first
            reason = error.strerror or str(error)
            where = f"{host}:{cluster.listen.port}"
            raise OSError(
                error.errno, f"cluster.listen (members) cannot listen on {where}: {reason}"
            ) from error
        self.members_port: int = self.members_sock.getsockname()[1]
        plain_tcp = any(each.tls is None and not each.websocket for each in broker.config.listeners)
        self.handoff = (
            self._handoff_socket()
            if cluster.hand_over_connections and plain_tcp and not self.static
            else None
        )
        """Where members on this host hand clients' connections to this one, and it to them (only with a
        plain TCP listener: the only connections that move)."""
        self.member = advertised_member(
            broker, cluster, self.members_port, self.handoff.name if self.handoff is not None else None
        )
        """This node's record: its advertised addresses."""
        self.members_routes: list[Callable[[web.Application], None]] = []
        """The members' endpoint's own routes (the peer link, replica fetches)."""
        self._members_runner: GuardedRunner | None = None
        self.forwarding = ClusterForwarding(
            self.view,
            broker.publish_path,
            broker.router,
            None,
            broker.loop,
            cluster.min_insync_replicas,
            cluster.forward_timeout_ms / 1000,
            cluster.redirect_publishers,
        )
        self.forwarding.handoff = self.handoff
        self.links = PeerLinks(
            cluster.node_id, self.clients, self.forwarding, self.proofs, self._dialed_certificate_refused
        )
        self.forwarding.links = self.links
        self.retained = RetainedSync(
            broker.router, self.view, self.links, broker.loop, cluster.retained_snapshot_timeout_ms / 1000
        )
        self.etcd: Etcd | None = None
        self.membership: Membership | None = None
        self.coordinator: Coordinator | None = None
        self.controller: Controller | None = None
        self.leader: LeaderReplication | None = None
        self.followers: Followers | None = None
        self.sessions: ClusterSessions | None = None
        self.wills: ClusterWills | None = None
        self.interest: LocalInterest | None = None
        self.epochs: LeaderEpochs | None = None
        self.remote_reads: RemoteReads | None = None
        self.log_starts: LogStarts | None = None
        self.remote_starts: RemoteStarts | None = None
        self.mirror_logs: ClusterMirrorLogs | None = None
        self.link_holder: LinkHolder | None = None
        """On a site: campaigns for its uplink, run by the member holding it (``hold_uplink``)."""
        if not self.static:
            self._build_coordination_and_replication()
        self.fenced_clients = FencedClients(
            self.view,
            self.membership,
            cluster.fenced_clients_hold_ms / 1000,
            self._move_clients,
            partial(members_now, self.view, self.clients),
        )
        if not self.static:
            self._build_sessions()
        directory = SharedDirectory()
        self.shared_registry = SharedRegistry(
            cluster.node_id, directory, self.etcd, cluster.key_prefix, self.membership
        )
        self.shared_registry.count_existing(broker.router.trie.subscriptions())
        reader = log_reader(broker.store) if broker.store is not None else None
        self.shared = SharedGroups(
            broker.router,
            self.view,
            self.links,
            directory,
            broker.loop,
            reader,
            cluster.shared_finished_remembered,
            cluster.shared_resend_ms / 1000,
        )
        if self.epochs is not None:
            self.shared.epoch_of = self.epochs.epoch_at
        if self.sessions is not None:
            self.sessions.shared_in_flight = self.shared
        if self.followers is not None:
            self.followers.delivery.wants = _subscribed_here(broker.router, self.shared)
        self.members_routes.append(self.links.add_routes)
        self.members_routes.append(cluster_info_route(self.view))  # a fenced member asks who is a member
        broker.add_offsets_api_routes(cluster_info_route(self.view, self._observer_status))
        self._started = False
        self._sessions_to: set[str] = set()
        """Members this node may hold HTTP sessions to (their connections are closed when they leave)."""
        self._closing: set[asyncio.Task[None]] = set()

    def _handoff_socket(self) -> ConnectionHandoff | None:
        """This member's handoff socket, or None (logged) where the system has none (abstract Unix
        sockets are Linux's)."""
        family = self.broker.metrics.counter(
            "connections_handed_over",
            "Client connections moved between the members on this host, by outcome: out (handed to the "
            "member leading their topic's partition), in (taken in from another member), stayed (held for "
            "moving, then read here again).",
            ["outcome"],
        )
        counts = {outcome: family.labels(outcome=outcome) for outcome in ("out", "in", "stayed")}
        try:
            return ConnectionHandoff(
                self.cluster.node_id,
                self.broker.loop,
                self.broker.adopt_connection,
                lambda outcome: counts[outcome].inc(),
            )
        except OSError as exc:
            log.warning("no handoff socket (%s): clients' connections stay where they arrive", exc)
            return None

    def _build_coordination_and_replication(self) -> None:
        from broker_edge.cluster.coordination.controller import Controller
        from broker_edge.cluster.coordination.coordinator import Coordinator
        from broker_edge.cluster.coordination.etcd import ClusterKeys, Etcd
        from broker_edge.cluster.coordination.membership import Membership
        from broker_edge.cluster.reads.interest import LocalInterest, RetainedRefresh
        from broker_edge.cluster.replication.delivery import LocalDelivery
        from broker_edge.cluster.replication.epochs import LeaderEpochs
        from broker_edge.cluster.replication.fetcher import FollowerConfig
        from broker_edge.cluster.replication.follower import Followers
        from broker_edge.cluster.replication.leader import LeaderReplication
        from broker_edge.cluster.replication.replica_fetch import replica_fetch_route
        from broker_edge.cluster.replication.replica_push import PUSH
        from broker_edge.cluster.replication.stage import LeaderConfig

        broker, cluster, view = self.broker, self.cluster, self.view
        store = broker.store
        if store is None:
            raise RuntimeError("a cluster node needs the commitlog (storage.enabled)")
        keys = ClusterKeys(cluster.key_prefix)
        self.etcd = Etcd(cluster.etcd, ETCD_TIMEOUT_S, cluster.etcd_tls, cluster.etcd_auth)
        self.membership = Membership(self.etcd, keys, self.member, view, cluster.lease_ttl_s)
        self.coordinator = Coordinator(self.etcd, keys, view, self.membership)
        self.controller = Controller(
            self.etcd,
            keys,
            view,
            self.coordinator,
            self.membership,
            cluster,
            clients=self.clients,
            proofs=self.proofs,
        )
        store.replicated_log.enable(cluster.hw_checkpoint_interval_ms / 1000)
        epochs = self.epochs = LeaderEpochs(store)
        delivery = LocalDelivery(store, broker.router.publish, broker.replays, live_from_ms=_now_ms())
        followed = broker.metrics.counter(
            "followed_records",
            "Committed records this member routes as a follower (or inherited as a new leader), by outcome: "
            "routed to its subscribers, or passed over undecoded (no subscription here matches the topic).",
            ["outcome"],
        )
        followed.labels("routed").set_function(lambda: delivery.records_routed)
        followed.labels("passed_over").set_function(lambda: delivery.records_passed_over)
        register_partition_metrics(
            broker.metrics, view, cluster.replication_factor, cluster.min_insync_replicas
        )
        self.leader = LeaderReplication(
            view,
            store,
            self.coordinator,
            LeaderConfig(cluster.min_insync_replicas, cluster.replica_lag_max_ms),
            epochs,
            route_committed=delivery.route_committed,
        )
        self.leader.serve_pushes(self.links)
        interest = self.interest = LocalInterest(view)
        interest.count_existing(broker.router.trie.subscriptions())
        self.followers = Followers(
            view,
            store,
            delivery,
            self.clients,
            FollowerConfig(unclean_election=cluster.unclean_election),
            epochs=epochs,
            links=self.links,
            interest=interest,
            retained=RetainedRefresh(broker.router, view, self.links),
        )
        if broker.replays is not None:
            from broker_edge.cluster.reads.log_starts import LogStarts
            from broker_edge.cluster.reads.remote_reads import RemoteReads
            from broker_edge.cluster.reads.remote_starts import RemoteStarts

            self.remote_reads = RemoteReads(
                view, self.followers, self._log_here, broker.replays, self.clients
            )
            self.log_starts = LogStarts(store, view, self.links)
            self.remote_starts = RemoteStarts(
                view,
                self.log_starts,
                self._copy_here,
                self.followers.observed_logs,
            )
        self.links.on(PUSH, self.followers.pushed)
        self.members_routes.append(replica_fetch_route(self.leader.fetch, pushes=True))
        self._build_mirror_logs(store, self.leader)

    def _build_mirror_logs(self, store: LogStore, leader: LeaderReplication) -> None:
        """The ``mirror_logs`` port (an uplink hub's sites' logs, on their partitions' leaders) and its
        members' endpoint routes."""
        from broker_edge.cluster.mirror_logs import ClusterMirrorLogs
        from broker_edge.cluster.reads.logs_elsewhere import LogsElsewhere

        cluster = self.cluster
        starts = self.log_starts
        self.mirror_logs = ClusterMirrorLogs(
            self.view,
            store,
            leader,
            leader.refusal,
            self.clients,
            (cluster.forward_timeout_ms / 1000) + cluster.lease_ttl_s,
            LogsElsewhere(self.view, starts, self._copy_here, self.clients) if starts is not None else None,
            self.broker.route_logged if self.broker.config.uplink is not None else None,
        )
        self.members_routes.append(self.mirror_logs.add_routes)

    def _build_sessions(self) -> None:
        """Cluster-wide sessions and wills (``sessions``, ``wills``): CONNECT claims its client id first."""
        from broker_edge.cluster.features.sessions import ClusterSessions
        from broker_edge.cluster.features.sessions_registry import SessionRegistry
        from broker_edge.cluster.features.wills import ClusterWills

        assert self.etcd is not None
        broker = self.broker
        registry = SessionRegistry(self.etcd, self.cluster.key_prefix)
        self.sessions = ClusterSessions(
            broker, registry, self.view, self.links, self.cluster, self.fenced_clients.referrals
        )
        self.sessions.forwards_settled = partial(
            self.forwarding.settle,
            timeout_s=min(self.cluster.forward_timeout_ms, self.cluster.session_handover_timeout_ms // 2)
            / 1000,
        )
        if self.followers is not None:
            self.sessions.observed_logs = self.followers.observed_logs
        self.sessions.remote_starts = self.remote_starts
        if self.handoff is not None:
            self.handoff.claims = self.sessions  # the records of the connections it moves go with them
        wills = self.wills = ClusterWills(
            self.sessions, registry, self.view, broker.publish_path.publish, self.sessions.tasks, broker.loop
        )
        self.view.on_change(wills.view_changed)

    def ports(self) -> ClusterPorts:
        """Every port this node lets into the engine: its parts, each where the engine asks."""
        return ClusterPorts(
            forwarding=self.forwarding,
            replication=RefusingReplication(self.leader) if self.leader is not None else LOCAL_ONLY,
            sessions=self.sessions,
            wills=self.wills,
            shared_dispatch=self.shared,
            shared_members=self.shared_registry,
            retained_sync=self.retained,
            interest=self.interest,
            subscribe_gate=self.followers,
            remote_logs=self.remote_reads,
            remote_starts=self.remote_starts,
            mirror_logs=self.mirror_logs,
        )

    def _certificate_refused(self, reason: str) -> None:
        """A request on the members' endpoint refused for its connection's certificate, counted."""
        refusals = self.broker.metrics.https_certificate_refusals_total
        refusals.labels("members' endpoint", reason).inc()

    def _dialed_certificate_refused(self, reason: str) -> None:
        """A connection this node dialed to another member (a peer link, a kept-alive connection) closed for
        the certificate that member served, counted."""
        refusals = self.broker.metrics.https_certificate_refusals_total
        refusals.labels(DIALED_MEMBERS, reason).inc()

    async def start(self) -> None:
        """Serve as a member: the engine takes this node's ports first (fenced until registered, so nothing
        is appended here yet), then follow the cluster's state, register, campaign for controller. A node
        that cannot reach etcd starts fenced and keeps trying."""
        if self.leader is not None and self.followers is not None:
            self.leader.start()
            self.followers.start()
        self.broker.join_cluster(self.ports())
        store = self.broker.store
        if store is None:
            raise RuntimeError("a cluster node needs the commitlog (storage.enabled)")
        self._members_runner = await serve_members_endpoint(
            self.members_sock,
            store,
            self.view,
            self.member_tls,
            self.cluster.listen,
            self.members_routes,
            self.broker.http_budget,
            self._certificate_refused,
        )
        if self.handoff is not None:
            self.handoff.start()
        self.view.on_change(self._view_changed)
        self._started = True
        self._view_changed()
        self.retained.start()
        self.shared.start()
        self.shared_registry.start()
        if self.coordinator is not None and self.membership is not None and self.controller is not None:
            try:
                await self.coordinator.start()
                # The first registration needs no re-read (the coordinator has just read everything); a
                # re-read restarts the coordinator's watch, and cancelling an etcd watch still being
                # created can deadlock the etcd client. Later registrations (after a lost lease) re-read.
                self.membership.before_unfence = None
                await self.membership.start()
                self.membership.before_unfence = self.coordinator.resync
                await self.controller.start()
                if self.sessions is not None:
                    self.sessions.start()
            except ConfigError:  # said once, as a configuration error (exit 2)
                raise
            except Exception:
                log.exception("joining the cluster failed")
                raise
            log.info(
                "cluster node %s (mqtt %s, offsets API %s) on etcd %s under %s",
                self.member.node_id,
                self.member.mqtt,
                self.member.offsets_api,
                ",".join(self.cluster.etcd),
                self.cluster.key_prefix,
            )

    def hold_uplink(self, hold: Callable[[], None], release: Callable[[], Awaitable[None]]) -> None:
        """Run a site's uplink (``hold()``) while this member holds it, one member of the cluster at a time
        (``coordination.link_holder``); ``release()`` stops it."""
        from broker_edge.cluster.coordination.etcd import ClusterKeys
        from broker_edge.cluster.coordination.link_holder import LinkHolder

        membership = self.membership
        if self.etcd is None or membership is None:
            raise RuntimeError("a site's uplink on a cluster needs etcd")
        view = self.view
        self.link_holder = LinkHolder(
            self.etcd,
            ClusterKeys(self.cluster.key_prefix).uplink,
            self.cluster.node_id,
            lambda: None if view.fenced else membership.lease_id,
            hold,
            release,
            membership.interval_s / 2,
        )
        self.link_holder.start()

    async def stop(self) -> None:
        """Leave the cluster now (the lease is revoked, so the others need not wait for it to expire), then
        stop replicating and forwarding."""
        if not self._started:
            return
        self._started = False
        self.fenced_clients.close()
        if self.handoff is not None:
            self.handoff.close()
        if self.link_holder is not None:
            await self.link_holder.stop()
        if self.sessions is not None:
            await self.sessions.stop()
        if self.controller is not None:
            await self.controller.stop()
        if self.membership is not None:
            await self.membership.stop()
        self.forwarding.fail_waiting("the broker is shutting down")
        await self.retained.stop()
        await self.shared_registry.stop()
        await self.shared.stop()
        if self.leader is not None:
            await self.leader.stop()
        if self.followers is not None:
            await self.followers.stop()
        if self.remote_reads is not None:
            await self.remote_reads.stop()
        if self.remote_starts is not None:
            await self.remote_starts.stop()
        await self.links.close()
        if self._members_runner is not None:
            await self._members_runner.cleanup()
        await self.clients.close()
        if self.coordinator is not None:
            await self.coordinator.stop()
        if self.etcd is not None:
            await self.etcd.close()

    def reload_credentials(self) -> None:
        """SIGHUP: read this member's certificate, key and cluster CAs again (new connections between
        members use them; open ones keep theirs), and open a new etcd channel with etcd's client
        certificate and password as they are now. A file that does not load keeps the old ones."""
        if self.member_tls is not None:
            try:
                self.member_tls.reload()
            except Exception as exc:
                log.error("member certificate not reloaded, the previous one stays in force: %s", exc)
        if self.etcd is not None and (
            self.cluster.etcd_tls is not None or self.cluster.etcd_auth is not None
        ):
            self.etcd.renew()

    def _log_here(self, topic: str) -> bool:
        """Whether this node's log of ``topic`` is complete: it holds a complete copy of its partition."""
        return self._copy_here(self.view.partition_of(topic))

    def _copy_here(self, number: int) -> bool:
        """Whether this node holds a complete copy of partition ``number``: it leads it, or replicates it and
        has caught up since it was given the copy (an observer's log is not complete: its sessions keep that
        partition's messages while offline instead of reading the log, and read backlogs from the leader)."""
        state = self.view.states.get(number)
        me = self.view.node_id
        if state is None or (state.leader != me and me not in state.replicas):
            return False
        return self.followers is None or self.followers.copy_complete(number)

    def _observer_status(self) -> dict[str, Any]:
        """What this node observes (``GET /v1/cluster``'s ``observer``)."""
        followers = self.followers
        if followers is None:
            return {"partitions": [], "fetches": {}}
        fetches = {str(number): count for number, count in sorted(followers.observer_fetches.items())}
        return {"partitions": followers.observed, "fetches": fetches}

    def _view_changed(self) -> None:
        if not self._started:
            return
        view = self.view
        self.proofs.changed()
        self.links.update({node: member.peer for node, member in view.members.items() if member.peer})
        for node in self._sessions_to - set(view.members):
            task = asyncio.get_running_loop().create_task(self.clients.forget(node))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        self._sessions_to = set(view.members)
        self.forwarding.retry()
        self.fenced_clients.view_changed()

    def _move_clients(self, why: str, references: list[str]) -> None:
        """Fenced (``why``): send every MQTT client to the members at ``references``, spread over them (none:
        no other member answered; the clients are disconnected, each finds a member by itself)."""
        moved = self.broker.send_clients_elsewhere(references, "this broker lost its cluster membership")
        log.warning(
            "fenced (%s): disconnected %d clients%s",
            why,
            moved,
            f", pointing v5 clients at {', '.join(references)}"
            if references
            else " (no other member answered: none named)",
        )
