"""``stop_signals``: SIGINT, SIGTERM and SIGHUP only noted from the command's first moment, before its event
loop exists. SIGHUP's handler goes in first, so a process seen catching SIGTERM (``/proc/<pid>/status``, what
a supervisor or ``tests/e2e/test_hangup_during_start.py`` reads) is never ended by a SIGHUP sent then."""

from __future__ import annotations

import signal
import subprocess
import sys
from typing import Any

import pytest

from broker_edge.runtime import stop_signals

CHILD = """
import os, signal
from broker_edge.runtime import stop_signals
stop_signals.catch_early_stops()
os.kill(os.getpid(), signal.SIGHUP)
os.kill(os.getpid(), signal.SIGTERM)
os.kill(os.getpid(), signal.SIGINT)
print(stop_signals.hangup_requested(), stop_signals.hangup_requested(), stop_signals.requested())
acted = []
stop_signals.take_hangups(lambda: acted.append(1))
os.kill(os.getpid(), signal.SIGHUP)
os.kill(os.getpid(), signal.SIGHUP)
stop_signals.ignore_hangups()
os.kill(os.getpid(), signal.SIGHUP)
print(len(acted), stop_signals.hangup_requested())
"""


def test_sighup_is_taken_before_sigterm_and_sigint(monkeypatch: pytest.MonkeyPatch) -> None:
    taken: list[int] = []

    def record(signum: int, _handler: Any) -> None:
        taken.append(signum)

    monkeypatch.setattr(signal, "signal", record)
    monkeypatch.setattr(signal, "getsignal", lambda _signum: signal.SIG_DFL)
    stop_signals.catch_early_stops()
    assert taken == [signal.SIGHUP, signal.SIGINT, signal.SIGTERM]


def test_the_signals_are_noted_then_a_sighup_acted_on_then_ignored_and_none_ends_the_process() -> None:
    result = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    noted, acted = result.stdout.splitlines()
    assert noted.split() == ["True", "False", "True"]  # hangup_requested forgets what it answered
    assert acted.split() == ["2", "False"]  # each SIGHUP acted on once taken, none noted, none once ignored
