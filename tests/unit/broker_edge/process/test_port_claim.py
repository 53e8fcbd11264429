"""``port_claim``: one ``--workers`` command per address, whoever else listens there refused."""

from __future__ import annotations

import errno
import multiprocessing
import os
import socket
from typing import Any

import pytest

from broker_edge.process.port_claim import answer_askers, claim_address, probe_unbound


def test_an_address_claimed_is_refused_to_a_second_claim_naming_the_holder_until_released():
    port = _free_port()
    first = claim_address("listeners[0] (m)", "127.0.0.1", port)
    assert first is not None
    try:
        with pytest.raises(OSError) as refused:
            claim_address("listeners[0] (m)", "127.0.0.1", port)
        assert refused.value.errno == errno.EADDRINUSE
        assert str(refused.value) == (
            f"[Errno 98] listeners[0] (m) 127.0.0.1:{port} is served by another timestone broker --workers "
            f"(pid {os.getpid()}): give each its own port (or host)"
        )
        other = claim_address("listeners[0] (m)", "127.0.0.1", port + 1 if port < 65535 else port - 1)
        assert other is not None  # another address: its own claim
        other.close()
    finally:
        first.close()
    again = claim_address("listeners[0] (m)", "127.0.0.1", port)
    assert again is not None
    again.close()


@pytest.mark.parametrize("reuse_port", [False, True], ids=["plain", "so-reuseport"])
def test_an_address_another_socket_listens_on_is_refused_even_one_that_could_be_joined(reuse_port: bool):
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        with pytest.raises(OSError) as refused:
            probe_unbound("listeners[0] (m)", "127.0.0.1", port)
        assert refused.value.errno == errno.EADDRINUSE
        assert str(refused.value) == (
            f"[Errno 98] listeners[0] (m) cannot listen on 127.0.0.1:{port}: Address already in use "
            "(another process listens there)"
        )
    finally:
        holder.close()
    probe_unbound("listeners[0] (m)", "127.0.0.1", port)  # free again: the probe leaves nothing bound
    probe_unbound("listeners[0] (m)", "127.0.0.1", port)


def test_a_port_with_connections_in_time_wait_is_not_taken():
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    accepted.close()  # the server's end closes first: its side stays in TIME_WAIT
    client.close()
    server.close()
    probe_unbound("listeners[0] (m)", "127.0.0.1", port)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_holder_is_named_to_every_refused_claim_while_it_answers_the_askers():
    port = _free_port()
    first = claim_address("listeners[0] (m)", "127.0.0.1", port)
    assert first is not None
    try:
        for _ in range(20):  # more than the claim's queue holds
            with pytest.raises(OSError) as refused:
                claim_address("listeners[0] (m)", "127.0.0.1", port)
            assert f"(pid {os.getpid()})" in str(refused.value)
            answer_askers(first)
    finally:
        first.close()


@pytest.mark.parametrize(
    ("held", "asked"),
    [
        ("127.0.0.1", "0.0.0.0"),
        ("0.0.0.0", "127.0.0.1"),
        ("", "::1"),
        ("::", "::1"),
        ("localhost", "127.0.0.1"),
    ],
)
def test_an_overlapping_host_on_a_claimed_port_is_refused_naming_the_holder(held: str, asked: str):
    port = _free_port()
    first = claim_address("listeners[0] (m)", held, port)
    assert first is not None
    try:
        with pytest.raises(OSError) as refused:
            claim_address("listeners[0] (n)", asked, port)
        assert refused.value.errno == errno.EADDRINUSE
        assert str(refused.value) == (
            f"[Errno 98] listeners[0] (n) {asked}:{port} overlaps {held}:{port}, served by another timestone "
            f"broker --workers (pid {os.getpid()}): give each its own port (or host)"
        )
    finally:
        first.close()
    again = claim_address("listeners[0] (n)", asked, port)  # released: the other host's claim is free
    assert again is not None
    again.close()


@pytest.mark.parametrize(
    ("held", "asked"), [("127.0.0.1", "127.0.0.2"), ("0.0.0.0", "::1"), ("::", "127.0.0.1")]
)
def test_hosts_that_do_not_overlap_claim_one_port_each(held: str, asked: str):
    port = _free_port()
    first = claim_address("listeners[0] (m)", held, port)
    second = claim_address("listeners[0] (n)", asked, port)
    assert first is not None and second is not None
    first.close()
    second.close()


def test_of_overlapping_claims_made_in_the_same_instant_exactly_one_holds():
    """Two processes (as two commands) claim overlapping hosts of one port at one barrier, 30 times: one
    holds and the other is refused every time (unlocked, both were refused in most rounds)."""
    for _ in range(30):
        assert _claim_at_once(_free_port(), ("0.0.0.0", "127.0.0.1")) == ["held", "refused"]


def _claim_at_once(port: int, hosts: tuple[str, ...]) -> list[str]:
    """Each host claimed on ``port`` by a process of its own, all released at one barrier and holding what
    they claimed until every one has answered: their answers, sorted."""
    context = multiprocessing.get_context("fork")
    start, answers, done = context.Barrier(len(hosts)), context.Queue(), context.Event()
    processes = [context.Process(target=_claim, args=(host, port, start, answers, done)) for host in hosts]
    for process in processes:
        process.start()
    try:
        return sorted(answers.get(timeout=30) for _ in hosts)
    finally:
        done.set()
        for process in processes:
            process.join(timeout=30)


def _claim(host: str, port: int, start: Any, answers: Any, done: Any) -> None:
    start.wait()
    try:
        claim = claim_address("listeners[0] (m)", host, port)
    except OSError as error:
        answers.put("refused" if error.errno == errno.EADDRINUSE else str(error))
        done.wait(30)
        return
    answers.put("held")
    done.wait(30)
    if claim is not None:
        claim.close()
