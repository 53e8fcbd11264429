"""The Python a local session's workers run: this interpreter when nothing is set, an error at once when what
is set cannot import the package (``sources.worker_python``), on the suite's real SparkSession."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from sources import register_sources
from sources.worker_python import WorkerPythonError, missing_modules
from tests.e2e.sources.conftest import EdgeBroker

pytestmark = pytest.mark.spark

SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")


@pytest.fixture
def workers_unset(spark: SparkSession, monkeypatch: pytest.MonkeyPatch) -> Iterator[SparkSession]:
    """The session as a user's own looks: no ``PYSPARK_PYTHON``, workers on the PATH's ``python3``."""
    context = spark.sparkContext
    kept = context.pythonExec
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    context.pythonExec = "python3"
    try:
        yield spark
    finally:
        context.pythonExec = kept
        register_sources(spark)  # registered again with the suite's Python, for the tests after this one


def test_a_python_that_lacks_the_package_is_told_apart() -> None:
    assert missing_modules(sys.executable) == []
    assert missing_modules("/nonexistent/python3") is None
    if SYSTEM_PYTHON is not None:  # Debian's python3, outside the virtual environment
        assert "sources" in (missing_modules(SYSTEM_PYTHON) or [])


def test_unset_workers_run_this_interpreter_and_read_a_broker(
    workers_unset: SparkSession, edge: EdgeBroker, tmp_path: Path
) -> None:
    """What docs/spark-source.md's snippet does in a fresh session: it reads, instead of failing a minute
    later in the workers with ModuleNotFoundError."""
    edge.fill("plant/a/temp", 5)
    register_sources(workers_unset)
    assert workers_unset.sparkContext.pythonExec == sys.executable
    query = (
        workers_unset.readStream.format("timestone")
        .option("brokers", f"edge={edge.url}")
        .option("topics", "plant/+/temp")
        .option("startingOffsets", "earliest")
        .load()
        .select("offset")
        .writeStream.format("memory")
        .queryName("worker_python_offsets")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    rows = workers_unset.table("worker_python_offsets").collect()
    assert sorted(row.offset for row in rows) == [0, 1, 2, 3, 4]


@pytest.mark.skipif(SYSTEM_PYTHON is None, reason="no python3 outside the virtual environment")
def test_a_python_set_that_cannot_import_the_package_fails_at_once(
    workers_unset: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert SYSTEM_PYTHON is not None
    monkeypatch.setenv("PYSPARK_PYTHON", SYSTEM_PYTHON)
    workers_unset.sparkContext.pythonExec = SYSTEM_PYTHON
    with pytest.raises(WorkerPythonError) as refused:
        register_sources(workers_unset)
    message = str(refused.value)
    assert f"run {SYSTEM_PYTHON!r} (PYSPARK_PYTHON), which cannot import sources" in message
    assert (
        f"set PYSPARK_PYTHON to a Python with Timestone's pipelines installed (this one is {sys.executable})"
        in (message)
    )
