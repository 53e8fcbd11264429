"""Writing several tables from one micro-batch, each exactly once.

A ``foreachBatch`` function that writes bronze, quarantine and dq_results can crash between two writes.
Spark then replays the whole batch with the same batch id. Because every table write is keyed by
``(app_id, batch_id)`` in that table's own log, the replay skips the tables already written and writes only
the missing ones. :func:`exactly_once` wires this up::

    def write(batch: DataFrame, out: BatchWriter) -> None:
        out.append("bronze_telemetry", to_bronze(batch))
        out.merge("devices", latest_device_rows(batch))

    stream.writeStream.foreachBatch(exactly_once(store, write)).option("checkpointLocation", cp).start()

The app id defaults to the streaming query id, which Spark keeps in the checkpoint: a restart from the same
checkpoint continues with the same id, and a fresh checkpoint (batch ids from 0 again) gets a new one, so old
markers never make it skip new batches. Pass ``app_id`` only with a name that changes with the checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sinks.store import TableData, TableStore

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

QUERY_ID_PROPERTY = "sql.streaming.queryId"


def streaming_query_id(batch: DataFrame) -> str:
    """The id of the streaming query running this ``foreachBatch`` call (a Spark local property)."""
    try:
        query_id = batch.sparkSession.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
    except Exception as exc:  # Spark Connect sessions have no SparkContext
        raise RuntimeError("cannot read the streaming query id here; pass app_id explicitly") from exc
    if not query_id:
        raise RuntimeError("not inside a streaming foreachBatch call; pass app_id explicitly")
    return query_id


@dataclass
class BatchWriter:
    """The table writes of one micro-batch; each is keyed by ``(app_id[/step], batch_id)``.

    Writing the same table twice in one batch needs distinct ``step`` names: with one key the second write
    would look like a replay of the first and be skipped.
    """

    store: TableStore
    app_id: str
    batch_id: int
    results: dict[str, bool] = field(default_factory=dict)

    def _key(self, name: str, step: str | None) -> str:
        key = f"{name}/{step}" if step else name
        if key in self.results:
            raise ValueError(f"{key} written twice in batch {self.batch_id}; give each write its own step")
        return key

    def _app_id(self, step: str | None) -> str:
        return f"{self.app_id}/{step}" if step else self.app_id

    def append(self, name: str, data: TableData, *, step: str | None = None) -> bool:
        """Append once; ``False`` if this batch's rows were already in the table."""
        key = self._key(name, step)
        self.results[key] = self.store.append(name, data, self._app_id(step), self.batch_id)
        return self.results[key]

    def merge(self, name: str, data: TableData, *, step: str | None = None, **options: Any) -> bool:
        """Merge once (``options`` as for :meth:`TableStore.merge`); ``False`` if already merged."""
        key = self._key(name, step)
        self.results[key] = self.store.merge(name, data, self._app_id(step), self.batch_id, **options)
        return self.results[key]


def exactly_once(
    store: TableStore,
    write: Callable[[DataFrame, BatchWriter], None],
    *,
    app_id: str | None = None,
    persist: bool = True,
) -> Callable[[DataFrame, int], None]:
    """A ``foreachBatch`` function running ``write`` with a :class:`BatchWriter` for the batch.

    ``persist`` caches the batch while ``write`` runs: several tables derived from one batch would otherwise
    re-read the source once per table. A ``write`` reading the batch once (one table) should pass
    ``persist=False``: building the cache then only costs time (a sizeable share of a bronze-only batch).
    """

    def run(batch: DataFrame, batch_id: int) -> None:
        writer = BatchWriter(store, app_id or streaming_query_id(batch), batch_id)
        if persist:
            batch.persist()
        try:
            write(batch, writer)
        finally:
            if persist:
                batch.unpersist()

    return run
