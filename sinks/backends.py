"""Which table store a session gets: Spark's own Delta where the session has it, else the embedded delta-rs.

The one place that knows both backends (``sinks.delta_native``, ``sinks.delta_rs``), each imported only when
chosen, so that opening a store needs neither delta-spark nor delta-rs unless it is the one picked.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Literal

from sinks.tables import DEFAULT_CATALOG, TableCatalog

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from sinks.store import TableStore

__all__ = [
    "DELTA_EXTENSION",
    "Backend",
    "choose_backend",
    "data_source_resolves",
    "delta_format_resolves",
    "native_backend_missing",
    "open_table_store",
    "session_has_delta",
]

Backend = Literal["auto", "delta-rs", "native"]

DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"


def choose_backend(backend: Backend, spark_extensions: str, delta_format_available: bool) -> str:
    """Pick the backend name: native where Spark has Delta, else the embedded delta-rs."""
    if backend in ("delta-rs", "native"):
        return backend
    if backend != "auto":
        raise ValueError(f"backend must be 'auto', 'delta-rs' or 'native', got {backend!r}")
    if DELTA_EXTENSION in spark_extensions or delta_format_available:
        return "native"
    return "delta-rs"


def session_has_delta(spark: SparkSession) -> tuple[str, bool]:
    """What :func:`choose_backend` looks at: the session extensions, and whether ``delta`` resolves.

    Databricks runtimes have Delta built in without listing the extension, hence the second check: asking
    Spark to resolve the ``delta`` data source class. It is only attempted when the runtime says it is
    Databricks or the delta-spark Python package is importable, so plain local sessions start no JVM work.
    """
    extensions = spark.conf.get("spark.sql.extensions", "") or ""
    if DELTA_EXTENSION in extensions:
        return extensions, True
    on_databricks = bool(os.environ.get("DATABRICKS_RUNTIME_VERSION"))
    if not (on_databricks or _delta_spark_importable()):
        return extensions, False
    # Spark Connect has no JVM handle to ask; Databricks always has Delta, so trust its runtime marker.
    return extensions, delta_format_resolves(spark) or on_databricks


def delta_format_resolves(spark: SparkSession) -> bool:
    """Whether Spark can resolve the ``delta`` data source (its jars are on the classpath)."""
    return data_source_resolves(spark, "delta")


def data_source_resolves(spark: SparkSession, name: str) -> bool:
    """Whether ``format(name)`` would find a data source class, asked of the JVM without reading anything."""
    try:
        jvm: Any = spark.sparkContext._jvm  # py4j's gateway: typed as optional, present on a live session
        conf = spark._jsparkSession.sessionState().conf()
        jvm.org.apache.spark.sql.execution.datasources.DataSource.lookupDataSource(name, conf)
    except Exception:
        return False
    return True


def native_backend_missing() -> str | None:
    """Why this process cannot open the native backend (a store opened with it would fail at its first
    table, Spark started), or None: it needs a Databricks runtime or the delta-spark package."""
    if os.environ.get("DATABRICKS_RUNTIME_VERSION") or _delta_spark_importable():
        return None
    return (
        "native needs Spark's own Delta (a Databricks runtime, or the delta-spark package, which is not "
        "installed here); auto or delta-rs write the tables with delta-rs"
    )


def _delta_spark_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("delta") is not None


def open_table_store(
    spark: SparkSession | None,
    root: str,
    backend: Backend = "auto",
    catalog: TableCatalog = DEFAULT_CATALOG,
    *,
    namespace: str | None = None,
    storage_options: dict[str, str] | None = None,
) -> TableStore:
    """The table store for this session: tables live at ``<root>/<table name>``.

    ``namespace`` (``catalog.schema``) makes the native backend address tables by name in the metastore
    instead of by path; ``storage_options`` are delta-rs object-store options (credentials, endpoints), which
    the Spark tasks writing a table's files read too.
    """
    if backend == "auto":
        if spark is None:
            chosen = "delta-rs"
        else:
            extensions, available = session_has_delta(spark)
            chosen = choose_backend(backend, extensions, available)
    else:
        chosen = choose_backend(backend, "", False)
    if chosen == "native":
        if spark is None:
            raise ValueError("the native Delta backend needs a SparkSession")
        from sinks.delta_native import DeltaNativeTableStore

        return DeltaNativeTableStore(spark, root, catalog, namespace=namespace)
    from sinks.delta_rs import DeltaRsTableStore

    return DeltaRsTableStore(spark, root, catalog, storage_options=storage_options)
