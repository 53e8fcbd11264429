"""Delta tables: their declarations (:mod:`sinks.tables`) and the one store interface pipelines write through.

Backends (:mod:`sinks.delta_rs`, :mod:`sinks.delta_native`) are imported by :func:`open_table_store` only
when chosen, so importing this package needs neither delta-rs nor delta-spark.
"""

from sinks.arrow_conform import SchemaMismatch
from sinks.backends import open_table_store
from sinks.foreach_batch import BatchWriter, exactly_once, streaming_query_id
from sinks.store import TableStore, TableStoreError
from sinks.tables import DEFAULT_CATALOG, TableCatalog, TableSpec, UnknownTable, build_catalog, table_spec

__all__ = [
    "DEFAULT_CATALOG",
    "BatchWriter",
    "SchemaMismatch",
    "TableCatalog",
    "TableSpec",
    "TableStore",
    "TableStoreError",
    "UnknownTable",
    "build_catalog",
    "exactly_once",
    "open_table_store",
    "streaming_query_id",
    "table_spec",
]
