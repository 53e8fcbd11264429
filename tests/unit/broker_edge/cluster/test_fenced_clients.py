"""When a fenced member sends its MQTT clients away (``FencedClients``): after ``fenced_clients_hold_ms``
while its lease may still be alive, at once when etcd says it is gone, never for a fence that lifts within
the hold, never while it was not a member yet, and only to members that answer they are members now. The
member's lease state and the others' answers are plain records here; the e2e tests
(``tests/e2e/cluster/test_fenced_clients.py``, ``test_failover.py``) run it on a real etcd."""

from __future__ import annotations

import asyncio
import socket
from functools import partial
from types import SimpleNamespace
from typing import Any, cast

from broker_edge.cluster.fenced_clients import FencedClients, members_now
from broker_edge.cluster.links.member_clients import MemberClients
from broker_edge.cluster.view import ClusterView
from broker_edge.placement import Member

HOLD_S = 0.2


def member(
    hold_s: float = HOLD_S, answering: list[str] | None = None
) -> tuple[ClusterView, SimpleNamespace, FencedClients, list[str]]:
    """A member registered under lease 7, unfenced, following its view; ``moves`` lists each move's why.
    ``answering``: the members that answer they are members now (b2 by default; change it in place)."""
    view = ClusterView("b1", 4)
    view.fenced = False
    lease = SimpleNamespace(proven_until=10.0, lease_id=7)
    moves: list[str] = []
    others = ["b2:1883"] if answering is None else answering

    async def ask() -> tuple[list[str], bool]:
        return list(others), False  # the others answer (members now or fenced): not cut off

    def move(why: str, referrals: list[str]) -> None:
        assert referrals == others
        moves.append(why)

    fenced = FencedClients(view, cast(Any, lease), hold_s, move, ask)
    view.on_change(fenced.view_changed)
    return view, lease, fenced, moves


def fence(view: ClusterView, fenced: bool = True) -> None:
    view.fenced = fenced
    view.changed()


def test_a_fence_that_outlasts_the_hold_sends_the_clients_away_once() -> None:
    async def scenario() -> list[str]:
        view, _lease, fenced, moves = member()
        fence(view)
        assert not fenced.sends_clients_away() and moves == []  # within the hold: kept, CONNECTs wait
        await asyncio.sleep(HOLD_S * 2)
        assert fenced.sends_clients_away()
        view.changed()  # another change of the view while fenced moves nobody twice
        return moves

    moves = asyncio.run(scenario())
    assert len(moves) == 1 and "fenced_clients_hold_ms" in moves[0]


def test_a_fence_lifted_within_the_hold_moves_nobody_and_the_next_fence_holds_again() -> None:
    async def scenario() -> list[str]:
        view, _lease, fenced, moves = member()
        fence(view)
        await asyncio.sleep(HOLD_S / 2)
        fence(view, False)  # the lease proven alive again (etcd back)
        await asyncio.sleep(HOLD_S * 2)
        assert moves == [] and not fenced.sends_clients_away()
        fence(view)
        await asyncio.sleep(HOLD_S / 2)
        assert moves == []  # a new fence, a new hold
        await asyncio.sleep(HOLD_S * 2)
        return moves

    assert len(asyncio.run(scenario())) == 1


def test_a_lease_etcd_says_is_gone_sends_the_clients_away_at_once() -> None:
    async def scenario() -> list[str]:
        view, lease, fenced, moves = member(hold_s=60)
        fence(view)  # renewals fail: held
        assert moves == []
        lease.lease_id = None  # etcd answers: the lease is gone (Membership._lose_lease)
        view.changed()
        assert fenced.sends_clients_away()
        await asyncio.sleep(0)  # the others asked
        return moves

    moves = asyncio.run(scenario())
    assert moves == ["etcd answered that its lease is gone"]


def test_a_node_starting_up_is_fenced_without_sending_anyone_away() -> None:
    async def scenario() -> list[str]:
        view, lease, fenced, moves = member(hold_s=0)
        lease.proven_until, lease.lease_id = 0.0, None  # never registered yet
        fence(view)
        await asyncio.sleep(0.05)
        assert not fenced.sends_clients_away()
        return moves

    assert asyncio.run(scenario()) == []


def test_a_hold_of_0_moves_at_the_fence_and_a_closed_one_never() -> None:
    async def scenario() -> tuple[list[str], list[str]]:
        view, _lease, _fenced, at_once = member(hold_s=0)
        fence(view)
        other_view, _other_lease, closed, never = member()
        fence(other_view)
        closed.close()  # the node stops
        await asyncio.sleep(HOLD_S * 2)
        return at_once, never

    at_once, never = asyncio.run(scenario())
    assert len(at_once) == 1 and never == []


def test_no_client_is_sent_to_members_that_do_not_answer_they_are_members() -> None:
    """etcd out of reach for all: the others are as fenced as this one. Clients stay, CONNECTs are refused
    (``referrals()`` empty) until one answers that it is a member, then the clients move there."""

    async def scenario() -> tuple[list[str], list[str] | None, list[str] | None]:
        answering: list[str] = []
        view, _lease, fenced, moves = member(answering=answering)
        fence(view)
        assert fenced.referrals() is None  # held: a CONNECT waits
        await asyncio.sleep(HOLD_S * 2)
        kept, refused = list(moves), fenced.referrals()
        answering.append("b2:1883")  # b2 proved its lease again; b1 is still cut off
        await asyncio.sleep(1.5)  # ASK_EVERY_S
        referred = fenced.referrals()
        fenced.close()
        return kept + moves, refused, referred

    moves, refused, referred = asyncio.run(scenario())
    assert refused == [] and referred == ["b2:1883"]
    assert len(moves) == 1 and "fenced_clients_hold_ms" in moves[0]


def test_with_no_other_member_answering_the_clients_are_disconnected_naming_nobody() -> None:
    """Cut off from every member (or the last one standing): nobody to name, but the clients leave."""

    async def scenario() -> list[tuple[str, list[str]]]:
        view = ClusterView("b1", 4)
        view.fenced = False
        lease = SimpleNamespace(proven_until=10.0, lease_id=7)
        moves: list[tuple[str, list[str]]] = []

        async def ask() -> tuple[list[str], bool]:
            return [], True  # cut off

        fenced = FencedClients(view, cast(Any, lease), 0, lambda why, to: moves.append((why, to)), ask)
        view.on_change(fenced.view_changed)
        fence(view)
        await asyncio.sleep(0.05)
        assert fenced.referrals() == []  # CONNECTs refused server unavailable
        fenced.close()
        return moves

    moves = asyncio.run(scenario())
    assert len(moves) == 1 and moves[0][1] == []


def test_a_view_without_other_members_is_no_sign_of_being_cut_off() -> None:
    """etcd expired every lease at once (it was paused) and deleted every member's key: for a moment this
    member knows of no other. Nobody failed to answer, so it does not take itself for cut off, which would
    disconnect its clients; nor for a member that left the view while it was being asked."""

    async def scenario() -> list[tuple[str, list[str]]]:
        silent = socket.create_server(("127.0.0.1", 0))  # accepts (backlog), never answers
        silent_url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        view = ClusterView("b1", 4)
        view.members["b1"] = Member("b1", "127.0.0.1:1881", "http://127.0.0.1:9881", silent_url)
        view.fenced = False
        lease = SimpleNamespace(proven_until=10.0, lease_id=7)
        clients = MemberClients("b1", None)
        moves: list[tuple[str, list[str]]] = []
        ask = partial(members_now, view, clients)
        fenced = FencedClients(view, cast(Any, lease), 0, lambda why, to: moves.append((why, to)), ask)
        view.on_change(fenced.view_changed)
        fence(view)  # hold 0: asks at once, and finds nobody to ask
        await asyncio.sleep(0.1)
        view.members["b2"] = Member("b2", "127.0.0.1:1882", "http://127.0.0.1:9882", silent_url)
        await asyncio.sleep(1.2)  # asked again (ASK_EVERY_S): b2 is asked, and does not answer yet ...
        del view.members["b2"]  # ... when its key is deleted
        await asyncio.sleep(1.0)  # b2's question timed out (ASK_TIMEOUT_S)
        fenced.close()
        await clients.close()
        silent.close()
        return moves

    assert asyncio.run(scenario()) == []
