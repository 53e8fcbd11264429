"""A run of plain QoS 0 PUBLISHes of one client on one topic, read together: handled once, written at once.

A device streaming telemetry sends QoS 0 PUBLISHes of one topic back to back, and one read brings many of
them. When each is plain (no properties, neither RETAIN nor DUP: it has a ``Publish.frame``) and the topic
is not logged, everything the broker decides about them is the same for all: the topic's checks, the
sessions it matches, and, for a subscriber of the publisher's protocol family at QoS 0, the bytes it is sent
(the frames as received). So the run is checked and matched once and such a subscriber gets its frames in one
write; any other subscriber (another protocol family, outgoing topic aliases, subscription identifiers, a
paused connection, a Maximum Packet Size below one of the frames) is sent each message as a lone PUBLISH
would be, and a run the broker would not accept alike (a refused or logged topic, shared groups, a cluster
member, a rate limit it exceeds) is handled one PUBLISH at a time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from broker_edge.engine.message import Message
from broker_edge.protocol.packets import Publish

if TYPE_CHECKING:
    from collections.abc import Sequence

    from broker_edge.protocol.packets import Packet

__all__ = ["PublishRun", "plain_run_end"]


def plain_run_end(packets: Sequence[Packet], start: int, topic: str) -> int:
    """Where the run of plain QoS 0 PUBLISHes on ``topic`` that starts at ``start`` ends (``packets[start]``
    is one)."""
    end = start + 1
    count = len(packets)
    while end < count:
        packet = packets[end]
        if type(packet) is not Publish or packet.qos or packet.frame is None or packet.topic != topic:
            break
        end += 1
    return end


class PublishRun:
    """Plain QoS 0 PUBLISHes of one client on ``topic`` (see the module docstring), ``v5``: in the MQTT 5
    family. ``frames`` and ``messages`` are made when first asked for and shared by every subscriber."""

    __slots__ = ("_frames", "_messages", "origin", "packets", "topic", "v5")

    def __init__(self, packets: list[Publish], origin: str, v5: bool) -> None:
        self.packets = packets
        self.topic = packets[0].topic
        self.origin = origin
        """The publishing client id (for No Local)."""
        self.v5 = v5
        self._frames: bytes | None = None
        self._messages: list[Message] | None = None

    def __len__(self) -> int:
        return len(self.packets)

    @property
    def frames(self) -> bytes:
        """The frames as received, one after the other: what a subscriber of the publisher's family gets."""
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
            topic, origin, v5 = self.topic, self.origin, self.v5
            messages = self._messages = [
                Message(topic, packet.payload, 0, False, None, origin, None, None, packet.frame, v5)
                for packet in self.packets
            ]
        return messages
