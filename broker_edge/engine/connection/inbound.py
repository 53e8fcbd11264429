"""What a client's publishes hold on its connection: the rate limiter and the count of unanswered ones.

A connection gets its ``Inbound`` with its first PUBLISH: a device that only subscribes, the bulk of an
idle fleet, pays no slot for either. A fresh rate bucket is full, so starting it at the first PUBLISH
grants the same as starting it at CONNECT.
"""

from __future__ import annotations

from broker_edge.security.limits import TokenBucket

__all__ = ["Inbound"]


class Inbound:
    """One connection's PUBLISH rate limiter (None: unlimited) and its QoS 1/2 publishes read and not yet
    answered (``Publisher.incoming_pending``)."""

    __slots__ = ("appended_here", "bucket", "pending")

    def __init__(self, bucket: TokenBucket | None) -> None:
        self.bucket = bucket
        self.pending = 0
        self.appended_here = False
        """A cluster member appended one of its publishes (it leads that topic): never sent elsewhere."""
