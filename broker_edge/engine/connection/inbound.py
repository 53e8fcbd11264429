"""What a client's publishes hold on its connection: the rate limiter and the count of unanswered ones.

A connection gets its ``Inbound`` with its first PUBLISH: a device that only subscribes, the bulk of an
idle fleet, pays no slot for either. A fresh rate bucket is full, so starting it at the first PUBLISH
grants the same as starting it at CONNECT.
"""

from __future__ import annotations

from broker_edge.security.limits import LimitsConfig, TokenBucket

__all__ = ["MAX_TOPICS_APPENDED_HERE", "Inbound"]

MAX_TOPICS_APPENDED_HERE = 64
"""The most topics ``Inbound.appended_here`` keeps (a gateway's many topics: any 64 of them are enough)."""


class Inbound:
    """One connection's PUBLISH rate limiter (None: unlimited) and its QoS 1/2 publishes read and not yet
    answered (``pending``, see ``Publisher.inbound``)."""

    __slots__ = ("appended_here", "bucket", "move_due", "over_said", "pending", "qos2")

    def __init__(self, bucket: TokenBucket | None) -> None:
        self.bucket = bucket
        self.pending = 0
        self.qos2: set[int] | None = None
        """The packet ids of the MQTT 5 client's QoS 2 PUBLISHes read on this connection and counted in
        ``pending`` until PUBCOMP (None: none): a flow a former connection of its session began took no
        place of this one's Receive Maximum, so its PUBREL frees none."""
        self.appended_here: set[str] | None = None
        """Topics of its publishes a cluster member appended (it led them then; at most
        ``MAX_TOPICS_APPENDED_HERE``; None: none): while it leads one of them, the client stays connected
        here, whatever it publishes elsewhere (a device publishing on topics led by several members does
        not go back and forth); once it leads none, the client follows the leader of the topics it is
        forwarded."""
        self.over_said = False
        """Whether the MQTT 5 client's publishes past its Receive Maximum were said (once a connection)."""
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

    def holds_at_maximum(self, v5: bool, limits: LimitsConfig) -> bool:
        """Whether the client's reading stops, rather than it being disconnected, once ``pending`` reaches
        ``limits.receive_maximum``: an MQTT 3.1.1 client's always; an MQTT 5 client's with
        ``limits.receive_maximum_exceeded: hold`` while its open QoS 2 flows, which only PUBRELs read later
        end, take at most half of them (reading resumes at half)."""
        if not v5:
            return True
        open_qos2 = self.qos2
        return limits.receive_maximum_exceeded == "hold" and (
            open_qos2 is None or len(open_qos2) <= limits.receive_maximum // 2
        )
