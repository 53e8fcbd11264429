"""The Broker: wires config, listeners, router, commitlog, metrics and HTTP endpoints; runs the one timer.

``Broker(config)`` then ``await broker.start()`` binds every listener (``broker.ports`` has the bound ports,
so port 0 works) and ``await broker.stop()`` closes them, tells v5 clients why (DISCONNECT 0x8B) and flushes
the commitlog. Everything runs on the calling event loop; nothing here starts a thread except the store's
writer and the password hasher.

There is one periodic callback, ``_sweep``, every second: keepalive and CONNECT timeouts over all
connections, delayed wills and session expiry (``Router.tick``), counters into Prometheus, ``$SYS`` topics
and log retention when their intervals come. No connection owns a timer or a task.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter

from broker_edge.acl import AccessControl
from broker_edge.admin_http import create_admin_app, start_admin_server
from broker_edge.auth import PasswordFile
from broker_edge.config.broker import BrokerConfig, ListenerConfig
from broker_edge.connection import CLOSED, Connection
from broker_edge.delivery import Message
from broker_edge.login_backoff import LoginBackoff
from broker_edge.metrics import BrokerMetrics
from broker_edge.protocol.reason_codes import ReasonCode
from broker_edge.router import Router
from broker_edge.session_store import SessionStore
from broker_edge.storage import StorageError, TooManyTopics
from broker_edge.storage.record import RecordFields
from broker_edge.sys_topics import sys_topic_messages
from broker_edge.tls import server_ssl_context
from broker_edge.topic_quota import TopicShares

if TYPE_CHECKING:
    import ssl

    from broker_edge.metrics import ListenerMetrics

__all__ = ["Broker", "ListenerRuntime", "ListenerStats"]

log = logging.getLogger("broker_edge.server")

BROKER_VERSION = "0.1.0"
SWEEP_INTERVAL_S = 1.0
LogEntry = tuple[Connection | None, Message | None, int | None, int, int]
"""(connection, publish or None, packet id, QoS, reason code) waiting for the log: a publish to route and
acknowledge once durable, or (no publish) an acknowledgement to send in its turn with the reason code."""


class ListenerStats:
    """Plain-integer counters of one listener, added into Prometheus once a second (no lock per packet)."""

    __slots__ = ("bytes_in", "bytes_out", "received", "sent")

    def __init__(self) -> None:
        self.received = [0, 0, 0]
        self.sent = [0, 0, 0]
        self.bytes_in = 0
        self.bytes_out = 0


class ListenerRuntime:
    """A listener's config with what connections need at hand: its counters, TLS context, anonymous rule."""

    __slots__ = ("allow_anonymous", "config", "metrics", "name", "port", "ssl_context", "stats", "tls")

    def __init__(self, config: ListenerConfig, allow_anonymous: bool, metrics: ListenerMetrics) -> None:
        self.config = config
        self.name = config.name
        self.allow_anonymous = allow_anonymous
        self.metrics = metrics
        self.stats = ListenerStats()
        self.tls = config.tls is not None
        self.ssl_context: ssl.SSLContext | None = server_ssl_context(config.tls) if config.tls else None
        self.port = config.port


class _FlushBeforeScrape:
    """A collector that yields nothing but first adds pending counters, so /metrics is never stale."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker

    def describe(self) -> list:
        return []

    def collect(self) -> list:
        self._broker.flush_stats()
        return []


class Broker:
    """An MQTT 3.1.1 / 5.0 broker with a commitlog (see docs/broker.md)."""

    def __init__(self, config: BrokerConfig | None = None) -> None:
        self.config = config = config if config is not None else BrokerConfig()
        registry = CollectorRegistry()
        registry.register(_FlushBeforeScrape(self))
        self.metrics = BrokerMetrics(registry)
        self.throttled_total = Counter(
            "timestone_broker_client_throttled",
            "Times a client's reading was paused for its message rate.",
            registry=registry,
        )
        self.router = Router(
            config.limits,
            max_retained=config.retain.max_retained,
            retain_enabled=config.retain.enabled,
            count_drop=self.count_drop,
        )
        self.router.publish_hook = self.publish_message
        self.acl: AccessControl | None = None
        if config.acl.rules or config.acl.file or config.acl.default:
            self.acl = AccessControl.from_config(config.acl)
        self.passwords: PasswordFile | None = None
        if config.auth.password_file:
            self.passwords = PasswordFile.load(config.auth.password_file)
        self.admission = config.limits.connection_admission()
        self.login_backoff = LoginBackoff(config.auth.failed_logins)
        self.topic_shares = TopicShares(
            config.limits.max_topics_per_identity, config.limits.topic_quota_exempt_users
        )
        self.store: Any = None
        self.replays: Any = None
        self.session_store: SessionStore | None = None
        """Persistent sessions across restarts (``sessions.persist`` with a commitlog)."""
        self.connections: set[Connection] = set()
        self.listeners: list[ListenerRuntime] = []
        self.ports: dict[str, int] = {}
        """Listener name → bound port (after ``start``)."""
        self.admin_port: int | None = None
        self.offsets_port: int | None = None
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self.started_at = 0.0
        self._servers: list[Any] = []
        self._runners: list[Any] = []
        self._dirty: list[Connection] = []
        self._flush_scheduled = False
        self._drops: dict[str, int] = {}
        self._refused: dict[str, int] = {}
        self._disconnects: dict[str, int] = {}
        self.partial_bytes = 0
        """Bytes of packets not fully arrived, all connections (at most limits.max_partial_packet_bytes)."""
        self.throttled = 0
        """Times a client's reading was paused for its message rate since the last ``flush_stats``."""
        self._flushed: dict[str, list[int]] = {}
        self._sweep_handle: asyncio.TimerHandle | None = None
        self._next_sys = 0.0
        self._next_retention = 0.0
        self._log_batch: list[LogEntry] = []
        self._log_batch_scheduled = False
        self._log_topics: dict[str, list[Message]] = {}
        self._stopping = False
        self.stopped = asyncio.Event()

    # -- lifecycle ----------------------------------------------------------------------------------------

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
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
                if listener_config.websocket:
                    from broker_edge.transports.websocket import start_websocket_listener

                    runner = await start_websocket_listener(self, runtime)
                    self._runners.append(runner)
                    runtime.port = runner.addresses[0][1]
                else:
                    from broker_edge.transports.tcp import start_tcp_listener

                    server = await start_tcp_listener(self, runtime)
                    self._servers.append(server)
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
                app = create_admin_app(self.metrics, self.health)
                admin = config.admin_http
                runner, self.admin_port = await start_admin_server(
                    app, admin.host, admin.port, None, admin.max_connections, admin.request_timeout_s
                )
                self._runners.append(runner)
            if self.store is not None and config.offsets_api.enabled:
                await self._start_offsets_api()
        except BaseException:
            await self.stop()
            raise
        self._bind_gauges()
        now = self.loop.time()
        self._next_sys = now + (1.0 if config.sys_topics.enabled else float("inf"))
        self._next_retention = now + config.storage.retention_interval_s
        self._sweep_handle = self.loop.call_later(SWEEP_INTERVAL_S, self._sweep)

    def _open_store(self) -> None:
        from broker_edge.replay import ReplayManager
        from broker_edge.storage import LogStore

        directory = Path(self.config.storage.directory)
        self.store = LogStore(directory, self.config.storage)
        report = self.store.open()
        if report.repaired:
            log.warning("commitlog recovery repaired %d logs", len(report.repaired))
        self.replays = ReplayManager(self.router, self.store, self.loop)
        self.router.replays = self.replays
        if self.config.sessions.persist:
            can_subscribe = self.acl.can_subscribe if self.acl is not None else None
            self.session_store = SessionStore(
                Path(self.store.layout.meta),
                self.router,
                self.store,
                self.config.sessions,
                self.loop,
                can_subscribe,
            )
            self.session_store.restore()

    async def _start_offsets_api(self) -> None:
        """Serve the offsets API over this broker's store on its own port (``offsets_api.serve``)."""
        try:
            from broker_edge import offsets_api
        except ImportError as exc:
            log.error("offsets API not available: %s", exc)
            return
        serve = getattr(offsets_api, "serve", None)
        if serve is None:
            log.error("offsets API not available: broker_edge.offsets_api has no serve()")
            return
        api = self.config.offsets_api
        ssl_context = server_ssl_context(api.tls) if api.tls else None
        from broker_edge.offsets_api.server import ApiLimits

        limits = ApiLimits(max_connections=api.max_connections, request_timeout_s=api.request_timeout_s)
        runner, self.offsets_port = await serve(
            self.store, host=api.host, port=api.port, token=api.token, ssl_context=ssl_context, limits=limits
        )
        self._runners.append(runner)

    async def stop(self) -> None:
        """Stop accepting, DISCONNECT 0x8B to v5 clients, close every connection, save the persistent
        sessions, flush the commitlog."""
        if self._stopping:
            return
        self._stopping = True
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
        for server in self._servers:
            server.close()
        for conn in list(self.connections):
            conn.close(ReasonCode.SERVER_SHUTTING_DOWN, "broker shutting down")
        for runner in self._runners:
            await runner.cleanup()
        for server in self._servers:
            await server.wait_closed()
        if self.connections:
            await asyncio.sleep(0)
            for conn in list(self.connections):
                conn.abort()
        if self.session_store is not None:
            await self.session_store.close()
        if self.store is not None:
            self.store.close()
        self.flush_stats()
        self.stopped.set()

    async def __aenter__(self) -> Broker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- connections --------------------------------------------------------------------------------------

    def connection_opened(self, conn: Connection) -> None:
        now = self.loop.time()
        refusal = self.admission.admit(now)
        conn.deadline = now + self.config.limits.connect_timeout_s
        self.connections.add(conn)
        if refusal is not None:
            conn.refused = refusal
            if refusal != "rate":
                self.count_refused(refusal)
                conn.state = CLOSED
                conn.transport.close()
            else:
                self.count_refused("rate")

    def connection_closed(self, conn: Connection, was_connected: bool) -> None:
        self.connections.discard(conn)
        if conn.refused is None:
            self.admission.release()
        if was_connected:
            conn.listener.metrics.disconnected()

    def schedule_flush(self, conn: Connection) -> None:
        """Write ``conn``'s batch at the end of this loop iteration (one call_soon for all connections)."""
        self._dirty.append(conn)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        dirty, self._dirty = self._dirty, []
        for conn in dirty:
            conn.flush()

    # -- publishing from inside the broker ----------------------------------------------------------------

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> None:
        """Publish as the broker itself (tools, tests): routed like a client PUBLISH, logged per rules."""
        self.publish_message(Message(topic, payload, qos, retain, None, "", None, None))

    def publish_message(self, message: Message) -> None:
        store = self.store
        if (
            store is not None
            and not message.topic.startswith("$")
            and store.should_persist(message.topic, message.qos)
        ):
            self.log_publish(None, message, None)
        else:
            self.router.publish(message)

    def log_publish(self, conn: Connection | None, message: Message, packet_id: int | None) -> None:
        """Queue ``message`` for its topic's log; route and acknowledge it once the log says it is durable.

        The publishes of one loop iteration are appended together, one batch per topic (a single encode
        loop and one bookkeeping step per batch), at the start of the next iteration.
        """
        queued = self._log_topics.get(message.topic)
        if queued is None:
            self._log_topics[message.topic] = [message]
        else:
            queued.append(message)
        self._queue_for_log((conn, message, packet_id, message.qos, 0))

    def ack_after_log(self, conn: Connection, packet_id: int, qos: int, reason_code: int) -> None:
        """Acknowledge in order behind any publish still waiting for the log (QoS 2 duplicates)."""
        if self.store is None:
            self._send_ack(conn, qos, packet_id, reason_code)
            return
        self._queue_for_log((conn, None, packet_id, qos, reason_code))

    def _queue_for_log(self, entry: LogEntry) -> None:
        """Add `entry` to the next log batch (appended at the start of the next loop iteration)."""
        self._log_batch.append(entry)
        if not self._log_batch_scheduled:
            self._log_batch_scheduled = True
            self.loop.call_soon(self._append_logged)

    def _append_logged(self) -> None:
        """Append the queued publishes (a batch per topic) and wait for them to be durable."""
        self._log_batch_scheduled = False
        batch, self._log_batch = self._log_batch, []
        topics, self._log_topics = self._log_topics, {}
        store = self.store
        retry: set[str] = set()
        runs: list[tuple[str, int, list[Message]]] = []
        for topic, messages in topics.items():
            try:
                first = store.append_batch(topic, [_record_fields(message) for message in messages])
            except StorageError:
                retry.add(topic)  # one by one below, so that only the publishes that fail are refused
                continue
            for offset, message in enumerate(messages, first):
                message.offset = offset
            runs.append((topic, first, messages))
        if retry:
            batch = [
                entry if entry[1] is None or entry[1].topic not in retry else self._append_one(*entry)
                for entry in batch
            ]
        if batch:
            store.when_durable(
                lambda: self._durable(batch, runs), lambda exc: self._durable_failed(batch, exc)
            )

    def _append_one(
        self, conn: Connection | None, message: Message, packet_id: int | None, qos: int, _code: int
    ) -> LogEntry:
        """Append one publish of a batch that failed. A failed append becomes a refusal, acknowledged in its
        turn with the reason (v5), so that acknowledgements keep the order of the publishes."""
        try:
            message.offset = self.store.append_message(message.topic, *_record_fields(message))
        except StorageError as exc:
            self.count_drop("log_failed")
            log.warning(
                "append to %r failed: %s", message.topic, exc, extra={"client_id": message.origin or "-"}
            )
            code = (
                ReasonCode.QUOTA_EXCEEDED if isinstance(exc, TooManyTopics) else ReasonCode.UNSPECIFIED_ERROR
            )
            if conn is not None and not conn.v5:
                conn.close()  # a v3 client cannot be told: it resends after reconnecting
            elif conn is not None and qos == 2 and conn.session is not None and conn.session.incoming_qos2:
                conn.session.incoming_qos2.discard(packet_id)  # a resend is a new publish
            return (conn, None, packet_id, qos, code)
        return (conn, message, packet_id, qos, 0)

    def _durable(self, batch: list, runs: list[tuple[str, int, list[Message]]]) -> None:
        """Route the publishes of `batch`, now durable, and acknowledge them in order; `runs` are the
        appended batches per topic (topic, first offset, messages), shared with log readers."""
        router = self.router
        appends = appended_bytes = 0
        for conn, message, packet_id, qos, reason_code in batch:
            if message is not None:
                appends += 1
                appended_bytes += len(message.payload)
                if not router.publish(message):
                    reason_code = ReasonCode.NO_MATCHING_SUBSCRIBERS
            if conn is None or packet_id is None or conn.state == CLOSED:
                continue
            if qos == 1 and conn.incoming_pending > 0:  # a QoS 1 entry is a logged publish or a refusal
                conn.incoming_pending -= 1
            self._send_ack(conn, qos, packet_id, reason_code)
        replays = self.replays
        if replays is not None:
            for topic, first, messages in runs:
                replays.appended(topic, first, messages)
        if appends:
            self.metrics.log_appends_total.inc(appends)
            self.metrics.log_bytes_total.inc(appended_bytes)

    def _durable_failed(self, batch: list, exc: BaseException) -> None:
        log.error("commitlog write failed, %d publishes not acknowledged: %s", len(batch), exc)
        for conn, message, packet_id, qos, _code in batch:
            if message is not None:
                self.count_drop("log_failed")
            if conn is not None and packet_id is not None and conn.state != CLOSED:
                if conn.v5:
                    self._send_ack(conn, qos, packet_id, ReasonCode.UNSPECIFIED_ERROR)
                else:
                    conn.close()

    @staticmethod
    def _send_ack(conn: Connection, qos: int, packet_id: int, reason_code: int) -> None:
        if qos == 1:
            conn.send_puback(packet_id, reason_code)
        elif qos == 2:
            conn.send_pubrec(packet_id, reason_code)

    # -- counters -----------------------------------------------------------------------------------------

    def count_drop(self, reason: str) -> None:
        self._drops[reason] = self._drops.get(reason, 0) + 1

    def count_refused(self, reason: str) -> None:
        self._refused[reason] = self._refused.get(reason, 0) + 1

    def count_disconnect(self, reason: str) -> None:
        """The broker closed a connected client (keep alive, protocol error, slow subscriber, ...)."""
        self._disconnects[reason] = self._disconnects.get(reason, 0) + 1

    def flush_stats(self) -> None:
        """Add the plain counters gathered since the last call into the Prometheus metrics."""
        metrics = self.metrics
        if self._drops:
            drops, self._drops = self._drops, {}
            for reason, count in drops.items():
                metrics.dropped(reason).inc(count)
        if self._refused:
            refused, self._refused = self._refused, {}
            for reason, count in refused.items():
                metrics.refused(reason).inc(count)
        if self._disconnects:
            disconnects, self._disconnects = self._disconnects, {}
            for reason, count in disconnects.items():
                metrics.disconnected(reason).inc(count)
        if self.throttled:
            self.throttled_total.inc(self.throttled)
            self.throttled = 0
        for listener in self.listeners:
            stats = listener.stats
            bound = listener.metrics
            for qos in range(3):
                if stats.received[qos]:
                    bound.received[qos].inc(stats.received[qos])
                    stats.received[qos] = 0
                if stats.sent[qos]:
                    bound.sent[qos].inc(stats.sent[qos])
                    stats.sent[qos] = 0
            if stats.bytes_in:
                bound.bytes_received.inc(stats.bytes_in)
                stats.bytes_in = 0
            if stats.bytes_out:
                bound.bytes_sent.inc(stats.bytes_out)
                stats.bytes_out = 0

    def _bind_gauges(self) -> None:
        router = self.router
        metrics = self.metrics
        metrics.subscriptions.set_function(lambda: router.trie.count)
        metrics.retained_messages.set_function(lambda: router.retained.count)
        metrics.inflight.set_function(router.inflight_count)
        metrics.sessions_online.set_function(router.online_count)
        metrics.sessions_offline.set_function(lambda: len(router.sessions) - router.online_count())

    def health(self) -> dict[str, Any]:
        """What /health reports: ok while listening (and the commitlog accepts writes)."""
        failure = self.store.committer.failure if self.store is not None else None
        return {
            "status": "ok" if not self._stopping and failure is None else "error",
            "connections": len(self.connections),
            "sessions": len(self.router.sessions),
            "listeners": dict(self.ports),
            "uptime_s": int(time.time() - self.started_at),
            "commitlog": None if self.store is None else ("failed: " + str(failure) if failure else "ok"),
        }

    # -- the one timer ------------------------------------------------------------------------------------

    def _sweep(self) -> None:
        now = self.loop.time()
        try:
            for conn in list(self.connections):
                conn.check_timers(now)
            self.router.tick(now)
            if self.session_store is not None:
                self.session_store.tick(now)
            self.flush_stats()
            if now >= self._next_sys:
                self._next_sys = now + self.config.sys_topics.interval_s
                self.publish_sys_topics()
            if self.store is not None and now >= self._next_retention:
                self._next_retention = now + self.config.storage.retention_interval_s
                report = self.store.apply_retention()
                if report.segments_deleted:
                    log.info(
                        "retention deleted %d segments (%d bytes)",
                        report.segments_deleted,
                        report.bytes_deleted,
                    )
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


def _record_fields(message: Message) -> RecordFields:
    """The log record of a publish: payload, QoS, retain, publisher and the properties it is forwarded with
    (what remains of its Message Expiry Interval counts from the record's time)."""
    props = message.properties
    expiry = message.expiry_left()
    if props is None:
        return (
            message.payload,
            message.qos,
            message.retain,
            message.origin,
            (),
            None,
            None,
            expiry,
            None,
            None,
        )
    return (
        message.payload,
        message.qos,
        message.retain,
        message.origin,
        list(props.user_properties),
        props.content_type,
        props.payload_format_indicator,
        expiry,
        props.response_topic,
        props.correlation_data,
    )
