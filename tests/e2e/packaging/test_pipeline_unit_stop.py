"""``systemctl stop`` and ``systemctl reload`` of ``timestone-pipeline@actions`` as systemd delivers them.

Stop: SIGTERM to the processes its ``KillMode`` names (the default, ``control-group``, signals every process
of the unit: the driver and the Spark JVM it started; ``mixed`` the driver alone, the rest SIGKILLed once it
has exited). The job must stop cleanly, between batches, well within ``TimeoutStopSec``. Reload: the unit's
``ExecReload`` with ``$MAINPID`` the driver's; the job goes on."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from broker_edge.runtime.launcher import BrokerProcess

UNIT = Path(__file__).resolve().parents[3] / "conf" / "systemd" / "timestone-pipeline@.service"
STARTED = "actions job started"
RELOADED = "timestone pipeline actions: SIGHUP: nothing to reload"


def setting(key: str, default: str) -> str:
    """The unit's value of ``key`` (systemd's default when it sets none)."""
    found = re.search(rf"^{key}=(.+?)\s*$", UNIT.read_text(), re.MULTILINE)
    return found.group(1) if found else default


@contextlib.contextmanager
def actions_job(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """The actions job run as the unit runs it, on a broker of its own, once it has started; its log."""
    with BrokerProcess(tmp_path / "broker") as broker:
        config = tmp_path / "actions.yaml"
        config.write_text(
            f"tables_root: {tmp_path}/tables\ncheckpoint_root: {tmp_path}/checkpoints\ncluster: false\n"
            "brokers:\n"
            f"  - {{name: e1, mqtt_host: 127.0.0.1, mqtt_port: {broker.port}, "
            f'offsets_api: "{broker.offsets_url}"}}\n'
        )
        log = tmp_path / "job.log"
        command = [str(Path(sys.executable).parent / "timestone"), "pipeline", "actions", "-c", str(config)]
        with log.open("w") as output:
            job = subprocess.Popen(
                [*command, "--spark-master", "local[1]"],
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            wait_for(job, log, STARTED)
            yield job, log
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()
            else:
                with contextlib.suppress(ProcessLookupError):  # systemd: the rest, once the main has exited
                    os.killpg(job.pid, signal.SIGKILL)


def wait_for(job: subprocess.Popen[bytes], log: Path, line: str) -> None:
    """Until the job's log holds ``line``, or the job has ended, or 120 s."""
    deadline = time.monotonic() + 120
    while line not in log.read_text() and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.3)
    assert line in log.read_text(), log.read_text()[-3000:]


def stop_as_systemd_does(job: subprocess.Popen[bytes], log: Path) -> None:
    """SIGTERM as the unit's ``KillMode`` sends it; the job must end with status 0 within 45 s."""
    timeout_stop_s = int(setting("TimeoutStopSec", "90"))
    mode = setting("KillMode", "control-group")
    assert mode in ("control-group", "mixed", "process")
    if mode == "control-group":
        os.killpg(job.pid, signal.SIGTERM)
    else:
        os.kill(job.pid, signal.SIGTERM)
    stopped = time.monotonic()
    status = job.wait(timeout=min(45, timeout_stop_s))
    assert status == 0 and time.monotonic() - stopped < 45, log.read_text()[-3000:]
    assert job_tracebacks(log.read_text()) == []


def job_tracebacks(text: str) -> list[str]:
    """The tracebacks in a job's log, but for those Spark's Python source runner may print when the JVM
    closes its socket at the stop (``python_streaming_source_runner``, reading from or writing to a socket
    gone: an ``EOFError``, then the ``BrokenPipeError`` of its goodbye, chained)."""
    blocks = text.split("Traceback (most recent call last):")[1:]
    runner = "python_streaming_source_runner.py"
    return [block[:1000] for block in blocks if not any(runner in frame for frame in frames(block))]


def frames(block: str) -> list[str]:
    """The frame lines of a traceback's text (up to its exception's line)."""
    lines = block.split("\n")[1:]
    return list(itertools.takewhile(lambda line: line.startswith("  "), lines))


def test_stopping_the_pipeline_unit_stops_the_job_cleanly_between_batches(tmp_path: Path) -> None:
    """With ``control-group`` the JVM died of the SIGTERM while the driver asked it to stop its queries: the
    driver logged py4j tracebacks and never exited, so every stop waited the 180 s of ``TimeoutStopSec`` and
    ended in SIGKILL."""
    with actions_job(tmp_path) as (job, log):
        stop_as_systemd_does(job, log)


def test_reloading_the_pipeline_unit_leaves_the_job_running(tmp_path: Path) -> None:
    """``systemctl reload`` sends the driver SIGHUP (the unit's ``ExecReload``), which the job did not
    handle: Python's default ended it at once, mid-batch, and as SIGHUP is a clean end to systemd,
    ``Restart=on-failure`` did not start it again: the job stayed stopped. It says there is nothing to
    reload and goes on, and stops cleanly afterwards."""
    reload = setting("ExecReload", "")
    with actions_job(tmp_path) as (job, log):
        subprocess.run(reload.replace("$MAINPID", str(job.pid)).split(), check=True, timeout=10)
        wait_for(job, log, RELOADED)
        assert job.poll() is None, log.read_text()[-3000:]
        stop_as_systemd_does(job, log)


def test_reloading_the_pipeline_unit_before_spark_has_started_leaves_the_job_going(tmp_path: Path) -> None:
    """``systemctl reload`` right after ``systemctl start``: the job took SIGHUP only once Spark had started,
    and one sent in the seconds before (reading its files, asking the brokers) ended it at once. Here the
    job is held asking its one broker whether it is a cluster member (an offsets API that takes the
    connection and never answers) when the SIGHUP comes: it says there is nothing to reload, and once the
    broker has gone away it ends as it would have without the SIGHUP, naming the broker (exit status 4)."""
    with socket.create_server(("127.0.0.1", 0)) as silent_api:
        port = silent_api.getsockname()[1]
        config = tmp_path / "actions.yaml"
        config.write_text(
            f"tables_root: {tmp_path}/tables\ncheckpoint_root: {tmp_path}/checkpoints\nbrokers:\n"
            f'  - {{name: e1, mqtt_port: {port}, offsets_api: "http://127.0.0.1:{port}"}}\n'
        )
        command = [str(Path(sys.executable).parent / "timestone"), "pipeline", "actions", "-c", str(config)]
        job = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            silent_api.settimeout(120)
            asking, _ = silent_api.accept()  # the job is past its start, asking the broker before Spark
            with asking:
                reload = setting("ExecReload", "")
                subprocess.run(reload.replace("$MAINPID", str(job.pid)).split(), check=True, timeout=10)
            _, err = job.communicate(timeout=60)
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()
    assert job.returncode == 4, err
    assert err.splitlines() == [
        f"{RELOADED} (the job reads its files at start: restart it to apply a changed one)",
        "timestone pipeline actions: no broker answered to tell whether they form a cluster: e1 (their "
        "offsets APIs; set cluster: true or false to start without asking)",
    ], err


RUNNER_AT_STOP = """Traceback (most recent call last):
  File "/x/pyspark.zip/pyspark/sql/streaming/python_streaming_source_runner.py", line 265, in main
  File "/x/pyspark.zip/pyspark/serializers.py", line 604, in read_int
EOFError

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/x/pyspark.zip/pyspark/worker_util.py", line 253, in get_sock_file_to_executor
  File "/x/pyspark.zip/pyspark/sql/streaming/python_streaming_source_runner.py", line 314, in <module>
  File "/usr/lib/python3.11/socket.py", line 724, in write
    return self._sock.send(b)
BrokenPipeError: [Errno 32] Broken pipe
"""
"""What Spark's Python source runner printed in a run when the JVM closed its socket at the stop."""


def test_the_stop_check_leaves_out_the_source_runners_chain_and_no_traceback_of_the_job() -> None:
    """The runner's chained tracebacks (its last starts in ``worker_util``) are Spark's; one of the job's
    own is kept, even when a later line names the runner."""
    own = (
        "Traceback (most recent call last):\n"
        '  File "/opt/timestone/pipelines/actions/job.py", line 150, in run\n'
        "ValueError: broken\n"
        "a later line naming python_streaming_source_runner.py\n"
    )
    assert job_tracebacks(RUNNER_AT_STOP) == []
    assert len(job_tracebacks(RUNNER_AT_STOP + own)) == 1
