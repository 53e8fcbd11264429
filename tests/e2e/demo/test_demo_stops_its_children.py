"""Stopping ``timestone demo`` with a signal stops the broker process it started."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.processes import children_of, command_line, running


@contextlib.contextmanager
def demo_and_its_broker(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int, list[str]]]:
    """A demo of 5 devices once it printed its broker's line: the demo, its broker's pid and what it printed;
    neither outlives the test, even when it fails."""
    command = [
        sys.executable,
        "-m",
        "pipelines.cli",
        "demo",
        "--devices",
        "5",
        "--workdir",
        str(tmp_path / "demo"),
    ]
    environment = dict(os.environ, PYTHONUNBUFFERED="1")
    demo = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=environment, text=True
    )
    brokers: list[int] = []
    try:
        assert demo.stdout is not None
        output = []
        for line in demo.stdout:
            output.append(line)
            if re.search(r"broker\s+MQTT 127\.0\.0\.1:\d+", line):
                break
        else:
            pytest.fail("the demo printed no broker line:\n" + "".join(output))
        brokers = [pid for pid in children_of([demo.pid]) if "broker" in command_line(pid)]
        assert len(brokers) == 1, brokers
        yield demo, brokers[0], output
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        for pid in brokers:
            if running(pid):
                os.kill(pid, signal.SIGKILL)


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not running(pid)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_demo_stops_its_broker(tmp_path: Path, signum: int) -> None:
    with demo_and_its_broker(tmp_path) as (demo, broker, output):
        demo.send_signal(signum)
        rest, _ = demo.communicate(timeout=60)
        assert demo.returncode == 128 + signum, "".join(output) + rest
        assert gone_within(broker, 20), "the broker outlived the demo"


def test_a_demo_killed_outright_takes_its_broker_with_it(tmp_path: Path) -> None:
    """SIGKILL leaves the demo no chance to stop anything: the kernel tells its broker (PR_SET_PDEATHSIG),
    which would otherwise serve on, an orphan holding its ports, under a working directory the next demo
    deletes."""
    with demo_and_its_broker(tmp_path) as (demo, broker, _):
        demo.kill()
        demo.wait(timeout=10)
        assert gone_within(broker, 20), "the broker outlived the demo killed with SIGKILL"


def test_the_first_signal_leaves_the_broker_to_be_stopped_after_the_queries(tmp_path: Path) -> None:
    """The first SIGINT stopped the broker at once, while the telemetry query's batch was reading it: the
    batch failed (broker unreachable) and Spark and py4j printed some 150 lines of stack traces before the
    demo ended. The signal now only unwinds the demo, which stops its queries, then the broker."""
    from broker_edge.runtime.launcher import BrokerProcess
    from pipelines.demo import Children

    children = Children()
    broker = children.add(BrokerProcess(tmp_path / "broker").start())
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        children.install()
        with pytest.raises(SystemExit) as unwound:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the handler runs at once: never reached
        assert unwound.value.code == 128 + signal.SIGINT
        assert broker.process is not None and broker.process.poll() is None, "stopped under the queries"
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        children.stop()
    assert broker.process.poll() is not None
