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

    __slots__ = ("appended_here", "bucket", "move_due", "pending", "qos2")

    def __init__(self, bucket: TokenBucket | None) -> None:
        self.bucket = bucket
        self.pending = 0
        self.qos2: set[int] | None = None
        """The packet ids of the MQTT 5 client's QoS 2 PUBLISHes read on this connection and counted in
        ``pending`` until PUBCOMP (None: none): a flow a former connection of its session began took no
        place of this one's Receive Maximum, so its PUBREL frees none."""
        self.appended_here = False
        """A cluster member appended a publish of its (it leads that topic) since the last answer to one it
        forwarded: it stays connected here at that answer (and the flag goes down), so that a device
        publishing on topics led by several members does not go back and forth, while one whose topic's
        leader moved away follows it."""
        self.move_due: str | None = None
        """The topic of a publish of its another member appended, whose leader it goes to once its open
        QoS 2 flows end (``PublishPath.move_after_qos2``); None: nothing waits for them."""

    def counts_qos2(self, packet_id: int) -> bool:
        """Whether a QoS 2 PUBLISH of ``packet_id`` read on this connection counts in ``pending``."""
        return self.qos2 is not None and packet_id in self.qos2

    def count_qos2(self, packet_id: int) -> None:
        """The MQTT 5 client's QoS 2 PUBLISH of ``packet_id``, read on this connection and held: one place of
        its Receive Maximum until PUBCOMP."""
        if self.qos2 is None:
            self.qos2 = set()
        self.qos2.add(packet_id)
        self.pending += 1

    def uncount_qos2(self, packet_id: int) -> None:
        """The QoS 2 flow of ``packet_id`` ended: the place its PUBLISH took is free, if one read on this
        connection took one."""
        counted = self.qos2
        if counted is None or packet_id not in counted:
            return
        counted.discard(packet_id)
        if not counted:
            self.qos2 = None
        if self.pending > 0:
            self.pending -= 1
