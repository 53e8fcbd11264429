"""The HTTP memory budget: one limit for every request's bytes, a share that only members may use."""

from __future__ import annotations

import pytest

from broker_edge.security.http_budget import BudgetExhausted, MemoryBudget, Reservation


def test_readers_stop_at_the_members_reserve_and_members_use_all_of_it() -> None:
    budget = MemoryBudget(100, reserved_for_members=30)
    readers = [Reservation(budget, member=False) for _ in range(3)]
    readers[0].grow(40)
    readers[1].grow(30)
    with pytest.raises(BudgetExhausted):
        readers[2].grow(1)  # 70 held by readers: the last 30 are the members'
    member = Reservation(budget, member=True)
    member.grow(30)
    with pytest.raises(BudgetExhausted):
        member.grow(1)  # the whole budget is held
    assert (budget.held, budget.held_by_readers, budget.refused) == (100, 70, 2)
    readers[0].release()
    member.grow(40)  # a member may take what readers gave back
    assert budget.held == 100


def test_a_request_settles_on_what_its_answer_really_holds_and_gives_it_all_back() -> None:
    budget = MemoryBudget(100, reserved_for_members=0)
    request = Reservation(budget, member=False)
    request.grow(64)  # what the read may hold
    request.settle(10)  # what the answer built from it is
    assert budget.held == 10
    request.settle(120)  # an answer past its share (one record larger than max_bytes) is counted
    assert budget.held == 120
    with pytest.raises(BudgetExhausted):
        Reservation(budget, member=False).grow(1)  # until it is given back
    request.release()
    assert (budget.held, budget.held_by_readers, request.size) == (0, 0, 0)


def test_a_budget_needs_room_beside_its_reserve() -> None:
    with pytest.raises(ValueError):
        MemoryBudget(10, reserved_for_members=10)
    with pytest.raises(ValueError):
        MemoryBudget(0)


def test_a_named_reader_holding_something_stops_at_half_of_the_readers_share() -> None:
    budget = MemoryBudget(100, reserved_for_members=20)  # readers: 80, one named reader: 40 once it holds
    first, second = Reservation(budget, False, "greedy"), Reservation(budget, False, "greedy")
    first.grow(60)  # its first request takes what it needs
    with pytest.raises(BudgetExhausted):
        second.grow(1)  # beside it, nothing more
    other = Reservation(budget, False, "spark")
    other.grow(20)  # the other readers keep the rest
    first.release()
    second.grow(40)
    with pytest.raises(BudgetExhausted):
        second.grow(1)  # 40: half of the readers' share
    Reservation(budget, False).grow(20)  # a request without a name is not counted as anyone's
    assert budget.by_holder == {"greedy": 40, "spark": 20}
    second.release()
    assert budget.by_holder == {"spark": 20}
