"""Bounded work per turn of the event loop: how many bytes the broker reads and handles before it lets the
loop go round again.

An event loop hands its protocols the bytes of every readable socket in one turn, and uvloop reads a stream
up to 32 times in a row while it stays readable, 256 KiB at a time. The packets of a read are handled in
place and their writes batched for the end of the turn, so a flood from many publishers could hold one turn
for seconds: nothing written, no timer run, ``/metrics`` and PINGREQ unanswered.

``ReadTurns`` caps a turn at ``budget`` bytes read, all connections together. A read that fits what is left
is handled at once; of one that does not, what fits is handled and the rest kept; a read that arrives once
the turn's bytes are spent is kept whole. A connection with bytes kept stops reading (its kernel buffers
fill, then TCP slows the client down) until they are handled: at the start of the next turns, every such
connection gets an equal share of the budget in its turn (at least ``MIN_SHARE`` bytes), so a PINGREQ waiting
behind sixteen floods is answered in the next turn, not after them. A connection that owes acknowledgements
(a QoS 1/2 subscriber whose window is taken) joins the line at its front: a fleet's consumer would otherwise
wait behind every device's kept read, its deliveries one window per pass over the fleet; it still gets one
share per turn. Between two turns the loop runs
everything else: the writes of the turn go out, timers fire, other sockets are served. A connection whose
reading is held for another reason (its message rate, a slow subscriber) keeps its bytes until it is
released (``wake``).

A turn also handles at most ``packets`` packets, all connections together: by default one for each
``PACKET_BYTES`` of its budget (``packets_per_turn``: 1,024 of 64 KiB), since 64 KiB of PINGREQs is 32,768
packets, a turn of 30-60 ms. A read whose packets pass what the turn has left is handled up to there
(``Connection.receive`` counts them off ``packets_left``) and the bytes past them are kept as bytes past the
budget are (``keep_unread``): in front of any kept after them, its socket not read meanwhile if they are
more than ``MIN_SHARE``. In the line each connection gets an equal share of the packets too (at least
``MIN_PACKET_SHARE``).

It knows connections only as ``TurnReader`` (a ``TcpConnection``, which feeds its reads through ``take``). A
socket aiohttp serves is one too (``SocketTurns``: a WebSocket's, the admin endpoint's and the offsets
API's): every byte it reads is taken before aiohttp parses it, so frames that carry no packet (empty
fragments of a WebSocket message that never ends) and HTTP bodies of one-byte chunks are bound as packets
are. Its messages are handled in a task, which takes their packets with
``spend_packets`` and waits for ``next_turn`` (their bytes were counted as the socket read them). An HTTP
request's work waits for turns of its own (``work_turn``, ``http.read_gate.WorkTurns``): one piece of it at
a time, the loop resting after each as long as it took.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from broker_edge.http.read_gate import WorkTurns

T = TypeVar("T")

if TYPE_CHECKING:
    from broker_edge.http.read_gate import ReadGate

__all__ = [
    "MIN_PACKET_SHARE",
    "MIN_SHARE",
    "PACKET_BYTES",
    "ReadTurns",
    "SocketTurns",
    "TurnReader",
    "packets_per_turn",
]

MIN_SHARE = 4096
"""The fewest bytes a connection with bytes kept is handed in a turn (however many wait)."""
MIN_PACKET_SHARE = 64
"""The fewest packets a connection with bytes kept may handle in a turn (however many wait)."""
PACKET_BYTES = 64
"""What a packet counts as at least, of a turn's bytes: a turn of 64 KiB handles 1,024 packets at most. A
PINGREQ costs about a microsecond here, so such a turn lasts about one millisecond; a fan-in of 64-byte
messages (about 800 to a 64 KiB read) is bound by the bytes, as before."""


def packets_per_turn(budget: int) -> int:
    """The packets a turn of ``budget`` bytes handles at most."""
    return max(budget // PACKET_BYTES, MIN_PACKET_SHARE)


class TurnReader(Protocol):
    """A connection whose reads ``ReadTurns`` may keep for a later turn."""

    def handle_bytes(self, data: bytes) -> int:
        """Handle bytes read from the client, at most ``packets_left`` of the turn's packets: the number of
        bytes at the end of ``data`` past them, not handled (0: all were)."""

    def pause_for_turn(self) -> None:
        """Stop reading the socket: it has bytes kept."""

    def resume_after_turn(self) -> None:
        """Its bytes are all handled: read the socket again (if it was paused), unless something else holds
        its reading."""

    def may_read(self) -> bool:
        """False while its reading is held for another reason (or it is closed): its bytes wait."""

    def awaits_acknowledgements(self) -> bool:
        """True while deliveries to it wait for its acknowledgements (its window is taken): its reads
        free that window, so bytes it has kept go to the front of the line."""


class ReadTurns:
    """The read budget of the turns of one event loop (see the module docstring)."""

    __slots__ = (
        "_call_soon",
        "_held",
        "_kept",
        "_scheduled",
        "_waiters",
        "budget",
        "handled",
        "left",
        "packets",
        "packets_left",
        "turns_cut",
        "work",
    )

    def __init__(
        self, budget: int, call_soon: Callable[[Callable[[], None]], object], packets: int | None = None
    ) -> None:
        self.budget = budget
        """Bytes one turn reads at most."""
        self.left = budget
        """What this turn may still read (0 or less: reads are kept for a later turn)."""
        self.packets = packets_per_turn(budget) if packets is None else packets
        """Packets one turn handles at most."""
        self.packets_left = self.packets
        """What this turn may still handle (0: reads are kept for a later turn); a read counts off its
        packets (``Connection.receive``)."""
        self.turns_cut = 0
        """Turns that kept bytes for a later one (a plain count)."""
        self._call_soon = call_soon
        self._kept: OrderedDict[TurnReader, bytes | bytearray] = OrderedDict()
        """Connections with bytes kept, in the order they get their share (the line): a read kept whole is
        kept as it came (no copy), a bytearray once more is added to it."""
        self._held: dict[TurnReader, bytes | bytearray] = {}
        """Connections with bytes kept whose reading is held for another reason: out of the line until
        ``wake`` puts them at its back, so that a turn never looks at them."""
        self._waiters: list[asyncio.Future[None]] = []
        """Readers in tasks (``next_turn``) waiting for a later turn."""
        self._scheduled = False
        self.handled = 0
        """Packets the turns before this one handled."""
        self.work = WorkTurns(devices=self.packets_handled)
        """The turns of the loop's HTTP requests' work (``SocketTurns.work_turn``)."""

    def take(self, reader: TurnReader, data: bytes) -> bytes | None:
        """What of ``data`` (just read by ``reader``) to handle now: all of it, the part that fits this
        turn, or None; the rest is kept until a later turn hands it back, and ``reader`` paused once it has
        more than ``MIN_SHARE`` kept (a device that sent one packet is not paused and resumed for it: two
        system calls more than the packet's own read)."""
        kept = self._kept
        if kept or self._held:
            waiting = kept.get(reader)
            if waiting is None:
                waiting = self._held.get(reader)
            if waiting is not None:  # bytes of this connection are kept already: these go behind them
                waiting = self._growable(reader, waiting)
                waiting += data
                if len(waiting) > MIN_SHARE:
                    reader.pause_for_turn()
                return None
        if not self._scheduled:
            self._scheduled = True
            self._call_soon(self._next_turn)
        left = self.left if self.packets_left > 0 else 0
        size = len(data)
        if size <= left:
            self.left = left - size
            return data
        if not kept and not self._waiters:
            self.turns_cut += 1
        if left <= 0:
            self._keep(reader, data if type(data) is bytes else bytes(data))
            return None
        self.left = 0
        self._keep(reader, data[left:])
        return data[:left]

    def keep_unread(self, reader: TurnReader, data: bytes) -> None:
        """``reader`` handled the packets this turn had left of what ``take`` handed it: ``data``, the bytes
        past them, go back to this turn's budget and wait for a later turn, in front of any it kept after
        them."""
        self.left += len(data)
        waiting = self._kept.get(reader)
        if waiting is None:
            if not self._kept and not self._waiters:
                self.turns_cut += 1
            self._keep(reader, data)
            return
        waiting = self._growable(reader, waiting)
        waiting[:0] = data
        if len(waiting) > MIN_SHARE:
            reader.pause_for_turn()

    def _growable(self, reader: TurnReader, waiting: bytes | bytearray) -> bytearray:
        """``reader``'s bytes kept as a bytearray (in its place in the line, or among those held), so that
        more can be added to them."""
        if type(waiting) is bytearray:
            return waiting
        grown = bytearray(waiting)
        if reader in self._kept:
            self._kept[reader] = grown  # an existing key keeps its place in the line
        else:
            self._held[reader] = grown
        return grown

    def _keep(self, reader: TurnReader, data: bytes | bytearray) -> None:
        """Put ``reader`` in line with ``data`` (at the front if it owes acknowledgements), paused if that
        is more than ``MIN_SHARE``."""
        kept = self._kept
        kept[reader] = data
        if reader.awaits_acknowledgements():
            kept.move_to_end(reader, last=False)
        if len(data) > MIN_SHARE:
            reader.pause_for_turn()

    def spend_packets(self, packets: int) -> bool:
        """Take ``packets`` packets from this turn, whatever its bytes (a reader in a task, whose bytes
        ``take`` counted as its socket read them); False: none left, wait for ``next_turn``."""
        if not self._scheduled:
            self._scheduled = True
            self._call_soon(self._next_turn)
        if self.packets_left > 0:
            self.packets_left -= packets
            return True
        return False

    def next_turn(self) -> asyncio.Future[None]:
        """A future done at the start of a later turn with packets left, once the connections with bytes
        kept had their share."""
        future = asyncio.get_running_loop().create_future()
        if not self._kept and not self._waiters:
            self.turns_cut += 1
        self._waiters.append(future)
        if not self._scheduled:
            self._scheduled = True
            self._call_soon(self._next_turn)
        return future

    def wake(self, reader: TurnReader) -> None:
        """``reader``'s reading is no longer held: its bytes kept are handed back from the next turn."""
        data = self._held.pop(reader, None)
        if data is not None:
            self._kept[reader] = data  # the back of the line
        if reader in self._kept and not self._scheduled:
            self._scheduled = True
            self._call_soon(self._next_turn)

    def take_back(self, reader: TurnReader) -> bytes:
        """The bytes kept for ``reader``, taken out of the line (it moves elsewhere with them)."""
        data = self._remove(reader)
        return bytes(data) if data is not None else b""

    def forget(self, reader: TurnReader) -> None:
        """``reader`` is closed: its bytes kept are dropped (nothing reads them any more)."""
        self._remove(reader)

    def _remove(self, reader: TurnReader) -> bytes | bytearray | None:
        """Take ``reader`` out of the line, or out of those held: the bytes it had kept (None: none)."""
        data = self._kept.pop(reader, None)
        return data if data is not None else self._held.pop(reader, None)

    def packets_handled(self) -> int:
        """MQTT packets the loop's turns have handled so far."""
        return self.handled + self.packets - self.packets_left

    def _next_turn(self) -> None:
        """A new turn: the budget again, shared first among the connections with bytes kept."""
        self._scheduled = False
        self.handled += self.packets - self.packets_left
        self.left = self.budget
        self.packets_left = self.packets
        kept = self._kept
        if kept:
            self._hand_back(kept)
        if self._waiters and self.packets_left > 0:
            waiters, self._waiters = self._waiters, []
            for future in waiters:
                if not future.done():
                    future.set_result(None)

    def _hand_back(self, kept: OrderedDict[TurnReader, bytes | bytearray]) -> None:
        """Hand the connections in line their share of this turn, from the front, until the budget is spent
        or each had one; one that still has bytes left goes to the back, one found held leaves the line.
        A turn looks at the connections it serves, not at the whole line: a fleet's thousands of kept reads
        cost each turn only the few hundred it handles."""
        share = max(self.budget // len(kept), MIN_SHARE)
        packet_share = max(self.packets // len(kept), MIN_PACKET_SHARE)
        offered = len(kept)  # those in line as the turn starts: none is offered a second share in it
        handed = False
        while offered and self.left > 0 and self.packets_left > 0:
            offered -= 1
            reader, data = kept.popitem(last=False)
            if not reader.may_read():  # held (or closed) by what was handled before it: out of the line
                self._held[reader] = data
                continue
            if not handed:
                handed = True
                self._scheduled = True  # this turn reads: the next one starts from a full budget again
                self._call_soon(self._next_turn)
            # a read kept whole is handed as it is
            part = data if type(data) is bytes and len(data) <= share else bytes(data[:share])
            self.left -= len(part)
            # ``reader`` handles ``part``, at most ``packet_share`` of the packets the turn has left
            packets_left = self.packets_left
            allowed = packet_share if packet_share < packets_left else packets_left
            self.packets_left = allowed
            unread = reader.handle_bytes(part)
            self.packets_left = packets_left - (allowed - self.packets_left)
            if isinstance(data, bytearray):  # the bytes past its packets stay in front of the rest
                del data[: len(part) - unread]
            else:
                data = data[len(part) - unread :]
            if unread:
                self.left += unread
                if len(data) > MIN_SHARE:
                    reader.pause_for_turn()
            if data:
                kept[reader] = data  # the back of the line
            else:
                reader.resume_after_turn()


HTTP_READ_WEIGHT = 16
"""What a byte read by an HTTP endpoint counts of a turn: aiohttp's parser spends about 4 us on a chunk of a
chunked body, 6 bytes for a chunk of one byte, so a turn's 64 KiB of them held the loop 40 ms; at 16 times
its bytes a turn parses 4 KiB of an HTTP socket, a few milliseconds whatever they hold (a fetch's body of
1 MiB is read over 256 turns)."""


class SocketTurns:
    """A socket served by aiohttp (a WebSocket, an HTTP endpoint) as ``ReadTurns`` sees it, its ``Intake``:
    every read is taken from the turn's bytes before aiohttp parses it, each byte counted ``weight`` bytes,
    the rest kept (the socket not read) for later turns, as a TCP connection's reads are. Whatever the bytes
    cost aiohttp (WebSocket frames carrying nothing, HTTP chunks of one byte), a turn parses no more of them
    than its budget: parsed as fast as the socket gave them, they held the loop from every other client."""

    __slots__ = ("gate", "owes_acknowledgements", "turns", "weight")

    def __init__(self, gate: ReadGate, turns: ReadTurns, weight: int = 1) -> None:
        self.gate = gate
        self.turns = turns
        self.weight = weight
        self.owes_acknowledgements: Callable[[], bool] = _owes_nothing
        """Whether deliveries wait for the socket's reads (a WebSocket's MQTT connection owing acks)."""

    def __call__(self, data: bytes) -> None:
        turns = self.turns
        part = turns.take(self, data)
        if part is not None:
            unread = self._feed(part)
            if unread:
                turns.keep_unread(self, part[len(part) - unread :])

    def handle_bytes(self, data: bytes) -> int:
        return self._feed(data)

    def _feed(self, data: bytes) -> int:
        """Hand aiohttp what of ``data`` (taken from the turn) the turn has room for at ``weight`` (at least
        ``MIN_SHARE`` / ``weight`` bytes); the bytes past them, not handed."""
        weight = self.weight
        if weight == 1:
            self.gate.feed(data)  # parsed; a WebSocket's task handles their packets (``spend_packets``)
            return 0
        size = len(data)
        turns = self.turns
        fed = min(size, max((turns.left + size) // weight, MIN_SHARE // weight))
        turns.left -= fed * (weight - 1)
        self.gate.feed(data if fed == size else data[:fed])
        return size - fed

    def drain(self) -> None:
        data = self.turns.take_back(self)
        if data:
            self.gate.feed(data)

    def close(self) -> None:
        self.turns.forget(self)

    async def work_turn(self) -> None:
        await self.turns.work.turn(self.gate.known)

    async def work_in_thread(self, work: Callable[..., T], *args: Any) -> T:
        return await self.turns.work.in_thread(work, *args, known=self.gate.known)

    def pause_for_turn(self) -> None:
        self.gate.hold_reading()

    def resume_after_turn(self) -> None:
        self.gate.release_reading()

    def may_read(self) -> bool:
        return self.gate.is_open()

    def awaits_acknowledgements(self) -> bool:
        return self.owes_acknowledgements()


def _owes_nothing() -> bool:
    return False
