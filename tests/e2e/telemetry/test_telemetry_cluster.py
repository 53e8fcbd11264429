"""The telemetry job on a Spark standalone cluster on loopback (a master and two 1-core workers), its tables
in S3 (moto's server) and on a local disk: every reading once, across its driver and one of its executors
killed (SIGKILL) in the middle of a batch, and resent readings dropped across the restart.

With the tables in S3 the executors write each data file through the object store's client and the driver
commits them, the path a cluster without a shared disk takes; on a local disk (a disk every worker and the
driver mount at the same path, as a single host's cluster does) they write the files there. Each driver on
the cluster costs tens of seconds, so each storage runs the one scenario.

The driver is a process of its own (``cluster_driver.py``, the job's ``supervise`` with a pause at a named
step of a named batch, so that a kill lands in the middle of that batch); the executors are the workers'
JVMs with their Python workers; the brokers' logs and offsets API run in this process. One cluster serves
the module.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from queue import Empty, Queue

import pyarrow as pa
import pyarrow.compute as pc
import pytest
import yaml
from deltalake import DeltaTable

from tests.e2e.sources.conftest import EdgeBroker
from tests.e2e.telemetry.telemetry_harness import (
    Fleet,
    LogAppendPublisher,
    at,
    checkpoint_query_id,
    ms,
    reading,
)
from tests.s3_server import S3Endpoint
from tests.spark_cluster import StandaloneCluster, spark_environment, standalone_cluster

pytestmark = pytest.mark.timeout(480)  # two drivers and their JVMs on a loaded 2-core machine

DRIVER = Path(__file__).with_name("cluster_driver.py")
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    with standalone_cluster(tmp_path_factory.mktemp("spark-cluster"), workers=2, cores=1) as running:
        yield running


@pytest.fixture
def edge(tmp_path: Path) -> Iterator[EdgeBroker]:
    broker = EdgeBroker(tmp_path / "edge1")
    yield broker
    broker.close()


class Driver:
    """One run of the job's driver process; its output lines arrive on a queue as it prints them."""

    def __init__(self, config: Path, master: str, pause: tuple[str, int, Path] | None = None) -> None:
        command = [sys.executable, str(DRIVER), str(config), master]
        if pause is not None:
            command += ["--pause", pause[0], str(pause[1]), str(pause[2])]
        self.process = subprocess.Popen(
            command,
            cwd=REPO,
            env=spark_environment(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its JVM and Python workers die with it
        )
        self.lines: Queue[str] = Queue()
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line)
            self.lines.put(line)

    def wait_for(self, text: str, timeout_s: float = 200) -> None:
        """Until the driver prints a line holding ``text``, at most ``timeout_s`` in all (within the
        test's own timeout, so that a failure shows the driver's last lines)."""
        deadline = time.monotonic() + timeout_s
        try:
            while text not in self.lines.get(timeout=max(0.0, deadline - time.monotonic())):
                pass
        except Empty:
            raise AssertionError(
                f"the driver never printed {text!r}:\n{''.join(self.output[-40:])}"
            ) from None

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=60)

    def finish(self, timeout_s: float = 600) -> int:
        try:
            return self.process.wait(timeout=timeout_s)
        finally:
            if self.process.poll() is None:
                self.kill()


def write_config(tmp_path: Path, edge: EdgeBroker, root: str, storage_options: dict[str, str]) -> Path:
    section = {
        "source": {
            "brokers": [f"edge1={edge.url}"],
            "max_records_per_trigger": 30,
            "options": {"fetchTimeoutMs": "30000", "fetchRetries": "6"},
        },
        "tables": {"root": root, "storage_options": storage_options, "maintenance": {"enabled": False}},
        "stream": {"checkpoint": str(tmp_path / "checkpoint"), "restart": {"initial_backoff_s": 0.5}},
        "quality": {"gx": {"schedule": "never"}},
    }
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump({"telemetry": section}))
    return path


def resend(publisher: LogAppendPublisher, device: str, seq: int) -> None:
    """``device`` sends reading ``seq`` again, as after a reconnect: the same payload, a later record."""
    publisher.publish(f"devices/{device}/telemetry", reading(device, seq, seconds=seq), ms(at(seq + 30)))
    publisher.flush()


@pytest.fixture
def drivers(cluster: StandaloneCluster) -> Iterator[Callable[..., Driver]]:
    """Starts drivers on the cluster; whatever the test's end (a failure, its timeout), none outlives it."""
    started: list[Driver] = []

    def start(config: Path, pause: tuple[str, int, Path] | None = None) -> Driver:
        started.append(Driver(config, cluster.master_url, pause))
        return started[-1]

    yield start
    for driver in started:
        driver.kill()


@pytest.fixture(params=["s3", "local-disk"])
def tables(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, str]]:
    """Where the job's tables are: the root and its storage options."""
    if request.param == "s3":
        s3: S3Endpoint = request.getfixturevalue("s3")
        return f"s3://{s3.new_bucket()}/tables", s3.storage_options()
    return str(tmp_path / "tables"), {}


def test_every_reading_once_across_a_driver_and_an_executor_killed_mid_batch(
    cluster: StandaloneCluster,
    drivers: Callable[..., Driver],
    edge: EdgeBroker,
    tables: tuple[str, dict[str, str]],
    tmp_path: Path,
) -> None:
    root, options = tables
    config = write_config(tmp_path, edge, root, options)
    publisher = LogAppendPublisher("edge1", edge)
    fleet = Fleet([publisher], devices=4)
    messages = fleet.send(rounds=12)  # 48 readings, seq 1-12 of each device
    resend(publisher, "dev-000", 3)

    # the first driver dies once batch 1 is in bronze (the other tables' writes run beside it), before the
    # batch ends: Spark has not committed it
    first = drivers(config, pause=("bronze_telemetry", 1, tmp_path / "never"))
    first.wait_for("paused bronze_telemetry 1")
    first.kill()
    query = checkpoint_query_id(tmp_path / "checkpoint")
    assert transaction(root, options, "bronze_telemetry", query) == 1
    assert (tmp_path / "checkpoint" / "commits" / "0").exists()
    assert not (tmp_path / "checkpoint" / "commits" / "1").exists()

    messages += fleet.send(rounds=3)  # seq 13-15
    for device, seq in (("dev-001", 2), ("dev-002", 12), ("dev-003", 14)):
        resend(publisher, device, seq)  # copies of readings the first driver let through, and of new ones
    executors = set(cluster.executors())  # the first driver's, if they have not exited yet

    # the second replays batch 1; an executor holding its cached rows dies between its jobs
    release = tmp_path / "release"
    second = drivers(config, pause=("profile", 1, release))
    second.wait_for("paused profile 1")
    running = [pid for pid in cluster.executors() if pid not in executors]
    assert len(running) == 2, "one executor per worker for the second driver"
    os.kill(running[0], signal.SIGKILL)
    release.touch()
    assert second.finish() == 0, "".join(second.output[-60:])
    assert "Lost executor" in "".join(second.output) or "ExecutorLostFailure" in "".join(second.output)

    bronze = read(root, options, "bronze_telemetry")
    keys = list(zip(bronze["topic"].to_pylist(), bronze["offset"].to_pylist(), strict=True))
    assert len(keys) == len(set(keys)) == messages + 4, "every record once"
    silver = read(root, options, "silver_telemetry")
    ids = list(zip(silver["device_id"].to_pylist(), silver["seq"].to_pylist(), strict=True))
    assert len(ids) == len(set(ids)) == messages, "every reading once, none of the copies"
    assert pc.sum(read(root, options, "device_minute")["count"]).as_py() == messages
    assert read(root, options, "devices").num_rows == 4
    dq = read(root, options, "dq_results").filter(
        pc.field("expectation") == "payload_is_json_of_declared_types"
    )
    assert len(set(dq["batch_id"].to_pylist())) == dq.num_rows, "one row per batch"
    assert pc.sum(dq["element_count"]).as_py() == messages + 4


def transaction(root: str, options: dict[str, str], name: str, app_id: str) -> int | None:
    return DeltaTable(f"{root}/{name}", storage_options=options or None).transaction_version(app_id)


def read(root: str, options: dict[str, str], name: str) -> pa.Table:
    return pa.table(DeltaTable(f"{root}/{name}", storage_options=options or None).to_pyarrow_table())
