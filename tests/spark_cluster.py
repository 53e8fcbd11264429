"""A Spark standalone cluster on loopback: a master and workers in JVMs of their own, each worker starting
executors (with their own Python workers) for the applications that connect to it.

Started from pyspark's own package (``bin/spark-class``), as a multi-node cluster is, but on one machine:
what runs on the executors runs in other processes than the driver, and a process can be killed alone.
The benches and the cluster tests share it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from broker_edge.runtime.launcher import free_port, wait_for_port
from tests.processes import children_of, command_line

EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def spark_environment() -> dict[str, str]:
    """What the cluster's JVMs and the drivers connecting to it need in their environment."""
    return {
        **os.environ,
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }


@dataclass
class StandaloneCluster:
    """A running cluster: its master's URL, and its processes (the master first)."""

    master_url: str
    work_dir: Path
    processes: list[subprocess.Popen] = field(default_factory=list)

    def executors(self) -> list[int]:
        """The process ids of the executor JVMs the workers run now (one per worker and application)."""
        workers = {p.pid for p in self.processes[1:]}
        return [pid for pid in children_of(workers) if EXECUTOR_CLASS in command_line(pid)]

    def wait_for_executors(self, count: int, timeout_s: float = 120) -> list[int]:
        deadline = time.monotonic() + timeout_s
        while len(found := self.executors()) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(found)} executors running, {count} wanted")
            time.sleep(0.2)
        return found

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)


@contextmanager
def standalone_cluster(
    work_dir: Path, workers: int = 2, cores: int = 1, memory: str = "1g"
) -> Iterator[StandaloneCluster]:
    """A master and ``workers`` workers of ``cores`` cores each on loopback, stopped when the block ends."""
    work_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = spark_environment()
    spark_class = str(spark_home() / "bin" / "spark-class")
    cluster = StandaloneCluster(f"spark://127.0.0.1:{port}", work_dir)

    def start(name: str, *args: str) -> subprocess.Popen:
        log = open(work_dir / f"{name}.log", "wb")  # noqa: SIM115 - the child writes to it until it stops
        process = subprocess.Popen(
            [spark_class, *args], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        cluster.processes.append(process)
        return process

    try:
        master = start(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            str(free_port()),
        )
        wait_for_port(port, timeout_s=120, alive=master.poll)
        for index in range(workers):
            directory = work_dir / f"worker-{index}"
            start(
                f"worker-{index}",
                "org.apache.spark.deploy.worker.Worker",
                cluster.master_url,
                "--host", "127.0.0.1",
                "--cores", str(cores),
                "--memory", memory,
                "--webui-port", str(free_port()),
                "--work-dir", str(directory),
            )  # fmt: skip
        _wait_for_workers(work_dir / "master.log", workers)
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(work_dir / "spark-events", ignore_errors=True)


def _wait_for_workers(master_log: Path, count: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while master_log.read_text(errors="replace").count("Registering worker") < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"fewer than {count} workers registered with the master")
        time.sleep(0.2)
