"""A pipeline's log: the pipeline's own lines, as text or JSON lines, without its libraries' chatter.

py4j logs every call between Python and the JVM at INFO and Great Expectations its every validation step;
at the default level they would outnumber the pipeline's own lines many times over, so they are raised to
WARNING unless ``--log-level DEBUG`` asks for everything. Spark's own (JVM) log goes to log4j, in log4j's
format: by default only its errors, and a failed streaming query is reported once, in one line, by the
pipeline (:func:`failure_summary`) rather than as Spark's stack of JVM and Python frames.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from typing import TYPE_CHECKING, TextIO, cast

from broker_edge.observe.logs import LoggingConfig, configure_logging

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "LIBRARY_LOGGERS",
    "configure_pipeline_logging",
    "failure_summary",
    "quiet_libraries",
    "quiet_spark",
]

LIBRARY_LOGGERS = ("py4j", "great_expectations")
"""Python loggers kept to WARNING and above unless the level is DEBUG."""
SPARK_STREAMING_LOGGER = "org.apache.spark.sql.execution.streaming"
"""Where Spark logs a failed query's whole stack (the pipeline reports the failure itself)."""

_CAUSE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$", re.MULTILINE)


class _StandardError:
    """Whatever ``sys.stderr`` is when a line is written (a test's capture, a redirected stream)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


class _LibraryFilter(logging.Filter):
    """Drops the libraries' records below ``minimum`` (a filter on the handler: Great Expectations sets its
    loggers' levels itself when it is first imported, inside a batch)."""

    def __init__(self, minimum: int) -> None:
        super().__init__()
        self.minimum = minimum

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= self.minimum or not record.name.startswith(LIBRARY_LOGGERS)


def configure_pipeline_logging(level: str = "INFO", log_format: str = "text") -> None:
    """The pipeline's handler on the root logger (broker_edge.observe.logs formats), libraries quietened."""
    config = LoggingConfig(level=level, format="json" if log_format == "json" else "text")
    handler = configure_logging(config, stream=cast(TextIO, _StandardError()))  # it only writes and flushes
    quiet_libraries(handler, logging.DEBUG if level.upper() == "DEBUG" else logging.WARNING)


def quiet_libraries(handler: logging.Handler, minimum: int = logging.WARNING) -> None:
    """``handler`` writes the records of :data:`LIBRARY_LOGGERS` from ``minimum`` up only."""
    handler.addFilter(_LibraryFilter(minimum))


def quiet_spark(spark: SparkSession, level: str = "INFO") -> None:
    """Spark's JVM log at ERROR (WARN with DEBUG), without the failed query's stack; a Databricks cluster's
    session is left as the cluster set it."""
    if os.environ.get("DATABRICKS_RUNTIME_VERSION"):
        return
    debug = level.upper() == "DEBUG"
    spark.sparkContext.setLogLevel("WARN" if debug else "ERROR")
    if not debug:
        jvm = spark.sparkContext._jvm
        assert jvm is not None, "a local session has a JVM"
        log4j = jvm.org.apache.logging.log4j
        log4j.core.config.Configurator.setLevel(SPARK_STREAMING_LOGGER, log4j.Level.OFF)


def failure_summary(error: BaseException) -> str:
    """One line saying why a pipeline failed: the innermost exception named in Spark's message (the
    Python error a source raised inside a query), else the error's first line."""
    text = str(error).split("=== Streaming Query ===")[0]
    causes = _CAUSE.findall(text)
    if causes:
        name, message = causes[-1]
        return f"{name.rsplit('.', 1)[-1]}: {message.strip()}"
    first = text.strip().splitlines()[0] if text.strip() else ""
    return f"{type(error).__name__}: {first}" if first else type(error).__name__
