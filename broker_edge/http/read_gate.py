"""A guarded socket's reads taken before aiohttp parses them (``guard.start_guarded_site(read_turns=...)``):
the taker (an ``Intake``) hands them on to aiohttp (``ReadGate.feed``) when it likes and may stop the
socket's reading meanwhile, so that what aiohttp parses per turn of the loop is bounded as the MQTT
listeners' reads are, whatever the bytes are (HTTP chunks of one byte, WebSocket frames of none). It also
gives the socket's requests their turns of the loop (``Intake.work_turn``): parsed, a request of a few
dozen bytes still costs its handling, and pipelined, a few hundred of them were handled in one turn. Known
clients' pieces (a token holder's) go before strangers', who have at most one turn in ``STRANGERS_SHARE``
while known clients' pieces wait."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

__all__ = [
    "STRANGERS_SHARE",
    "WORK_REST",
    "HeldTransport",
    "Intake",
    "ReadGate",
    "ReadTaker",
    "WorkTurns",
    "work_in_thread",
    "work_turn",
]

WORK_REST = 1.0
"""How many times its own time the loop rests from HTTP work after a piece before it begins the next, when
devices were served since the piece before: the pieces then take at most half of the loop's time however
many requests ask, and all of it when no device asks for any."""
MAX_WORK_REST_S = 0.1
"""The longest rest after one piece (one slowed by a pause of the whole process)."""
STRANGERS_SHARE = 4
"""While known clients' pieces wait, at most one piece in this many is a stranger's: requests without a
valid token, pipelined flat out over a hundred connections, had a reader's fetch wait behind a piece of
each of them (11-41 ms in the median, 300-800 ms at worst, against 1-4 ms alone)."""
T = TypeVar("T")


class ReadGate(Protocol):
    """One socket's reads as its ``Intake`` passes them on."""

    intake: Intake | None
    """What takes the socket's reads (None: aiohttp gets them at once)."""

    known: bool
    """Its request is a known client's (a token holder's, or one of a site that asks for none): its pieces
    of work go before strangers' (``WorkTurns``)."""

    def feed(self, data: bytes) -> None:
        """Hand aiohttp ``data`` to parse (nothing once the socket is gone)."""

    def hold_reading(self) -> None:
        """Stop reading the socket."""

    def release_reading(self) -> None:
        """Read the socket again (unless aiohttp holds it itself)."""

    def is_open(self) -> bool:
        """Whether the socket is still there."""


class Intake(Protocol):
    """What takes a socket's reads before aiohttp does."""

    def __call__(self, data: bytes) -> None:
        """A read of the socket: hand it on now or later."""

    def drain(self) -> None:
        """The peer ended its side: hand aiohttp every byte kept, now, before it hears of the end."""

    def close(self) -> None:
        """The socket is gone: what it kept is dropped."""

    async def work_turn(self) -> None:
        """Wait for the turn of the next piece of work of the socket's requests (a request's handling, a
        chunk of a listing): one piece at a time, every socket of the loop's endpoints in line
        (``WorkTurns``), so that however many requests come at once the loop serves its devices between
        two."""

    async def work_in_thread(self, work: Callable[..., T], *args: Any) -> T:
        """``work(*args)`` in a thread of the loop's executor, as one of those pieces."""


ReadTaker = Callable[[ReadGate], Intake]
"""What makes the ``Intake`` of each socket of a site as it opens."""


class WorkTurns:
    """The turns of one loop's HTTP work (``Intake.work_turn``): one piece at a time (a request's handling
    begun, a chunk of a listing, a slice of a read), in the order they asked, known clients' first (a
    stranger's at most once in ``STRANGERS_SHARE`` while theirs wait), each begun once the loop has
    rested ``rest`` times the last piece's time since it ended (what ran meanwhile, MQTT included, is part
    of the rest) if the loop served devices since the piece before (``devices``: a count of the MQTT
    packets it handled), so that readers alone (a Spark query's fetches) have the whole loop. Pipelined,
    a few hundred requests were begun in one turn of the loop, and seventy listings each listed a chunk of
    milliseconds in every turn: the loop, busy with them all along, left the commitlog's thread the
    interpreter only every switch interval, and a publisher's PUBACK waited tens to hundreds of
    milliseconds. ``pieces`` and ``seconds`` count the pieces and their time."""

    def __init__(self, rest: float = WORK_REST, devices: Callable[[], int] | None = None) -> None:
        self.rest = rest
        self._devices = devices
        self._devices_seen = -1
        """``devices()`` when the last piece ended."""
        self.pieces = 0
        self.seconds = 0.0
        self._waiting: deque[asyncio.Future[None]] = deque()
        """Known clients' pieces waiting for their turns."""
        self._strangers: deque[asyncio.Future[None]] = deque()
        """Strangers' pieces waiting for their turns."""
        self._known_in_a_row = 0
        """Known clients' pieces begun since a stranger's last."""
        self._working = False
        """A piece is under way (its time not counted yet)."""
        self._rested_at = 0.0
        """When (``time.monotonic``) the loop has rested enough after the last piece to begin the next."""
        self._timer: asyncio.TimerHandle | None = None

    async def turn(self, known: bool = True) -> None:
        """Wait for the turn of a piece of work (a stranger's unless ``known``), begun when this returns (at
        once when nothing waits)."""
        loop = asyncio.get_running_loop()
        await self._take(loop, known)
        loop.call_soon(self._end, loop, time.monotonic())  # right after the piece, which runs before it

    async def in_thread(self, work: Callable[..., T], *args: Any, known: bool = True) -> T:
        """``work(*args)`` in a thread of the loop's executor, as a piece of work: none other begins while it
        runs, and the loop rests after it as after any other. Built each in a thread of their own, seventy
        fetches' Arrow answers took the interpreter from the loop most of the time."""
        loop = asyncio.get_running_loop()
        await self._take(loop, known)
        began = time.monotonic()
        try:
            return await loop.run_in_executor(None, work, *args)
        finally:
            self._end(loop, began)

    async def _take(self, loop: asyncio.AbstractEventLoop, known: bool) -> None:
        """Wait until no piece is under way, the loop has rested and the line's turn has come, then mark a
        piece under way."""
        idle = not self._working and not self._waiting and not self._strangers
        if idle and time.monotonic() >= self._rested_at:
            self._working = True
            return
        future = loop.create_future()
        (self._waiting if known else self._strangers).append(future)
        self._schedule(loop)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():  # its turn was given: the next one's, then
                self._working = False
                self._schedule(loop)
            raise

    def _end(self, loop: asyncio.AbstractEventLoop, began: float) -> None:
        ended = time.monotonic()
        took = ended - began
        self.pieces += 1
        self.seconds += took
        self._working = False
        if self._served_devices():
            self._rested_at = ended + min(self.rest * took, MAX_WORK_REST_S)
        self._schedule(loop)

    def _served_devices(self) -> bool:
        """Whether the loop handled MQTT packets since the last piece ended (always, without ``devices``)."""
        if self._devices is None:
            return True
        seen, self._devices_seen = self._devices_seen, self._devices()
        return seen != self._devices_seen

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        """Have the first waiting piece begin once the loop has rested (unless a piece is under way)."""
        if self._working or self._timer is not None or not (self._waiting or self._strangers):
            return
        self._timer = loop.call_later(max(self._rested_at - time.monotonic(), 0.0), self._next)

    def _next(self) -> None:
        self._timer = None
        while self._waiting or self._strangers:
            future = self._first()
            if not future.done():  # (one whose request went away waits no more)
                future.set_result(None)
                self._working = True
                return

    def _first(self) -> asyncio.Future[None]:
        """The next piece's (some piece waits): a known client's, unless none waits or a stranger's is due
        (``STRANGERS_SHARE``)."""
        if self._strangers and (not self._waiting or self._known_in_a_row >= STRANGERS_SHARE - 1):
            self._known_in_a_row = 0
            return self._strangers.popleft()
        self._known_in_a_row += 1
        return self._waiting.popleft()


async def work_in_thread(gate: ReadGate | None, work: Callable[..., T], *args: Any) -> T:
    """``work(*args)`` in a thread of the loop's executor, as a piece of work of a request on ``gate``
    (``Intake.work_in_thread``), or at once on a socket without an intake."""
    intake = gate.intake if gate is not None else None
    if intake is None:
        return await asyncio.get_running_loop().run_in_executor(None, work, *args)
    return await intake.work_in_thread(work, *args)


async def work_turn(gate: ReadGate | None) -> None:
    """Wait for the turn of the next piece of work of a request on ``gate`` (``Intake.work_turn``); on a
    socket without an intake (or none), let the loop go round once."""
    intake = gate.intake if gate is not None else None
    if intake is None:
        await asyncio.sleep(0)
    else:
        await intake.work_turn()


class HeldTransport:
    """The transport aiohttp is given on a socket whose reads an ``Intake`` takes: aiohttp resumes its reading
    itself (at every piece of a body it reads), which must not undo the intake's ``hold``; the socket reads
    again once neither holds it. Everything else is the transport's own."""

    __slots__ = ("held", "paused", "transport")

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        self.held = False
        """The intake holds its reading (its bytes kept for later turns)."""
        self.paused = False
        """aiohttp paused its reading (its own buffers full)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)

    def write(self, data: Any) -> None:
        self.transport.write(data)

    def writelines(self, data: Any) -> None:
        self.transport.writelines(data)

    def is_closing(self) -> bool:
        return bool(self.transport.is_closing())

    def pause_reading(self) -> None:
        self.paused = True
        self.transport.pause_reading()

    def resume_reading(self) -> None:
        self.paused = False
        if not self.held:
            self.transport.resume_reading()

    def hold(self) -> None:
        """Stop reading for the intake."""
        self.held = True
        if not self.transport.is_closing():
            self.transport.pause_reading()

    def release(self) -> None:
        """The intake reads again: the socket does unless aiohttp paused it."""
        self.held = False
        if not self.paused and not self.transport.is_closing():
            self.transport.resume_reading()
