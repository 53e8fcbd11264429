"""Ctrl-C and SIGTERM stop a pipeline between micro-batches, with one line and no traceback.

PySpark's own SIGINT handler cancels every Spark job and raises ``KeyboardInterrupt`` wherever the main
thread is: usually inside a py4j call (``awaitTermination``), which py4j then logs as several tracebacks.
Here the first signal asks every streaming query of the session to stop once its batch is done (from
another thread, so the main thread's call simply returns when the query ends) and the pipeline returns as
it does when a query ends; a second signal exits at once.

SIGHUP (``systemctl reload``) changes nothing: ``pipelines.reload_signal`` takes it from the job's start.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from types import FrameType
from typing import TYPE_CHECKING

from pipelines.spark_session import stop_between_batches

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["INTERRUPTED", "StopRequest", "stop_on_signals"]

log = logging.getLogger(__name__)

INTERRUPTED = 130
"""Exit status after a second Ctrl-C, which does not wait for the queries."""


class StopRequest:
    """Whether a stop was asked for; :meth:`finished` once the pipeline has returned."""

    def __init__(self) -> None:
        self.asked = threading.Event()
        self._finished = threading.Event()

    def finished(self) -> None:
        self._finished.set()

    def stop_queries(self, spark: SparkSession) -> None:
        """Stop every query of the session, including ones a pipeline still starting starts later."""
        while not self._finished.is_set():
            for query in spark.streams.active:
                try:
                    stop_between_batches(query)
                except Exception as error:  # the query ended or the session went away meanwhile
                    log.debug("stopping query %s: %s", query.name, error)
            self._finished.wait(0.5)


def stop_on_signals(spark: SparkSession, prefix: str) -> StopRequest:
    """Install the handlers (main thread only)."""
    request = StopRequest()

    def handle(signum: int, frame: FrameType | None) -> None:
        if request.asked.is_set():
            print(f"{prefix}: stopped without waiting for the running batch", file=sys.stderr, flush=True)
            os._exit(INTERRUPTED)
        request.asked.set()
        name = signal.Signals(signum).name
        print(f"{prefix}: {name}: stopping after the running batch (again to stop now)", file=sys.stderr)
        threading.Thread(target=request.stop_queries, args=(spark,), name="stop-queries", daemon=True).start()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, handle)
    return request
