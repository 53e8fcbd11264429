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
  offset, its delivery and its PUBACK, in order); once durable, consecutive plain messages of one publisher
  on one topic (a ``LoggedRun``) are matched once, and a QoS 0 subscriber of the publisher's family that
  takes them as they are gets their QoS 0 frames (each the received frame less its packet id) in one write.

A run the broker would not accept alike (a refused topic, one logged at QoS 0 or not logged at QoS 1, a topic
whose log it would create, shared groups or a cluster member at QoS 0, a rate limit or a Receive Maximum it
would pass) is handled one PUBLISH at a time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from broker_edge.engine.message import Message
from broker_edge.protocol.codec import qos0_frame_of
from broker_edge.protocol.packets import Publish

if TYPE_CHECKING:
    from collections.abc import Sequence

    from broker_edge.protocol.packets import Packet

__all__ = ["LoggedRun", "PublishRun", "plain_run_end"]


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


class LoggedRun:
    """Consecutive plain QoS 1 messages of one publisher on one topic, logged and durable (each carries its
    offset), routed together (see the module docstring). ``frames``: their QoS 0 frames, made when first
    asked for and shared by every subscriber that takes them as they are."""

    __slots__ = ("_frames", "_messages", "origin", "topic", "v5")

    qos = 1
    """The QoS of its messages."""

    def __init__(self, messages: list[Message]) -> None:
        first = messages[0]
        self._messages = messages
        self.topic = first.topic
        self.origin = first.origin
        """The publishing client id (for No Local)."""
        self.v5 = first.frame_v5
        self._frames: bytes | None = None

    def __len__(self) -> int:
        return len(self._messages)

    @property
    def frames(self) -> bytes:
        """Each message's frame received less its packet id, one after the other: what a QoS 0 subscriber of
        the publisher's family gets."""
        frames = self._frames
        if frames is None:
            v5 = self.v5
            frames = self._frames = b"".join(
                [qos0_frame_of(cast(bytes, m.frame), m.payload, v5) for m in self._messages]
            )
        return frames

    def fits(self, max_packet_size: int) -> bool:
        """Whether every QoS 0 frame fits a subscriber's ``max_packet_size`` (each is its frame less 2)."""
        return len(self.frames) <= max_packet_size or all(
            len(cast(bytes, m.frame)) - 2 <= max_packet_size for m in self._messages
        )

    def messages(self) -> list[Message]:
        return self._messages
