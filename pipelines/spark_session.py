"""A local SparkSession configured for this machine: loopback only, no UI, few shuffle partitions."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession


def local_spark_session(app_name: str = "timestone", master: str = "local[*]") -> SparkSession:
    """Return (or create) a local SparkSession whose Python workers run this interpreter.

    Workers must run ``sys.executable``: the PATH's ``python3`` lacks the project's packages and the
    workers then fail to connect back after a long timeout.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
