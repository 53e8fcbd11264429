"""A guarded socket's reads taken before aiohttp parses them (``guard.start_guarded_site(read_turns=...)``):
the taker (an ``Intake``) hands them on to aiohttp (``ReadGate.feed``) when it likes and may stop the
socket's reading meanwhile, so that what aiohttp parses per turn of the loop is bounded as the MQTT
listeners' reads are, whatever the bytes are (HTTP chunks of one byte, WebSocket frames of none)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["HeldTransport", "Intake", "ReadGate", "ReadTaker"]


class ReadGate(Protocol):
    """One socket's reads as its ``Intake`` passes them on."""

    intake: Intake | None
    """What takes the socket's reads (None: aiohttp gets them at once)."""

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


ReadTaker = Callable[[ReadGate], Intake]
"""What makes the ``Intake`` of each socket of a site as it opens."""


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
