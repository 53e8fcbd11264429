"""``WorkTurns``: HTTP work on the broker's loop, one piece at a time, in the order asked (known clients'
first), the loop resting after each as long as it took; a request gone while it waited leaves the line
moving."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time

from broker_edge.http.read_gate import STRANGERS_SHARE, WorkTurns


async def pieces_in_order(turns: WorkTurns, count: int) -> tuple[list[int], int]:
    """``count`` requests asking for a turn at once, each taking two pieces: the order the pieces ran in,
    and the most that were under way together."""
    ran: list[int] = []
    under_way = most = 0

    async def request(number: int) -> None:
        nonlocal under_way, most
        for _ in range(2):
            await turns.turn()
            under_way += 1
            most = max(most, under_way)
            ran.append(number)
            await asyncio.sleep(0)  # the piece ends here: none other may have begun meanwhile
            under_way -= 1

    await asyncio.wait_for(asyncio.gather(*(request(number) for number in range(count))), 30)
    return ran, most


def test_pieces_run_one_at_a_time_first_come_first_served() -> None:
    turns = WorkTurns(rest=0.0)
    ran, most = asyncio.run(pieces_in_order(turns, 5))

    assert most == 1
    assert ran[:5] == [0, 1, 2, 3, 4]  # each request's first piece, in the order they asked
    assert sorted(ran) == sorted(list(range(5)) * 2)
    assert turns.pieces == 10


async def gone_in_line(turns: WorkTurns, given: bool) -> list[str]:
    """Two requests waiting in line behind a piece under way; the first goes away (``given``: after its
    turn was given, before it ran). What ran."""
    ran: list[str] = []

    async def request(name: str) -> None:
        await turns.turn()
        ran.append(name)

    turns._working = True  # a piece under way
    gone = asyncio.create_task(request("gone"))
    after = asyncio.create_task(request("after"))
    await asyncio.sleep(0)  # both wait in line
    turns._working = False
    if given:
        turns._next()  # the first in line is given its turn
    else:
        turns._schedule(asyncio.get_running_loop())
    gone.cancel()
    await asyncio.wait_for(after, 30)
    return ran


def test_a_request_gone_while_it_waits_leaves_the_next_its_turn() -> None:
    assert asyncio.run(gone_in_line(WorkTurns(rest=0.0), given=False)) == ["after"]


def test_a_request_gone_after_its_turn_was_given_leaves_the_next_its_turn() -> None:
    assert asyncio.run(gone_in_line(WorkTurns(rest=0.0), given=True)) == ["after"]


async def thread_builds(turns: WorkTurns, count: int) -> int:
    """``count`` builds in threads asked at once: the most that ran together."""
    lock = threading.Lock()
    running = {"now": 0, "most": 0}

    def build(number: int) -> int:
        with lock:
            running["now"] += 1
            running["most"] = max(running["most"], running["now"])
        threading.Event().wait(0.01)
        with lock:
            running["now"] -= 1
        return number

    results = await asyncio.wait_for(asyncio.gather(*(turns.in_thread(build, n) for n in range(count))), 30)
    assert results == list(range(count))
    return running["most"]


def test_builds_in_threads_are_pieces_one_at_a_time() -> None:
    turns = WorkTurns(rest=0.0)
    assert asyncio.run(thread_builds(turns, 4)) == 1
    assert turns.pieces == 4


async def rests_after_two_pieces(turns: WorkTurns) -> list[bool]:
    """Two pieces one after the other: whether the loop rests after each (its rest ends after the piece
    began; a piece after which the loop does not rest leaves the rest before, which ended before it began)."""
    rests: list[bool] = []
    for _ in range(2):
        await turns.turn()
        began = time.monotonic()
        await asyncio.sleep(0)  # the piece ends: its rest is set
        rests.append(turns._rested_at > began)
    return rests


def test_the_loop_rests_after_a_piece_only_when_it_served_devices_since_the_one_before() -> None:
    quiet = itertools.repeat(7)  # no MQTT packet handled between the pieces
    busy = itertools.count()  # packets handled between any two pieces
    # rest=1e6: the longest rest (0.1 s) after any piece that rests
    assert asyncio.run(rests_after_two_pieces(WorkTurns(rest=1e6, devices=quiet.__next__))) == [True, False]
    assert asyncio.run(rests_after_two_pieces(WorkTurns(rest=1e6, devices=busy.__next__))) == [True, True]
    assert asyncio.run(rests_after_two_pieces(WorkTurns(rest=1e6))) == [True, True]


async def turns_of_strangers_and_known(turns: WorkTurns, strangers: int, known: int) -> list[str]:
    """``strangers`` requests asking for a turn, then ``known`` clients' requests: the order their pieces
    ran in (the first stranger's begins at once, the line being empty)."""
    ran: list[str] = []

    async def request(name: str, is_known: bool) -> None:
        await turns.turn(is_known)
        ran.append(name)
        await asyncio.sleep(0)

    asking = [request(f"s{number}", False) for number in range(strangers)]
    asking += [request(f"k{number}", True) for number in range(known)]
    await asyncio.wait_for(asyncio.gather(*asking), 30)
    return ran


def test_known_clients_pieces_go_before_strangers_who_have_one_turn_in_four_while_they_wait() -> None:
    assert STRANGERS_SHARE == 4
    ran = asyncio.run(turns_of_strangers_and_known(WorkTurns(rest=0.0), strangers=6, known=4))

    assert ran == ["s0", "k0", "k1", "k2", "s1", "k3", "s2", "s3", "s4", "s5"]
