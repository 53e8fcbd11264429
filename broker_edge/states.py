"""The states of a client connection, in the order a connection passes through them.

A connection starts ``NEW`` (no CONNECT yet), is ``AUTHENTICATING`` while a password check runs off the
loop, ``CONNECTED`` once CONNACK 0 was written (from then on it has a session) and ``CLOSED`` for good.
Plain ints: the hot path compares them for every packet. ``keepalive_deadline`` is when a connected client
that stays silent is closed.
"""

from __future__ import annotations

import math
from typing import Final

__all__ = ["AUTHENTICATING", "CLOSED", "CONNECTED", "NEW", "NO_LIMIT", "keepalive_deadline"]

NEW: Final = 0
AUTHENTICATING: Final = 1
CONNECTED: Final = 2
CLOSED: Final = 3

NO_LIMIT: Final = 1 << 62
"""A size bound that never binds (a v3 client states no Maximum Packet Size)."""


_DEADLINES: dict[float, float] = {}


def keepalive_deadline(now: float, keepalive: int) -> float:
    """When a client heard from at ``now`` has been silent for 1.5 times its ``keepalive`` (MQTT 3.1.2.10;
    0.0: no keep alive), rounded up to a quarter second.

    Rounded, the deadlines of clients heard from in the same quarter second are equal, and they share one
    float instead of holding 24 bytes each (every idle connection keeps one). The broker's sweep looks at
    them once a second, so a quarter second more does not change when a silent client is closed by more
    than that.
    """
    if not keepalive:
        return 0.0
    at = math.ceil((now + keepalive * 1.5) * 4) / 4
    shared = _DEADLINES.get(at)
    if shared is None:
        if len(_DEADLINES) >= 1024:  # the deadlines of the last few minutes: older ones are shared by now
            _DEADLINES.clear()
        shared = _DEADLINES[at] = at
    return shared
