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
behind sixteen floods is answered in the next turn, not after them. Between two turns the loop runs
everything else: the writes of the turn go out, timers fire, other sockets are served. A connection whose
reading is held for another reason (its message rate, a slow subscriber) keeps its bytes until it is
released (``wake``).

It knows connections only as ``TurnReader`` (a ``TcpConnection``, which feeds its reads through ``take``). A
WebSocket reader, which reads in a task, takes its bytes with ``spend`` and waits for ``next_turn``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

__all__ = ["MIN_SHARE", "ReadTurns", "TurnReader"]

MIN_SHARE = 4096
"""The fewest bytes a connection with bytes kept is handed in a turn (however many wait)."""


class TurnReader(Protocol):
    """A connection whose reads ``ReadTurns`` may keep for a later turn."""

    def handle_bytes(self, data: bytes) -> None:
        """Handle bytes read from the client."""

    def pause_for_turn(self) -> None:
        """Stop reading the socket: it has bytes kept."""

    def resume_after_turn(self) -> None:
        """Its bytes are all handled: read the socket again (if it was paused), unless something else holds
        its reading."""

    def may_read(self) -> bool:
        """False while its reading is held for another reason (or it is closed): its bytes wait."""


class ReadTurns:
    """The read budget of the turns of one event loop (see the module docstring)."""

    __slots__ = ("_call_soon", "_kept", "_scheduled", "_waiters", "budget", "left", "turns_cut")

    def __init__(self, budget: int, call_soon: Callable[[Callable[[], None]], object]) -> None:
        self.budget = budget
        """Bytes one turn reads at most."""
        self.left = budget
        """What this turn may still read (0 or less: reads are kept for a later turn)."""
        self.turns_cut = 0
        """Turns that kept bytes for a later one (a plain count)."""
        self._call_soon = call_soon
        self._kept: dict[TurnReader, bytearray] = {}
        """Connections with bytes kept, in the order they get their share."""
        self._waiters: list[asyncio.Future[None]] = []
        """Readers in tasks (``next_turn``) waiting for a later turn."""
        self._scheduled = False

    def take(self, reader: TurnReader, data: bytes) -> bytes | None:
        """What of ``data`` (just read by ``reader``) to handle now: all of it, the part that fits this
        turn, or None; the rest is kept until a later turn hands it back, and ``reader`` paused once it has
        more than ``MIN_SHARE`` kept (a device that sent one packet is not paused and resumed for it: two
        system calls more than the packet's own read)."""
        kept = self._kept
        if kept:
            waiting = kept.get(reader)
            if waiting is not None:  # bytes of this connection are kept already: these go behind them
                waiting += data
                if len(waiting) > MIN_SHARE:
                    reader.pause_for_turn()
                return None
        if not self._scheduled:
            self._scheduled = True
            self._call_soon(self._next_turn)
        left = self.left
        size = len(data)
        if size <= left:
            self.left = left - size
            return data
        if not kept and not self._waiters:
            self.turns_cut += 1
        if left <= 0:
            kept[reader] = bytearray(data)
            if size > MIN_SHARE:
                reader.pause_for_turn()
            return None
        self.left = 0
        kept[reader] = bytearray(data[left:])
        if size - left > MIN_SHARE:
            reader.pause_for_turn()
        return data[:left]

    def spend(self, size: int) -> bool:
        """Take ``size`` bytes from this turn (a reader in a task); False: none left, wait for
        ``next_turn``."""
        if not self._scheduled:
            self._scheduled = True
            self._call_soon(self._next_turn)
        if self.left > 0:
            self.left -= size
            return True
        return False

    def next_turn(self) -> asyncio.Future[None]:
        """A future done at the start of a later turn, once the connections with bytes kept had theirs."""
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
        if reader in self._kept and not self._scheduled:
            self._scheduled = True
            self._call_soon(self._next_turn)

    def forget(self, reader: TurnReader) -> None:
        """``reader`` is closed: its bytes kept are dropped (nothing reads them any more)."""
        self._kept.pop(reader, None)

    def _next_turn(self) -> None:
        """A new turn: the budget again, shared first among the connections with bytes kept."""
        self._scheduled = False
        self.left = self.budget
        kept = self._kept
        if kept:
            self._hand_back(kept)
        if self._waiters and self.left > 0:
            waiters, self._waiters = self._waiters, []
            for future in waiters:
                if not future.done():
                    future.set_result(None)

    def _hand_back(self, kept: dict[TurnReader, bytearray]) -> None:
        """Hand each connection with bytes kept its share of this turn, in order; one that still has some
        left goes to the back."""
        readers = [reader for reader in kept if reader.may_read()]
        if not readers:
            return  # all held: each comes back with ``wake``
        share = max(self.budget // len(readers), MIN_SHARE)
        self._scheduled = True  # this turn reads: the next one starts from a full budget again
        self._call_soon(self._next_turn)
        for reader in readers:
            if self.left <= 0:
                return
            if reader not in kept or not reader.may_read():  # closed or held by what was handled before it
                continue
            data = kept.pop(reader)
            if len(data) > share:
                part = bytes(data[:share])
                del data[:share]
                kept[reader] = data  # the back of the line
            else:
                part = bytes(data)
                reader.resume_after_turn()
            self.left -= len(part)
            reader.handle_bytes(part)
