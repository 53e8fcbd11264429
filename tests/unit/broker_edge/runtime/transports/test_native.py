"""The broker's own TCP transport on real loopback sockets, under asyncio's event loop and uvloop's.

Each test connects a plain client socket to a ``NativeTransport`` (or to a ``NativeServer``) and checks what
the protocol is told and what the client receives: partial writes and back-pressure, the peer's end of
stream, resets, closing with bytes still pending, abort, and the accept loop.
"""

from __future__ import annotations

import asyncio
import os
import resource
import socket
import struct
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import uvloop

from broker_edge.runtime.transports.native import (
    ACCEPT_BATCH,
    DEFAULT_HIGH_WATER,
    NativeServer,
    NativeTransport,
    start_native_server,
)
from tests.harness.async_waits import until

TOTAL = 2 * 1024 * 1024
PIECE = 32 * 1024


class Recorder(asyncio.Protocol):
    """A protocol that writes down every call the transport makes."""

    def __init__(self, keep_open_on_eof: bool = False) -> None:
        self.events: list[str] = []
        self.received = bytearray()
        self.transport: NativeTransport | None = None
        self.peer: Any = None
        self.lost_with: list[Exception | None] = []
        self.keep_open_on_eof = keep_open_on_eof

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, NativeTransport)
        self.transport = transport
        self.peer = transport.get_extra_info("peername")
        self.events.append("made")

    def data_received(self, data: bytes) -> None:
        if not self.events or self.events[-1] != "data":
            self.events.append("data")
        self.received += data

    def eof_received(self) -> bool:
        self.events.append("eof")
        return self.keep_open_on_eof

    def pause_writing(self) -> None:
        self.events.append("pause")

    def resume_writing(self) -> None:
        self.events.append("resume")

    def connection_lost(self, exc: Exception | None) -> None:
        self.events.append("lost")
        self.lost_with.append(exc)


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Iterator[Callable[[Callable[[], Awaitable[None]]], None]]:
    """Run a scenario to its end on a new event loop of either kind (10 s at most)."""

    def runner(scenario: Callable[[], Awaitable[None]]) -> None:
        loop = uvloop.new_event_loop() if request.param == "uvloop" else asyncio.new_event_loop()
        try:
            loop.run_until_complete(asyncio.wait_for(scenario(), 10))
        finally:
            loop.close()

    yield runner


def tcp_pair(
    server_sndbuf: int | None = None, client_rcvbuf: int | None = None
) -> tuple[socket.socket, socket.socket]:
    """(accepted side, client side) of a fresh loopback TCP connection."""
    with socket.create_server(("127.0.0.1", 0)) as listening:
        client = socket.socket()
        if client_rcvbuf:
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, client_rcvbuf)
        client.connect(listening.getsockname())
        accepted, _ = listening.accept()
    if server_sndbuf:
        accepted.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, server_sndbuf)
    client.setblocking(False)
    return accepted, client


def attach(sock: socket.socket, protocol: Recorder) -> NativeTransport:
    """A transport started on ``sock`` as the listener starts one, with asyncio's default limits."""
    server = NativeServer(asyncio.get_running_loop(), [], lambda: protocol)
    sock.setblocking(False)
    transport = NativeTransport(sock, protocol, server)
    transport.start(sock.getpeername())
    return transport


def pattern(total: int = TOTAL) -> bytes:
    return b"".join(struct.pack(">I", n) for n in range(total // 4))


async def read_all(client: socket.socket, limit: int | None = None) -> tuple[bytes, bool]:
    """What the client reads until the end of stream (True) or ``limit`` bytes (False); a reset ends it."""
    loop = asyncio.get_running_loop()
    data = bytearray()
    while limit is None or len(data) < limit:
        try:
            chunk = await loop.sock_recv(client, 65536)
        except ConnectionResetError:
            return bytes(data), True
        if not chunk:
            return bytes(data), True
        data += chunk
    return bytes(data), False


def test_reads_and_writes_and_says_who_the_peer_is(run):
    async def scenario() -> None:
        accepted, client = tcp_pair()
        protocol = Recorder()
        transport = attach(accepted, protocol)
        assert protocol.peer == client.getsockname()
        assert transport.get_extra_info("sockname") == client.getpeername()
        assert transport.get_extra_info("socket").fileno() == accepted.fileno()
        assert transport.get_extra_info("sslcontext", "none") == "none"
        await asyncio.get_running_loop().sock_sendall(client, b"hello")
        await until(lambda: protocol.received == b"hello")
        transport.write(b"one ")
        transport.writelines([b"two ", bytearray(b"three ")])
        transport.write(memoryview(b"four"))
        assert (await read_all(client, 18))[0] == b"one two three four"
        transport.close()
        transport.close()
        await until(lambda: "lost" in protocol.events)
        assert protocol.events == ["made", "data", "lost"]
        assert protocol.lost_with == [None]
        assert await read_all(client) == (b"", True)
        client.close()

    run(scenario)


def test_a_partial_write_keeps_the_rest_and_pauses_then_resumes_the_writer(run):
    async def scenario() -> None:
        accepted, client = tcp_pair(server_sndbuf=4096, client_rcvbuf=4096)
        protocol = Recorder()
        transport = attach(accepted, protocol)
        data = pattern()
        for start in range(0, TOTAL, PIECE):
            transport.write(data[start : start + PIECE])
        assert transport.get_write_buffer_size() > DEFAULT_HIGH_WATER
        assert protocol.events == ["made", "pause"]
        received, _ = await read_all(client, TOTAL)
        assert received == data
        await until(lambda: transport.get_write_buffer_size() == 0)
        assert protocol.events == ["made", "pause", "resume"]
        transport.close()
        await until(lambda: "lost" in protocol.events)
        client.close()

    run(scenario)


def test_write_buffer_limits_pause_at_once_when_already_above_them(run):
    async def scenario() -> None:
        accepted, client = tcp_pair(server_sndbuf=4096, client_rcvbuf=4096)
        protocol = Recorder()
        transport = attach(accepted, protocol)
        transport.write(pattern(256 * 1024))
        assert protocol.events == ["made", "pause"]
        assert transport.get_write_buffer_limits() == (DEFAULT_HIGH_WATER // 4, DEFAULT_HIGH_WATER)
        transport.set_write_buffer_limits(high=10 * 1024 * 1024)
        assert transport.get_write_buffer_limits() == (10 * 1024 * 1024 // 4, 10 * 1024 * 1024)
        assert protocol.events == ["made", "pause"]  # paused stays paused until it drains below low
        await read_all(client, 256 * 1024)
        await until(lambda: protocol.events[-1] == "resume")
        transport.set_write_buffer_limits(high=100, low=10)
        transport.write(pattern(256 * 1024))  # above 100 bytes at once
        assert protocol.events == ["made", "pause", "resume", "pause"]
        with pytest.raises(ValueError):
            transport.set_write_buffer_limits(high=1, low=2)
        transport.abort()
        await until(lambda: "lost" in protocol.events)
        client.close()

    run(scenario)


def test_the_peers_end_of_stream_closes_unless_the_protocol_keeps_it_open(run):
    async def scenario() -> None:
        accepted, client = tcp_pair()
        protocol = Recorder()
        attach(accepted, protocol)
        client.shutdown(socket.SHUT_WR)
        await until(lambda: "lost" in protocol.events)
        assert protocol.events == ["made", "eof", "lost"]
        assert protocol.lost_with == [None]
        assert await read_all(client) == (b"", True)
        client.close()

        accepted, client = tcp_pair()
        protocol = Recorder(keep_open_on_eof=True)
        transport = attach(accepted, protocol)
        await asyncio.get_running_loop().sock_sendall(client, b"last words")
        client.shutdown(socket.SHUT_WR)
        await until(lambda: "eof" in protocol.events)
        assert protocol.received == b"last words"
        assert not transport.is_closing()
        transport.pause_reading()
        transport.resume_reading()  # nothing more to read: the socket stays unwatched for reading
        transport.write(b"half-closed: still writing")
        transport.write_eof()
        assert await read_all(client) == (b"half-closed: still writing", True)
        with pytest.raises(RuntimeError):
            transport.write(b"more")
        transport.close()
        await until(lambda: "lost" in protocol.events)
        assert protocol.events == ["made", "data", "eof", "lost"]
        client.close()

    run(scenario)


def reset(client: socket.socket) -> None:
    """Close ``client`` with a TCP reset (linger 0)."""
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()


def test_a_reset_read_ends_the_connection_with_the_error(run):
    async def scenario() -> None:
        accepted, client = tcp_pair()
        protocol = Recorder()
        attach(accepted, protocol)
        reset(client)
        await until(lambda: "lost" in protocol.events)
        assert protocol.events == ["made", "lost"]
        assert isinstance(protocol.lost_with[0], ConnectionResetError)
        assert accepted.fileno() == -1

    run(scenario)


def test_a_write_to_a_reset_peer_ends_the_connection_with_the_error(run):
    async def scenario() -> None:
        accepted, client = tcp_pair()
        protocol = Recorder()
        transport = attach(accepted, protocol)
        transport.pause_reading()  # the write, not a read, meets the reset
        reset(client)
        await asyncio.sleep(0.05)
        transport.write(b"to nobody")
        assert transport.is_closing()
        transport.write(b"dropped silently")
        await until(lambda: "lost" in protocol.events)
        assert protocol.events == ["made", "lost"]
        assert isinstance(protocol.lost_with[0], ConnectionResetError | BrokenPipeError)

    run(scenario)


def test_close_writes_what_is_pending_first(run):
    async def scenario() -> None:
        accepted, client = tcp_pair(server_sndbuf=4096, client_rcvbuf=4096)
        protocol = Recorder()
        transport = attach(accepted, protocol)
        data = pattern()
        transport.writelines([data[: TOTAL // 2], data[TOTAL // 2 :]])
        assert transport.get_write_buffer_size() > 0
        transport.close()
        assert transport.is_closing()
        await asyncio.sleep(0.05)
        assert "lost" not in protocol.events  # not before everything is written
        assert await read_all(client) == (data, True)
        await until(lambda: "lost" in protocol.events)
        assert protocol.events == ["made", "pause", "resume", "lost"]
        assert protocol.lost_with == [None]
        client.close()

    run(scenario)


def test_abort_drops_what_is_pending(run):
    async def scenario() -> None:
        accepted, client = tcp_pair(server_sndbuf=4096, client_rcvbuf=4096)
        protocol = Recorder()
        transport = attach(accepted, protocol)
        transport.write(pattern())
        transport.abort()
        assert transport.get_write_buffer_size() == 0
        transport.abort()
        transport.close()
        await until(lambda: "lost" in protocol.events)
        assert protocol.events == ["made", "pause", "lost"]
        received, ended = await read_all(client)
        assert ended and len(received) < TOTAL
        client.close()

    run(scenario)


def test_reading_pauses_and_resumes(run):
    async def scenario() -> None:
        accepted, client = tcp_pair()
        protocol = Recorder()
        transport = attach(accepted, protocol)
        transport.pause_reading()
        assert not transport.is_reading()
        await asyncio.get_running_loop().sock_sendall(client, b"held")
        await asyncio.sleep(0.05)
        assert protocol.received == b""
        transport.resume_reading()
        await until(lambda: protocol.received == b"held")
        transport.close()
        await until(lambda: "lost" in protocol.events)
        client.close()

    run(scenario)


def test_the_protocol_may_close_or_pause_in_connection_made(run):
    class Refusing(Recorder):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            assert isinstance(transport, asyncio.WriteTransport)
            transport.write(b"refused")
            transport.close()

    async def scenario() -> None:
        accepted, client = tcp_pair()
        protocol = Refusing()
        attach(accepted, protocol)
        assert await read_all(client) == (b"refused", True)
        await until(lambda: "lost" in protocol.events)
        client.close()

    run(scenario)


def test_the_server_accepts_many_per_readiness_and_gives_each_its_peer(run):
    async def scenario() -> None:
        made: list[Recorder] = []

        def factory() -> Recorder:
            made.append(Recorder())
            return made[-1]

        server = start_native_server(factory, "127.0.0.1", 0, backlog=1024)
        address = server.sockets[0].getsockname()
        clients = [socket.create_connection(address) for _ in range(ACCEPT_BATCH + 72)]
        await until(lambda: len(made) == len(clients))
        assert {p.peer for p in made} == {c.getsockname() for c in clients}
        server.close()
        await server.wait_closed()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(address)
        for client in clients:
            client.close()
        await until(lambda: all("lost" in p.events for p in made))

    run(scenario)


def _free_descriptor_numbers() -> Iterator[int]:
    used = {int(name) for name in os.listdir("/proc/self/fd")}
    return (n for n in range(1 << 20) if n not in used)


def test_the_server_pauses_accepting_while_out_of_descriptors_and_then_goes_on(run):
    async def scenario() -> None:
        made: list[Recorder] = []

        def factory() -> Recorder:
            made.append(Recorder())
            return made[-1]

        server = start_native_server(factory, "127.0.0.1", 0)
        address = server.sockets[0].getsockname()
        clients = [socket.socket() for _ in range(8)]
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        free = _free_descriptor_numbers()
        limit = [next(free) for _ in range(4)][-1]  # about three more descriptors may be opened
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
        try:
            for client in clients:
                client.connect(address)
            await until(lambda: not server.is_serving())
            accepted_while_short = len(made)
            await asyncio.sleep(0.6)  # retried (and failed again) at least once
            assert len(made) == accepted_while_short < len(clients)  # none accepted while short
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        await until(lambda: len(made) == len(clients))
        assert server.is_serving()
        server.close()
        for client in clients:
            client.close()
        await until(lambda: all("lost" in p.events for p in made))

    run(scenario)


def test_writelines_sends_many_pieces_in_order_and_keeps_copies_of_changeable_ones(run):
    async def scenario() -> None:
        accepted, client = tcp_pair(server_sndbuf=4096, client_rcvbuf=4096)
        protocol = Recorder()
        transport = attach(accepted, protocol)
        data = pattern()
        pieces: list[bytes | bytearray] = [data[i : i + 1024] for i in range(0, TOTAL, 1024)]  # over IOV max
        changeable = bytearray(b"kept as written")
        pieces.append(changeable)
        transport.writelines(pieces)
        assert transport.get_write_buffer_size() > 0
        changeable[:] = b"X" * len(changeable)
        transport.writelines([b"then", b" more"])
        expected = data + b"kept as written" + b"then more"
        assert (await read_all(client, len(expected)))[0] == expected
        transport.close()
        await until(lambda: "lost" in protocol.events)
        client.close()

    run(scenario)
