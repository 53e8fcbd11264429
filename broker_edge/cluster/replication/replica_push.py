"""Replica push: the replica fetch protocol carried over the peer link, leader-driven, in steady state.

A follower opens its fetch session over HTTP (`replica_fetch`: the first request lists every topic, and
divergence, restarts and catch-up are answered there). Once the session is open and the peer link to the
leader is up, the follower sends its first `ACK` on the link, and from then on:

- the leader sends a `PUSH` whenever the session has news (records durable on the leader, a higher
  watermark): the body is a fetch response, exactly what a parked fetch would have been answered with.
  Everything new in one event-loop iteration leaves as one push (one WebSocket message with the peer
  link's own batching). Frames are sent from where the previous push ended, without waiting for the
  follower, as long as no more than the session's `max_bytes` of frames are unacknowledged.
- the follower appends what a push brings, commits and routes what its watermark makes committed (never
  past what it holds durably), and once the frames are durable sends an `ACK`: a fetch request listing
  the topics whose position moved, which tells the leader, as a fetch from offset N does, that it holds
  everything below N durably. The leader moves the watermark and pushes it to every session at once.

Both directions number their messages. A gap (a message lost when the link dropped), an error, a
partition whose leader or epoch changed, or anything but frames and watermarks in a push ends push mode:
the follower opens a new session over HTTP, which re-lists every position and runs the epoch checks. A
follower whose link is down, or whose leader's fetch answers do not offer pushes (`PUSH_HEADER`: an
earlier version), fetches over HTTP as before. While idle, the leader sends a keepalive every `wait_ms`
(a push repeating its last number, so a follower notices a lost push), and the follower one every half
`wait_ms` (an `ACK` listing nothing, so the leader's in-sync check sees it alive).

Parts (peer link kinds, little endian)::

    PUSH (leader -> follower) = u64 sequence | fetch response (`replica_fetch.encode_response`)
    ACK  (follower -> leader) = u64 sequence | u64 durable_bytes | fetch request (`encode_request`)

`durable_bytes` counts the frame bytes of this session's pushes the follower holds durably; the leader's
window is what it pushed minus that. Observers keep fetching over HTTP (they hold no log to acknowledge).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .replica_fetch import (
    FetchRequest,
    FetchResponse,
    WireError,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)

__all__ = ["ACK", "PUSH", "Ack", "Push", "decode_ack", "decode_push", "encode_ack", "encode_push"]

PUSH = 48
"""Peer link kind of a leader's push (the replication range is 48-63)."""
ACK = 49
"""Peer link kind of a follower's acknowledgement."""

_PUSH_HEAD = struct.Struct("<Q")
_ACK_HEAD = struct.Struct("<QQ")


@dataclass(slots=True)
class Push:
    sequence: int
    """1 for a session's first push, +1 for each; a keepalive repeats the last one's."""
    response: FetchResponse


@dataclass(slots=True)
class Ack:
    sequence: int
    """1 for a session's first acknowledgement, +1 for each."""
    durable_bytes: int
    request: FetchRequest


def encode_push(push: Push) -> bytes:
    return _PUSH_HEAD.pack(push.sequence) + b"".join(encode_response(push.response))


def decode_push(body: bytes | memoryview) -> Push:
    if len(body) < _PUSH_HEAD.size:
        raise WireError("replica push ends inside its header")
    (sequence,) = _PUSH_HEAD.unpack_from(body, 0)
    return Push(sequence, decode_response(bytes(body[_PUSH_HEAD.size :])))


def encode_ack(ack: Ack) -> bytes:
    return _ACK_HEAD.pack(ack.sequence, ack.durable_bytes) + encode_request(ack.request)


def decode_ack(body: bytes | memoryview) -> Ack:
    if len(body) < _ACK_HEAD.size:
        raise WireError("replica acknowledgement ends inside its header")
    sequence, durable_bytes = _ACK_HEAD.unpack_from(body, 0)
    return Ack(sequence, durable_bytes, decode_request(bytes(body[_ACK_HEAD.size :])))
