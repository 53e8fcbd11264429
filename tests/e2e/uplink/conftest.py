"""Fixtures of the uplink tests."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession


@pytest.fixture
def timestone_spark(spark: SparkSession) -> SparkSession:
    """The shared SparkSession with the timestone source registered (registering again is harmless)."""
    from sources import register_sources

    register_sources(spark)
    return spark
