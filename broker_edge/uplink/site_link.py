"""The site's side of the uplink: one connection it dials to the hub, carrying its logs by (topic, offset).

The site never keeps its own idea of what the hub holds: each connection starts by asking (``HELLO`` →
``ENDS``) and sends every topic from the hub's durable end, so after an outage or a restart on either side
every record crosses once. Records go only once durable (committed, in a cluster) here, verbatim (their
stored frames); the hub acknowledges a batch once it is durable there.

Batches take topics in turn (a topic with a backlog gives way to the others after its share), each topic
oldest first: live records keep flowing while a backlog catches up. The bandwidth limit holds what is sent
(``throttle``); up to ``max_batches_in_flight`` batches are unanswered at once. Records the site's retention
would delete before they are sent raise a WARNING and a metric; records it deleted are skipped, and the
hub records the gap.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from broker_edge.config import ConfigError
from broker_edge.engine.ports import MirrorRefused
from broker_edge.http.client_errors import failure_text
from broker_edge.protocol.topics import topic_matches
from broker_edge.security.tls import client_ssl_context as tls_client_context
from broker_edge.settings.uplink import UplinkConfig
from broker_edge.uplink.batches import next_batch
from broker_edge.uplink.batches_elsewhere import batch_elsewhere
from broker_edge.uplink.hub_certificate import HubCertificate
from broker_edge.uplink.hub_ends import follow_hub_ends
from broker_edge.uplink.mirror import Gap, apply_batch, mirror_batch
from broker_edge.uplink.site_identity import check_site_certificate
from broker_edge.uplink.throttle import Throttle
from broker_edge.uplink.unsent import CHECKED_AT_ONCE, UnsentRecords
from broker_edge.uplink.wire import (
    ACK,
    DOWN,
    ENDS,
    ERROR,
    HELLO,
    REFUSAL_HEADER,
    SITE_CONNECTED,
    STATE,
    VERSION,
    Batch,
    Message,
    WireError,
    decode,
    decode_batch,
    encode,
    encode_batch,
    ends_of,
    message_limit_of,
    seq_of,
    too_large,
)

if TYPE_CHECKING:
    from aiohttp import ClientWebSocketResponse, web

    from broker_edge.engine.ports import MirrorLogs
    from broker_edge.observe.metrics import BrokerMetrics
    from broker_edge.storage import LogStore

__all__ = ["SiteLink", "client_ssl_context"]

log = logging.getLogger("broker_edge.uplink.site_link")

T = TypeVar("T")

HANDSHAKE_TIMEOUT_S = 30.0
HUB_MESSAGE_BYTES = 16 * 1024 * 1024
"""Largest message taken from the hub, as it travels (a page of its ``ENDS``, a downlink batch)."""
MAX_DOWN_BYTES = 16 * 1024 * 1024
"""Largest downlink batch taken from the hub, once decompressed (the hub sends 256 KiB ones)."""
STOP_CLOSE_S = 2.0
"""How long a stopping site waits for the hub to answer its close."""
ELSEWHERE_POLL_S = 0.5
"""How often a cluster site's link holder looks again at the logs it holds no copy of (nothing wakes it
when another member appends to them)."""


def _failure(error: BaseException) -> str:
    """``failure_text(error)``, with the hub's reason when it refused the connection."""
    import aiohttp

    text = failure_text(error)
    if isinstance(error, aiohttp.WSServerHandshakeError) and error.headers is not None:
        reason = error.headers.get(REFUSAL_HEADER)
        if reason:
            text += f": {reason[:300]}"
    return text


def client_ssl_context(config: UplinkConfig) -> ssl.SSLContext:
    """The site's TLS, its files read now (``ConfigError`` naming the ``uplink.tls`` file that does not
    load, or a certificate replaced by one naming another site than ``uplink.site_id``)."""
    tls = config.tls
    context = tls_client_context(tls.certfile, tls.keyfile, tls.cafile, "uplink.tls")
    check_site_certificate(tls.certfile, config.site_id)
    context.check_hostname = tls.check_hostname
    return context


class SiteConnected(WireError):
    """The hub refused this connection: the site is connected from another broker with its certificate."""


class SiteLink:
    """Sends ``store``'s logs matching ``config.topics`` to the hub until stopped."""

    def __init__(
        self,
        store: LogStore,
        config: UplinkConfig,
        metrics: BrokerMetrics,
        deliver: Callable[[str, int, int], None],
    ) -> None:
        self.store = store
        self.deliver = deliver
        """Routes a downlinked topic's records ``[start, end)`` to this broker's subscribers, once durable."""
        self.received_down = 0
        """Records the hub sent down (appended here)."""
        self.config = config
        self.hub_ends: dict[str, int] = {}
        """What the hub holds of each topic, durable (its last answer)."""
        self.hub_limit: int | None = None
        """The largest message the hub takes, as its ``ENDS`` says (None: a hub that does not say)."""
        self.connected = False
        self.hub: str | None = None
        self.last_contact = 0.0
        self.sent_bytes = 0
        self.sent_records = 0
        self.stored_bytes = 0
        """Bytes of the records sent as stored, before compression."""
        self.gap_records = 0
        self._gaps_said: dict[str, tuple[int, int]] = {}
        """Per topic, the last gap said (``[position, start)``): a batch built again before the gap could
        travel (no record after it yet) does not say nor count it again."""
        self.logs: MirrorLogs | None = None
        """A cluster member's ``mirror_logs`` port (None: a broker alone, whose store holds every log): the
        logs this member holds no copy of are read from their leaders, the downlink appended on them."""
        self.elsewhere_ends: dict[str, int] = {}
        """The committed ends of the logs carried that this member holds no copy of (its last look)."""
        self._turn_elsewhere = False
        self._tasks: list[asyncio.Task[None]] = []
        self._ws: ClientWebSocketResponse | None = None
        """The connection to the hub while one is open."""
        self._reported: dict[str, int] = {}
        self._carried: dict[str, bool] = {}
        """Whether each log of the store is one the uplink carries (``_carries``: its settings decide)."""
        self._acknowledged = False
        """Whether the hub acknowledged a batch on this connection (a refusal before any does not reset
        the backoff: it lasts)."""
        self.unsent = UnsentRecords(
            store, config.retention_warning_ratio, self.topics, self.hub_ends, self.elsewhere_ends
        )
        """The lag and the retention check (``hub_ends`` and ``elsewhere_ends`` are updated in place)."""
        self.hub_certificate = HubCertificate(config.tls.cafile, metrics)
        """The watch of what the hub presented (``reload`` at SIGHUP)."""
        self._bind(metrics)

    def _bind(self, metrics: BrokerMetrics) -> None:
        for name, documentation, read in (
            ("uplink_connected", "1 while the uplink to the hub is open.", lambda: float(self.connected)),
            ("uplink_sent_bytes", "Bytes of batches sent to the hub (compressed).", lambda: self.sent_bytes),
            ("uplink_sent_records", "Records sent to the hub.", lambda: self.sent_records),
            (
                "uplink_stored_bytes_sent",
                "Stored bytes of the records sent (before compression).",
                lambda: self.stored_bytes,
            ),
            (
                "uplink_lag_records",
                "Records here the hub has not acknowledged.",
                lambda: self.unsent.lag()[0],
            ),
            (
                "uplink_lag_seconds",
                "Age of the oldest record the hub has not acknowledged.",
                lambda: self.unsent.lag()[1],
            ),
            (
                "uplink_last_contact_timestamp",
                "Wall time of the hub's last message.",
                lambda: self.last_contact,
            ),
            (
                "uplink_gap_records",
                "Records retention deleted before they were sent.",
                lambda: self.gap_records,
            ),
            (
                "uplink_unsent_at_risk_records",
                "Unsent records retention is about to delete (uplink.retention_warning_ratio).",
                lambda: self.unsent.at_risk_records,
            ),
        ):
            metrics.gauge(name, documentation).set_function(read)

    # -- what is sent ----------------------------------------------------------------------------------

    def topics(self) -> list[str]:
        """This site's logs the uplink carries (no ``$`` topics: they are the broker's own), not set aside.
        Whether a topic is carried is worked out once: a site of many logs lists them at every heartbeat
        and every metrics scrape."""
        store, carried = self.store, self._carried
        if len(carried) > 2 * len(store) + 1024:  # logs deleted since (retention, the store's limits)
            carried.clear()
        hidden = {log.topic for log in store.quarantined()}
        found = []
        for topic in store.topics():
            carries = carried.get(topic)
            if carries is None:
                carries = carried[topic] = self._carries(topic)
            if carries and self._held(topic) and topic not in hidden:
                found.append(topic)
        return found

    def _held(self, topic: str) -> bool:
        """Whether this broker holds a complete copy of ``topic``'s log (a broker alone holds every one)."""
        return self.logs is None or self.logs.holds(topic)

    def downlinked(self, topic: str) -> bool:
        """Whether ``topic`` is one the hub sends down: only the hub writes it here (the broker refuses a
        client's publish to it, ``BrokerCore.reserved_topics``)."""
        return self.config.downlinked(topic)

    async def _downlink_request(self) -> dict[str, object] | None:
        """The downlink's filters and where the copies end: committed here, or (on a cluster, the logs this
        member holds no copy of) on their leaders. An end too low only has the hub send records again, which
        are skipped."""
        downlink = self.config.downlink
        if not downlink:
            return None
        store = self.store
        ends = {
            info.topic: store.committed_end(info.topic)
            for topic_filter in downlink
            for info in store.logs(topic_filter)
            if not info.topic.startswith("$") and self._held(info.topic)
        }
        if self.logs is not None:
            for topic, (_start, end) in (await self.logs.logs_elsewhere(downlink)).items():
                ends.setdefault(topic, end)
        return {"filters": downlink, "ends": ends, "codec": self.config.compression}

    def status(self) -> dict[str, object]:
        records, seconds = self.unsent.lag()
        return {
            "site": self.config.site_id,
            "hub": self.hub,
            "connected": self.connected,
            "last_contact": self.last_contact or None,
            "sent_bytes": self.sent_bytes,
            "sent_records": self.sent_records,
            "stored_bytes_sent": self.stored_bytes,
            "gap_records": self.gap_records,
            "unsent_at_risk_records": self.unsent.at_risk_records,
            "lag_records": records,
            "lag_seconds": round(seconds, 3),
            "topics": len(self.topics()),
            "downlink_records": self.received_down,
        }

    def add_status_route(self, app: web.Application) -> None:
        """``GET /v1/uplink/sites``: this site's link (on the offsets API: ``timestone uplink status``)."""
        from aiohttp import web

        async def site(_request: web.Request) -> web.Response:
            return web.json_response({"role": "site", "site": self.status()})

        app.router.add_get("/v1/uplink/sites", site)

    # -- running ---------------------------------------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._run(), name="uplink"),
            loop.create_task(self._watch_retention(), name="uplink-retention"),
        ]

    async def stop(self) -> None:
        """Close the connection (the hub frees the site for another broker at once: a connection that ends
        without a close keeps it for this one a while), then stop."""
        ws = self._ws
        if ws is not None and not ws.closed:
            with contextlib.suppress(Exception):  # a link already gone: nothing to tell
                await asyncio.wait_for(ws.close(), STOP_CLOSE_S)
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        self.connected = False

    async def _watch_retention(self) -> None:
        """Check unsent records against retention every ``heartbeat_s``, link up or down (an outage is
        when it matters)."""
        while True:
            await asyncio.sleep(self.config.heartbeat_s)
            await self.unsent.check_retention()

    async def _run(self) -> None:
        import aiohttp

        config = self.config
        delay = config.reconnect_min_s
        attempt = 0
        while True:
            hub = config.hubs[attempt % len(config.hubs)]
            attempt += 1
            refused = False
            try:
                context = client_ssl_context(config)  # read at each dial: rotated files are taken
                async with (
                    aiohttp.ClientSession() as session,
                    session.ws_connect(
                        hub,
                        ssl=context,
                        proxy=config.proxy,
                        heartbeat=config.keepalive_s,
                        max_msg_size=HUB_MESSAGE_BYTES,
                        timeout=aiohttp.ClientWSTimeout(ws_close=5.0),
                    ) as ws,
                ):
                    self.hub = hub
                    self._ws = ws
                    self.hub_certificate.watch(hub, ws)
                    await self._converse(ws)
            except SiteConnected as error:  # another broker holds this site's link: said louder, backed off
                refused = True
                log.error("uplink to %s: %s; again in %.1f s", hub, error, delay)
            except (
                aiohttp.ClientError,
                OSError,
                TimeoutError,
                WireError,
                ConnectionError,
                ssl.SSLError,
            ) as error:
                refused = isinstance(error, WireError) and not self._acknowledged  # nothing taken: it lasts
                delay = self._wait_after(delay, refused)
                log.warning("uplink to %s: %s; again in %.1f s", hub, _failure(error), delay)
            except ConfigError as error:  # its files were replaced by ones that do not load
                delay = self._wait_after(delay, refused)
                log.error("uplink to %s: %s; again in %.1f s", hub, error, delay)
            except Exception:  # never let the link end for good: whatever it was, dial again
                delay = self._wait_after(delay, refused)
                log.exception("uplink to %s failed; again in %.1f s", hub, delay)
            finally:
                delay = self._wait_after(delay, refused)
                self.connected = False
                self._ws = None
                self.hub_certificate.unwatch()
            await asyncio.sleep(delay)
            delay = min(delay * 2, config.reconnect_max_s)

    def _wait_after(self, delay: float, refused: bool) -> float:
        """The wait before the next dial: ``reconnect_min_s`` after a link that worked (connected, not
        refused), else ``delay``; said in the line of the failure, so it is set before that line."""
        return self.config.reconnect_min_s if self.connected and not refused else delay

    async def _converse(self, ws: ClientWebSocketResponse) -> None:

        config = self.config
        hello: dict[str, object] = {"version": VERSION, "site": config.site_id}
        hello["max_message_bytes"] = HUB_MESSAGE_BYTES  # the hub's ENDS come in pages that fit it
        if self.logs is None and self.store.store_id is not None:  # a cluster's members take turns: unsaid
            hello["source"] = self.store.store_id
        downlink = await self._downlink_request()
        if downlink is not None:
            hello["downlink"] = downlink
        await ws.send_bytes(encode(HELLO, hello))
        answer = await self._hub_answer(ws)
        ends = ends_of(answer.header.get("ends"), "the hub's ends")
        self.hub_ends.clear()  # (in place: ``unsent`` reads it)
        self.hub_ends.update(ends)
        self.hub_limit = message_limit_of(answer.header.get("max_message_bytes"))
        while answer.header.get("more") is True:  # the hub's ends in pages: a site of many topics
            answer = await self._hub_answer(ws)
            self.hub_ends.update(ends_of(answer.header.get("ends"), "the hub's ends"))
        follow_hub_ends(self.store, self.hub_ends, member=self.logs is not None)
        self.connected = True
        self._acknowledged = False
        self.last_contact = time.time()
        self._reported = {}
        log.info("uplink: connected to %s as site %s", self.hub, config.site_id)
        window = _Window(config.max_batches_in_flight)
        reader = asyncio.get_running_loop().create_task(self._read_acks(ws, window))
        try:
            await self._send(ws, window, reader)
        finally:
            reader.cancel()

    async def _hub_answer(self, ws: ClientWebSocketResponse) -> Message:
        """The hub's next ``ENDS`` (a page of them) after the ``HELLO``; its refusal as ``WireError``
        (``SiteConnected``: the site is connected from another broker)."""
        import aiohttp

        message = await ws.receive(timeout=HANDSHAKE_TIMEOUT_S)
        if message.type != aiohttp.WSMsgType.BINARY:  # closed under the HELLO (a link cut): dial again
            why = f": {message.data}" if message.type == aiohttp.WSMsgType.ERROR else ""
            raise ConnectionError(f"the hub's connection ended before it answered ({message.type.name}{why})")
        answer = decode(message.data)
        if answer.kind == ERROR:
            kind = SiteConnected if answer.header.get("refusal") == SITE_CONNECTED else WireError
            raise kind(f"the hub refused: {answer.header.get('message')}")
        if answer.kind != ENDS:
            raise WireError("the hub did not answer HELLO with its ends")
        return answer

    async def _read_acks(self, ws: ClientWebSocketResponse, window: _Window) -> None:
        import aiohttp

        async for message in ws:
            if message.type != aiohttp.WSMsgType.BINARY:
                break
            decoded = decode(message.data)
            self.last_contact = time.time()
            if decoded.kind == ACK:
                self._acknowledged = True
                seq = seq_of(decoded.header.get("seq"))
                for topic, end in ends_of(decoded.header.get("ends", {}), "the ACK's ends").items():
                    self.hub_ends[topic] = max(self.hub_ends.get(topic, 0), end)
                window.acknowledged(seq)
            elif decoded.kind == DOWN:
                await self._apply_down(decode_batch(decoded, MAX_DOWN_BYTES))
            elif decoded.kind == ERROR:
                raise WireError(f"the hub refused: {decoded.header.get('message')}")
            else:
                raise WireError(f"unexpected message kind {decoded.kind} from the hub")
        raise ConnectionError(self._why_closed(ws))

    def _why_closed(self, ws: ClientWebSocketResponse) -> str:
        """What ended a connection whose messages stopped: the hub, or this site's own heartbeat."""
        import aiohttp

        error = ws.exception()
        if isinstance(error, aiohttp.ServerTimeoutError):
            keepalive = self.config.keepalive_s
            return (
                f"the hub did not answer a ping within {keepalive / 2:g} s after {keepalive:g} s of silence "
                "(uplink.keepalive_s): the connection is taken for cut"
            )
        if error is not None:
            return f"the connection failed: {failure_text(error)}"
        if self.hub_certificate.ended:
            return "this site closed the uplink: the hub's certificate is no longer accepted"
        return f"the hub closed the uplink (WebSocket close code {ws.close_code})"

    async def _apply_down(self, batch: Batch) -> None:
        """The hub's records of downlinked topics, at the hub's offsets, then to this broker's subscribers
        once durable; the hub can write nothing else here. On a cluster they are appended on each topic's
        leader and acknowledged once replicated, and every member routes them as it routes what its
        partitions commit."""
        store = self.store
        for part in batch.topics:
            if not self.downlinked(part.topic) or part.topic.startswith("$"):
                raise WireError(f"the hub sent {part.topic!r}, which is not downlinked here")
        if self.logs is not None:
            await self._mirror_down(self.logs, batch)
            return
        before = {part.topic: store.committed_end(part.topic) for part in batch.topics}
        gaps: list[Gap] = []
        applied = apply_batch(store, batch, gaps, str)
        for gap in gaps:
            log.warning(
                "downlink: %r records [%d, %d) never reached this site", gap.topic, gap.start, gap.end
            )
        await store.wait_durable()
        self.received_down += applied.records
        for topic, start in before.items():
            self.deliver(topic, max(start, store.start_offset(topic)), store.committed_end(topic))

    async def _mirror_down(self, logs: MirrorLogs, batch: Batch) -> None:
        gaps: list[Gap] = []
        try:
            applied, _ends = await mirror_batch(logs, batch, gaps, str)
        except MirrorRefused as error:  # the next HELLO says where the copies end: the hub resends from there
            raise ConnectionError(f"the downlink could not be appended: {error}") from None
        for gap in gaps:
            log.warning(
                "downlink: %r records [%d, %d) never reached this site", gap.topic, gap.start, gap.end
            )
        self.received_down += applied.records

    async def _send(self, ws: ClientWebSocketResponse, window: _Window, reader: asyncio.Task[None]) -> None:
        config = self.config
        store = self.store
        loop = asyncio.get_running_loop()
        throttle = Throttle(config.bandwidth_bytes_per_s, loop.time())
        positions = dict(self.hub_ends)
        pending: collections.OrderedDict[str, None] = collections.OrderedDict()
        woken = asyncio.Event()

        def advanced(topic: str) -> None:  # one call per log appended to: waiting costs nothing per log
            if self._carries(topic) and self._held(topic):
                pending[topic] = None
                woken.set()

        unwatch = store.watch_advances(advanced)
        try:
            pending.update(dict.fromkeys(self.topics()))
            await self._send_batches(ws, window, reader, throttle, positions, pending, woken)
        finally:
            unwatch()

    async def _send_batches(
        self,
        ws: ClientWebSocketResponse,
        window: _Window,
        reader: asyncio.Task[None],
        throttle: Throttle,
        positions: dict[str, int],
        pending: collections.OrderedDict[str, None],
        woken: asyncio.Event,
    ) -> None:
        """Batches from the logs of ``pending`` (those appended to since they were last sent up to their
        end, which ``woken`` tells of), and when idle a while from every log again."""
        config = self.config
        loop = asyncio.get_running_loop()
        seq = 0
        next_state = loop.time()
        while True:
            await _until(window.free(), reader)
            woken.clear()
            batch = await self._build(seq, positions, pending)
            if batch is None:
                if loop.time() >= next_state:
                    ends, oldest = await self._changed_ends()
                    await ws.send_bytes(encode(STATE, {"site_ends": ends, "site_oldest": oldest}))
                    next_state = loop.time() + config.heartbeat_s
                idle_s = ELSEWHERE_POLL_S if self.elsewhere_ends else config.heartbeat_s
                with contextlib.suppress(TimeoutError):
                    await _until(asyncio.wait_for(woken.wait(), idle_s), reader)
                if not woken.is_set():
                    pending.update(dict.fromkeys(self.topics()))
                continue
            if loop.time() >= next_state:
                batch.site_ends, batch.site_oldest = await self._changed_ends()
                next_state = loop.time() + config.heartbeat_s
            data = encode_batch(batch, config.compression)
            if self.hub_limit is not None and len(data) > self.hub_limit:
                raise WireError(too_large(batch, len(data), self.hub_limit))
            pause = throttle.delay(len(data), loop.time())
            if pause:
                await _until(asyncio.sleep(pause), reader)
            window.sent(seq)
            await ws.send_bytes(data)
            seq += 1
            self.sent_bytes += len(data)
            self.stored_bytes += len(batch.frames)
            self.sent_records += sum(part.count for part in batch.topics)

    def _budget(self) -> int:
        """Stored bytes of one batch: ``batch_bytes``, and at most half of what the hub takes in a message
        (the rest is its header's)."""
        limit = self.hub_limit
        return self.config.batch_bytes if limit is None else max(1, min(self.config.batch_bytes, limit // 2))

    def _carries(self, topic: str) -> bool:
        return (
            not topic.startswith("$")
            and any(topic_matches(f, topic) for f in self.config.topics)
            and not self.downlinked(topic)
        )

    async def _build(
        self, seq: int, positions: dict[str, int], pending: collections.OrderedDict[str, None]
    ) -> Batch | None:
        """The next batch: from this store, and on a cluster taking turns with the logs held elsewhere, so
        a backlog of either never holds back the other."""
        if self.logs is None:
            return next_batch(self.store, seq, positions, pending, self._budget(), self._gap)
        self._turn_elsewhere = not self._turn_elsewhere
        if self._turn_elsewhere:
            batch = await self._build_elsewhere(self.logs, seq, positions)
            if batch is not None:
                return batch
        here = next_batch(self.store, seq, positions, pending, self._budget(), self._gap)
        if here is not None or self._turn_elsewhere:
            return here
        return await self._build_elsewhere(self.logs, seq, positions)

    async def _build_elsewhere(self, logs: MirrorLogs, seq: int, positions: dict[str, int]) -> Batch | None:
        """A batch of the logs this member holds no copy of, read from their leaders (committed only)."""
        batch, bounds = await batch_elsewhere(
            logs, seq, self.config.topics, positions, self._budget(), self._gap, self._carries
        )
        self.elsewhere_ends.clear()  # (in place: ``unsent`` reads it)
        self.elsewhere_ends.update((topic, end) for topic, (_start, end) in bounds.items())
        return batch

    def _gap(self, topic: str, position: int, start: int) -> None:
        said = self._gaps_said.get(topic)
        counted = said[1] if said is not None and said[0] == position else position
        if start <= counted:
            return  # said and counted already: it waits for a record after it to travel with
        log.warning(
            "uplink: %r records [%d, %d) are gone before they were sent (retention, or damage)",
            topic,
            position,
            start,
        )
        self.gap_records += start - counted
        self._gaps_said[topic] = (position, start)

    async def _changed_ends(self) -> tuple[dict[str, list[int]], dict[str, int]]:
        """The ends of the logs changed since they were last reported, and of those the hub holds nothing
        of the time of each one's oldest record (read once while it stays the oldest unsent: the hub's lag
        on a topic new to it), as many as fit a quarter of the hub's largest message (the others go in the
        next report). It gives way to other work every ``CHECKED_AT_ONCE`` records read."""
        store = self.store
        room = None if self.hub_limit is None else self.hub_limit // 4
        changed: dict[str, list[int]] = {}
        oldest: dict[str, int] = {}
        read = 0
        for topic in self.topics():
            if topic not in store:  # gone while this report gave way (the store's limits)
                continue
            end = store.committed_end(topic)
            if self._reported.get(topic) != end:
                timestamp = None
                if self.hub_ends.get(topic, 0) == 0:
                    read += 1
                    if read % CHECKED_AT_ONCE == 0:
                        await asyncio.sleep(0)
                    timestamp = self.unsent.timestamp(topic, store.start_offset(topic))
                if room is not None:
                    size = len(topic.encode()) + _END_JSON_BYTES
                    room -= size if timestamp is None else 2 * size
                    if room < 0 and changed:
                        break
                self._reported[topic] = end
                changed[topic] = [end, store.log_info(topic).last_append_ms or 0]
                if timestamp is not None:
                    oldest[topic] = timestamp
        return changed, oldest


_END_JSON_BYTES = 48
"""Bytes of one log's ``site_ends`` entry in JSON, its topic apart (quotes, numbers of 16 and 13 digits)."""


class _Window:
    """Batches sent and not yet acknowledged, at most ``size``."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.unanswered: collections.deque[int] = collections.deque()
        self._room = asyncio.Event()
        self._room.set()

    def sent(self, seq: int) -> None:
        self.unanswered.append(seq)
        if len(self.unanswered) >= self.size:
            self._room.clear()

    def acknowledged(self, seq: int) -> None:
        while self.unanswered and self.unanswered[0] <= seq:
            self.unanswered.popleft()
        if len(self.unanswered) < self.size:
            self._room.set()

    async def free(self) -> None:
        await self._room.wait()


async def _until(work: Awaitable[T], reader: asyncio.Task[None]) -> T:
    """``work``'s result, unless the connection's reader ends first: then its error (the link is gone)."""
    task = asyncio.ensure_future(work)
    try:
        await asyncio.wait({task, reader}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
    if task.done() and not task.cancelled():
        return task.result()
    error = None if reader.cancelled() else reader.exception()
    raise error if error is not None else ConnectionError("the uplink closed")
