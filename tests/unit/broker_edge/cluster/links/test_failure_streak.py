"""Which failed calls to another member are worth a WARNING (``member_clients.FailureStreak``)."""

from __future__ import annotations

from broker_edge.cluster.links.member_clients import NOT_KNOWN_YET_S, FailureStreak


def warnings_of(streak: FailureStreak, calls: list[tuple[float, bool]]) -> list[int]:
    """The numbers (1-based) of the failures ``streak`` says to log at WARNING."""
    return [number for number, (now, refused) in enumerate(calls, 1) if streak.failed(now, refused)]


def test_the_first_failure_then_every_nth_is_a_warning() -> None:
    streak = FailureStreak(every=5)
    assert warnings_of(streak, [(0.1 * n, False) for n in range(12)]) == [1, 5, 10]


def test_a_refusal_is_quiet_while_the_other_member_may_not_know_this_one_yet() -> None:
    streak = FailureStreak(every=1000)
    calls = [(0.2 * n, True) for n in range(40)]  # 8 s of 403 answers, every 0.2 s
    first_loud = next(n for n, (now, _) in enumerate(calls, 1) if now >= NOT_KNOWN_YET_S)
    assert warnings_of(streak, calls) == [first_loud]


def test_a_short_streak_of_refusals_says_nothing_and_a_success_starts_over() -> None:
    streak = FailureStreak(every=1000)
    assert warnings_of(streak, [(0.0, True), (0.2, True), (0.4, True)]) == []
    streak.succeeded()
    assert warnings_of(streak, [(10.0, True), (10.2, False)]) == [2]  # any other failure is said at once
    streak.succeeded()
    assert warnings_of(streak, [(20.0, False)]) == [1]
