"""A ``timestone`` query run once over what the brokers hold (``availableNow``), the same on every Spark.

Spark 4.2+ runs ``Trigger.AvailableNow`` for the source in batches bounded by ``maxRecordsPerTrigger``. Spark
4.0 and 4.1 run it as a single batch (their fallback for Python sources, sources/stream_api.py), which with a
read limit would end the run early, and without one reads a backlog in one batch. There a pipeline's
``--available-now`` runs a processing-time query instead, over the source's ``endAtQueryStart`` (the brokers'
ends when the query starts, as ``availableNow`` takes them), and stops it once it has read everything: the
same batches, and a query that ends when it is done.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from sources.stream_api import admission_control

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

__all__ = ["source_options", "start"]

log = logging.getLogger(__name__)


def source_options(spark: SparkSession) -> dict[str, str]:
    """Options of the ``timestone`` source for an ``availableNow`` run on ``spark``."""
    return {} if admission_control(spark.version) else {"endAtQueryStart": "true"}


def start(writer: DataStreamWriter, spark: SparkSession) -> StreamingQuery:
    """Start ``writer`` (over a source given :func:`source_options`) to read what there is, then end."""
    if admission_control(spark.version):
        return writer.trigger(availableNow=True).start()
    query = writer.trigger(processingTime="0 seconds").start()
    threading.Thread(target=_stop_when_done, args=(query,), name="available-now", daemon=True).start()
    return query


def _stop_when_done(query: StreamingQuery) -> None:
    """Stop ``query`` once it has processed everything its source offers (what it held at the start)."""
    try:
        query.processAllAvailable()
    except Exception:  # the query failed: whoever waits for it gets the failure
        return
    log.info("query %s read everything there was when it started: stopping it", query.name or query.id)
    query.stop()
