"""Clients' connections moved between two members' handoff sockets on one loop: real TCP connections, real
abstract Unix sockets, the descriptor passed; what the receiving end drops (no descriptor, several, not a
TCP socket, a record that is not JSON, one its broker refuses), a name that does not connect, and a process
of another user at either end (run as root, the other process drops to user ``nobody``)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from broker_edge.cluster.links.handoff import MAX_RECORD, MOVE_WITHIN_S, ConnectionHandoff
from broker_edge.placement import HANDOFF_NAME


class Client:
    """A TCP connection on loopback: the device's end and the broker's end."""

    def __init__(self) -> None:
        with socket.create_server(("127.0.0.1", 0)) as listening:
            self.device = socket.create_connection(listening.getsockname(), timeout=5)
            self.broker_end, _ = listening.accept()

    def close(self) -> None:
        self.device.close()
        self.broker_end.close()


class Movable:
    """A connection as a handoff sees it, over ``Client``'s broker end: it may move (``movable``), and
    can once ``answered`` (its publishes read answered); ``unread`` goes along."""

    def __init__(self, client: Client, record: dict[str, Any] | None, unread: bytes = b"") -> None:
        self.client = client
        self.record = record
        self.movable = record is not None
        self.answered = True
        self.unread = unread
        self.held = False
        self.resumed_with: bytes | None = None
        self.moved_to: str | None = None
        self.seen_when_handed_over: Callable[[], object] = lambda: None
        self.seen: object = None
        """What ``seen_when_handed_over`` returned as the connection ended."""

    def may_move(self) -> bool:
        return self.movable

    def hold_for_handover(self) -> None:
        self.held = True

    def handover_record(self) -> dict[str, Any] | None:
        return dict(self.record) if self.record is not None and self.answered and self.movable else None

    def handover_socket(self) -> tuple[int, bytes] | None:
        unread, self.unread = self.unread, b""
        return self.client.broker_end.fileno(), unread

    def resume_after_handover(self, unread: bytes = b"") -> None:
        self.held = False
        self.resumed_with = unread

    def handed_over(self, node: str) -> None:
        self.moved_to = node
        self.seen = self.seen_when_handed_over()
        self.client.broker_end.close()  # its transport closes its copy of the descriptor


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


class Ends:
    """Two members' handoff ends on ``loop``: ``a`` hands over to ``b``, whose adoptions are kept."""

    def __init__(self, loop: asyncio.AbstractEventLoop, refuse: bool = False) -> None:
        self.loop = loop
        self.adopted: list[tuple[dict[str, Any], socket.socket, str]] = []

        def adopt(record: dict[str, Any], sock: socket.socket, origin: str) -> None:
            if refuse:
                raise ValueError("listener: none here")
            self.adopted.append((record, sock, origin))

        self.outcomes: dict[str, list[str]] = {"a": [], "b": []}
        self.a = ConnectionHandoff("a", loop, lambda *_: None, self.outcomes["a"].append)
        self.b = ConnectionHandoff("b", loop, adopt, self.outcomes["b"].append)
        self.a.start()
        self.b.start()

    def turn(self, seconds: float = 0.05) -> None:
        self.loop.run_until_complete(asyncio.sleep(seconds))

    def close(self) -> None:
        self.a.close()
        self.b.close()
        for _, sock, _ in self.adopted:
            sock.close()


@pytest.fixture
def ends(loop: asyncio.AbstractEventLoop) -> Iterator[Ends]:
    pair = Ends(loop)
    yield pair
    pair.close()


def test_a_connection_handed_over_goes_on_over_the_same_tcp_connection(ends: Ends) -> None:
    """Held at once, moved once its publishes read are answered, after the turn's writes: the record, who
    it came from and the bytes read and not handled go with the descriptor."""
    assert HANDOFF_NAME.fullmatch(ends.b.name)
    client = Client()
    conn = Movable(client, {"client_id": "d-1", "listener": "default"}, unread=b"\x30\x03")
    conn.answered = False
    ends.a.hand_over(conn, "b", ends.b.name)
    assert conn.held and conn.moved_to is None, "held, not moved at once"
    ends.turn(0.1)
    assert conn.held and conn.moved_to is None, "waiting for the answers to its publishes"
    conn.answered = True
    ends.turn()
    assert conn.moved_to == "b" and conn.resumed_with is None
    ((record, sock, origin),) = ends.adopted
    assert (
        record == {"client_id": "d-1", "listener": "default", "from": "a", "unread": "MAM="} and origin == "a"
    )
    assert ends.outcomes == {"a": ["out"], "b": ["in"]}
    client.device.sendall(b"\x00\x01t")  # the device's next bytes reach the member that took it
    sock.setblocking(True)
    sock.settimeout(5)
    assert sock.recv(16) == b"\x00\x01t"
    sock.sendall(b"\x40\x02\x00\x01")
    assert client.device.recv(16) == b"\x40\x02\x00\x01"
    client.device.close()


class Claims:
    """A member's session registry side as a handoff sees it: the records it wrote, by client id."""

    def __init__(self, written: dict[str, dict[str, int]]) -> None:
        self.written = written
        self.moved: list[str] = []

    def carried(self, client_id: str) -> dict[str, int] | None:
        return self.written.get(client_id)

    def moved_away(self, client_id: str) -> None:
        self.moved.append(client_id)
        self.written.pop(client_id, None)


def test_the_registry_record_goes_with_the_connection_and_is_let_go_of_once_it_went(ends: Ends) -> None:
    """The record ``a`` wrote of the client's session travels with the descriptor (``b`` swaps it without
    a read), and ``a`` lets go of it only once the message went: before the connection ends there, so its
    end changes nothing in the registry."""
    claims = ends.a.claims = Claims({"d-1": {"generation": 3, "revision": 41}})
    client = Client()
    conn = Movable(client, {"client_id": "d-1"})
    conn.seen_when_handed_over = lambda: list(claims.moved)
    ends.a.hand_over(conn, "b", ends.b.name)
    ends.turn()
    ((record, sock, _),) = ends.adopted
    assert record["claim"] == {"generation": 3, "revision": 41}
    assert conn.seen == ["d-1"], "let go of before the connection ended"
    sock.close()
    client.close()


def test_a_connection_that_stays_keeps_its_registry_record(ends: Ends) -> None:
    claims = ends.a.claims = Claims({"d-8": {"generation": 1, "revision": 7}})
    client = Client()
    conn = Movable(client, {"client_id": "d-8"}, unread=b"\x30" + b"x" * MAX_RECORD)
    ends.a.hand_over(conn, "b", ends.b.name)
    ends.turn()
    assert conn.moved_to is None and claims.moved == [] and "d-8" in claims.written
    client.close()


def test_a_connection_whose_unread_bytes_do_not_fit_a_message_stays_with_them(ends: Ends) -> None:
    """A large packet half-read: the record would pass ``MAX_RECORD``, so the connection is read again
    with every byte it had, and nothing is sent."""
    client = Client()
    unread = b"\x30" + b"x" * MAX_RECORD
    conn = Movable(client, {"client_id": "d-8"}, unread=unread)
    ends.a.hand_over(conn, "b", ends.b.name)
    ends.turn()
    assert conn.moved_to is None and not conn.held and conn.resumed_with == unread
    assert ends.adopted == [] and ends.outcomes == {"a": ["stayed"], "b": []}
    client.close()


def _waiting(ends: Ends) -> tuple[Client, Movable]:
    """A connection held for moving to ``b``, its publishes read not yet answered."""
    client = Client()
    conn = Movable(client, {"client_id": "d-0"})
    conn.answered = False
    ends.a.hand_over(conn, "b", ends.b.name)
    return client, conn


def test_a_connection_that_may_no_longer_move_is_read_again(ends: Ends) -> None:
    client, conn = _waiting(ends)
    conn.movable = False  # it subscribed meanwhile, say
    ends.turn()
    assert not conn.held and conn.resumed_with == b"" and conn.moved_to is None and ends.adopted == []
    assert ends.outcomes == {"a": ["stayed"], "b": []}
    client.close()


def test_a_connection_whose_answers_do_not_come_in_time_is_read_again(ends: Ends) -> None:
    client, conn = _waiting(ends)
    ends.turn(MOVE_WITHIN_S / 2)
    assert conn.held
    ends.turn(MOVE_WITHIN_S)
    assert not conn.held and conn.moved_to is None and ends.adopted == []
    assert ends.outcomes == {"a": ["stayed"], "b": []}
    client.close()


def test_a_name_that_does_not_connect_is_left_untried_and_the_connection_stays(ends: Ends) -> None:
    client = Client()
    conn = Movable(client, {"client_id": "d-2"})
    gone = "timestone-handoff-" + "0" * 32
    assert ends.a.reaches(gone)
    ends.a.hand_over(conn, "c", gone)
    ends.turn()
    assert conn.moved_to is None and not conn.held and conn.resumed_with == b""
    assert not ends.a.reaches(gone), "not tried again for RETRY_S"
    client.close()


def test_a_member_that_refuses_the_record_closes_the_connection(loop: asyncio.AbstractEventLoop) -> None:
    pair = Ends(loop, refuse=True)
    try:
        client = Client()
        conn = Movable(client, {"client_id": "d-3"})
        pair.a.hand_over(conn, "b", pair.b.name)
        pair.turn()
        assert conn.moved_to == "b" and pair.outcomes == {"a": ["out"], "b": []}
        client.device.settimeout(5)
        assert client.device.recv(16) == b"", "closed: the client connects again"
        client.device.close()
    finally:
        pair.close()


def _link(name: str) -> socket.socket:
    link = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    link.connect("\0" + name)
    return link


def test_what_is_not_one_tcp_connection_with_a_record_is_dropped(ends: Ends) -> None:
    """A message without a descriptor, with two, with one that is not a TCP socket, with a record that is
    not JSON: nothing taken in, every descriptor closed, and the socket still takes what comes next."""
    link = _link(ends.b.name)
    record = json.dumps({"client_id": "x"}).encode()
    link.send(record)  # no descriptor
    first, second = Client(), Client()
    socket.send_fds(link, [record], [first.broker_end.fileno(), second.broker_end.fileno()])
    reader, writer = os.pipe()
    socket.send_fds(link, [record], [reader])
    third = Client()
    socket.send_fds(link, [b"{not json"], [third.broker_end.fileno()])
    for client in (first, second, third):
        client.broker_end.close()
    ends.turn()
    assert ends.adopted == []
    for client in (first, second, third):
        client.device.settimeout(5)
        assert client.device.recv(16) == b"", "every descriptor that came was closed"
        client.device.close()
    os.close(reader)
    os.close(writer)
    good = Client()
    socket.send_fds(link, [record], [good.broker_end.fileno()])
    good.broker_end.close()
    ends.turn()
    assert [each[0] for each in ends.adopted] == [{"client_id": "x"}]
    good.device.close()
    link.close()


_ANOTHER_USERS_PROCESS = r"""
import os, socket, sys
mode, name = sys.argv[1], "\0" + sys.argv[2]
os.setgroups([])  # 65534: the user and group nobody
os.setresgid(65534, 65534, 65534)
os.setresuid(65534, 65534, 65534)
if mode == "hand":  # connect to a member's handoff socket and hand it a TCP connection
    link = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    link.connect(name)
    try:
        socket.send_fds(link, [b'{"client_id":"intruder"}'], [int(sys.argv[3])])
        link.settimeout(10)
        answer = link.recv(1)
    except OSError:
        answer = b""
    print("closed" if answer == b"" else "answered", flush=True)
else:  # listen as a member's handoff socket would, and tell what a member sent
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listening.bind(name)
    listening.listen(1)
    print("ready", flush=True)
    listening.settimeout(10)
    link, _ = listening.accept()
    link.settimeout(10)
    try:
        data, fds, _, _ = socket.recv_fds(link, 65536, 4)
    except OSError:
        data, fds = b"", []
    print(f"received {len(data)} bytes and {len(fds)} descriptors", flush=True)
"""


def _another_users_process(*args: str, pass_fds: tuple[int, ...] = ()) -> subprocess.Popen[str]:
    """A Python process that drops to user ``nobody`` before it touches a socket."""
    return subprocess.Popen(
        [sys.executable, "-I", "-c", _ANOTHER_USERS_PROCESS, *args],
        stdout=subprocess.PIPE,
        text=True,
        pass_fds=pass_fds,
    )


needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="another user's process is made by root dropping its id"
)


@needs_root
def test_a_process_of_another_user_hands_nothing_in(ends: Ends, caplog: pytest.LogCaptureFixture) -> None:
    """A process of another user that connects to a member's handoff socket and sends it a TCP connection
    is refused as it is accepted: its link closed unread, nothing taken in, a warning logged; the socket
    still takes in what a member of this user hands over next."""
    client = Client()
    fd = client.broker_end.fileno()
    intruder = _another_users_process("hand", ends.b.name, str(fd), pass_fds=(fd,))
    try:
        deadline = time.monotonic() + 15
        while intruder.poll() is None and time.monotonic() < deadline:
            ends.turn()
        output, _ = intruder.communicate(timeout=5)
    finally:
        intruder.kill()
        intruder.wait()
    assert output.strip() == "closed"
    assert ends.adopted == [] and ends.outcomes["b"] == []
    assert "refused a process of another user" in caplog.text
    conn = Movable(client, {"client_id": "d-4"})
    ends.a.hand_over(conn, "b", ends.b.name)
    ends.turn()
    assert conn.moved_to == "b" and [each[0]["client_id"] for each in ends.adopted] == ["d-4"]
    client.device.close()


@needs_root
def test_a_handoff_name_of_another_users_process_is_not_given_a_connection(
    ends: Ends, caplog: pytest.LogCaptureFixture
) -> None:
    """A name advertised by a process of another user connects, but nothing is sent to it: the
    connection stays and is read again, and the name is left untried for ``RETRY_S``."""
    caplog.set_level(logging.INFO, logger="broker_edge.cluster.handoff")
    name = "timestone-handoff-" + os.urandom(16).hex()
    listener = _another_users_process("listen", name)
    try:
        assert listener.stdout is not None and listener.stdout.readline().strip() == "ready"
        client = Client()
        conn = Movable(client, {"client_id": "d-5"})
        ends.a.hand_over(conn, "c", name)
        ends.turn()
        assert conn.moved_to is None and not conn.held and conn.resumed_with == b""
        assert ends.outcomes["a"] == ["stayed"] and not ends.a.reaches(name)
        assert "PermissionError: its process runs as another user" in caplog.text
        output, _ = listener.communicate(timeout=15)
        assert output.strip() == "received 0 bytes and 0 descriptors"
        client.close()
    finally:
        listener.kill()
        listener.wait()
