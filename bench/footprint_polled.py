"""Prototype, bench only: the broker with a TCP transport of its own on ``loop.add_reader``.

    python -m bench.footprint_polled broker --config FILE

Runs ``timestone broker`` unchanged except for its plain TCP listeners: instead of uvloop's server and
transports, the listening socket is watched with ``loop.add_reader`` and each accepted socket gets a
``PolledTransport`` (its descriptor, its protocol, unsent bytes, flags), read with ``os.read`` when the
loop says it is readable and written with ``os.write``, the rest waiting for ``loop.add_writer``. The
protocol is the broker's own ``Connection``, as with uvloop's transport.

What it is for: the footprint benchmark measures its memory per idle connection next to the uvloop
transport's (the poll floor says where it would start from) and the soak its CPU per message (every read
is a Python call and an ``os.read`` where uvloop reads in C). It is not the production transport: no TLS,
no ``TCP_NODELAY`` on platforms that need it set after accept, reading stops only through
``pause_reading``, and it is tested by these benchmarks only.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import sys
from pathlib import Path
from typing import Any

from bench.brokers.timestone import Timestone
from broker_edge.connection import Connection

_READ_SIZE = 256 * 1024
_CLOSING, _CLOSED, _PAUSED_WRITING = 1, 2, 4
_loop: asyncio.AbstractEventLoop | None = None
_peer: Any = None
"""The address of the socket being accepted, while its connection starts (kept by no transport)."""


class PolledTransport:
    """A ``ByteTransport`` over one non-blocking socket descriptor (see the module docstring)."""

    __slots__ = ("fd", "flags", "protocol", "unsent")

    def __init__(self, fd: int, protocol: Connection) -> None:
        self.fd = fd
        self.protocol = protocol
        self.unsent: list[bytes] | None = None
        self.flags = 0

    def readable(self) -> None:
        try:
            data = os.read(self.fd, _READ_SIZE)
        except BlockingIOError:
            return
        except OSError as exc:
            self._finish(exc)
            return
        if data:
            self.protocol.data_received(data)
        else:
            self._finish(None)

    def write(self, data: bytes) -> None:
        if self.flags & (_CLOSED | _CLOSING):
            return
        if self.unsent is not None:
            self.unsent.append(data)
            self._check_limit()
            return
        try:
            sent = os.write(self.fd, data)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            self._finish(exc)
            return
        if sent < len(data):
            self.unsent = [data[sent:]]
            assert _loop is not None
            _loop.add_writer(self.fd, self._writable)
            self._check_limit()

    def writelines(self, parts: Any) -> None:
        self.write(b"".join(parts))

    def _check_limit(self) -> None:
        unsent = self.unsent
        limit = self.protocol.host.config.limits.outgoing_buffer_bytes
        if unsent and not self.flags & _PAUSED_WRITING and sum(map(len, unsent)) > limit:
            self.flags |= _PAUSED_WRITING
            self.protocol.pause_writing()

    def _writable(self) -> None:
        unsent = self.unsent
        if not unsent:
            return
        data = b"".join(unsent) if len(unsent) > 1 else unsent[0]
        try:
            sent = os.write(self.fd, data)
        except BlockingIOError:
            return
        except OSError as exc:
            self._finish(exc)
            return
        if sent < len(data):
            self.unsent = [data[sent:]]
            return
        self.unsent = None
        assert _loop is not None
        _loop.remove_writer(self.fd)
        if self.flags & _PAUSED_WRITING:
            self.flags &= ~_PAUSED_WRITING
            self.protocol.resume_writing()
        if self.flags & _CLOSING:
            self._finish(None)

    def is_closing(self) -> bool:
        return bool(self.flags & (_CLOSING | _CLOSED))

    def close(self) -> None:
        if self.flags & (_CLOSING | _CLOSED):
            return
        self.flags |= _CLOSING
        if self.unsent is None:
            assert _loop is not None
            _loop.call_soon(self._finish, None)

    def abort(self) -> None:
        if not self.flags & _CLOSED:
            assert _loop is not None
            _loop.call_soon(self._finish, None)
            self.flags |= _CLOSING

    def pause_reading(self) -> None:
        if not self.flags & _CLOSED:
            assert _loop is not None
            _loop.remove_reader(self.fd)

    def resume_reading(self) -> None:
        if not self.flags & (_CLOSED | _CLOSING):
            assert _loop is not None
            _loop.add_reader(self.fd, self.readable)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peername":
            if _peer is not None:
                return _peer
            try:
                with socket.socket(fileno=os.dup(self.fd)) as sock:
                    return sock.getpeername()
            except OSError:
                return default
        return default

    def _finish(self, exc: Exception | None) -> None:
        if self.flags & _CLOSED:
            return
        self.flags |= _CLOSED
        assert _loop is not None
        _loop.remove_reader(self.fd)
        if self.unsent is not None:
            _loop.remove_writer(self.fd)
            self.unsent = None
        os.close(self.fd)
        self.protocol.connection_lost(exc)


class _PolledServer:
    """What ``Broker.start`` and its shutdown use of an ``asyncio.Server``."""

    def __init__(self, sock: socket.socket) -> None:
        self.sockets = [sock]

    def close(self) -> None:
        assert _loop is not None
        _loop.remove_reader(self.sockets[0].fileno())
        self.sockets[0].close()

    async def wait_closed(self) -> None:
        return None


async def start_polled_listener(broker: Any, listener: Any) -> _PolledServer:
    global _loop
    loop = _loop = asyncio.get_running_loop()
    config = listener.config
    if listener.ssl_context is not None:
        raise RuntimeError("the polled transport prototype has no TLS")
    listening = socket.create_server((config.host, config.port), backlog=1024, reuse_port=False)
    listening.setblocking(False)

    def accept() -> None:
        global _peer
        for _ in range(64):
            try:
                sock, address = listening.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE):
                    return
                raise
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            connection = Connection(broker, listener)
            transport = PolledTransport(sock.detach(), connection)
            _peer = address
            try:
                connection.connection_made(transport)  # type: ignore[arg-type]  # has the methods Connection calls
            finally:
                _peer = None
            if not transport.flags & _CLOSED:
                loop.add_reader(transport.fd, transport.readable)

    loop.add_reader(listening.fileno(), accept)
    return _PolledServer(listening)


class PolledTimestone(Timestone):
    """The benchmark's Timestone (same configuration) on the polled transport."""

    name = "timestone-polled"

    @property
    def label(self) -> str:
        return "timestone, polled transport (prototype)"

    def command(self, port: int, workdir: Path) -> list[str]:
        return [sys.executable, "-m", "bench.footprint_polled", *super().command(port, workdir)[1:]]

    def env(self) -> dict[str, str] | None:
        return dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))


def main(argv: list[str]) -> int:
    from broker_edge.transports import tcp

    tcp.start_tcp_listener = start_polled_listener  # type: ignore[assignment]  # this process only
    from pipelines.cli import main as timestone

    return timestone(argv)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
