"""The hub's uplink endpoint: sites dial in (WebSocket over mutual TLS), each writes only its own namespace.

A site is the site id its certificate names (``site_identity``); nothing it says can change that. One
connection per site at a time: a new one replaces the old, whose batch in progress finishes first, so a
site's topics have one writer. Each batch is appended at the site's offsets through the ``mirror_logs``
port (``broker_edge.engine.ports``): on a broker alone here, acknowledged once durable; on a cluster member
on each topic's partition leader, acknowledged once the in-sync replicas hold it. The ACK carries the
acknowledged ends of its topics and ``ENDS`` the acknowledged end of every topic of the site; the site
sends from those ends. A batch that cannot be acknowledged now (an election) is answered ``ERROR``: the
site dials again (another hub address, when it has several) and resends from the ends it is given.
The downlink sends the hub's matching topics at the hub's offsets: from this broker's copies, and on a
cluster member those it holds no copy of read through the same port from a member that does.
The status of every site is served as JSON by ``status_routes`` (on the offsets API) and as metrics.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import socket
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import WSCloseCode, WSMsgType, web

from broker_edge import bounds
from broker_edge.engine.ports import MirrorRefused
from broker_edge.http.guard import GuardedRunner, start_guarded_site, tls_failure_lines
from broker_edge.protocol.errors import InvalidTopic
from broker_edge.protocol.topics import topic_matches, validate_topic_filter
from broker_edge.security.tls import ServerContexts, server_ssl_context
from broker_edge.settings.uplink import UplinkHubConfig, site_topic
from broker_edge.uplink.batches import next_batch
from broker_edge.uplink.batches_elsewhere import batch_elsewhere
from broker_edge.uplink.expired import ExpiredOnArrival
from broker_edge.uplink.mirror import Gap, LocalMirrorLogs, mirror_batch, mirrored_ends
from broker_edge.uplink.site_certificates import SiteCertificates
from broker_edge.uplink.site_identity import site_of_certificate
from broker_edge.uplink.site_status import SitesStatus, SiteStatus
from broker_edge.uplink.wire import (
    ACK,
    BATCH,
    CODECS,
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
    ends_pages,
    message_limit_of,
    site_ends_of,
    site_oldest_of,
)

if TYPE_CHECKING:
    from broker_edge.engine.ports import MirrorLogs
    from broker_edge.observe.metrics import BrokerMetrics
    from broker_edge.storage import LogStore

__all__ = ["UplinkHub"]

log = logging.getLogger("broker_edge.uplink.hub")

HEARTBEAT_S = 15.0
GAPS_FILE = "uplink-gaps.jsonl"
DOWN_BATCH_BYTES = 256 * 1024
DOWN_IDLE_S = 5.0
REPLACED_TIMES = 5
REPLACED_WINDOW_S = 60.0
"""A site whose open connection is replaced ``REPLACED_TIMES`` times within this many seconds is said at
ERROR: two brokers use its certificate (a site that reconnects after a cut replaces its connection once)."""
SOURCE_HOLD_S = 60.0
"""How long a site whose connection ended without the site closing it (a cut) is kept for the broker it came
from: another broker with its certificate is refused meanwhile, while the first dials again (its backoff is
at most ``uplink.reconnect_max_s``, 30 s by default)."""
REPLACED_NOTICE_S = 1.0
"""How long a replaced connection's ERROR may take to send (one cut silently may never take it)."""
SAID_TOPICS = 20
"""Topics named one line each when a site's copies end past this hub's logs (the rest are counted)."""
DOWN_POLL_S = 0.5
ENDS_PAGE_BYTES = 1024 * 1024
"""Most bytes of topics' ends in one ``ENDS`` message, for a site that says what it takes (half of that at
most): its topics' ends go in as many pages as they need."""
"""How often a cluster member asks again for downlinked logs it holds no copy of (nothing wakes it)."""


class UplinkHub:
    """Sites' uplinks into ``store``, written through ``logs`` (a broker alone's unless ``start`` is given
    a cluster member's); ``start`` binds the endpoint (``port`` then holds the bound port)."""

    def __init__(self, store: LogStore, config: UplinkHubConfig, metrics: BrokerMetrics) -> None:
        self.store = store
        self.logs: MirrorLogs = LocalMirrorLogs(store)
        self.config = config
        self.status = SitesStatus(store, metrics, config.sites)
        self.expired = ExpiredOnArrival(store)
        self.tls = ServerContexts(lambda: server_ssl_context(config.tls), config.tls, "uplink hub")
        self.certificates = SiteCertificates(self.tls.trust)
        """The connected sites' certificates: a link ends with its certificate's authorization."""
        self.port = 0
        self._runner: GuardedRunner | None = None
        self._sockets: dict[str, web.WebSocketResponse] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._downlinks: dict[str, asyncio.Task[None]] = {}
        self._replaced: dict[str, collections.deque[float]] = {}
        """When each site's open connection was last replaced by a new one (the last ``REPLACED_TIMES``)."""
        self._replaced_said: dict[str, float] = {}
        self._kept: dict[str, tuple[str, str | None, float]] = {}
        """Sites whose connection was cut, kept for their broker: its source, address, and when it ended."""
        self._sources: dict[str, tuple[str, str | None] | None] = {}
        """The broker each connected site's connection comes from (its ``HELLO``'s ``source``) and its
        address; None for a site that does not say (an earlier version, or a site cluster's member)."""
        self._gaps_path = Path(store.layout.meta) / GAPS_FILE

    async def start(self, logs: MirrorLogs | None = None, sock: socket.socket | None = None) -> None:
        if logs is not None:
            self.logs = logs
        app = web.Application()
        app.router.add_get(self.config.path, self._serve)
        config = self.config
        self._runner = await start_guarded_site(
            app,
            config.host,
            config.port,
            self.tls.context,
            config.max_connections,
            config.request_timeout_s,
            sock=sock,
            on_tls_failure=tls_failure_lines(
                "uplink endpoint", cafile=("uplink_hub.tls.cafile", config.tls.cafile or "")
            ),
        )
        self.port = self._runner.port

    async def stop(self) -> None:
        for ws in list(self._sockets.values()):
            await ws.close()
        if self._runner is not None:
            await self._runner.cleanup()

    def add_status_route(self, app: web.Application) -> None:
        """``GET /v1/uplink/sites``: every site's status (on the offsets API: ``timestone uplink status``)."""

        async def sites(_request: web.Request) -> web.Response:
            return web.json_response({"role": "hub", **self.status.as_json()})

        app.router.add_get("/v1/uplink/sites", sites)

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        transport = request.transport
        site = site_of_certificate(transport.get_extra_info("peercert") if transport else None)
        if site is None:
            return _refuse(request, "the client certificate names no site (timestone://site/<site_id>)")
        allowed = self.config.sites
        if allowed is not None and site not in allowed:
            return _refuse(request, f"site {site!r} is not admitted here")
        ssl_object = transport.get_extra_info("ssl_object") if transport else None
        status = self.status.site(site)
        refused = self.certificates.refused_at_connect(ssl_object)
        if refused is not None:  # a TLS session resumed after a reload that no longer accepts it
            reason, line = refused
            status.certificate_closes[reason] = status.certificate_closes.get(reason, 0) + 1
            return _refuse(request, f"site {site!r}: {line} (a resumed TLS session)")
        ws = web.WebSocketResponse(heartbeat=HEARTBEAT_S, max_msg_size=self.config.max_message_bytes)
        await ws.prepare(request)
        watched = self.certificates.watch(site, ws, status, ssl_object)
        try:
            return await self._serve_site(request, ws, site, status)
        finally:
            self.certificates.forget(watched)

    def reloaded(self) -> int:
        """After a SIGHUP read the TLS files again: end the links of the sites whose certificate the new
        ``cafile`` no longer trusts or whose CRLs revoke it; how many were."""
        return self.certificates.reloaded()

    async def _serve_site(
        self, request: web.Request, ws: web.WebSocketResponse, site: str, status: SiteStatus
    ) -> web.WebSocketResponse:
        """A site's connection (``ws``, its WebSocket prepared) from its ``HELLO`` until it ends."""
        try:
            hello = await self._hello(ws)
        except (WireError, ConnectionError, TimeoutError) as error:
            log.warning("site %s: %s: closing its connection", site, error)
            with contextlib.suppress(ConnectionError, RuntimeError):
                await ws.send_bytes(encode(ERROR, {"message": str(error)}))
            await ws.close()
            return ws
        source = _source_of(hello.header)
        taken = self._taken_by_another(site, source)
        if taken is not None:
            await self._refuse_second(ws, site, status, taken, request.remote)
            return ws
        previous = self._sockets.get(site)
        if previous is not None:
            await self._replace(site, previous, request.remote)
        lock = self._locks.setdefault(site, asyncio.Lock())
        async with lock:
            if ws.closed:
                return ws
            self._sockets[site] = ws
            self._sources[site] = (source, request.remote) if source is not None else None
            status.connected = True
            status.report_bound_said = False
            closed_by_site = False
            try:
                await self._converse(ws, site, status, hello)
                closed_by_site = ws.close_code == WSCloseCode.OK
            except (WireError, MirrorRefused) as error:
                log.warning("site %s: %s: closing its connection", site, error)
                if not ws.closed:
                    with contextlib.suppress(ConnectionError):
                        await ws.send_bytes(encode(ERROR, {"message": str(error)}))
            except ConnectionError as error:  # the link was cut while this hub answered: the site resumes
                log.info("site %s: connection lost: %s", site, error)
            finally:
                if self._sockets.get(site) is ws:
                    del self._sockets[site]
                    self._sources.pop(site, None)
                    status.connected = False
                    self._keep_for(site, source, request.remote, closed_by_site)
                await ws.close()
        return ws

    async def _hello(self, ws: web.WebSocketResponse) -> Message:
        """The connection's first message, a ``HELLO`` of this version (``WireError`` otherwise)."""
        message = await ws.receive(timeout=self.config.request_timeout_s)
        if message.type != WSMsgType.BINARY:
            raise ConnectionError(f"the connection ended before its HELLO ({message.type.name})")
        decoded = decode(message.data)
        if decoded.kind != HELLO or decoded.header.get("version") != VERSION:
            raise WireError(f"expected HELLO version {VERSION} first")
        return decoded

    def _taken_by_another(self, site: str, source: str | None) -> str | None:
        """Why ``site`` is not ``source``'s now (None: it is, or either does not say): connected from
        another broker, or kept for one whose connection was cut less than ``SOURCE_HOLD_S`` ago."""
        if source is None:
            return None
        connected = self._sources.get(site)
        if connected is not None:
            return f"is already connected from {connected[1]}" if connected[0] != source else None
        kept = self._kept.get(site)
        if kept is None:
            return None
        holder, remote, ended = kept
        now = time.monotonic()
        if holder == source or now - ended >= SOURCE_HOLD_S:
            del self._kept[site]
            return None
        return (
            f"was connected from {remote} {now - ended:.0f} s ago and its connection ended without a close "
            f"(a cut): it is kept for that broker {SOURCE_HOLD_S - (now - ended):.0f} s more"
        )

    def _keep_for(self, site: str, source: str | None, remote: str | None, closed_by_site: bool) -> None:
        """After ``site``'s connection from ``source`` ended: kept for that broker ``SOURCE_HOLD_S`` when it
        ended without the site closing it (a cut: the broker dials again), free when the site closed it."""
        if source is None or closed_by_site:
            self._kept.pop(site, None)
        else:
            self._kept[site] = (source, remote, time.monotonic())

    async def _refuse_second(
        self, ws: web.WebSocketResponse, site: str, status: SiteStatus, why: str, remote: str | None
    ) -> None:
        """Refuse a connection of ``site`` from another broker (another ``source``) than the one it is
        connected from, or kept for (``why``): two brokers use its certificate, and their records would mix
        in its logs at the same offsets. Said at ERROR here and in the ``ERROR`` the site logs; counted."""
        status.refused_connections += 1
        message = (
            f"site {site!r} {why} by another broker (another data directory): this connection from "
            f"{remote} is refused, so that the hub's copy of the site holds one broker's records. Are two "
            "brokers using its certificate?"
        )
        log.error(
            "site %s %s by another broker: refused its connection from %s (two brokers using its "
            "certificate?); %s keeps the other's records only",
            site,
            why,
            remote,
            site_topic(site, "#"),
        )
        with contextlib.suppress(ConnectionError, RuntimeError):
            await ws.send_bytes(encode(ERROR, {"message": message, "refusal": SITE_CONNECTED}))
        await ws.close()

    async def _replace(self, site: str, previous: web.WebSocketResponse, remote: str | None) -> None:
        """Close ``site``'s open connection for its new one (from ``remote``), telling it why first; an
        ERROR (at most once per ``REPLACED_WINDOW_S``) when this keeps happening: two brokers using one
        site's certificate take turns, and their records mix in its namespace at the same offsets."""
        log.info("site %s connected again (from %s): closing its previous connection", site, remote)
        message = f"site {site!r} connected again from {remote}: this connection is replaced"
        notice = encode(ERROR, {"message": message})
        with contextlib.suppress(ConnectionError, RuntimeError, TimeoutError):  # a dead one: no wait
            await asyncio.wait_for(previous.send_bytes(notice), REPLACED_NOTICE_S)
        await previous.close()
        now = time.monotonic()
        times = self._replaced.setdefault(site, collections.deque(maxlen=REPLACED_TIMES))
        times.append(now)
        said = self._replaced_said.get(site)
        if len(times) < REPLACED_TIMES or now - times[0] > REPLACED_WINDOW_S:
            return
        if said is not None and now - said < REPLACED_WINDOW_S:
            return
        self._replaced_said[site] = now
        log.error(
            "site %s: a new connection replaced an open one %d times within %.0f s (the last from %s): "
            "are two brokers using its certificate? Their records mix in %s at the same offsets",
            site,
            REPLACED_TIMES,
            now - times[0],
            remote,
            site_topic(site, "#"),
        )

    async def _converse(
        self, ws: web.WebSocketResponse, site: str, status: SiteStatus, hello: Message
    ) -> None:
        try:
            await self._answer_hello(ws, site, status, hello)
            await self._read_site(ws, site, status)
        finally:
            downlink = self._downlinks.pop(site, None)
            if downlink is not None:
                downlink.cancel()

    async def _answer_hello(
        self, ws: web.WebSocketResponse, site: str, status: SiteStatus, hello: Message
    ) -> None:
        """``ENDS``: where each of the site's topics ends here, durable (in pages that fit the largest message
        the site says it takes); then the downlink it asked for."""
        self.status.contact(status)
        down = _downlink_request(hello.header, self.config.downlink_of(site))
        takes = message_limit_of(hello.header.get("max_message_bytes"))  # None: one message, as before
        ends = await mirrored_ends(self.logs, site_topic(site, ""))  # a previous connection's appends count
        page_bytes = None if takes is None else min(takes // 2, ENDS_PAGE_BYTES)
        for page in ends_pages(ends, self.config.max_message_bytes, page_bytes):
            await ws.send_bytes(encode(ENDS, page))
            await asyncio.sleep(0)  # a site of many topics: other sites' work goes on between pages
        log.info("site %s connected (%d topics held)", site, len(ends))
        if down is not None:
            self._check_down_ends(site, down)
            self._downlinks[site] = asyncio.get_running_loop().create_task(
                self._send_down(ws, down), name=f"downlink-{site}"
            )

    async def _read_site(self, ws: web.WebSocketResponse, site: str, status: SiteStatus) -> None:
        limit = self.config.max_message_bytes
        async for message in ws:
            if message.type != WSMsgType.BINARY:
                if message.type == WSMsgType.TEXT:
                    raise WireError("text message on the uplink")
                if message.type == WSMsgType.ERROR:  # a broken frame, or past max_message_bytes (1009)
                    too_big = getattr(message.data, "code", None) == WSCloseCode.MESSAGE_TOO_BIG
                    raise WireError(f"{message.data}{' (uplink_hub.max_message_bytes)' if too_big else ''}")
                break
            self.status.contact(status)
            decoded = decode(message.data)
            if decoded.kind == BATCH:
                batch = decode_batch(decoded, limit)
                gaps: list[Gap] = []
                applied, ends = await mirror_batch(self.logs, batch, gaps, partial(site_topic, site))
                status.received_bytes += len(message.data)
                status.received_records += applied.records
                status.duplicate_records += applied.duplicates
                self.expired.check(site, batch)
                if gaps:
                    self._record_gaps(site, status, gaps)
                if batch.site_ends:
                    self._take_report(site, status, batch.site_ends, batch.site_oldest)
                await ws.send_bytes(encode(ACK, {"seq": batch.seq, "ends": ends}))
            elif decoded.kind == STATE:
                header = decoded.header
                reported = site_ends_of(header.get("site_ends", {}))
                self._take_report(site, status, reported, site_oldest_of(header.get("site_oldest", {})))
            else:
                raise WireError(f"unexpected message kind {decoded.kind}")

    def _take_report(
        self, site: str, status: SiteStatus, ends: dict[str, list[int]], oldest: dict[str, int]
    ) -> None:
        """The site's report of its logs' ends (and of the oldest record of those new here), for its lag; a
        site reporting more topics than this broker keeps logs (``storage.max_topics``) has the rest left
        out, said at WARNING once a connection."""
        left_out = status.report(ends, self.store.config.max_topics, oldest)
        if left_out and not status.report_bound_said:
            status.report_bound_said = True
            log.warning(
                "site %s reports more topics than storage.max_topics (%d): %d left out of its lag",
                site,
                self.store.config.max_topics,
                left_out,
            )

    def _check_down_ends(self, site: str, down: Downlink) -> None:
        """An ERROR for each topic sent down whose copy on ``site`` ends past this hub's log (the hub's data
        lost or replaced): the records it takes below that end never reach the site. The logs another member
        holds are not looked at; ``SAID_TOPICS`` are named, the rest counted."""
        store, logs = self.store, self.logs
        behind = [
            (topic, position, store.durable_end(topic) if topic in store else 0)
            for topic, position in down.positions.items()
            if down.sends(topic) and any(topic_matches(f, topic) for f in down.served) and logs.holds(topic)
        ]
        behind = [(topic, position, held) for topic, position, held in behind if position > held]
        for topic, position, held in behind[:SAID_TOPICS]:
            log.error(
                "site %s holds %r up to %d, this hub only to %d: this hub's log was lost or replaced; the "
                "records it takes below %d never reach the site",
                site,
                topic,
                position,
                held,
                position,
            )
        if len(behind) > SAID_TOPICS:
            log.error(
                "site %s: %d more topics sent down end past this hub's logs", site, len(behind) - SAID_TOPICS
            )

    async def _send_down(self, ws: web.WebSocketResponse, down: Downlink) -> None:
        """The hub's topics the site is served (``down``) to the site, from where its copies end, until the
        connection ends; the WebSocket's flow control paces it. The logs held here are read here; on a
        cluster hub, those this member holds no copy of are read from a member that does (polled), the two
        taking turns so that a backlog of either never holds back the other."""
        store, logs = self.store, self.logs
        filters, positions, codec, sends = down.served, down.positions, down.codec, down.sends
        seq = 0
        turn_elsewhere = False
        try:
            while not ws.closed:
                topics = [t for t in _own_topics(store, filters) if sends(t) and logs.holds(t)]
                pending = collections.OrderedDict.fromkeys(topics)
                batch: Batch | None = None
                elsewhere: dict[str, tuple[int, int]] = {}
                if turn_elsewhere:
                    batch, elsewhere = await batch_elsewhere(
                        logs, seq, filters, positions, DOWN_BATCH_BYTES, _skip, sends
                    )
                if batch is None:
                    batch = next_batch(store, seq, positions, pending, DOWN_BATCH_BYTES, _skip)
                if batch is None and not turn_elsewhere:
                    batch, elsewhere = await batch_elsewhere(
                        logs, seq, filters, positions, DOWN_BATCH_BYTES, _skip, sends
                    )
                turn_elsewhere = not turn_elsewhere
                if batch is not None:
                    await ws.send_bytes(encode_batch(batch, codec, DOWN))
                    seq += 1
                    continue
                waiting = {topic: positions.get(topic, 0) for topic in topics}
                await store.wait_for_data(waiting, DOWN_POLL_S if elsewhere else DOWN_IDLE_S, "#")
        except (ConnectionError, RuntimeError) as error:  # the connection closed under a send
            log.debug("downlink ended: %s", error)

    def _record_gaps(self, site: str, status: SiteStatus, gaps: list[Gap]) -> None:
        """Count and say each gap, then journal them; a journal that cannot be written (a full disk) is an
        ERROR naming it and the gaps: the log's own marker holds each gap, and the batch is acknowledged."""
        lines = []
        for gap in gaps:
            status.gap_records += gap.end - gap.start
            log.warning(
                "site %s topic %r: records [%d, %d) never reached the hub (the site's retention deleted "
                "them): the hub's copy continues at %d",
                site,
                gap.topic,
                gap.start,
                gap.end,
                gap.end,
            )
            lines.append(json.dumps({"site": site, "topic": gap.topic, "start": gap.start, "end": gap.end}))
        try:
            with self._gaps_path.open("a") as journal:
                journal.write("".join(line + "\n" for line in lines))
        except OSError as error:
            log.error(
                "cannot write the gaps journal %s (%s): site %s, not journaled: %s",
                self._gaps_path,
                error.strerror or error,
                site,
                ", ".join(f"{gap.topic!r} [{gap.start}, {gap.end})" for gap in gaps),
            )


@dataclass(frozen=True, slots=True)
class Downlink:
    """What the hub sends a site: its logs matching ``served`` (the hub's configuration for that site) that
    also match one of ``asked`` (the site's ``HELLO``, which may ask for less, never for more), from where
    the site's copies end (``positions``), compressed with ``codec``."""

    served: list[str]
    asked: list[str]
    positions: dict[str, int]
    codec: str

    def sends(self, topic: str) -> bool:
        return any(topic_matches(topic_filter, topic) for topic_filter in self.asked)


def _downlink_request(header: dict[str, object], served: list[str]) -> Downlink | None:
    """The downlink a HELLO asks for, within what the hub serves the site (``served``); None when either
    is nothing. The site's filters only narrow what is sent: a site asking for ``#`` gets ``served``."""
    request = header.get("downlink")
    if request is None:
        return None
    if not isinstance(request, dict) or not isinstance(request.get("filters"), list):
        raise WireError("bad downlink request: expected {filters: [...], ends: {topic: end}}")
    asked = request["filters"]
    for topic_filter in asked:
        if not isinstance(topic_filter, str):
            raise WireError(f"bad downlink request: a filter {bounds.shown(topic_filter)} is not a string")
        try:
            validate_topic_filter(topic_filter)
        except InvalidTopic as error:
            raise WireError(f"bad downlink request: {topic_filter!r}: {error}") from None
    positions = ends_of(request.get("ends"), "the downlink's ends")
    codec = request.get("codec", "none")
    if codec not in CODECS:
        raise WireError(f"unknown codec {bounds.shown(codec)}")
    if not asked or not served:
        return None
    return Downlink(list(served), list(asked), positions, codec)


def _own_topics(store: LogStore, filters: list[str]) -> list[str]:
    found: dict[str, None] = {}
    for topic_filter in filters:
        for info in store.logs(topic_filter):
            if not info.topic.startswith("$"):
                found[info.topic] = None
    return list(found)


def _skip(topic: str, position: int, start: int) -> None:
    log.warning(
        "downlink: %r records [%d, %d) are gone here before the site had them (retention, or damage)",
        topic,
        position,
        start,
    )


def _source_of(header: dict[str, object]) -> str | None:
    """A ``HELLO``'s ``source``: the sending broker's store identity (None when it does not say)."""
    source = header.get("source")
    if source is None:
        return None
    if not isinstance(source, str) or not 0 < len(source) <= 200:
        raise WireError(f"bad source {bounds.shown(source)}: expected a string of 1 to 200 characters")
    return source


def _refuse(request: web.Request, message: str) -> web.Response:
    """403 with ``message``, in the body and in the ``REFUSAL_HEADER`` a site's WebSocket client reads (it
    sees no body), logged here."""
    log.warning("refused a site's connection: %s (from %s)", message, request.remote)
    body = {"error": "forbidden", "message": message}
    return web.json_response(body, status=403, headers={REFUSAL_HEADER: message})
