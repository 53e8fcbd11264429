"""The states of a client connection, in the order a connection passes through them.

A connection starts ``NEW`` (no CONNECT yet), is ``AUTHENTICATING`` while a password check runs off the
loop, ``CONNECTED`` once CONNACK 0 was written (from then on it has a session) and ``CLOSED`` for good.
Plain ints: the hot path compares them for every packet.
"""

from __future__ import annotations

from typing import Final

__all__ = ["AUTHENTICATING", "CLOSED", "CONNECTED", "NEW", "NO_LIMIT"]

NEW: Final = 0
AUTHENTICATING: Final = 1
CONNECTED: Final = 2
CLOSED: Final = 3

NO_LIMIT: Final = 1 << 62
"""A size bound that never binds (a v3 client states no Maximum Packet Size)."""
