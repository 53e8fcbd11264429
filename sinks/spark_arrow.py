"""Spark and Arrow schemas converted the same way on every supported pyspark (4.0 to 4.3).

pyspark's own converters changed in 4.2: ``to_arrow_schema`` takes the session time zone as ``timezone=``
where 4.0 and 4.1 take ``timestamp_utc=True``, and ``from_arrow_schema`` reads a timestamp without a time
zone as ``TIMESTAMP_NTZ`` by default where 4.0 and 4.1 read it as ``TIMESTAMP``; and only 4.2 has a helper
turning Arrow rows into the pandas frame ``toPandas`` would give. Tables, sources and pipelines convert
through here, so what they read does not depend on the Spark it was read with.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from pyspark.sql.pandas import types as _pyspark_types

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa
    from pyspark.sql.types import StructType

__all__ = ["to_arrow", "to_pandas", "to_spark"]

_to_arrow_schema: Any = _pyspark_types.to_arrow_schema
_TAKES_TIMEZONE = "timezone" in inspect.signature(_to_arrow_schema).parameters


def to_arrow(schema: StructType) -> pa.Schema:
    """``schema`` as Arrow: timestamps in microseconds, UTC (as Spark hands rows to Python, and Delta
    stores them); ``TIMESTAMP_NTZ`` without a time zone."""
    if _TAKES_TIMEZONE:
        return _to_arrow_schema(schema, timezone="UTC")
    return _to_arrow_schema(schema, timestamp_utc=True)


def to_spark(schema: pa.Schema) -> StructType:
    """``schema`` as Spark types: a timestamp with a time zone is ``TIMESTAMP``, one without
    ``TIMESTAMP_NTZ``."""
    return _pyspark_types.from_arrow_schema(schema, prefer_timestamp_ntz=True)


def to_pandas(table: pa.Table, schema: StructType, timezone: str | None) -> pd.DataFrame:
    """Rows of ``schema`` held as Arrow, as the pandas frame ``toPandas()`` of them would be in a session
    whose time zone is ``timezone`` (timestamps local and naive, dates as ``datetime.date``)."""
    from pyspark.sql.pandas import conversion

    convert: Any = getattr(conversion, "_convert_arrow_table_to_pandas", None)
    if convert is not None:  # pyspark 4.2+
        return convert(table, schema, timezone=timezone, date_as_object=True)
    import pandas as pd

    columns = table.rename_columns([f"col_{i}" for i in range(table.num_columns)])
    frame = columns.to_pandas(date_as_object=True, coerce_temporal_nanoseconds=True)
    converter: Any = _pyspark_types._create_converter_to_pandas
    series = [
        converter(field.dataType, field.nullable, timezone=timezone, struct_in_pandas="dict")(frame[column])
        for column, field in zip(frame.columns, schema.fields, strict=True)
    ]
    converted = pd.concat(series, axis="columns") if series else frame
    converted.columns = schema.names
    return converted
