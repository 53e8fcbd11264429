"""Clients that ask one HTTP request flat out: each connection keeps several in flight (HTTP/1.1
pipelining) and sends another as each answer arrives, on one asyncio loop of a thread of its own. An answer
that closes its connection (a 401 to a stranger) has the connection opened again at once, its requests
sent anew: a stranger who keeps asking."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter

METRICS_REQUEST = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


def http_request(
    path: str, method: str = "GET", headers: dict[str, str] | None = None, body: bytes = b""
) -> bytes:
    """The bytes of one HTTP/1.1 request."""
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    if body:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class HttpPipeliners:
    """``connections`` connections to ``127.0.0.1:port`` pipelining ``request``, ``depth`` in flight each;
    ``answers`` counts the answers read, all connections together, ``statuses`` them by status, ``reopened``
    the connections opened again after an answer closed them. ``stop()`` closes them."""

    def __init__(
        self, port: int, connections: int = 70, depth: int = 8, request: bytes = METRICS_REQUEST
    ) -> None:
        self.port = port
        self.connections = connections
        self.depth = depth
        self.request = request
        self.answers = 0
        self.statuses: Counter[int] = Counter()
        self.reopened = 0
        self.failures: list[BaseException] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="pipeliners", daemon=True)
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> HttpPipeliners:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._open(), self._loop).result(timeout=30)
        return self

    async def _open(self) -> None:
        for _ in range(self.connections):
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            self._tasks.append(asyncio.create_task(self._keep_asking(reader, writer)))

    async def _keep_asking(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await self._ask(reader, writer):  # the answer closed the connection: open another
                self.reopened += 1
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        except asyncio.CancelledError:
            raise
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            self.failures.append(exc)

    async def _ask(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Ask on one connection until an answer closes it (True) or the task is cancelled."""
        try:
            writer.write(self.request * self.depth)
            while True:
                closes = await self._read_answer(reader)
                self.answers += 1
                if closes:
                    return True
                writer.write(self.request)
        finally:
            writer.close()

    async def _read_answer(self, reader: asyncio.StreamReader) -> bool:
        """Read one answer (a length or chunks); whether it closes its connection."""
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        self.statuses[int(head[0].split()[1])] += 1
        fields = {
            name.strip().lower(): value.strip().lower()
            for name, _, value in (h.partition(":") for h in head[1:])
        }
        if fields.get("transfer-encoding") == "chunked":
            while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
                await reader.readexactly(size + 2)
            await reader.readuntil(b"\r\n")
        else:
            await reader.readexactly(int(fields.get("content-length", "0")))
        return fields.get("connection") == "close"

    def stop(self) -> None:
        async def cancel() -> None:
            for task in self._tasks:
                task.cancel()
            for task in self._tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

        asyncio.run_coroutine_threadsafe(cancel(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()
