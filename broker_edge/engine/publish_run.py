"""A run of plain PUBLISHes of one client on one topic at one QoS (0 or 1), read together: handled once.

A device streaming telemetry sends PUBLISHes of one topic back to back, and one read brings many of them.
When each is plain (no properties, neither RETAIN nor DUP: it has a ``Publish.frame``), everything the broker
decides about them is the same for all: the topic's checks, its persistence rule, and for QoS 0 the sessions
it matches and, for a subscriber of the publisher's protocol family, the bytes it is sent (the frames as
received). So the run is checked once:

- at QoS 0 on a topic that is not logged, it is matched once and such a subscriber gets its frames in one
  write; any other subscriber (another protocol family, outgoing topic aliases, subscription identifiers, a
  paused connection, a Maximum Packet Size below one of the frames) is sent each message as a lone PUBLISH
  would be;
- at QoS 1 on a topic already logged, its messages are queued for the log together (each still gets its
  offset, its delivery and its PUBACK, in order).

A run the broker would not accept alike (a refused topic, one logged at QoS 0 or not logged at QoS 1, a topic
whose log it would create, shared groups or a cluster member at QoS 0, a rate limit or a Receive Maximum it
would pass) is handled one PUBLISH at a time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from broker_edge.engine.message import Message
from broker_edge.protocol.packets import Publish

if TYPE_CHECKING:
    from collections.abc import Sequence

    from broker_edge.protocol.packets import Packet

__all__ = ["PublishRun", "plain_run_end"]


def plain_run_end(packets: Sequence[Packet], start: int, topic: str, qos: int) -> int:
    """Where the run of plain PUBLISHes at ``qos`` on ``topic`` that starts at ``start`` ends
    (``packets[start]`` is one)."""
    end = start + 1
    count = len(packets)
    while end < count:
        packet = packets[end]
        if type(packet) is not Publish or packet.qos != qos or packet.frame is None or packet.topic != topic:
            break
        end += 1
    return end


class PublishRun:
    """Plain PUBLISHes of one client on ``topic`` at ``qos`` (see the module docstring), ``v5``: in the MQTT 5
    family. ``frames`` and ``messages`` are made when first asked for and shared by every subscriber."""

    __slots__ = ("_frames", "_messages", "origin", "packets", "qos", "topic", "v5")

    def __init__(self, packets: list[Publish], origin: str, v5: bool) -> None:
        self.packets = packets
        self.topic = packets[0].topic
        self.qos = packets[0].qos
        self.origin = origin
        """The publishing client id (for No Local)."""
        self.v5 = v5
        self._frames: bytes | None = None
        self._messages: list[Message] | None = None

    def __len__(self) -> int:
        return len(self.packets)

    @property
    def frames(self) -> bytes:
        """The frames as received, one after the other: what a subscriber of the publisher's family gets (of a
        QoS 0 run)."""
        frames = self._frames
        if frames is None:
            parts: list[Any] = [packet.frame for packet in self.packets]  # every one is a frame (bytes)
            frames = self._frames = b"".join(parts)
        return frames

    def fits(self, max_packet_size: int) -> bool:
        """Whether every frame fits a subscriber's ``max_packet_size`` (all of them together do, mostly)."""
        return len(self.frames) <= max_packet_size or all(
            len(cast(bytes, packet.frame)) <= max_packet_size for packet in self.packets
        )

    def messages(self) -> list[Message]:
        """The run's messages, as ``handle_publish`` would make them one by one."""
        messages = self._messages
        if messages is None:
            topic, qos, origin, v5 = self.topic, self.qos, self.origin, self.v5
            messages = self._messages = [
                Message(topic, packet.payload, qos, False, None, origin, None, None, packet.frame, v5)
                for packet in self.packets
            ]
        return messages
