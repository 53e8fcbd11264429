"""Running a query of the timestone source to its end, as the Spark tests of the source do."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql.streaming import DataStreamWriter


def run_to_end(writer: DataStreamWriter, checkpoint: Path, timeout_s: int = 120) -> None:
    """Start ``writer`` as an availableNow query on ``checkpoint``, wait until it has ended and raise what
    failed it (a ``StreamingQueryException``); the query is stopped however it ends."""
    query = writer.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    try:
        query.awaitTermination(timeout_s)
        assert not query.isActive
        error = query.exception()
        if error is not None:
            raise error
    finally:
        query.stop()
