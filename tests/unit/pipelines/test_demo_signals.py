"""A signal the demo took is acted on even when the ``SystemExit`` its handler raised was swallowed.

A SIGTERM taken just after the demo's fleet started lost the handler's ``SystemExit`` in whatever ran then
(a finalizer is one place where Python swallows what is raised): the demo said it was stopping, started
Spark and ran on to its end. A finalizer plays that place here.
"""

from __future__ import annotations

import io
import signal
import time

import pytest

from pipelines.demo import Children, Progress, _wait


class Finalized:
    """An object whose finalizer is where the signal's handler runs."""

    def __init__(self, children: Children) -> None:
        self.children = children

    def __del__(self) -> None:
        self.children._on_signal(signal.SIGTERM, None)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_signal_whose_exit_a_finalizer_swallowed_stops_the_demo_at_its_next_step():
    children = Children()
    Finalized(children)  # dropped at once: its handler's SystemExit is "ignored", as in any finalizer
    assert children.stopping
    with pytest.raises(SystemExit) as stopped:
        children.exit_if_signalled()
    assert stopped.value.code == 128 + signal.SIGTERM


def test_no_signal_no_exit():
    Children().exit_if_signalled()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_swallowed_signal_ends_the_demos_wait_at_its_next_poll():
    """The demo waits for its tables and its actions (minutes); a signal whose exit was lost meanwhile stops
    the wait at its next poll, not when the wait is over."""
    children = Children()
    Finalized(children)
    polls: list[float] = []

    def never() -> bool:
        polls.append(time.monotonic())
        return False

    progress = Progress(stream=io.StringIO())
    with pytest.raises(SystemExit) as stopped:
        _wait(never, 2, progress, lambda: "waiting", children)
    assert stopped.value.code == 128 + signal.SIGTERM
    assert polls == []  # stopped before it looked again


def test_a_wait_without_a_signal_polls_until_its_condition_holds():
    polls: list[int] = []
    progress = Progress(stream=io.StringIO())

    def holds() -> bool:
        polls.append(1)
        return len(polls) >= 2

    assert _wait(holds, 600, progress, lambda: "waiting", Children())
    assert len(polls) == 2
