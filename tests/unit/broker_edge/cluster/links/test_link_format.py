"""A rolling upgrade keeps forwarding: a link speaks format 1 (what members of earlier versions read) until
its peer says it speaks format 2, and every member reads both."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

import pytest

from broker_edge.cluster.links import link_format_1 as format_1
from broker_edge.cluster.links.link_wire import MAX_RECORD_BODY, decode_parts
from broker_edge.cluster.links.peer_link import (
    ANSWER,
    FORMAT_SERVICE,
    FORWARD,
    REPLY,
    REQUEST,
    PeerLink,
    PeerLinks,
)
from broker_edge.engine.message import Message
from broker_edge.engine.ports import ForwardAck
from broker_edge.protocol.properties import Properties

TOPIC = "site/a/temp"


def _message(payload: bytes, properties: Properties | None = None) -> Message:
    return Message(TOPIC, payload, 1, True, properties, "device-7", None, time.monotonic() + 60)


def test_format_1_round_trips_a_forward_and_its_answer():
    rich = _message(b"\x00\x01", Properties(content_type="application/cbor", user_properties=[("u", "C")]))
    ((kind, body),) = decode_parts(format_1.encode_forward_1(41, TOPIC, [_message(b"21.5"), rich]))
    assert kind == format_1.FORWARD_1
    batch, messages = format_1.decode_forward_1(body, 1000.0, MAX_RECORD_BODY)
    assert batch == 41
    assert [(m.topic, m.payload, m.qos, m.retain, m.origin) for m in messages] == [
        (TOPIC, b"21.5", 1, True, "device-7"),
        (TOPIC, b"\x00\x01", 1, True, "device-7"),
    ]
    assert messages[1].properties is not None and messages[1].properties.content_type == "application/cbor"
    assert messages[0].expires_at is not None and 59 <= messages[0].expires_at - 1000.0 <= 60

    acks = [ForwardAck(0, 7), ForwardAck(0x97, None, "quota exceeded")]
    ((kind, body),) = decode_parts(format_1.encode_answer_1(41, acks))
    assert kind == format_1.ANSWER_1
    assert format_1.decode_answer_1(body) == (41, acks)


def test_format_1_refuses_what_is_cut_short_and_answers_it_cannot_carry():
    ((_, body),) = decode_parts(format_1.encode_forward_1(1, TOPIC, [_message(b"payload")]))
    with pytest.raises(ValueError, match="record frame"):
        format_1.decode_forward_1(body[:-3], 0.0, MAX_RECORD_BODY)
    ((_, body),) = decode_parts(format_1.encode_answer_1(1, [ForwardAck(0x80, None, "refused")]))
    with pytest.raises(ValueError, match="truncated"):
        format_1.decode_answer_1(body[:-2])
    with pytest.raises(ValueError, match="at most 65535"):
        format_1.encode_answer_1(1, [ForwardAck(0, offset) for offset in range(70_000)])


class _Appender:
    """A leader: answers every forwarded publish with the next offset of its log."""

    def __init__(self) -> None:
        self.appended: list[bytes] = []

    def forwarded(self, link: PeerLink, batch: int, messages: list[Message]) -> None:
        first = len(self.appended)
        self.appended += [message.payload for message in messages]
        link.answer(batch, [ForwardAck(0, first + index) for index in range(len(messages))])

    def unlogged(self, message: Message) -> None:
        raise AssertionError("no unlogged publishes here")


class _Wire:
    """One side's socket in memory, recording the kinds of the parts it carries."""

    def __init__(self, to: PeerLinks, link: PeerLink) -> None:
        self.to, self.link = to, link
        self.kinds: list[int] = []

    async def send_bytes(self, data: bytes) -> None:
        self.kinds += [kind for kind, _ in decode_parts(data)]
        self.link.received(data, self.to.receiver, self.to._handlers, self.to._services)

    async def close(self) -> None:
        return None


def _linked(old_b: bool) -> tuple[PeerLinks, PeerLinks, _Wire, _Wire]:
    """Members a (this version) and b, linked in memory; b stands for a member of an earlier version when
    ``old_b``: it has no format service and never asks, so it forwards and answers in format 1."""
    a, b = PeerLinks("a", None, _Appender()), PeerLinks("b", None, _Appender())
    if old_b:
        del b._services[FORMAT_SERVICE]
    a_to_b, b_to_a = _Wire(b, b.link("a")), _Wire(a, a.link("b"))
    a.link("b").attach(a_to_b)
    b.link("a").attach(b_to_a)
    a.link("b").learn_format()
    if not old_b:
        b.link("a").learn_format()
    return a, b, a_to_b, b_to_a


async def _forward(link: PeerLink, payloads: Sequence[bytes]) -> list[ForwardAck]:
    answered: asyncio.Future[list[ForwardAck]] = asyncio.get_running_loop().create_future()
    link.forward(TOPIC, [_message(p) for p in payloads], lambda acks: answered.set_result(list(acks)))
    return await asyncio.wait_for(answered, 2)


def test_members_of_this_version_agree_on_format_2():
    async def scenario() -> None:
        a, b, a_to_b, b_to_a = _linked(old_b=False)
        early = await _forward(a.link("b"), [b"1"])  # before b's answer to the question: format 1
        await asyncio.sleep(0.01)
        assert (a.link("b").format, b.link("a").format) == (2, 2)
        later = await _forward(a.link("b"), [b"2", b"3"])
        assert [ack.offset for ack in early + later] == [0, 1, 2]
        assert format_1.FORWARD_1 in a_to_b.kinds and a_to_b.kinds[-1] == FORWARD
        assert b_to_a.kinds[-1] == ANSWER
        leader = b.receiver
        assert isinstance(leader, _Appender) and leader.appended == [b"1", b"2", b"3"]

    asyncio.run(scenario())


def test_a_member_of_an_earlier_version_gets_format_1_both_ways(caplog: pytest.LogCaptureFixture):
    async def scenario() -> None:
        a, b, a_to_b, b_to_a = _linked(old_b=True)
        await asyncio.sleep(0.01)
        assert a.link("b").format == 1
        acks = await _forward(a.link("b"), [b"1", b"2"])  # a forwards to the old member
        assert [ack.offset for ack in acks] == [0, 1]
        back = await _forward(b.link("a"), [b"3"])  # the old member forwards to a
        assert [ack.offset for ack in back] == [0]
        first = {format_1.FORWARD_1, format_1.ANSWER_1}
        assert set(a_to_b.kinds) <= first | {REQUEST}  # the question, and no part of format 2
        assert set(b_to_a.kinds) <= first | {REPLY}  # the old member's error reply
        assert format_1.ANSWER_1 in a_to_b.kinds and format_1.FORWARD_1 in b_to_a.kinds

    with caplog.at_level(logging.WARNING, logger="broker_edge.cluster.peer_link"):
        asyncio.run(scenario())
    assert "peer b runs an earlier version (peer link format 1)" in caplog.text


def test_a_new_socket_asks_again():
    async def scenario() -> None:
        a, b, _, _ = _linked(old_b=False)
        await asyncio.sleep(0.01)
        link = a.link("b")
        assert link.format == 2
        link.attach(_Wire(b, b.link("a")))  # the peer redialed: it may have been downgraded meanwhile
        assert link.format == 1
        link.learn_format()
        await asyncio.sleep(0.01)
        assert link.format == 2

    asyncio.run(scenario())
