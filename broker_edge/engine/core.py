"""The broker's shared parts without any I/O: what every connection and handler works with.

``BrokerCore`` holds the configuration, the router, the PUBLISH path, the ACL, the password file, the
connection admission, the slow-subscriber policy and the counters, and implements ``ConnectionHost`` on top
of three primitives: a clock (``now``), "run at the end of this loop iteration" (``call_soon``) and a timer
(``call_later``).
``server.Broker`` gives them the event loop and adds listeners, storage, HTTP and the sweep; the handler unit
tests give them a clock and a queue they drive by hand, so bytes can be fed to a ``Connection`` with no socket
and no event loop.

A cluster enters here and nowhere else: ``join_cluster`` takes its ports (``broker_edge.engine.ports``) once
and hands each part of the engine those it asks.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, cast

from broker_edge.engine.connection.states import AUTHENTICATING, CLOSED, CONNECTED
from broker_edge.engine.cursors import ReplayManager
from broker_edge.engine.handlers.connect import refuse_elsewhere
from broker_edge.engine.ports import ALONE, ClusterPorts
from broker_edge.engine.publish import PublishPath
from broker_edge.engine.routing.retained import RetainedBounds
from broker_edge.engine.routing.router import Router
from broker_edge.engine.slow_subscribers import HeldPublisher, SlowSubscribers
from broker_edge.observe.counters import BrokerCounters
from broker_edge.observe.logs import connection_logger
from broker_edge.protocol.reason_codes import ReasonCode
from broker_edge.security.acl import AccessControl
from broker_edge.security.auth import PasswordFile
from broker_edge.security.login_backoff import LoginBackoff
from broker_edge.security.topic_quota import TopicShares

if TYPE_CHECKING:
    import asyncio

    from broker_edge.engine.connection.connection import Connection
    from broker_edge.engine.connection.outgoing import Outgoing
    from broker_edge.engine.connection.reading import PeerPartial
    from broker_edge.engine.message import Message
    from broker_edge.engine.sessions.session import Session
    from broker_edge.observe.metrics import BrokerMetrics
    from broker_edge.settings.broker import BrokerConfig
    from broker_edge.storage.store import LogStore

__all__ = ["BrokerCore"]

_refusals_log = logging.getLogger("broker_edge.connection")


class BrokerCore:
    """Config, router, PUBLISH path, ACL, passwords, admission and counters of one broker (no I/O)."""

    def __init__(self, config: BrokerConfig, metrics: BrokerMetrics) -> None:
        self.config = config
        self.metrics = metrics
        self.counters = BrokerCounters()
        retain = config.retain
        self.router = Router(
            config.limits,
            retained=RetainedBounds(
                retain.max_retained, retain.max_retained_bytes, retain.max_retained_bytes_per_client
            ),
            retain_enabled=config.retain.enabled,
            count_drop=self.counters.drop,
            clock=self.now,
        )
        self.router.retained_refused = self._retained_refused
        self.router.drop_for = self._dropped_for
        self.publish_path = PublishPath(self.router, self.counters, metrics, self.call_soon)
        self.publish_path.keeps_qos2_ids = config.storage.record_format >= 2
        self.slow_subscribers = SlowSubscribers(
            config.limits, self.counters, self.now, self.call_soon, self._connection_of
        )
        """What becomes of QoS 0 messages for a subscriber whose write buffer is full."""
        self.router.publish_through = self.publish_path.publish
        self.cluster: ClusterPorts = ALONE
        """The ports of the cluster this broker is a member of (``join_cluster``); ``ALONE`` otherwise."""
        self.reserved_topics: Callable[[str], bool] | None = None
        """Topics only another writer writes here (a site's link sets the downlink its hub writes): a client's
        PUBLISH to one is refused as not authorized."""
        self.acl: AccessControl | None = None
        if config.acl.rules or config.acl.file or config.acl.default:
            self.acl = AccessControl.from_config(config.acl)
        self.passwords: PasswordFile | None = None
        if config.auth.password_file:
            self.passwords = PasswordFile.load(config.auth.password_file)
        self.replays: ReplayManager | None = None
        """Log cursors and replays, set once a commitlog is open."""
        self.admission = config.limits.connection_admission()
        self.login_backoff = LoginBackoff(config.auth.failed_logins)
        self.topic_shares = TopicShares(config.limits.max_topics_per_identity)
        self.partial_bytes = 0
        """Bytes of packets not fully arrived, all connections (at most limits.max_partial_packet_bytes)."""
        self.partial_peers: dict[str, PeerPartial] = {}
        """Client address → its packets not fully arrived (``engine.connection.reading``)."""
        self._unattached: dict[Connection, None] = {}
        """Open connections that are not their session's connection: before and during CONNECT, and taken
        over while they close (a dict used as a set: its table grows more densely than a set's). A connected
        client is reached through its session (``connections``), so it costs no entry of its own here."""
        self._dirty: list[Outgoing] = []
        self._flush_scheduled = False

    @property
    def connections(self) -> list[Connection]:
        """Open connections: the unattached ones, then those of the sessions (for the sweep, shutdown and
        counts, never per message)."""
        return list(self._open_connections())

    def connection_count(self) -> int:
        """How many connections ``connections`` would list, counted without building that list."""
        return sum(1 for _ in self._open_connections())

    def _open_connections(self) -> Iterator[Connection]:
        unattached = self._unattached
        yield from unattached
        for session in self.router.sessions.values():
            conn = session.connection
            if conn is not None and conn not in unattached:
                yield cast("Connection", conn)  # every session's connection is one of this broker's

    # -- what the runtime attaches --------------------------------------------------------------------------

    def attach_store(self, store: LogStore, loop: asyncio.AbstractEventLoop | None) -> ReplayManager:
        """Log into ``store`` from now on: the PUBLISH path appends to it and the log cursors read it (their
        deferred pumps run on ``loop``)."""
        replays = self.replays = ReplayManager(store, loop, self.router.count_drop)
        replays.join_cluster(self.cluster)
        self.router.replays = replays
        self.publish_path.attach_store(store, replays)
        return replays

    def join_cluster(self, ports: ClusterPorts) -> None:
        """Run as a member of the cluster whose ``ports`` these are; once, before the member serves."""
        if self.cluster is not ALONE:
            raise RuntimeError("this broker has joined a cluster already")
        self.cluster = ports
        self.router.join_cluster(ports)
        self.publish_path.join_cluster(ports)
        if self.replays is not None:
            self.replays.join_cluster(ports)

    def send_clients_elsewhere(self, server_references: Sequence[str], reason: str) -> int:
        """Disconnect every client so that it reconnects to another broker (the cluster fenced this one): v5
        clients get DISCONNECT 0x9C "use another server" with one of ``server_references``, in turn, so that
        no one broker takes them all, or 0x8B when there is none. A CONNECT still under way is answered
        (``connect.refuse_elsewhere``: CONNACK 0x9C with a reference) rather than cut; a connection that
        has sent no CONNECT yet stays open, for the cluster's claim to answer its CONNECT the same way.
        Returns how many connections there were."""
        connections = self.connections
        references = itertools.cycle(server_references) if server_references else None
        for conn in connections:
            if conn.state == AUTHENTICATING:
                refuse_elsewhere(self, conn, references)
            elif conn.state != CONNECTED:
                continue
            elif conn.terms.v5 and references is not None:
                conn.redirect(next(references), reason)
            else:
                conn.close(ReasonCode.SERVER_SHUTTING_DOWN, reason)
        return len(connections)

    def _connection_of(self, client_id: str) -> HeldPublisher | None:
        """The open connection of the client ``client_id`` on this broker, if any."""
        session = self.router.sessions.get(client_id)
        conn = session.connection if session is not None else None
        return cast("Connection | None", conn)  # every session's connection is one of this broker's

    # -- the primitives a runtime provides ------------------------------------------------------------------

    def now(self) -> float:
        """Monotonic seconds (the clock asyncio and uvloop read for ``loop.time()``)."""
        return time.monotonic()

    def call_soon(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` at the end of this loop iteration."""
        raise NotImplementedError

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        """Run ``callback`` in ``delay`` seconds."""
        raise NotImplementedError

    def _dropped_for(self, session: Session, reason: str, message: Message) -> None:
        """A message the policy kept from ``session`` (its queue full): counted, and said naming it."""
        conn = cast("Connection | None", session.connection)
        client_id = session.client_id
        self.counters.drop_for(
            reason,
            self.now(),
            conn.log if conn is not None else (lambda: connection_logger(client_id, "-", "")),
            f"message dropped: {reason} (the session's queue is at limits.max_offline_messages or "
            "max_offline_bytes)",
            topic=message.topic,
            qos=message.qos,
        )

    def _retained_refused(self, message: Message, reason: str, size: int) -> None:
        """A retained message over its bounds: delivered, not kept; said in a rate-limited WARNING."""
        self.counters.refusal_log.write(
            _refusals_log,
            self.now(),
            reason,
            f"retained message not kept: {reason}",
            action="retain",
            client_id=message.origin,
            topic=message.topic,
            bytes=size,
        )

    # -- the ConnectionHost interface -----------------------------------------------------------------------

    def verify_password(self, username: str, password: bytes | None, done: Callable[[bool], None]) -> None:
        """Check the password here, answer in ``call_soon`` (the broker overrides it to hash off the loop)."""
        ok = self.passwords is not None and self.passwords.verify(username, password)
        self.call_soon(lambda: done(ok))

    def connection_opened(self, conn: Connection) -> None:
        now = self.now()
        refusal = self.admission.admit(now, conn.peer_host(), new=not conn.handed_in)
        conn.deadline = now + self.config.limits.connect_timeout_s
        self._unattached[conn] = None
        if refusal is not None:
            conn.refused = refusal
            self.counters.refused(refusal)
            if refusal != "rate":  # a rate refusal waits for CONNECT, to tell a v5 client why
                conn.close()
                conn.state = CLOSED

    def connection_closed(self, conn: Connection, was_connected: bool) -> None:
        self._unattached.pop(conn, None)
        certificate_ends = conn.terms.listener.certificate_ends
        if certificate_ends is not None:
            certificate_ends.forget(conn)
        if conn.terms.paused:
            self.slow_subscribers.resumed(conn)  # its publishers are read again
        if conn.refused is None:
            self.admission.release()
        if was_connected:
            conn.terms.listener.metrics.disconnected()
            claims = self.cluster.sessions
            session = conn.session
            if claims is not None and session is not None and session.connection is conn:
                claims.connection_ended(session, conn.will)

    def connection_attached(self, conn: Connection) -> None:
        self._unattached.pop(conn, None)

    def connection_detached(self, conn: Connection) -> None:
        if conn.state != CLOSED:
            self._unattached[conn] = None

    def schedule_flush(self, conn: Outgoing) -> None:
        """Have ``conn``'s transport take its output at the end of this loop iteration (one call_soon for all
        connections)."""
        self._dirty.append(conn)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        dirty, self._dirty = self._dirty, []
        for conn in dirty:
            conn.flush()
