"""The states of a client connection, in the order a connection passes through them.

A connection starts ``NEW`` (no CONNECT yet), is ``AUTHENTICATING`` while a password check runs off the
loop, ``CONNECTED`` once CONNACK 0 was written (from then on it has a session) and ``CLOSED`` for good.
Plain ints: the hot path compares them for every packet. ``keepalive_deadline`` is when a connected client
that stays silent is closed.
"""

from __future__ import annotations

import math
from typing import Final

__all__ = [
    "AUTHENTICATING",
    "CLOSED",
    "CONNECTED",
    "HEARD_FROM",
    "HELD_FOR_ACKS",
    "HELD_FOR_CONNECT",
    "HELD_FOR_HANDOVER",
    "HELD_FOR_RATE",
    "HELD_FOR_SUBACK",
    "HELD_FOR_SUBSCRIBERS",
    "HELD_FOR_TURN",
    "NEW",
    "NO_LIMIT",
    "TIMERS_CHECKED_EVERY_S",
    "keepalive_deadline",
]

NEW: Final = 0
AUTHENTICATING: Final = 1
CONNECTED: Final = 2
CLOSED: Final = 3

HELD_FOR_CONNECT: Final = 1
"""Why a connection's reading is held (``Connection.hold``; bits, any number at once): the CONNECT is being
checked (the password, a cluster's claim of the session)."""
HELD_FOR_RATE: Final = 2
"""The client's PUBLISH rate (``limits.messages_per_second_per_client``) is used up."""
HELD_FOR_SUBACK: Final = 4
"""The SUBACK or UNSUBACK waits: replays being positioned or log cursors being dropped in later turns of the
loop, or a cluster node routing new subscriptions' records here only once it may send the SUBACK."""
HELD_FOR_ACKS: Final = 8
"""An MQTT 3.1.1 client has ``limits.receive_maximum`` QoS 1/2 publishes read and not yet answered."""
HELD_FOR_SUBSCRIBERS: Final = 16
"""A subscriber of the client's messages cannot keep up (``engine.slow_subscribers``, policy
``backpressure``)."""
HELD_FOR_TURN: Final = 32
"""This turn of the event loop has read its bytes (``limits.read_bytes_per_turn``): the client's next bytes
wait for a later turn (``runtime.transports.turns``)."""
HELD_FOR_HANDOVER: Final = 64
"""The connection is moving to another member on this host once its publishes read are answered
(``connection.handover``): nothing more is read here."""

TIMERS_CHECKED_EVERY_S: Final = 1.0
"""The broker's sweep calls every connection's ``check_timers`` this often; a keep-alive deadline due before
the next sweep gets a timer of its own, so a silent client is closed when due, not up to a sweep late."""

HEARD_FROM: Final = -1.0
"""A connected client's keep-alive deadline once it has sent something since the broker's last sweep, which
sets the next deadline from it (one float store per read, no slot of its own)."""

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
