"""The broker's own transport for plain TCP: sockets watched with ``loop.add_reader`` / ``loop.add_writer``.

An idle connection holds its socket, a ``NativeTransport`` of a few slots and the loop's watch of its
descriptor; nothing is allocated up front for reading or writing. A read is one ``recv_into`` when the loop
says the socket is readable, into a buffer the listener's connections share, and the protocol gets a copy of
exactly the bytes read. A write goes to the socket at once when nothing waits before it; only what the socket
did not take is kept (a list of the unsent pieces, dropped once empty) until the loop says it is writable.

It behaves as asyncio's selector socket transport towards its protocol: ``connection_made`` first, then
``data_received`` per read, ``eof_received`` at the peer's end of stream (the transport closes unless it
returns true), ``pause_writing`` when the unsent bytes pass the high-water mark and ``resume_writing`` once
they are back at the low one, and ``connection_lost`` exactly once, in a later loop iteration, after
``close`` (once what is pending is written), ``abort`` or an error (``ECONNRESET``, ``EPIPE``, ...: the
exception is passed).

``NativeServer`` is the listener: its socket is watched for readability and each readiness accepts up to
``ACCEPT_BATCH`` connections without blocking; running out of descriptors (``EMFILE``, ``ENFILE``) or
memory pauses accepting for ``ACCEPT_RETRY_DELAY_S`` and leaves the waiting connections in the backlog.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
from asyncio.trsock import TransportSocket
from collections.abc import Callable, Iterable
from typing import Any, cast

from broker_edge.process.sockets import listening_sockets

__all__ = ["ACCEPT_BATCH", "ACCEPT_RETRY_DELAY_S", "NativeServer", "NativeTransport", "start_native_server"]

log = logging.getLogger("broker_edge.transports.native")

READ_SIZE = 256 * 1024
"""Bytes asked of one read (asyncio's ``max_size``)."""
ACCEPT_BATCH = 128
"""Connections accepted at most per readiness of the listening socket."""
ACCEPT_RETRY_DELAY_S = 0.25
"""How long accepting pauses when the process or the system is out of descriptors or buffers."""
MAX_IOV = min(os.sysconf("SC_IOV_MAX"), 1024) if hasattr(os, "sysconf") else 16
"""Pieces handed to one ``sendmsg`` at most (the system's limit)."""
DEFAULT_HIGH_WATER = 64 * 1024
"""asyncio's default write-buffer high-water mark (the low one is a quarter of it)."""

_OUT_OF_RESOURCES = frozenset((errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM))

# Flags of a transport (one small int: most are never set on an idle connection).
_STARTING = 1  # connection_made is running: the listener knows the peer's address
_CLOSING = 2  # close() or abort() called, or an error: no more reading
_LOST = 4  # connection_lost is scheduled or done: nothing more is written
_READ_PAUSED = 8
_READ_EOF = 16  # the peer's end of stream was read (half-closed, kept open by eof_received)
_WRITE_EOF = 32  # write_eof() called: shut down writing once the pending bytes are written
_PROTOCOL_PAUSED = 64  # pause_writing was called, resume_writing not yet
_DROPPED = 128  # connection_made failed: connection_lost is not called


class _Pending(list[bytes | memoryview]):
    """The bytes a socket has not taken yet, in order, with their total (exists only while not empty)."""

    __slots__ = ("size",)

    def __init__(self, pieces: list[bytes | memoryview]) -> None:
        super().__init__(pieces)
        self.size = sum(map(len, pieces))


class NativeTransport(asyncio.Transport):
    """An ``asyncio.Transport`` over one connected non-blocking TCP socket (see the module docstring).

    Made by ``NativeServer`` for each accepted socket; ``start`` hands it to its protocol.
    """

    __slots__ = ("_flags", "_limits", "_pending", "_protocol", "_server", "_sock")

    def __init__(self, sock: socket.socket, protocol: asyncio.Protocol, server: NativeServer) -> None:
        # asyncio.BaseTransport.__init__ is not called: its per-transport ``extra`` dict is what this
        # transport does without (``get_extra_info`` asks the socket).
        self._sock = sock
        self._protocol = protocol
        self._server = server
        self._pending: _Pending | None = None
        self._limits: tuple[int, int] | None = None
        """(high, low) water marks when they differ from the server's; None: the server's."""
        self._flags = 0

    def start(self, peername: Any = None) -> None:
        """Call the protocol's ``connection_made``, then start reading (unless it closed the transport)."""
        server = self._server
        self._flags |= _STARTING
        server.starting_peer = peername
        try:
            self._protocol.connection_made(self)
        finally:
            server.starting_peer = None
            self._flags &= ~_STARTING
        if not self._flags & (_CLOSING | _READ_PAUSED):
            server.loop.add_reader(self._sock.fileno(), self._read_ready)

    def __repr__(self) -> str:
        return f"<NativeTransport fd={self._sock.fileno()} flags={self._flags:#x}>"

    # -- reading ------------------------------------------------------------------------------------------

    def _read_ready(self) -> None:
        if self._flags & _LOST:
            return
        server = self._server
        try:
            size = self._sock.recv_into(server.read_buffer)
        except (BlockingIOError, InterruptedError):
            return
        except Exception as exc:
            self._fatal_error(exc, "read error")
            return
        if not size:
            self._eof_read()
            return
        try:
            self._protocol.data_received(server.read_view[:size].tobytes())
        except Exception as exc:
            self._fatal_error(exc, "protocol.data_received() failed")

    def _eof_read(self) -> None:
        try:
            keep_open = self._protocol.eof_received()
        except Exception as exc:
            self._fatal_error(exc, "protocol.eof_received() failed")
            return
        if keep_open:  # half-closed: nothing more to read, writing goes on
            if not self._flags & (_CLOSING | _READ_PAUSED):
                self._server.loop.remove_reader(self._sock.fileno())
            self._flags |= _READ_EOF
        else:
            self.close()

    def is_reading(self) -> bool:
        return not self._flags & (_CLOSING | _READ_PAUSED | _READ_EOF)

    def pause_reading(self) -> None:
        if self._flags & (_CLOSING | _READ_PAUSED):
            return
        self._flags |= _READ_PAUSED
        if not self._flags & (_STARTING | _READ_EOF):
            self._server.loop.remove_reader(self._sock.fileno())

    def resume_reading(self) -> None:
        if self._flags & _CLOSING or not self._flags & _READ_PAUSED:
            return
        self._flags &= ~_READ_PAUSED
        if not self._flags & (_STARTING | _READ_EOF):
            self._server.loop.add_reader(self._sock.fileno(), self._read_ready)

    # -- writing ------------------------------------------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if data.__class__ is not bytes and not isinstance(data, (bytearray, memoryview)):
            raise TypeError(f"data argument must be a bytes-like object, not {type(data).__name__!r}")
        if self._flags & (_WRITE_EOF | _LOST):
            if self._flags & _WRITE_EOF:
                raise RuntimeError("Cannot call write() after write_eof()")
            return
        if not data:
            return
        pending = self._pending
        if pending is not None:
            if data.__class__ is not bytes:
                data = bytes(data)  # the caller may change its buffer before it is sent
            pending.append(data)
            pending.size += len(data)
            self._maybe_pause_protocol(pending.size)
            return
        try:
            sent = self._sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except Exception as exc:
            self._fatal_error(exc, "write error")
            return
        if sent != len(data):
            self._keep_unsent([data], sent)

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        """Write the pieces in order: one ``sendmsg`` of them all when nothing is pending (no joined copy)."""
        pieces = list_of_data if list_of_data.__class__ is list else list(list_of_data)
        if len(pieces) == 1:
            self.write(pieces[0])
            return
        if self._flags & _WRITE_EOF:
            raise RuntimeError("Cannot call write() after write_eof()")
        if not pieces or self._flags & _LOST:
            return
        pending = self._pending
        if pending is not None:
            for data in pieces:
                pending.append(data if data.__class__ is bytes else bytes(data))
                pending.size += len(data)
            self._maybe_pause_protocol(pending.size)
            return
        if len(pieces) <= MAX_IOV:
            self._send_pieces(pieces)
            return
        for start in range(0, len(pieces), MAX_IOV):  # as many calls as the system's limit needs
            chunk = pieces[start : start + MAX_IOV]
            if not self._send_pieces(chunk):
                if not self._flags & _LOST:  # the socket is full: the later chunks wait behind the kept rest
                    self._keep_unsent(pieces[start + len(chunk) :], 0, append=True)
                return

    def _send_pieces(self, pieces: list[bytes | bytearray | memoryview]) -> bool:
        """``sendmsg`` of ``pieces``, what was not taken kept; whether the socket took them all."""
        try:
            sent = self._sock.sendmsg(pieces)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._fatal_error(exc, "write error")
            return False
        if sent == sum(map(len, pieces)):
            return True
        self._keep_unsent(pieces, sent)
        return False

    def _keep_unsent(
        self, pieces: list[bytes | bytearray | memoryview], sent: int, append: bool = False
    ) -> None:
        """Keep what of ``pieces`` the socket did not take (``sent`` bytes did go) until it is writable
        (``append``: after what is already kept)."""
        index = 0
        while index < len(pieces) and sent >= len(pieces[index]):
            sent -= len(pieces[index])
            index += 1
        if index == len(pieces):
            return
        # bytes are kept as they are; other buffers are copied: their owner may change them before they go
        rest: list[bytes | memoryview] = [p if p.__class__ is bytes else bytes(p) for p in pieces[index:]]
        if sent:
            rest[0] = memoryview(rest[0])[sent:]
        pending = self._pending
        if append and pending is not None:
            pending.extend(rest)
            pending.size += sum(map(len, rest))
        else:
            self._pending = pending = _Pending(rest)
            self._server.loop.add_writer(self._sock.fileno(), self._write_ready)
        self._maybe_pause_protocol(pending.size)

    def _write_ready(self) -> None:
        pending = self._pending
        if pending is None or self._flags & _LOST:
            return
        try:
            if len(pending) == 1:
                sent = self._sock.send(pending[0])
            else:
                sent = self._sock.sendmsg(pending if len(pending) <= MAX_IOV else pending[:MAX_IOV])
        except (BlockingIOError, InterruptedError):
            return
        except Exception as exc:
            self._fatal_error(exc, "write error")
            return
        pending.size -= sent
        if pending.size:
            _drop_sent(pending, sent)
            self._maybe_resume_protocol(pending.size)
            return
        self._pending = None
        self._server.loop.remove_writer(self._sock.fileno())
        self._maybe_resume_protocol(0)  # may write again (then a new pending list and writer exist)
        if self._pending is not None:
            return
        if self._flags & _CLOSING:
            self._connection_lost(None)
        elif self._flags & _WRITE_EOF:
            self._shutdown_write()

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        if self._flags & (_CLOSING | _WRITE_EOF):
            return
        self._flags |= _WRITE_EOF
        if self._pending is None:
            self._shutdown_write()

    def _shutdown_write(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError as exc:
            self._fatal_error(exc, "shutdown error")

    # -- write-buffer limits -------------------------------------------------------------------------------

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if high is None:
            high = DEFAULT_HIGH_WATER if low is None else 4 * low
        if low is None:
            low = high // 4
        if not high >= low >= 0:
            raise ValueError(f"high ({high!r}) must be >= low ({low!r}) must be >= 0")
        limits = self._server.limits
        self._limits = None if limits == (high, low) else (high, low)
        self._maybe_pause_protocol(self.get_write_buffer_size())

    def get_write_buffer_limits(self) -> tuple[int, int]:
        high, low = self._limits or self._server.limits
        return low, high

    def get_write_buffer_size(self) -> int:
        pending = self._pending
        return pending.size if pending is not None else 0

    def _maybe_pause_protocol(self, size: int) -> None:
        if self._flags & _PROTOCOL_PAUSED or size <= (self._limits or self._server.limits)[0]:
            return
        self._flags |= _PROTOCOL_PAUSED
        try:
            self._protocol.pause_writing()
        except Exception as exc:
            self._report("protocol.pause_writing() failed", exc)

    def _maybe_resume_protocol(self, size: int) -> None:
        if not self._flags & _PROTOCOL_PAUSED or size > (self._limits or self._server.limits)[1]:
            return
        self._flags &= ~_PROTOCOL_PAUSED
        try:
            self._protocol.resume_writing()
        except Exception as exc:
            self._report("protocol.resume_writing() failed", exc)

    # -- closing ------------------------------------------------------------------------------------------

    def is_closing(self) -> bool:
        return bool(self._flags & _CLOSING)

    def close(self) -> None:
        """Stop reading; once the pending bytes are written, close and call ``connection_lost(None)``."""
        flags = self._flags
        if flags & _CLOSING:
            return
        self._flags = flags | _CLOSING
        self._stop_reading(flags)
        if self._pending is None:
            self._flags |= _LOST
            self._server.loop.call_soon(self._connection_lost, None)

    def abort(self) -> None:
        """Close at once, dropping what is pending; ``connection_lost(None)`` follows."""
        self._force_close(None)

    def _force_close(self, exc: Exception | None) -> None:
        flags = self._flags
        if flags & _LOST:
            return
        loop = self._server.loop
        if self._pending is not None:
            self._pending = None
            loop.remove_writer(self._sock.fileno())
        if not flags & _CLOSING:
            self._stop_reading(flags)
        self._flags |= _CLOSING | _LOST
        loop.call_soon(self._connection_lost, exc)

    def _stop_reading(self, flags: int) -> None:
        if not flags & (_STARTING | _READ_PAUSED | _READ_EOF):
            self._server.loop.remove_reader(self._sock.fileno())

    def _fatal_error(self, exc: Exception, message: str) -> None:
        if isinstance(exc, OSError):
            log.debug("%r: %s: %s", self, message, exc)  # resets and broken pipes are the peer's doing
        else:
            self._report(message, exc)
        self._force_close(exc)

    def _report(self, message: str, exc: Exception) -> None:
        self._server.loop.call_exception_handler(
            {"message": message, "exception": exc, "transport": self, "protocol": self._protocol}
        )

    def drop(self) -> None:
        """Close the socket without telling the protocol (its ``connection_made`` failed)."""
        if not self._flags & _LOST:
            self._force_close(None)
            self._flags |= _DROPPED

    def _connection_lost(self, exc: Exception | None) -> None:
        if self._flags & _DROPPED:
            self._sock.close()
            return
        self._flags |= _CLOSING | _LOST
        try:
            self._protocol.connection_lost(exc)
        finally:
            self._sock.close()

    # -- what the protocol may ask ---------------------------------------------------------------------------

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """``peername``, ``sockname`` and ``socket`` (as asyncio gives it); anything else: ``default``."""
        try:
            if name == "peername":
                if self._flags & _STARTING and self._server.starting_peer is not None:
                    return self._server.starting_peer
                return self._sock.getpeername()
            if name == "sockname":
                return self._sock.getsockname()
        except OSError:
            return default
        if name == "socket":
            return TransportSocket(self._sock)
        return default

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = cast(asyncio.Protocol, protocol)  # a stream protocol, as asyncio's socket transport


def _drop_sent(pending: _Pending, sent: int) -> None:
    """Remove the first ``sent`` bytes from ``pending`` (whole pieces, then the front of one)."""
    index = 0
    while sent >= len(pending[index]):
        sent -= len(pending[index])
        index += 1
    if sent:
        pending[index] = memoryview(pending[index])[sent:]
    del pending[:index]


class NativeServer:
    """Listening sockets that give each accepted connection a ``NativeTransport`` and a new protocol.

    Has what the broker uses of an ``asyncio.Server``: ``sockets``, ``close``, ``wait_closed``.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sockets: list[socket.socket],
        protocol_factory: Callable[[], asyncio.Protocol],
        limits: tuple[int, int] = (DEFAULT_HIGH_WATER, DEFAULT_HIGH_WATER // 4),
    ) -> None:
        self.loop = loop
        self.sockets = sockets
        self.protocol_factory = protocol_factory
        self.limits = limits
        """(high, low) water marks of every transport that was not given its own."""
        self.starting_peer: Any = None
        """The address of the connection whose ``connection_made`` runs now (accept gave it)."""
        self.read_buffer = bytearray(READ_SIZE)
        """What every read of this server's transports goes into first; the protocol gets a copy of the
        bytes read (one allocation of their size, not one of ``READ_SIZE`` shrunk afterwards)."""
        self.read_view = memoryview(self.read_buffer)
        self._serving = False
        self._retry: asyncio.TimerHandle | None = None

    def start_serving(self) -> None:
        """Watch the listening sockets and accept what arrives."""
        if not self._serving and self.sockets:
            self._serving = True
            for sock in self.sockets:
                self.loop.add_reader(sock.fileno(), self._accept_ready, sock)

    def is_serving(self) -> bool:
        return self._serving

    def close(self) -> None:
        """Stop accepting and close the listening sockets (connections already accepted stay open)."""
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        self._stop_serving()
        sockets, self.sockets = self.sockets, []
        for sock in sockets:
            sock.close()

    async def wait_closed(self) -> None:
        """Nothing to wait for: ``close`` closed the listening sockets."""

    def _stop_serving(self) -> None:
        if self._serving:
            self._serving = False
            for sock in self.sockets:
                self.loop.remove_reader(sock.fileno())

    def _accept_ready(self, listening: socket.socket) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                sock, address = listening.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue  # gone before it was accepted
            except OSError as exc:
                if exc.errno not in _OUT_OF_RESOURCES:
                    raise
                self._pause_accepting(exc)
                return
            self._start_connection(sock, address)

    def adopt(self, sock: socket.socket, protocol: asyncio.Protocol) -> None:
        """Serve a connected socket accepted elsewhere (a connection another member handed over) with
        ``protocol``."""
        self._start_connection(sock, None, protocol)

    def _start_connection(
        self, sock: socket.socket, address: Any, protocol: asyncio.Protocol | None = None
    ) -> None:
        try:
            sock.setblocking(False)
            if sock.family != socket.AF_UNIX:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            sock.close()  # reset before it could be set up
            return
        if protocol is None:
            protocol = self.protocol_factory()
        transport = NativeTransport(sock, protocol, self)
        try:
            transport.start(address)
        except Exception as exc:  # connection_made failed: the protocol never had a connection
            self.loop.call_exception_handler(
                {"message": "protocol.connection_made() failed", "exception": exc, "protocol": protocol}
            )
            transport.drop()

    def _pause_accepting(self, exc: OSError) -> None:
        log.warning("accepting paused for %.2f s: %s", ACCEPT_RETRY_DELAY_S, exc)
        self._stop_serving()
        self._retry = self.loop.call_later(ACCEPT_RETRY_DELAY_S, self._resume_accepting)

    def _resume_accepting(self) -> None:
        self._retry = None
        self.start_serving()


def start_native_server(
    protocol_factory: Callable[[], asyncio.Protocol],
    host: str | None,
    port: int,
    backlog: int = 100,
    limits: tuple[int, int] = (DEFAULT_HIGH_WATER, DEFAULT_HIGH_WATER // 4),
    reuse_port: bool = False,
    serving: bool = True,
) -> NativeServer:
    """Bind ``host:port`` (port 0: a free one; ``reuse_port``: shared with other processes) and accept on the
    running loop with native transports (``serving=False``: once ``start_serving`` is called)."""
    server = NativeServer(
        asyncio.get_running_loop(),
        listening_sockets(host, port, backlog, reuse_port),
        protocol_factory,
        limits,
    )
    if serving:
        server.start_serving()
    return server
