"""A refused request's connection closed after its answer has reached the client: the broker stops
writing (a FIN after the answer) and reads and drops what the client still sends, for at most
`LINGER_S`, before it closes.

Closing at once, with the rest of a large request still unread (a header of a megabyte, a body no handler
reads), makes the kernel reset the connection, and a reset throws away whatever the client had not read
yet: the 431 or 400 answer itself. What the client sends after the answer goes nowhere (aiohttp's handler
reads nothing more once it closes). The connection ends when the client closes its side, or at
`LINGER_S`. A transport that cannot half-close (TLS) closes at once, as before.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["LINGER_S", "linger_on_close"]

LINGER_S = 2.0
"""The longest a refused connection reads and drops what its client still sends before it closes."""


class _LingeringTransport:
    """A connection's transport whose `close` half-closes it and closes it for good `LINGER_S` later (or
    when the client closes first); everything else is the transport's own."""

    __slots__ = ("_closing", "_transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._closing = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def close(self) -> None:
        transport = self._transport
        if self._closing or transport.is_closing():
            return
        self._closing = True
        try:
            transport.write_eof()  # after what is buffered: the answer leaves first
        except (OSError, RuntimeError):
            transport.close()
            return
        asyncio.get_running_loop().call_later(LINGER_S, transport.close)


def linger_on_close(protocol: Any) -> None:
    """Have the connection of `protocol` (an aiohttp request handler about to answer a refusal and close)
    linger as the module docstring says."""
    transport = protocol.transport
    if transport is None or isinstance(transport, _LingeringTransport) or not transport.can_write_eof():
        return
    protocol.transport = _LingeringTransport(transport)
