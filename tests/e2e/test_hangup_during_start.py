"""SIGHUP (``systemctl reload``, a certificate renewal hook's ``kill -HUP``) at any moment of a broker's start
or stop: it never ends the broker. One that comes while the broker starts is acted on once it serves (its
files may have changed after the start read them); one during its stop changes nothing (exit 0).

As ``test_stop_during_start``, each run waits until the command's own code has taken the signals (SIGTERM
caught, in ``/proc/<pid>/status``; before that the interpreter itself is starting)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.test_stop_during_start import STARTED, catches_sigterm, write_config

pytestmark = pytest.mark.timeout(120)


def hang_up_until(process: subprocess.Popen[bytes], done: Callable[[], bool]) -> int:
    """SIGHUP every few milliseconds until ``done()`` or the process ends; how many were sent."""
    sent = 0
    while process.poll() is None and not done():
        os.kill(process.pid, signal.SIGHUP)
        sent += 1
        time.sleep(0.005)
    return sent


def test_sighup_during_the_start_and_the_stop_never_ends_the_broker(tmp_path: Path):
    config = write_config(tmp_path)
    log = tmp_path / "broker.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "pipelines.cli", "broker", "--config", str(config)],
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while not catches_sigterm(process.pid):
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.002)
        sent = hang_up_until(process, lambda: STARTED in log.read_text())
        assert process.poll() is None, f"ended by SIGHUP number {sent} of its start:\n{log.read_text()}"
        assert sent > 0
        deadline = time.monotonic() + 10
        while "SIGHUP" not in log.read_text().split(STARTED, 1)[1]:  # acted on once it serves
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.01)
        process.send_signal(signal.SIGTERM)
        hang_up_until(process, lambda: False)
        assert process.wait(timeout=30) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    text = log.read_text()
    assert "broker stopped" in text and "Traceback" not in text
