"""Features talk over the peer link without touching its core: one-way parts of their own kinds, and
requests answered by a registered service; a link that drops fails the calls waiting on it."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from broker_edge.cluster.links.link_wire import decode_parts
from broker_edge.cluster.links.peer_link import (
    FIRST_EXTENSION_KIND,
    PeerLink,
    PeerLinkDown,
    PeerLinks,
    PeerRequestFailed,
    encode_forward,
)
from broker_edge.engine.message import Message


class _Receiver:
    def forwarded(self, link: PeerLink, batch: int, messages: list[Message]) -> None:
        raise AssertionError("no forwards in these tests")

    def unlogged(self, message: Message) -> None:
        raise AssertionError("no unlogged publishes in these tests")


class _Wire:
    """One side's socket: what it sends is received by the other side's link."""

    def __init__(self, links: PeerLinks, link: PeerLink) -> None:
        self.links = links
        self.link = link

    async def send_bytes(self, data: bytes) -> None:
        self.link.received(data, self.links.receiver, self.links._handlers, self.links._services)

    async def close(self) -> None:
        return None


def _pair() -> tuple[PeerLinks, PeerLinks]:
    """Nodes a and b, linked back to back in memory."""
    a, b = PeerLinks("a", None, _Receiver()), PeerLinks("b", None, _Receiver())
    a.link("b").attach(_Wire(b, b.link("a")))
    b.link("a").attach(_Wire(a, a.link("b")))
    return a, b


def test_an_extension_part_reaches_its_handler_with_the_link_it_came_on():
    asyncio.run(_test_an_extension_part_reaches_its_handler_with_the_link_it_came_on())


async def _test_an_extension_part_reaches_its_handler_with_the_link_it_came_on():
    a, b = _pair()
    seen: list[tuple[str, bytes]] = []
    b.on(FIRST_EXTENSION_KIND, lambda link, body: seen.append((link.peer, bytes(body))))

    a.link("b").send(FIRST_EXTENSION_KIND, b"hello")
    a.link("b").send(FIRST_EXTENSION_KIND, b"again")
    await asyncio.sleep(0.01)

    assert seen == [("a", b"hello"), ("a", b"again")]


def test_a_request_gets_its_services_reply_and_errors_come_back_as_exceptions():
    asyncio.run(_test_a_request_gets_its_services_reply_and_errors_come_back_as_exceptions())


async def _test_a_request_gets_its_services_reply_and_errors_come_back_as_exceptions():
    a, b = _pair()

    async def echo(link: PeerLink, body: memoryview) -> bytes:
        return link.peer.encode() + b":" + bytes(body)

    async def broken(link: PeerLink, body: memoryview) -> bytes:
        raise KeyError("no such session")

    b.serve_requests(7, echo)
    b.serve_requests(8, broken)

    assert await a.link("b").request(7, b"ping", timeout=1) == b"a:ping"
    with pytest.raises(PeerRequestFailed, match="no such session"):
        await a.link("b").request(8, b"", timeout=1)
    with pytest.raises(PeerRequestFailed, match="no peer service 9"):
        await a.link("b").request(9, b"", timeout=1)


def test_a_link_that_drops_fails_the_requests_waiting_on_it():
    asyncio.run(_test_a_link_that_drops_fails_the_requests_waiting_on_it())


async def _test_a_link_that_drops_fails_the_requests_waiting_on_it():
    a, b = _pair()
    started = asyncio.Event()

    async def never(link: PeerLink, body: memoryview) -> bytes:
        started.set()
        await asyncio.Event().wait()
        return b""

    b.serve_requests(1, never)
    link = a.link("b")
    call = asyncio.ensure_future(link.request(1, b"", timeout=5))
    await started.wait()
    socket = link._socket
    assert socket is not None
    link.detach(socket)

    with pytest.raises(PeerLinkDown):
        await call
    with pytest.raises(PeerLinkDown):
        await link.request(1, b"", timeout=1)


def test_core_kinds_and_duplicate_registrations_are_refused():
    links = PeerLinks("a", None, _Receiver())
    with pytest.raises(ValueError, match="reserved"):
        links.on(FIRST_EXTENSION_KIND - 1, lambda link, body: None)
    links.on(FIRST_EXTENSION_KIND, lambda link, body: None)
    with pytest.raises(ValueError, match="already"):
        links.on(FIRST_EXTENSION_KIND, lambda link, body: None)


def test_what_one_iteration_sends_leaves_as_one_message_in_the_next_with_late_builders_parts():
    asyncio.run(_test_what_one_iteration_sends_leaves_as_one_message_in_the_next())


async def _test_what_one_iteration_sends_leaves_as_one_message_in_the_next():
    messages: list[bytes] = []
    release = asyncio.Event()

    class Socket:
        async def send_bytes(self, data: bytes) -> None:
            messages.append(data)
            if len(messages) == 1:
                await release.wait()  # the first send waits for its buffer to drain

        async def close(self) -> None:
            return None

    link = PeerLink("b", asyncio.get_running_loop())
    link.attach(Socket())
    built: list[int] = []

    def build() -> None:  # a push or an acknowledgement, built as late as possible
        built.append(len(messages))
        link.send(FIRST_EXTENSION_KIND, b"late")

    link.send(FIRST_EXTENSION_KIND, b"one")
    link.soon(build)
    link.send(FIRST_EXTENSION_KIND, b"two")
    assert messages == []
    await asyncio.sleep(0)  # one loop iteration, no timer
    assert built == [0]
    assert [bytes(body) for _kind, body in decode_parts(messages[0])] == [b"one", b"two", b"late"]

    link.send(FIRST_EXTENSION_KIND, b"three")  # while the first send waits
    link.soon(build)
    link.send(FIRST_EXTENSION_KIND, b"four")
    await asyncio.sleep(0)
    assert len(messages) == 1
    release.set()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert [bytes(body) for _kind, body in decode_parts(messages[1])] == [b"three", b"four", b"late"]
    assert built == [0, 1]


class _Frames:
    """A socket the test feeds WebSocket frames to (``None`` ends it)."""

    def __init__(self) -> None:
        self.frames: asyncio.Queue[bytes | None] = asyncio.Queue()

    def __aiter__(self) -> _Frames:
        return self

    async def __anext__(self) -> Any:
        import aiohttp

        data = await self.frames.get()
        if data is None:
            raise StopAsyncIteration
        return SimpleNamespace(type=aiohttp.WSMsgType.BINARY, data=data)

    async def send_bytes(self, data: bytes) -> None:
        return None

    async def close(self) -> None:
        return None


class _Forwards(_Receiver):
    def __init__(self) -> None:
        self.payloads: list[bytes] = []

    def forwarded(self, link: PeerLink, batch: int, messages: list[Message]) -> None:
        self.payloads += [message.payload for message in messages]


def test_what_arrives_on_a_replaced_socket_is_dropped_not_appended_after_the_new_sockets():
    """The peer redials after its socket failed (its forwards on it refused); what the old socket still
    delivers must not be appended behind what comes on the new one, out of the publisher's order."""

    async def scenario() -> None:
        receiver = _Forwards()
        links = PeerLinks("b", None, receiver)
        link = links.link("a")
        old, new = _Frames(), _Frames()
        reading_old = asyncio.create_task(links._read(link, old))
        await asyncio.sleep(0)
        reading_new = asyncio.create_task(links._read(link, new))
        await asyncio.sleep(0)
        assert link.uses(new) and not link.uses(old)
        topic = "plant/meter"
        await new.frames.put(encode_forward(1, topic, [Message(topic, b"52", 1)]))
        await asyncio.sleep(0.01)
        await old.frames.put(encode_forward(9, topic, [Message(topic, b"51", 1)]))
        await old.frames.put(None)
        await new.frames.put(None)
        await asyncio.wait_for(asyncio.gather(reading_old, reading_new), 2)
        assert receiver.payloads == [b"52"]

    asyncio.run(scenario())
