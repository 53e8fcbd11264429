"""Ctrl-C while a command's Spark session starts (``timestone pipeline``, ``timestone demo``): the command
stops, and so does the JVM it was starting. A ``KeyboardInterrupt`` raised while PySpark waited for its JVM's
port deleted the directory the JVM tells it through: the JVM never learnt that its parent had gone and ran
on for ever after the command's exit (holding the command's standard output open), one more at each Ctrl-C.
The signal is now acted on once the session has started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.processes import children_of, command_line, running

pytestmark = pytest.mark.timeout(240)

REPO = Path(__file__).resolve().parents[2]
SPARK_SUBMIT = "org.apache.spark.deploy.SparkSubmit"
STARTING = (
    "from pipelines.spark_session import local_spark_session\n"
    "local_spark_session('stopped-while-starting', 'local[1]')\n"
    "print('started', flush=True)\n"
)


def starting_jvm(parent: int) -> int | None:
    """The process id of the Spark driver JVM ``parent`` is starting (its child), once there is one."""
    jvms = [pid for pid in children_of([parent]) if SPARK_SUBMIT in command_line(pid)]
    return jvms[0] if jvms else None


def test_ctrl_c_while_spark_starts_stops_the_command_and_the_jvm_it_was_starting():
    process = subprocess.Popen(
        [sys.executable, "-c", STARTING],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    jvm = None
    try:
        deadline = time.monotonic() + 60
        while (jvm := starting_jvm(process.pid)) is None and process.poll() is None:
            assert time.monotonic() < deadline, "no Spark JVM started"
            time.sleep(0.01)
        assert jvm is not None
        process.send_signal(signal.SIGINT)  # (as a terminal's Ctrl-C to the command; its JVM ignores SIGINT)
        output, _ = process.communicate(timeout=120)  # to the end of its output: the JVM's end too
        deadline = time.monotonic() + 30
        while running(jvm):
            assert time.monotonic() < deadline, "the JVM runs on after its command"
            time.sleep(0.1)
    finally:
        for pid in (process.pid, jvm):
            if pid is not None and running(pid):
                os.kill(pid, signal.SIGKILL)
    assert "SIGINT: stopping once Spark has started" in output, output[-3000:]
    assert "started\n" not in output.replace("has started", "")
    assert process.returncode != 0
