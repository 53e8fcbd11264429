"""A local SparkSession configured for this machine: loopback only, no UI, few shuffle partitions."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

from pipelines.spark_start import signals_held_while_spark_starts


def local_spark_session(
    app_name: str = "timestone", master: str = "local[*]", conf: Mapping[str, str] | None = None
) -> SparkSession:
    """Return (or create) a SparkSession on this machine (local mode, or a standalone cluster's master on
    loopback) whose Python workers run this interpreter; ``conf`` adds or overrides settings.

    Workers must run ``sys.executable``: the PATH's ``python3`` lacks the project's packages and the
    workers then fail to connect back after a long timeout.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.python.worker.reuse", "true")
        .config("spark.ui.showConsoleProgress", "false")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    with signals_held_while_spark_starts():
        return builder.getOrCreate()


def stop_between_batches(query, timeout_s: float = 30.0) -> None:
    """Stop a streaming query when no micro-batch is running, so none is interrupted half-way.

    ``query.stop()`` interrupts a running batch; its writes are idempotent so nothing is lost, but the
    interruption surfaces as noisy errors. Waiting for the trigger to go idle first avoids that.
    """
    import time

    deadline = time.monotonic() + timeout_s
    while query.isActive and query.status.get("isTriggerActive") and time.monotonic() < deadline:
        time.sleep(0.05)
    query.stop()
