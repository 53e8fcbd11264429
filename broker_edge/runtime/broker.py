"""The Broker: wires config, listeners, router, PUBLISH path, commitlog, metrics and HTTP; runs the one timer.

``Broker(config)`` then ``await broker.start()`` binds every listener (``broker.ports`` has the bound ports,
so port 0 works) and ``await broker.stop()`` closes them, tells v5 clients why (DISCONNECT 0x8B) and flushes
the commitlog. With a ``cluster:`` section, ``start`` then joins the cluster (``broker_edge.cluster.node``,
imported only then) and ``stop`` leaves it before anything else closes. Everything runs on the calling
event loop; nothing here starts a thread except the store's writer and the password hasher.

The Broker is the ``ConnectionHost`` (``broker_edge.engine.connection.connection``) of every connection:
handlers see it only through ``BrokerContext``. What happens to a PUBLISH is in
``broker_edge.engine.publish``.

There is one periodic callback, ``_sweep``, every second: keepalive and CONNECT timeouts over all
connections, delayed wills and session expiry (``Router.tick``), counters into Prometheus, ``$SYS`` topics,
log retention and the trim of the C heap (``broker_edge.process.heap_trim``) when their intervals come. No
connection owns a timer or a task.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker_edge.engine.connection.states import TIMERS_CHECKED_EVERY_S
from broker_edge.engine.connection.terms import ListenerRuntime, ListenerStats
from broker_edge.engine.core import BrokerCore
from broker_edge.engine.message import Message
from broker_edge.http.lazy_endpoint import LazyHttpEndpoint
from broker_edge.observe.metrics import BrokerMetrics
from broker_edge.observe.sys_topics import sys_topic_messages
from broker_edge.process.descriptors import (
    RESERVE,
    DescriptorBudget,
    describe_cap,
    open_descriptors,
    plan_descriptors,
    raise_descriptor_limit,
)
from broker_edge.process.heap_trim import HeapTrimmer, heap_in_use
from broker_edge.protocol.reason_codes import ReasonCode
from broker_edge.runtime.data_lock import DataDirectoryLock
from broker_edge.runtime.retained_file import RetainedFile
from broker_edge.runtime.session_store import SessionStore
from broker_edge.runtime.transports.turns import ReadTurns
from broker_edge.security.limits import DEFAULT_MAX_CONNECTIONS
from broker_edge.security.tls import ServerContexts, server_ssl_context
from broker_edge.settings.broker import BrokerConfig
from broker_edge.storage.errors import SHORTAGE_CAUSES

if TYPE_CHECKING:
    from aiohttp import web

    from broker_edge.cluster.node import ClusterNode
    from broker_edge.http.guard import GuardedRunner
    from broker_edge.http.peer_certificates import CertificateCheck
    from broker_edge.runtime.transports.tcp import TcpServer
    from broker_edge.storage import LogStore
    from broker_edge.storage.group_commit import GroupCommitter
    from broker_edge.uplink.hub import UplinkHub
    from broker_edge.uplink.site_link import SiteLink

__all__ = ["Broker", "ListenerRuntime", "ListenerStats"]

log = logging.getLogger("broker_edge.server")

BROKER_VERSION = "0.1.0"
SWEEP_INTERVAL_S = TIMERS_CHECKED_EVERY_S
"""How often `_sweep` runs (keep-alive and CONNECT timeouts, expiries, stats, retention)."""


@contextmanager
def naming_endpoint(endpoint: str, host: str, port: int) -> Iterator[None]:
    """An ``OSError`` of binding ``endpoint`` says which endpoint and address (``Address already in use``
    alone leaves an operator of several brokers guessing)."""
    try:
        yield
    except OSError as error:
        reason = error.strerror or str(error)
        raise OSError(error.errno, f"{endpoint} cannot listen on {host}:{port}: {reason}") from error


def budget_descriptors(config: BrokerConfig) -> DescriptorBudget:
    """Raise the descriptor limit, share it, and cap ``config.limits.max_connections`` to what is left;
    ``ConfigError`` when the other needs alone do not fit. The cap of the default is expected where the limit
    is about as large (INFO); a value the operator chose above what fits is a WARNING."""
    needs = {"open at start": open_descriptors(), "reserve": RESERVE, **config.descriptor_needs()}
    budget = plan_descriptors(raise_descriptor_limit(), config.limits.max_connections, needs)
    if budget.capped_from is not None:
        chosen = budget.capped_from != DEFAULT_MAX_CONNECTIONS
        log.log(logging.WARNING if chosen else logging.INFO, "%s", describe_cap(budget))
        config.limits.max_connections = budget.connections
    return budget


class Broker(BrokerCore):
    """An MQTT 3.1.1 / 5.0 broker with a commitlog (see docs/broker.md)."""

    def __init__(self, config: BrokerConfig | None = None) -> None:
        config = config if config is not None else BrokerConfig()
        self.descriptors = budget_descriptors(config)
        """How the process's file descriptors are shared (``process.descriptors``); ``limits.max_connections``
        is held within it."""
        super().__init__(config, BrokerMetrics(before_collect=self.flush_stats))  # /metrics is never stale
        self.throttled_total = self.metrics.counter(
            "client_throttled", "Times a client's reading was paused for its message rate."
        )
        self.held_for_acks_total = self.metrics.counter(
            "client_held_for_acks",
            "Times an MQTT 3.1.1 client's reading was paused with limits.receive_maximum of its QoS 1/2 "
            "publishes not yet answered.",
        )
        self.offsets_left_out_total = self.metrics.counter(
            "offset_properties_left_out",
            "Deliveries sent without the offset user property, which alone made them larger than the "
            "client's Maximum Packet Size.",
        )
        self.metrics.gauge(
            "publishes_unanswered", "QoS 1/2 publishes read from clients and not yet answered, all clients."
        ).set_function(self.unanswered_publishes)
        self.read_turns_cut_total = self.metrics.counter(
            "read_turns_cut",
            "Turns of the event loop that read limits.read_bytes_per_turn (or handled a packet for each 64 "
            "bytes of it) and left the rest of the clients' bytes for the next turns (the broker is reading "
            "as fast as it can).",
        )
        slow = self.slow_subscribers
        self.metrics.gauge(
            "slow_subscribers", "Subscribers whose outgoing buffer is past limits.outgoing_buffer_bytes now."
        ).set_function(lambda: slow.paused_count)
        self.metrics.gauge(
            "publishers_held", "Publishers not read now because a subscriber of their messages is slow."
        ).set_function(lambda: slow.held_count)
        self.read_turns = ReadTurns(config.limits.read_bytes_per_turn, self.call_soon)
        """How many bytes one turn of the loop reads from clients (``transports.turns``)."""
        self.store: LogStore | None = None
        self.records_lost_at_open = 0
        """Records the store found gone from its files when it opened (``RecoveryReport.records_lost``)."""
        self.cluster_node: ClusterNode | None = None
        """This broker's part in its cluster (``cluster:`` configured), after ``start``; None: a broker
        alone, nothing of the cluster is loaded."""
        self.data_lock = DataDirectoryLock(config.storage.directory)
        """This broker's hold on its data directory (``runtime.data_lock``), store open to store close."""
        self.uplink_hub: UplinkHub | None = None
        """Sites' uplinks into this broker (``uplink_hub:`` configured), after ``start``."""
        self.site_link: SiteLink | None = None
        """This site's uplink to its hub (``uplink:`` configured), after ``start``."""
        self.session_store: SessionStore | None = None
        self.retained_file: RetainedFile | None = None
        """A broker alone's retained messages across restarts (a commitlog and ``sessions.persist``)."""
        """Persistent sessions across restarts (``sessions.persist`` with a commitlog)."""
        self.listeners: list[ListenerRuntime] = []
        self.ports: dict[str, int] = {}
        """Listener name → bound port (after ``start``)."""
        self.admin_port: int | None = None
        self.offsets_port: int | None = None
        self.offsets_api_routes: list[Callable[[web.Application], None]] = []
        """More offsets API endpoints (``add_offsets_api_routes``: a cluster's ``/v1/cluster``)."""
        self.http_budget = budget = config.limits.http_budget()
        """The one memory budget of every HTTP endpoint's requests (``broker_edge.security.http_budget``)."""
        self.metrics.gauge(
            "http_buffer_bytes", "Bytes the HTTP endpoints' requests hold now (bodies, answers being sent)."
        ).set_function(lambda: budget.held)
        self.metrics.gauge(
            "http_requests_over_budget",
            "HTTP requests refused (503) because the HTTP memory budget could not take them.",
        ).set_function(lambda: budget.refused)
        self.certificate_expiry = self.metrics.gauge(
            "tls_certificate_expiry_timestamp_seconds",
            "When the certificate each TLS endpoint serves to new connections expires (Unix time).",
            ["endpoint"],
        )
        self.reader_tokens = config.offsets_api.reader_tokens()
        """The offsets API's readers' tokens (None: it asks for none; loopback only); SIGHUP reloads them."""
        self.offsets_tls: ServerContexts | None = None
        """The offsets API's TLS, which SIGHUP reloads."""
        self.started_at = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tcp_listeners: dict[str, tuple[ListenerRuntime, TcpServer]] = {}
        """The TCP and TLS listeners by name, with their servers (where connections handed over land)."""
        self._adopting: set[asyncio.Task[Any]] = set()
        self._runners: list[web.AppRunner | LazyHttpEndpoint | GuardedRunner] = []
        self._websocket_guards: list[GuardedRunner] = []
        """The WebSocket listeners' sites: their refusals before the upgrade are counted (``flush_stats``)."""
        self._websocket_refusals = (0, 0)
        self._sweep_handle: asyncio.TimerHandle | None = None
        self._next_sys = 0.0
        self._next_retention = 0.0
        self._retention: asyncio.Task | None = None
        self._stopping = False
        self.stopped = asyncio.Event()
        self.heap_trimmer = HeapTrimmer()
        """Returns the C heap's free pages to the system every half minute (``process.heap_trim``)."""
        self._bind_memory_gauges()

    def _bind_memory_gauges(self) -> None:
        """What the process's memory holds beyond its RSS: the RSS after the last heap trim, the C heap's
        bytes in use, Python's allocated blocks (read on each /metrics request)."""
        trimmer = self.heap_trimmer
        gauge = self.metrics.gauge
        gauge("heap_trims", "Trims of the C heap done (malloc_trim).").set_function(lambda: trimmer.trims)
        gauge(
            "rss_after_trim_bytes", "The broker's RSS read right after its last trim of the C heap."
        ).set_function(lambda: trimmer.rss_after_trim)
        gauge(
            "heap_in_use_bytes", "Bytes the C heap has handed out and not got back (glibc mallinfo2)."
        ).set_function(heap_in_use)
        gauge(
            "python_allocated_blocks", "Memory blocks Python's allocator holds (sys.getallocatedblocks)."
        ).set_function(sys.getallocatedblocks)

    def add_offsets_api_routes(self, add: Callable[[web.Application], None]) -> None:
        """Serve more endpoints on the offsets API (a cluster's peer link, replica fetch, ``/v1/cluster``):
        ``add(app)`` adds them, before the API's first connection builds its app."""
        self.offsets_api_routes.append(add)

    # -- lifecycle ----------------------------------------------------------------------------------------

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the broker runs on (set by ``start``)."""
        if self._loop is None:
            raise RuntimeError("the broker has not been started")
        return self._loop

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.started_at = time.time()
        config = self.config
        if config.storage.enabled:
            self._open_store()
        try:
            for listener_config in config.listeners:
                runtime = ListenerRuntime(
                    listener_config,
                    config.listener_allows_anonymous(listener_config),
                    self.metrics.for_listener(listener_config.name),
                )
                self.listeners.append(runtime)
                self._watch_expiry(runtime.tls_contexts)
                label = f"listeners[{len(self.listeners) - 1}] ({runtime.name})"
                if listener_config.websocket:
                    from broker_edge.runtime.transports.websocket import start_websocket_listener

                    with naming_endpoint(label, listener_config.host, listener_config.port):
                        runner = await start_websocket_listener(self, runtime)
                    self._runners.append(runner)
                    self._websocket_guards.append(runner)
                    runtime.port = runner.port
                else:
                    from broker_edge.runtime.transports.tcp import start_tcp_listener

                    with naming_endpoint(label, listener_config.host, listener_config.port):
                        # a cluster member accepts clients once it has joined (see below)
                        server = await start_tcp_listener(self, runtime, serving=config.cluster is None)
                    self._tcp_listeners[runtime.name] = (runtime, server)
                    runtime.port = server.sockets[0].getsockname()[1]
                self.ports[runtime.name] = runtime.port
                log.info(
                    "listening: %s %s on %s:%d (anonymous %s)",
                    runtime.name,
                    listener_config.type,
                    listener_config.host,
                    runtime.port,
                    "allowed" if runtime.allow_anonymous else "refused",
                )
            if config.admin_http.enabled:
                with naming_endpoint("admin_http", config.admin_http.host, config.admin_http.port):
                    admin = await LazyHttpEndpoint.start(
                        self._serve_admin,
                        config.admin_http.host,
                        config.admin_http.port,
                        ("broker_edge.http.guard", "broker_edge.runtime.admin_http"),
                    )
                self.admin_port = admin.port
                self._runners.append(admin)
            if self.store is not None:
                self._prepare_uplink(self.store)
            if self.store is not None and config.offsets_api.enabled:
                await self._start_offsets_api(self.store)
            if config.cluster is not None:
                from broker_edge.cluster.node import ClusterNode
                from broker_edge.runtime.transports.tcp import start_accepting

                self.cluster_node = ClusterNode(self, config.cluster)
                await self.cluster_node.start()
                # only now: a publish is never taken as a broker alone's
                for _, server in self._tcp_listeners.values():
                    await start_accepting(server)
            await self._start_uplink_hub()
            self._start_site_link()
        except BaseException:
            await self.stop()
            raise
        self._bind_gauges()
        now = self.loop.time()
        self._next_sys = now + (1.0 if config.sys_topics.enabled else float("inf"))
        self._next_retention = now + config.storage.retention_interval_s
        self.heap_trimmer.next_at = now + self.heap_trimmer.interval_s
        self._sweep_handle = self.loop.call_later(SWEEP_INTERVAL_S, self._sweep)

    def adopt_connection(self, record: dict[str, Any], sock: socket.socket, origin: str) -> None:
        """Take in a client's connection member ``origin`` on this host handed over
        (``cluster.links.handoff``), as a ``HandedInConnection`` of the plain TCP listener its record names
        (else of the first plain TCP listener: a member's own listener has its node's name); ``ValueError``
        for a record this broker cannot take."""
        from broker_edge.runtime.transports.native import NativeServer
        from broker_edge.runtime.transports.tcp import HandedInConnection

        name = record.get("listener")
        found = self._tcp_listeners.get(name) if isinstance(name, str) else None
        if found is None or found[0].tls:
            found = next((each for each in self._tcp_listeners.values() if not each[0].tls), None)
        if found is None:
            raise ValueError("no plain TCP listener here")
        listener, server = found
        protocol = HandedInConnection(self, listener, record, origin)  # the record checked first
        if isinstance(server, NativeServer):
            server.adopt(sock, protocol)
            return
        task = self.loop.create_task(self.loop.connect_accepted_socket(lambda: protocol, sock))
        self._adopting.add(task)
        task.add_done_callback(partial(self._adopted, sock))

    def _adopted(self, sock: socket.socket, task: asyncio.Task[Any]) -> None:
        self._adopting.discard(task)
        error = "cancelled" if task.cancelled() else task.exception()
        if error is not None:
            log.warning("a connection handed over was not taken in: %s", error)
            sock.close()

    def _open_store(self) -> None:
        from broker_edge.storage import LogStore

        directory = Path(self.config.storage.directory)
        self.data_lock.acquire()  # before anything in the directory is read or written
        self.store = store = LogStore(directory, self.config.storage)
        try:
            report = store.open()
        except BaseException:
            self.store = None
            self.data_lock.release()
            raise
        if report.repaired:
            log.warning("commitlog recovery repaired %d logs", len(report.repaired))
        self.records_lost_at_open = report.records_lost
        self.attach_store(store, self.loop)
        budget = store.tail_cache_budget
        self.metrics.gauge(
            "tail_cache_bytes", "Memory the commitlog's tail caches hold, as they account it."
        ).set_function(lambda: budget.bytes)
        self.metrics.gauge(
            "tail_cache_max_bytes", "The bound on the tail caches' memory (storage.tail_cache_total_bytes)."
        ).set(budget.max_bytes)
        self.metrics.histogram(
            "log_commit_seconds",
            "Seconds from a log commit's start to its appends being durable (write, fdatasync, hand-offs).",
            store.committer.commit_seconds,
        )
        self._bind_shortage_metrics(store.committer)
        self.metrics.gauge(
            "storage_quarantined_logs",
            "Logs set aside at open: they could not be opened, and are neither read nor written.",
        ).set(len(report.quarantined))
        if self.config.sessions.persist:
            can_subscribe = self.acl.can_subscribe if self.acl is not None else None
            self.session_store = SessionStore(
                Path(store.layout.meta),
                self.router,
                store,
                self.config.sessions,
                self.loop,
                can_subscribe,
            )
            self.session_store.restore()
            if self.config.cluster is None:  # a member loads the set from the others
                interval = self.config.sessions.persist_interval_s
                self.retained_file = RetainedFile(Path(store.layout.meta), self.router, interval, self.loop)
                self.retained_file.restore()

    def _bind_shortage_metrics(self, committer: GroupCommitter) -> None:
        """The commitlog's passing shortages by cause (``disk_full``, ``descriptor_shortage``): whether
        appends are refused for one now (the gauge to alert on), and how many began since the start."""
        now = self.metrics.gauge(
            "log_shortage",
            "1 while the commitlog refuses appends for this shortage (disk full, file descriptors), else 0.",
            ["cause"],
        )
        began = self.metrics.counter(
            "log_shortages", "Shortages the commitlog rode out (or is riding out), by cause.", ["cause"]
        )
        for cause in SHORTAGE_CAUSES:
            now.labels(cause.reason).set_function(partial(committer.short_of, cause))
            began.labels(cause.reason).set_function(partial(committer.shortages.__getitem__, cause.reason))

    def _prepare_uplink(self, store: LogStore) -> None:
        """This site's link to its hub, and the hub's endpoint for sites (not yet serving), when configured;
        their status at ``/v1/uplink/sites`` on the offsets API."""
        config = self.config
        if config.uplink_hub is not None:
            from broker_edge.uplink.hub import UplinkHub

            self.uplink_hub = UplinkHub(store, config.uplink_hub, self.metrics)
            self._watch_expiry(self.uplink_hub.tls)
            self.add_offsets_api_routes(self.uplink_hub.add_status_route)
        if config.uplink is not None:
            from broker_edge.uplink.site_link import SiteLink

            self.site_link = SiteLink(store, config.uplink, self.metrics, self.route_logged)
            self.reserved_topics = self.site_link.downlinked
            self.add_offsets_api_routes(self.site_link.add_status_route)

    def _start_site_link(self) -> None:
        """Dial the hub: a broker alone at once; a cluster member while it holds the site's link, one member
        at a time, reading the logs it holds no copy of from their leaders and appending the downlink on
        them (through its ``mirror_logs`` port)."""
        link, node = self.site_link, self.cluster_node
        if link is None:
            return
        if node is None:
            link.start()
            return
        link.logs = node.mirror_logs
        node.hold_uplink(link.start, link.stop)

    async def _start_uplink_hub(self) -> None:
        """Serve the hub's endpoint, once a cluster member has joined: the sites' logs are then written
        through its ``mirror_logs`` port (on their partitions' leaders), a broker alone's into its store."""
        hub = self.uplink_hub
        config = self.config.uplink_hub
        if hub is None or config is None:
            return
        with naming_endpoint("uplink_hub", config.host, config.port):
            await hub.start(self.cluster.mirror_logs)
        log.info("uplink hub: sites connect on %s:%d", config.host, hub.port)

    def route_logged(self, topic: str, start: int, end: int) -> None:
        """Route the durable records ``[start, end)`` of ``topic`` that another broker wrote into the log
        (the uplink's downlink) to this broker's subscribers and log readers, as the PUBLISH path does."""
        from broker_edge.engine.records import message_of_record

        store = self.store
        assert store is not None
        while start < end:
            records = store.read(topic, start, end - start, 1 << 20)
            if not records:
                return
            messages = [message_of_record(topic, record) for record in records]
            for message in messages:
                self.router.publish(message)
            if self.replays is not None:
                self.replays.appended(topic, start, messages)
            start = records[-1].offset + 1

    async def _serve_admin(self, sock: socket.socket) -> GuardedRunner:
        """The admin endpoint on its listening socket (run by its first connection: see ``lazy_http``)."""
        from broker_edge.http.guard import start_guarded_site
        from broker_edge.runtime.admin_http import create_admin_app
        from broker_edge.runtime.transports.turns import HTTP_READ_WEIGHT, SocketTurns

        admin = self.config.admin_http
        app = create_admin_app(self.metrics, self.health)
        return await start_guarded_site(
            app,
            admin.host,
            admin.port,
            None,
            admin.max_connections,
            admin.request_timeout_s,
            sock=sock,
            budget=self.http_budget,
            min_read_bytes_per_s=admin.min_read_bytes_per_s,
            read_turns=partial(SocketTurns, turns=self.read_turns, weight=HTTP_READ_WEIGHT),
        )

    def _certificate_check(self, name: str, contexts: ServerContexts | None) -> CertificateCheck | None:
        """The check of each request's client certificate on the HTTPS endpoint ``name`` served with
        ``contexts`` (None: plain HTTP, or no client certificates), counted in this broker's metrics."""
        from broker_edge.http.peer_certificates import CertificateCheck

        trust = contexts.trust if contexts is not None else None
        if trust is None:
            return None
        refusals = self.metrics.https_certificate_refusals_total
        return CertificateCheck(name, trust, lambda reason: refusals.labels(name, reason).inc())

    def _watch_expiry(self, contexts: ServerContexts | None) -> None:
        """Expose when the certificate ``contexts`` serves expires, as it is now (SIGHUP moves it)."""
        if contexts is not None:
            self.certificate_expiry.labels(contexts.name).set_function(lambda: contexts.not_after)

    async def _start_offsets_api(self, store: LogStore) -> None:
        """Serve the offsets API over this broker's store on its own port; aiohttp (and the API's code) are
        loaded by its first connection (see ``lazy_http``)."""
        api = self.config.offsets_api
        tls_config = api.tls
        if tls_config is not None:
            self.offsets_tls = ServerContexts(
                lambda: server_ssl_context(tls_config), tls_config, "offsets API"
            )
            self._watch_expiry(self.offsets_tls)
        ssl_context = self.offsets_tls.context if self.offsets_tls is not None else None

        async def serve(sock: socket.socket) -> GuardedRunner:
            from broker_edge.http.guard import start_guarded_site, tls_failure_lines
            from broker_edge.offsets_api.requests import request_line_for
            from broker_edge.offsets_api.server import ApiLimits, create_app, reader_authenticator
            from broker_edge.runtime.transports.turns import HTTP_READ_WEIGHT, SocketTurns

            limits = ApiLimits(
                max_connections=api.max_connections,
                max_connections_per_reader=api.connections_per_reader,
                request_timeout_s=api.request_timeout_s,
                min_read_bytes_per_s=api.min_read_bytes_per_s,
                max_request_line=request_line_for(self.config.limits.max_topic_length),
            )
            readers = reader_authenticator(self.reader_tokens)
            tokens = self.reader_tokens

            def holds_a_token(request: web.Request) -> bool:  # (its work goes before strangers')
                return tokens is None or tokens.holds_token(request.headers.get("Authorization"))

            certificates = self._certificate_check("offsets API", self.offsets_tls)
            app = create_app(store, limits=limits, routes=self.offsets_api_routes, authenticate=readers)
            return await start_guarded_site(
                app,
                api.host,
                api.port,
                ssl_context,
                limits.max_connections,
                limits.request_timeout_s,
                sock=sock,
                budget=self.http_budget,  # readers: never the members' share
                send_timeout_s=limits.send_timeout_s,
                max_line_size=limits.max_request_line,
                min_read_bytes_per_s=limits.min_read_bytes_per_s,
                max_per_reader=limits.max_connections_per_reader,
                read_turns=partial(SocketTurns, turns=self.read_turns, weight=HTTP_READ_WEIGHT),
                on_tls_failure=tls_failure_lines(
                    "offsets API",
                    cafile=("offsets_api.tls.cafile", tls_config.cafile or "") if tls_config else None,
                ),
                certificates=certificates,
                vouch=holds_a_token,
            )

        with naming_endpoint("offsets_api", api.host, api.port):
            endpoint = await LazyHttpEndpoint.start(
                serve, api.host, api.port, ("broker_edge.http.guard", "broker_edge.offsets_api.server")
            )
        self.offsets_port = endpoint.port
        self._runners.append(endpoint)

    async def stop(self) -> None:
        """Stop accepting, DISCONNECT 0x8B to v5 clients, close every connection, save the persistent
        sessions, flush the commitlog."""
        if self._stopping:
            return
        self._stopping = True
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
        if self.cluster_node is not None:
            await self.cluster_node.stop()  # leave first: peers take over while the clients are told
        if self.site_link is not None:
            await self.site_link.stop()
        if self.uplink_hub is not None:
            await self.uplink_hub.stop()
        for _, server in self._tcp_listeners.values():
            server.close()
        for conn in self.connections:
            conn.close(ReasonCode.SERVER_SHUTTING_DOWN, "broker shutting down")
            conn.flush()
        for runner in self._runners:
            await runner.cleanup()
        for _, server in self._tcp_listeners.values():
            await server.wait_closed()
        if self.connections:
            await asyncio.sleep(0)
            for conn in self.connections:
                conn.abort()
                conn.flush()
        if self.session_store is not None:
            await self.session_store.close()  # a file it cannot write is logged, the old one stays
        if self.retained_file is not None:
            await self.retained_file.close()
        if self._retention is not None and not self._retention.done():
            self._retention.cancel()
        if self.store is not None:
            try:
                self.store.close()  # a full disk: logged there, the next start checks the logs
            except Exception:  # the stop goes on: the lock is released, the process exits
                log.exception("closing the commitlog failed")
        self.data_lock.release()
        self.flush_stats()
        self.stopped.set()

    async def __aenter__(self) -> Broker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- the event loop as the core's runtime ----------------------------------------------------------------

    def now(self) -> float:
        """The loop's clock (the one the sweep's keepalive and will deadlines are compared with)."""
        loop = self._loop
        return loop.time() if loop is not None else time.monotonic()

    def verify_password(self, username: str, password: bytes | None, done: Callable[[bool], None]) -> None:
        """Check the password in the hasher's threads; ``done(ok)`` runs on the loop (never raises)."""
        passwords = self.passwords
        if passwords is None:
            done(False)
            return
        task = self.loop.create_task(passwords.verify_async(username, password))

        def finished(task: asyncio.Task[bool]) -> None:
            done(not task.cancelled() and task.exception() is None and task.result())

        task.add_done_callback(finished)

    def call_soon(self, callback: Callable[[], None]) -> None:
        self.loop.call_soon(callback)

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        self.loop.call_later(delay, callback)

    # -- publishing from inside the broker ----------------------------------------------------------------

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> None:
        """Publish as the broker itself (tools, tests): routed like a client PUBLISH, logged per rules."""
        self.publish_path.publish(Message(topic, payload, qos, retain, None, "", None, None))

    # -- counters -----------------------------------------------------------------------------------------

    def flush_stats(self) -> None:
        """Add the plain counters gathered since the last call into the Prometheus metrics."""
        throttled = self.counters.flush_into(self.metrics)
        if throttled:
            self.throttled_total.inc(throttled)
        held, self.counters.held_for_acks = self.counters.held_for_acks, 0
        if held:
            self.held_for_acks_total.inc(held)
        left_out, self.counters.offsets_left_out = self.counters.offsets_left_out, 0
        if left_out:
            self.offsets_left_out_total.inc(left_out)
        cut, self.read_turns.turns_cut = self.read_turns.turns_cut, 0
        if cut:
            self.read_turns_cut_total.inc(cut)
        for listener in self.listeners:
            listener.stats.flush_into(listener.metrics)
        if self._websocket_guards:
            self._count_websocket_refusals()

    def _count_websocket_refusals(self) -> None:
        """WebSocket connections closed before their upgrade, as TCP ones refused before CONNECT are:
        ``connect_timeout`` (no upgrade in time) and ``max_connections`` (503 at the cap)."""
        guards = [runner.guard for runner in self._websocket_guards]
        timed_out, refused = sum(g.timed_out for g in guards), sum(g.refused for g in guards)
        counted_timeouts, counted_refusals = self._websocket_refusals
        for _ in range(timed_out - counted_timeouts):
            self.counters.refused("connect_timeout")
        for _ in range(refused - counted_refusals):
            self.counters.refused("max_connections")
        self._websocket_refusals = (timed_out, refused)

    def _bind_gauges(self) -> None:
        router = self.router
        metrics = self.metrics
        metrics.subscriptions.set_function(lambda: router.trie.count)
        metrics.retained_messages.set_function(lambda: router.retained.count)
        metrics.inflight.set_function(router.inflight_count)
        metrics.sessions_online.set_function(router.online_count)
        metrics.sessions_offline.set_function(lambda: len(router.sessions) - router.online_count())

    def unanswered_publishes(self) -> int:
        """QoS 1/2 publishes read from the open connections and not yet answered (for /metrics, not per
        message)."""
        return sum(conn.incoming_pending for conn in self._open_connections())

    def health(self) -> dict[str, object]:
        """What /health reports: ok while listening (and the commitlog has not failed); ``log_shortage``: the
        passing shortage (``disk_full``, ``descriptor_shortage``) its appends are refused for now, or None."""
        failure = self.store.committer.failure if self.store is not None else None
        shortage = self.store.committer.shortage if self.store is not None else None
        return {
            "status": "ok" if not self._stopping and failure is None else "error",
            "connections": self.connection_count(),
            "sessions": len(self.router.sessions),
            "listeners": dict(self.ports),
            "uptime_s": int(time.time() - self.started_at),
            "commitlog": None if self.store is None else ("failed: " + str(failure) if failure else "ok"),
            "log_shortage": None if shortage is None else shortage.cause.reason,
            "quarantined_logs": [
                {"topic": entry.topic, "reason": entry.reason, "since_ms": entry.since_ms}
                for entry in (self.store.quarantined() if self.store is not None else [])
            ],
            "records_lost_at_open": self.records_lost_at_open,
        }

    # -- the one timer ------------------------------------------------------------------------------------

    def _sweep(self) -> None:
        now = self.loop.time()
        try:
            for conn in self.connections:
                conn.check_timers(now)
            self.router.tick(now)
            self.slow_subscribers.tick(now)
            if self.session_store is not None:
                self.session_store.tick(now)
            if self.retained_file is not None:
                self.retained_file.tick(now)
            self.flush_stats()
            if now >= self._next_sys:
                self._next_sys = now + self.config.sys_topics.interval_s
                self.publish_sys_topics()
            if self.store is not None and now >= self._next_retention:
                self._next_retention = now + self.config.storage.retention_interval_s
                if self._retention is None or self._retention.done():  # a slice per loop iteration
                    self._retention = self.loop.create_task(self.store.apply_retention_async())
            self.heap_trimmer.tick(now)
        except Exception:
            log.exception("broker sweep failed")
        finally:
            if not self._stopping:
                self._sweep_handle = self.loop.call_later(SWEEP_INTERVAL_S, self._sweep)

    def publish_sys_topics(self) -> None:
        """Publish every ``$SYS/broker/...`` topic now (retained); the sweep calls it every interval."""
        self.flush_stats()
        messages = sys_topic_messages(self.metrics.snapshot(), BROKER_VERSION, self.started_at, time.time())
        for topic, payload in messages.items():
            self.router.publish(Message(topic, payload, 0, True))
