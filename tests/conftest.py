"""Fixtures shared by the whole suite: one local SparkSession per test session, free loopback ports."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for processes that cannot take port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def spark():
    """The one local SparkSession of the test session (starting one costs seconds)."""
    from pipelines.spark_session import local_spark_session

    session = local_spark_session(app_name="timestone-tests", master="local[2]")
    yield session
    session.stop()


def wait_for_port(port: int, host: str = "127.0.0.1", timeout_s: float = 15.0) -> None:
    """Block until something accepts TCP connections on ``host:port``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex((host, port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {host}:{port}")


@pytest.fixture
def mosquitto(tmp_path):
    """(host, port) of a Mosquitto started for this test: an independent MQTT broker to check against."""
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    port = free_port()
    config = tmp_path / "mosquitto.conf"
    config.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
    process = subprocess.Popen(
        [binary, "-c", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for_port(port)
        yield "127.0.0.1", port
    finally:
        process.terminate()
        process.wait(timeout=10)
