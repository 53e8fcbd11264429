"""What the uplink tests share: a CA for the hub and its sites, the two config sections, a TCP relay between a
site and its hub that a test can cut (the WAN), devices publishing continuously, and the check that a hub
holds a site's logs exactly."""

from __future__ import annotations

import asyncio
import ssl
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from aiohttp import ClientSession, WSMsgType, web

from broker_edge.runtime.local_pki import LocalPki
from broker_edge.settings.uplink import site_topic
from broker_edge.storage import LogStore
from broker_edge.storage.record import RecordFields, encode_frames
from broker_edge.uplink.wire import BATCH, DOWN, ENDS, ERROR, HELLO, VERSION, Message, decode, encode
from tests.e2e.conftest import RunningBroker


def hub_section(pki: LocalPki, **overrides: Any) -> dict[str, Any]:
    server = pki.server("hub")
    tls = {"certfile": str(server.cert), "keyfile": str(server.key), "cafile": str(pki.ca.cert)}
    return {"tls": tls, "host": "127.0.0.1", "port": 0, **overrides}


def site_section(pki: LocalPki, site_id: str, hub_port: int, **overrides: Any) -> dict[str, Any]:
    pair = pki.site(site_id)
    return {
        "hubs": [f"wss://127.0.0.1:{hub_port}/v1/uplink"],
        "site_id": site_id,
        "tls": {"certfile": str(pair.cert), "keyfile": str(pair.key), "cafile": str(pki.ca.cert)},
        "reconnect_min_s": 0.05,
        "reconnect_max_s": 0.5,
        "heartbeat_s": 0.5,
        **overrides,
    }


def hub_port(hub: RunningBroker) -> int:
    uplink_hub = hub.broker.uplink_hub
    assert uplink_hub is not None
    return uplink_hub.port


def log_frames(store: LogStore, topic: str) -> tuple[int, int, bytes]:
    """A log's start, end and every stored byte of its records up to a gap, if it has one (call on the
    broker's loop)."""
    if topic not in store:
        return 0, 0, b""
    start, end = store.start_offset(topic), store.durable_end(topic)
    chunks: list[bytes] = []
    offset = start
    while offset < end:
        frames, count = store.replicated_log.read_frames(topic, offset, 1 << 20)
        if not count:
            break
        chunks.extend(frames)
        offset += count
    return start, end, b"".join(chunks)


def payloads(store: LogStore, topics: list[str]) -> list[bytes]:
    """Every payload the logs of ``topics`` hold, log after log, in offset order."""
    return [
        record.payload
        for topic in topics
        if topic in store
        for record in store.read(topic, store.start_offset(topic), 1_000_000, 1 << 30)
    ]


def mirrored(
    site_store: LogStore, hub_store: LogStore, site_id: str, topics: list[str], records: int
) -> bool:
    """Whether the site holds ``records`` records in ``topics`` and the hub each of them exactly as the site
    does: same offsets, same bytes."""
    site_logs = [log_frames(site_store, topic) for topic in topics]
    hub_logs = [log_frames(hub_store, site_topic(site_id, topic)) for topic in topics]
    return sum(end - start for start, end, _ in site_logs) == records and site_logs == hub_logs


def wait_while_progressing(
    done: Callable[[], bool], progress: Callable[[], float], stall_s: float = 20.0
) -> bool:
    """Poll ``done()`` until it holds (True), or until ``progress()`` has not moved for ``stall_s`` (False):
    a loaded machine (other tests' fsyncs) moves slowly, a stuck link not at all."""
    last = progress()
    stalled_at = time.monotonic() + stall_s
    while not done():
        now = time.monotonic()
        current = progress()
        if current != last:
            last, stalled_at = current, now + stall_s
        elif now > stalled_at:
            return False
        time.sleep(0.05)
    return True


class WanRelay:
    """A TCP relay on 127.0.0.1 to ``port``; ``cut()`` drops every connection through it (both ends see the
    link die mid-stream) and, with ``down``, refuses new ones until ``heal()``; ``silence()`` loses every
    byte from then on while the connections stay open (a cut neither end is told of)."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.loop = asyncio.new_event_loop()
        self.down = False
        self.silent = False
        self.cuts = 0
        self._writers: set[asyncio.StreamWriter] = set()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="wan-relay")
        self._thread.start()
        self._ready.wait(5)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self._server = self.loop.run_until_complete(asyncio.start_server(self._relay, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self.loop.run_forever()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.down:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    if not self.silent:
                        sink.write(data)
                        await sink.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                sink.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers.difference_update((writer, up_writer))

    def cut(self, down: bool = False) -> None:
        def drop() -> None:
            self.down = down
            self.cuts += 1
            for writer in list(self._writers):
                writer.transport.abort()

        self.loop.call_soon_threadsafe(drop)

    def silence(self) -> None:
        self.loop.call_soon_threadsafe(setattr, self, "silent", True)

    def heal(self) -> None:
        self.loop.call_soon_threadsafe(setattr, self, "down", False)
        self.loop.call_soon_threadsafe(setattr, self, "silent", False)

    def close(self) -> None:
        async def shut() -> None:
            self._server.close()
            for writer in list(self._writers):
                writer.transport.abort()
            await asyncio.sleep(0.05)
            tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shut(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


class Telemetry:
    """Devices publishing QoS 1 on ``topics`` in turn until stopped; ``acknowledged`` holds every payload
    the broker PUBACKed with success (a cluster refuses some with 0x83 while too few replicas are in sync).
    ``label`` starts every payload (several devices' payloads stay apart)."""

    def __init__(self, port: int, topics: list[str], label: str = "reading") -> None:
        self.port = port
        self.topics = topics
        self.label = label
        self.acknowledged: set[bytes] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        sequence = 0
        while not self._stop.is_set():
            client = mqtt.Client(
                mqtt.CallbackAPIVersion.VERSION2,
                client_id="",
                protocol=mqtt.MQTTv5,
                reconnect_on_failure=False,
            )
            try:
                client.connect("127.0.0.1", self.port)
            except OSError:
                self._stop.wait(0.1)
                continue
            refused = _refusals(client)
            client.loop_start()
            try:
                while not self._stop.is_set():
                    payload = f"{self.label} {sequence}".encode()
                    info = client.publish(self.topics[sequence % len(self.topics)], payload, qos=1)
                    sequence += 1
                    info.wait_for_publish(2)
                    if not info.is_published():
                        break
                    if info.mid not in refused:
                        self.acknowledged.add(payload)
            except (RuntimeError, ValueError):
                pass  # the broker went away mid-publish: not acknowledged
            finally:
                client.loop_stop()
                client.disconnect()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def _refusals(client: mqtt.Client) -> set[int]:
    """The message ids ``client``'s broker answers with a failure reason code, as they come."""
    refused: set[int] = set()

    def published(_client: object, _userdata: object, mid: int, code: Any, _properties: object) -> None:
        if code.is_failure:
            refused.add(mid)

    client.on_publish = published
    return refused


def pki_in(directory: Path) -> LocalPki:
    return LocalPki(directory / "pki", name="uplink-ca")


class StandInHub:
    """A stand-in hub on 127.0.0.1 (TLS, ``server``'s certificate) on its own thread's loop: it takes a
    site's WebSocket and hands it to ``converse``, what each kind of stand-in does with a site."""

    def __init__(self, pki: LocalPki) -> None:
        server = pki.server("hub")
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(str(server.cert), str(server.key))
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=type(self).__name__)
        self._thread.start()
        self._ready.wait(5)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_get("/v1/uplink", self._serve)
        self._runner = web.AppRunner(app)
        self.loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self.context)
        self.loop.run_until_complete(site.start())
        self.port = self._runner.addresses[0][1]
        self._ready.set()
        self.loop.run_forever()

    async def _serve(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await self.converse(ws)
        return ws

    async def converse(self, ws: web.WebSocketResponse) -> None:
        raise NotImplementedError

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


class HelloClosingHub(StandInHub):
    """Reads a site's first message (the HELLO) and closes the connection without answering; ``hellos``
    counts them."""

    hellos = 0

    async def converse(self, ws: web.WebSocketResponse) -> None:
        await ws.receive()
        self.hellos += 1
        await ws.close()


class ScriptedHub(StandInHub):
    """Answers a site's HELLO with empty ENDS, then sends ``script`` (each a whole uplink message, a DOWN at
    an absurd offset), and reads until the site closes; ``closed_by_site`` counts the connections the site
    closed."""

    def __init__(self, pki: LocalPki, script: list[bytes]) -> None:
        self.script = script
        self.closed_by_site = 0
        super().__init__(pki)

    async def converse(self, ws: web.WebSocketResponse) -> None:
        await ws.receive()  # the HELLO
        await ws.send_bytes(encode(ENDS, {"ends": {}}))
        for message in self.script:
            await ws.send_bytes(message)
        async for _message in ws:
            pass
        self.closed_by_site += 1


def converse_as_site(
    pki: LocalPki, site_id: str, port: int, messages: list[bytes], hello: bytes | None = None
) -> list[Message | None]:
    """Dial a hub's uplink on ``port`` as ``site_id`` (its certificate), send a HELLO (``hello`` or the
    plain one), then each of ``messages``; what the hub answered to each, in order, the ENDS first (None:
    the hub closed the connection instead of answering; the rest is not sent)."""
    pair = pki.site(site_id)
    context = ssl.create_default_context(cafile=str(pki.ca.cert))
    context.load_cert_chain(str(pair.cert), str(pair.key))

    async def talk() -> list[Message | None]:
        answers: list[Message | None] = []
        async with (
            ClientSession() as session,
            session.ws_connect(f"wss://127.0.0.1:{port}/v1/uplink", ssl=context) as ws,
        ):
            for message in [hello or encode(HELLO, {"version": VERSION, "site": site_id}), *messages]:
                await ws.send_bytes(message)
                answer = await ws.receive(timeout=15)
                if answer.type != WSMsgType.BINARY:
                    answers.append(None)
                    break
                decoded = decode(answer.data)
                answers.append(decoded)
                if decoded.kind == ERROR:
                    closing = await ws.receive(timeout=15)
                    assert closing.type in (WSMsgType.CLOSE, WSMsgType.CLOSED, WSMsgType.CLOSING)
                    break
        return answers

    return asyncio.run(talk())


def frames_at(first: int, payloads: list[bytes]) -> bytes:
    """Stored frames of ``payloads`` at offsets ``first``, ``first + 1``, ... (what a sender's log holds)."""
    records: list[RecordFields] = [
        (payload, 1, False, "device", [], None, None, None, None, None) for payload in payloads
    ]
    return b"".join(encode_frames(first, int(time.time() * 1000), records))


def batch_message(topic: str, first: int, frames: bytes, kind: int = BATCH, **header: Any) -> bytes:
    """A BATCH (or DOWN) of one topic's ``frames`` from offset ``first``; ``header`` overrides its fields
    (an absurd ``seq``, ``site_ends``)."""
    count = len(decode_frames_loosely(frames))
    fields = {
        "seq": 0,
        "codec": "none",
        "topics": [[topic, first, count, len(frames)]],
        "site_ends": {},
        **header,
    }
    return encode(kind, fields, frames)


def decode_frames_loosely(frames: bytes) -> list[int]:
    """Where each frame of ``frames`` starts (their length prefixes only)."""
    starts, position = [], 0
    while position < len(frames):
        starts.append(position)
        (length,) = struct.unpack_from("<I", frames, position)
        position += 8 + length
    return starts


def raw_message(kind: int, header: str, body: bytes = b"") -> bytes:
    """An uplink message whose header is ``header`` as written (JSON no encoder writes: ``1e400``)."""
    data = header.encode()
    return struct.pack(">BI", kind, len(data)) + data + body


def downlink_as_site(pki: LocalPki, site_id: str, port: int, filters: list[str], quiet_s: float) -> set[str]:
    """Dial a hub as ``site_id`` asking for the downlink ``filters`` from the start; the topics of every
    DOWN the hub sends until none has come for ``quiet_s``."""
    pair = pki.site(site_id)
    context = ssl.create_default_context(cafile=str(pki.ca.cert))
    context.load_cert_chain(str(pair.cert), str(pair.key))
    hello = {"version": VERSION, "site": site_id, "downlink": {"filters": filters, "ends": {}}}

    async def listen() -> set[str]:
        topics: set[str] = set()
        async with (
            ClientSession() as session,
            session.ws_connect(f"wss://127.0.0.1:{port}/v1/uplink", ssl=context) as ws,
        ):
            await ws.send_bytes(encode(HELLO, hello))
            while True:
                try:
                    answer = await ws.receive(timeout=quiet_s)
                except TimeoutError:
                    return topics
                if answer.type != WSMsgType.BINARY:
                    return topics
                message = decode(answer.data)
                if message.kind == DOWN:
                    topics.update(part[0] for part in message.header["topics"])

    return asyncio.run(listen())
