"""Spark streaming sources of Timestone; ``register_sources(spark)`` makes them usable by format name."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["register_sources"]


def register_sources(spark: SparkSession) -> None:
    """Register ``timestone`` (MQTT records from the brokers' commitlogs) and ``delta_cdf`` with ``spark``.

    Imports happen here so that importing ``sources.options`` or the planner does not pull in pyspark.
    ``timestone`` takes the session's ``defaultParallelism`` as its default ``minPartitions``. A local
    session's workers are given a Python that imports this package first (``worker_python``): one that
    cannot is an error now, not in the middle of the first batch. On a Spark older than 4.2 it logs what
    the sources do differently there (``sources.stream_api``).
    """
    from .delta_cdf import DeltaCdfDataSource
    from .stream_api import note_spark_version
    from .timestone_source import TimestoneDataSource
    from .worker_python import choose_worker_python

    choose_worker_python(spark)
    note_spark_version(spark.version)
    spark.dataSource.register(TimestoneDataSource.for_session(spark))
    spark.dataSource.register(DeltaCdfDataSource)
