"""Clients that ask ``GET /metrics`` flat out: each connection keeps several requests in flight (HTTP/1.1
pipelining) and sends another as each answer arrives, on one asyncio loop of a thread of its own."""

from __future__ import annotations

import asyncio
import contextlib
import threading

REQUEST = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


class MetricsPipeliners:
    """``connections`` connections to ``127.0.0.1:port`` pipelining ``GET /metrics``, ``depth`` requests
    each in flight; ``answers`` counts the answers read, all connections together. ``stop()`` closes them."""

    def __init__(self, port: int, connections: int = 70, depth: int = 8) -> None:
        self.port = port
        self.connections = connections
        self.depth = depth
        self.answers = 0
        self.failures: list[BaseException] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="pipeliners", daemon=True)
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> MetricsPipeliners:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._open(), self._loop).result(timeout=30)
        return self

    async def _open(self) -> None:
        for _ in range(self.connections):
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            self._tasks.append(asyncio.create_task(self._ask(reader, writer)))

    async def _ask(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(REQUEST * self.depth)
            while True:
                headers = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in headers.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                await reader.readexactly(length)
                self.answers += 1
                writer.write(REQUEST)
        except asyncio.CancelledError:
            raise
        except (OSError, asyncio.IncompleteReadError, StopIteration) as exc:
            self.failures.append(exc)
        finally:
            writer.close()

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
