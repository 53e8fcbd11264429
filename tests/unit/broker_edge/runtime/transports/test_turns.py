"""A turn of the event loop reads a bounded number of bytes and handles a bounded number of packets
(``ReadTurns``): by hand, with the turns driven by the test, then on real loopback sockets under uvloop and
asyncio's loop with each transport."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import cast

import pytest
import uvloop

from broker_edge.runtime.transports.native import start_native_server
from broker_edge.runtime.transports.tcp import TcpServer
from broker_edge.runtime.transports.turns import MIN_SHARE, PACKET_BYTES, ReadTurns


class Reader:
    """A connection as ``ReadTurns`` sees it, recording what it is handed and whether it reads."""

    def __init__(self, name: str, log: list[tuple[str, bytes]]) -> None:
        self.name = name
        self.log = log
        self.reading = True
        self.held = False
        self.owes = False
        """Deliveries to it wait for its acknowledgements."""
        self.asked = 0
        """How often ``ReadTurns`` asked whether it may read."""

    def handle_bytes(self, data: bytes) -> int:
        self.log.append((self.name, data))
        return 0

    def pause_for_turn(self) -> None:
        self.reading = False

    def resume_after_turn(self) -> None:
        self.reading = not self.held

    def may_read(self) -> bool:
        self.asked += 1
        return not self.held

    def awaits_acknowledgements(self) -> bool:
        return self.owes


class Turns:
    """``ReadTurns`` whose turns end when the test says (``end_turn``: the loop's call_soon queue run)."""

    def __init__(self, budget: int) -> None:
        self.queue: list[Callable[[], None]] = []
        self.turns = ReadTurns(budget, self.queue.append)
        self.handled: list[tuple[str, bytes]] = []

    def reader(self, name: str) -> Reader:
        return Reader(name, self.handled)

    def read(self, reader: Reader, data: bytes) -> None:
        """What the transport does with a read: the part ``take`` lets through is handled now."""
        now = self.turns.take(reader, data)
        if now is not None:
            reader.handle_bytes(now)

    def end_turn(self) -> None:
        queue, self.queue[:] = list(self.queue), []
        for callback in queue:
            callback()


K = MIN_SHARE
"""Sizes in the tests below are multiples of it: a connection with more than it kept stops reading."""


def test_a_turn_handles_its_budget_and_keeps_the_rest_in_order():
    t = Turns(budget=100 * K)
    a, b = t.reader("a"), t.reader("b")
    t.read(a, b"x" * 60 * K)
    t.read(b, b"y" * 60 * K)  # crosses the budget: 40 now, 20 kept
    t.read(a, b"z" * 10 * K)  # the turn's bytes are spent: kept whole
    assert t.handled == [("a", b"x" * 60 * K), ("b", b"y" * 40 * K)]
    assert not a.reading and not b.reading
    t.handled.clear()
    t.end_turn()
    assert t.handled == [("b", b"y" * 20 * K), ("a", b"z" * 10 * K)]  # in the order they were put off
    assert a.reading and b.reading


def test_a_small_read_kept_for_the_next_turn_leaves_its_connection_reading():
    """A device's one packet put off to the next turn does not cost it a pause and a resume of its socket
    (two system calls); a second read behind it is kept too, and a connection with more than ``MIN_SHARE``
    kept stops reading."""
    t = Turns(budget=K)
    flood, device = t.reader("flood"), t.reader("device")
    t.read(flood, b"f" * K)
    t.read(device, b"\x32\x0c packet")
    assert device.reading
    t.read(device, b"d" * 2 * K)
    assert not device.reading
    t.end_turn()
    t.end_turn()
    t.end_turn()
    assert b"".join(data for name, data in t.handled if name == "device") == b"\x32\x0c packet" + b"d" * 2 * K
    assert device.reading


def test_a_connection_with_bytes_kept_puts_its_next_reads_behind_them():
    t = Turns(budget=10 * K)
    a = t.reader("a")
    t.read(a, b"1" * 10 * K)
    t.read(a, b"2" * 5 * K)
    a.reading = True  # its reading resumed for another reason (a rate hold released)
    t.read(a, b"3" * 5 * K)
    assert not a.reading
    t.end_turn()
    t.end_turn()
    assert b"".join(data for _, data in t.handled) == b"1" * 10 * K + b"2" * 5 * K + b"3" * 5 * K


def test_connections_with_bytes_kept_share_a_turn_so_a_small_read_is_not_behind_large_ones():
    budget = 16 * MIN_SHARE
    t = Turns(budget=budget)
    floods = [t.reader(f"flood-{n}") for n in range(16)]
    t.read(floods[0], b"f" * budget)
    for flood in floods[1:]:
        t.read(flood, b"f" * 10 * budget)
    ping = t.reader("ping")
    t.read(ping, b"\xc0\x00")
    t.handled.clear()
    t.end_turn()
    assert ("ping", b"\xc0\x00") in t.handled  # in the very next turn
    assert sum(len(data) for _, data in t.handled) <= budget + MIN_SHARE


def test_every_turn_starts_from_the_full_budget():
    t = Turns(budget=100)
    a = t.reader("a")
    for _ in range(5):
        t.read(a, b"x" * 90)
        t.end_turn()
    assert len(t.handled) == 5 and all(len(data) == 90 for _, data in t.handled)
    assert t.turns.turns_cut == 0


def test_a_held_connection_keeps_its_bytes_until_woken_and_a_closed_one_loses_them():
    t = Turns(budget=10)
    a, b = t.reader("a"), t.reader("b")
    t.read(a, b"a" * 10)
    t.read(a, b"A" * 5)
    t.read(b, b"b" * 5)
    a.held = True  # its publishes wait for a slow subscriber
    t.handled.clear()
    t.end_turn()
    assert t.handled == [("b", b"b" * 5)]
    t.end_turn()
    assert not t.queue  # nothing to do: the loop is not kept busy by a held connection
    a.held = False
    t.turns.wake(a)
    t.end_turn()
    assert t.handled[-1] == ("a", b"A" * 5)
    t.read(b, b"b" * 10)
    t.read(b, b"B" * 3)
    t.turns.forget(b)
    t.handled.clear()
    t.end_turn()
    assert t.handled == []


DEVICE_READ = b"\x32\x80\x01" + b"d" * 128
"""One QoS 1 PUBLISH of a device, as one read."""


def fleet_in_line(t: Turns, devices: int) -> list[Reader]:
    """``devices`` readers, each with one read kept: read after the first turn's budget was spent."""
    t.read(t.reader("flood"), b"f" * t.turns.budget)
    readers = [t.reader(f"device-{n}") for n in range(devices)]
    for reader in readers:
        t.read(reader, DEVICE_READ)
    t.handled.clear()
    return readers


def test_a_turn_looks_only_at_the_connections_it_serves_not_at_the_whole_line():
    """Ten thousand devices with a read kept each: a turn of 64 KiB serves about five hundred of them, and
    asks no other whether it may read (a pass over the whole line per turn cost more than the reads)."""
    t = Turns(budget=64 * 1024)
    devices = fleet_in_line(t, 10_000)
    t.end_turn()
    served = {name for name, _ in t.handled}
    assert 400 < len(served) < 600
    assert sum(reader.asked for reader in devices) == len(served)
    assert all(reader.asked == (reader.name in served) for reader in devices)
    while t.queue:
        t.end_turn()
    assert len(t.handled) == 10_000 and len({name for name, _ in t.handled}) == 10_000, "each once, none lost"


def test_a_held_connection_leaves_the_line_and_returns_at_its_back_when_woken():
    t = Turns(budget=len(DEVICE_READ))
    first, second, third = (t.reader(name) for name in ("first", "second", "third"))
    for reader in (first, second, third):
        t.read(reader, DEVICE_READ)  # the first handled, the others kept
    t.read(first, DEVICE_READ)  # kept, behind the others
    second.held = True
    t.handled.clear()
    t.end_turn()  # second found held: out of the line; third handled
    t.end_turn()  # first
    t.end_turn()
    assert [name for name, _ in t.handled] == ["third", "first"]
    assert second.asked == 1, "a held connection is not asked again each turn"
    t.read(second, b"more")  # read before its hold took effect: behind its kept bytes
    second.held = False
    t.turns.wake(second)
    t.end_turn()
    assert t.handled[-1] == ("second", DEVICE_READ + b"more")


def test_a_subscriber_owing_acknowledgements_is_served_first_in_the_next_turn_once_per_turn():
    """A fleet's consumer whose window is taken: its PUBACKs, read after the turn's budget is spent, are
    handled at the start of the next turn, not after every device's kept read; with more kept than its
    share it goes to the back like any other, so it cannot take the turns for itself."""
    t = Turns(budget=4 * 1024)
    fleet_in_line(t, 1_000)
    consumer = t.reader("consumer")
    consumer.owes = True
    pubacks = b"\x40\x02\x00\x01" * 64
    t.read(consumer, pubacks)
    t.end_turn()
    assert t.handled[0] == ("consumer", pubacks)
    flood = b"\x30\x7e" + b"f" * 126
    t.handled.clear()
    t.read(consumer, flood * 500)  # far more than a share: the front once, then the back of the line
    t.end_turn()
    assert t.handled[0][0] == "consumer" and len(t.handled[0][1]) == 4 * 1024
    assert [name for name, _ in t.handled[1:]] == [name for name, _ in t.handled[1:] if name != "consumer"]
    t.end_turn()
    assert "consumer" not in {name for name, _ in t.handled[-20:]}, "behind the devices now"


def test_a_reader_in_a_task_waits_for_the_next_turn_once_the_packets_are_spent():
    async def scenario() -> list[str]:
        turns = ReadTurns(10, asyncio.get_running_loop().call_soon, packets=2)
        events: list[str] = []
        assert turns.spend_packets(2)
        assert not turns.spend_packets(1)

        async def later() -> None:
            await turns.next_turn()
            events.append("next turn")

        task = asyncio.get_running_loop().create_task(later())
        await asyncio.sleep(0)
        events.append("this turn")
        await task
        assert turns.spend_packets(1)
        return events

    assert asyncio.run(scenario()) == ["this turn", "next turn"]


PINGREQ = b"\xc0\x00"


class PacketReader(Reader):
    """A connection whose reads are 2-byte packets (PINGREQs), handling at most the turn's packets left of
    each, as ``Connection.receive`` does: the bytes past them are handed back."""

    def __init__(self, name: str, log: list[tuple[str, bytes]], turns: ReadTurns) -> None:
        super().__init__(name, log)
        self.turns = turns

    def handle_bytes(self, data: bytes) -> int:
        count = min(len(data) // 2, self.turns.packets_left)
        self.turns.packets_left -= count
        self.log.append((self.name, data[: 2 * count]))
        return len(data) - 2 * count

    def read(self, data: bytes) -> None:
        """What ``TcpConnection`` does with a read."""
        now = self.turns.take(self, data)
        if now is not None:
            unread = self.handle_bytes(now)
            if unread:
                self.turns.keep_unread(self, now[-unread:])


def packet_turns() -> tuple[Turns, Callable[[str], PacketReader]]:
    """Turns of 64 KiB: 1,024 packets (``PACKET_BYTES`` each) at most."""
    t = Turns(budget=64 * 1024)
    assert t.turns.packets == 64 * 1024 // PACKET_BYTES == 1024
    return t, lambda name: PacketReader(name, t.handled, t.turns)


def test_a_turn_handles_at_most_its_packets_and_keeps_the_bytes_past_them_for_the_next_turns():
    """64 KiB of PINGREQs is 32,768 packets: a turn of 1,024 handles that many, the rest is kept (the
    connection not read meanwhile) and handled 1,024 a turn, in order, none lost."""
    t, reader = packet_turns()
    flood = reader("flood")
    flood.read(PINGREQ * 32_768)
    assert t.handled == [("flood", PINGREQ * 1024)] and not flood.reading
    assert t.turns.turns_cut == 1
    turns = 1
    while t.queue:
        t.end_turn()
        turns += 1
        assert len(t.handled[-1][1]) <= 2 * 1024
    assert b"".join(data for _, data in t.handled) == PINGREQ * 32_768
    assert turns == 32 + 1 and flood.reading  # the last turn found nothing kept


def test_a_read_behind_a_flood_s_packets_is_handled_in_the_next_turn_and_reads_behind_kept_bytes_wait():
    t, reader = packet_turns()
    flood, healthy = reader("flood"), reader("healthy")
    flood.read(PINGREQ * 10_000)
    healthy.read(PINGREQ)  # this turn's packets are handled: kept
    flood.read(b"\xe0\x00")  # behind its kept bytes
    assert [name for name, _ in t.handled] == ["flood"]
    t.end_turn()
    assert ("healthy", PINGREQ) in t.handled
    assert sum(len(data) for _, data in t.handled[1:]) <= 2 * 1024  # the flood had its share, not more
    while t.queue:
        t.end_turn()
    flooded = b"".join(data for name, data in t.handled if name == "flood")
    assert flooded == PINGREQ * 10_000 + b"\xe0\x00"


# -- on real sockets ---------------------------------------------------------------------------------------

FLOOD = 4 * 1024 * 1024
CLIENTS = 8
BUDGET = 64 * 1024


class Counting(asyncio.Protocol):
    """A protocol that reads through ``ReadTurns`` as ``TcpConnection`` does, counting the bytes handled in
    each turn of the loop."""

    def __init__(self, turns: ReadTurns, per_turn: list[int], done: Callable[[int], None]) -> None:
        self.turns = turns
        self.per_turn = per_turn
        self.done = done
        self.transport: asyncio.ReadTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.ReadTransport, transport)

    def data_received(self, data: bytes) -> None:
        now = self.turns.take(self, data)
        if now is not None:
            self.handle_bytes(now)

    def handle_bytes(self, data: bytes) -> int:
        self.per_turn[-1] += len(data)
        self.done(len(data))
        return 0

    def pause_for_turn(self) -> None:
        assert self.transport is not None
        self.transport.pause_reading()

    def resume_after_turn(self) -> None:
        assert self.transport is not None
        self.transport.resume_reading()

    def may_read(self) -> bool:
        return True

    def awaits_acknowledgements(self) -> bool:
        return False


@pytest.mark.parametrize(
    ("loop_factory", "transport"),
    [
        (uvloop.new_event_loop, "asyncio"),
        (uvloop.new_event_loop, "native"),
        (asyncio.new_event_loop, "asyncio"),
    ],
    ids=["uvloop", "uvloop-native", "asyncio"],
)
def test_a_flood_on_real_sockets_is_read_a_budget_per_turn(loop_factory, transport):
    async def scenario() -> list[int]:
        loop = asyncio.get_running_loop()
        turns = ReadTurns(BUDGET, loop.call_soon)
        per_turn = [0]
        finished = loop.create_future()
        total = 0

        def done(size: int) -> None:
            nonlocal total
            total += size
            if total >= FLOOD * CLIENTS and not finished.done():
                finished.set_result(None)

        def factory() -> Counting:
            return Counting(turns, per_turn, done)

        server: TcpServer = (
            start_native_server(factory, "127.0.0.1", 0)
            if transport == "native"
            else await loop.create_server(factory, "127.0.0.1", 0)
        )
        port = server.sockets[0].getsockname()[1]

        def tick() -> None:  # a callback every turn: where one turn ends and the next begins
            per_turn.append(0)
            if not finished.done():
                loop.call_soon(tick)

        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(CLIENTS)]
        payload = b"p" * FLOOD

        def flood(sock: socket.socket) -> None:
            sock.sendall(payload)

        writers = [loop.run_in_executor(None, flood, sock) for sock in clients]
        loop.call_soon(tick)
        await asyncio.wait_for(finished, 60)
        await asyncio.gather(*writers)
        for sock in clients:
            sock.close()
        server.close()
        return per_turn

    loop = loop_factory()
    try:
        per_turn = loop.run_until_complete(scenario())
    finally:
        loop.close()
    read_size = 256 * 1024  # the largest read of any of the loops and transports
    assert sum(per_turn) == FLOOD * CLIENTS
    assert max(per_turn) <= BUDGET + read_size
    assert len([n for n in per_turn if n]) >= FLOOD * CLIENTS // (BUDGET + read_size)
