"""Fixtures shared by the whole suite: one local SparkSession per test session, free loopback ports."""

from __future__ import annotations

import os
import socket
import sys

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
