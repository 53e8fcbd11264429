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

A broker's decoder hands PUBLISHes read back to back that begin alike (one size, one topic) as one
``PublishesAlike``; a run is made of those and of lone PUBLISHes (``plain_run_end``), its packet ids,
payloads and frames kept in lists, with no ``Publish`` object for each message.

A run the broker would not accept alike (a refused topic, one logged at QoS 0 or not logged at QoS 1, a topic
whose log it would create, shared groups or a cluster member at QoS 0, a rate limit or a Receive Maximum it
would pass) is handled one PUBLISH at a time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from broker_edge.engine.message import Message
from broker_edge.protocol.codec import qos0_frame_of
from broker_edge.protocol.packets import Publish, PublishesAlike

if TYPE_CHECKING:
    from collections.abc import Sequence

    from broker_edge.protocol.packets import Packet

__all__ = ["LoggedRun", "PublishRun", "each_apart", "plain_run_end"]


def plain_run_end(packets: Sequence[Packet], start: int, topic: str, qos: int) -> tuple[int, int]:
    """Where the run of plain PUBLISHes at ``qos`` on ``topic`` that starts at ``start`` ends
    (``packets[start]`` is one, or a ``PublishesAlike`` of them), and how many PUBLISHes it holds."""
    first = packets[start]
    count = len(first.payloads) if type(first) is PublishesAlike else 1
    end = start + 1
    size = len(packets)
    while end < size:
        packet = packets[end]
        if type(packet) is PublishesAlike:
            publish, publishes = packet.first, len(packet.payloads)
        elif type(packet) is Publish:
            publish, publishes = packet, 1
        else:
            break
        if publish.qos != qos or publish.frame is None or publish.topic != topic:
            break
        count += publishes
        end += 1
    return end, count


def each_apart(packets: list[Packet], start: int, end: int) -> int:
    """Each ``PublishesAlike`` in ``packets[start:end]`` replaced by its PUBLISHes, in place (so that each is
    handled on its own): the number of packets added."""
    added = 0
    index = start
    while index < end + added:
        packet = packets[index]
        if type(packet) is PublishesAlike:
            publishes = packet.publishes()
            packets[index : index + 1] = publishes
            added += len(publishes) - 1
            index += len(publishes)
        else:
            index += 1
    return added


class PublishRun:
    """Plain PUBLISHes of one client on ``topic`` at ``qos`` (see the module docstring), ``v5``: in the MQTT 5
    family: each one's packet id, payload and frame as received. ``frames`` and ``messages`` are made when
    first asked for and shared by every subscriber."""

    __slots__ = (
        "_frames",
        "_messages",
        "head",
        "origin",
        "packet_ids",
        "payloads",
        "qos",
        "received",
        "topic",
        "v5",
    )

    def __init__(self, parts: Sequence[Publish | PublishesAlike], origin: str, v5: bool) -> None:
        """The run of ``parts`` (``plain_run_end``'s), in order."""
        first = parts[0]
        self.received: list[Any]  # every one is a frame (bytes)
        self.head: bytes | None = None
        """The bytes every frame begins with, up to its packet id, when one ``PublishesAlike`` is the run."""
        if len(parts) == 1 and isinstance(first, PublishesAlike):  # a client streaming on one topic
            self.packet_ids, self.payloads = first.packet_ids, first.payloads
            self.received = first.frames or []
            self.head = first.head
        else:
            self.packet_ids, self.payloads, self.received = [], [], []
            for part in parts:
                if isinstance(part, PublishesAlike):
                    self.packet_ids += part.packet_ids
                    self.payloads += part.payloads
                    self.received += part.frames or []
                else:
                    self.packet_ids.append(part.packet_id)
                    self.payloads.append(part.payload)
                    self.received.append(part.frame)
        self.topic = first.topic
        self.qos = first.qos
        self.origin = origin
        """The publishing client id (for No Local)."""
        self.v5 = v5
        self._frames: bytes | None = None
        self._messages: list[Message] | None = None

    def __len__(self) -> int:
        return len(self.payloads)

    @property
    def frames(self) -> bytes:
        """The frames as received, one after the other: what a subscriber of the publisher's family gets (of a
        QoS 0 run)."""
        frames = self._frames
        if frames is None:
            frames = self._frames = b"".join(self.received)
        return frames

    def fits(self, max_packet_size: int) -> bool:
        """Whether every frame fits a subscriber's ``max_packet_size`` (all of them together do, mostly)."""
        return len(self.frames) <= max_packet_size or all(
            len(frame) <= max_packet_size for frame in self.received
        )

    def messages(self) -> list[Message]:
        """The run's messages, as ``handle_publish`` would make them one by one."""
        messages = self._messages
        if messages is None:
            topic, qos, origin, v5 = self.topic, self.qos, self.origin, self.v5
            messages = self._messages = [
                Message(topic, payload, qos, False, None, origin, None, None, frame, v5)
                for payload, frame in zip(self.payloads, self.received, strict=True)
            ]
            if qos and not v5 and (head := self.head) is not None:
                # their MQTT 3.1.1 frames' part before the packet id, one for all (``Message.frame_head``)
                for message in messages:
                    message.frame_head = head
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
