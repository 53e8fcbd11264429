"""Payloads read into the declared fields on the executors, as a DataFrame step or as a column.

Spark hands each task's records to a Python worker as Arrow batches; the worker reads each batch's payloads
with the format's reader (:mod:`.fields`). :func:`with_decoded_fields` (one ``mapInArrow``) hands the batch
back with the declared fields and ``decode_error`` (null when the payload was read) added;
:func:`decoded_struct` is the same as one struct column (an Arrow-backed pandas UDF), which takes the place
of ``from_json``'s struct in an expression. No row goes through the driver, and the columns have the Spark
types the fields declare.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import pandas as pd
import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql.functions import pandas_udf
from pyspark.sql.types import StringType, StructField, StructType

from sinks.tables import parse_fields

from .fields import decode_payloads
from .formats import FieldFormat

DECODE_ERROR = "decode_error"
#: The nullable (masked) pandas types of the Arrow types of numbers and booleans: a NumPy column with a null
#: is float64, which rounds an integer past 2**53 and reads NaN as null on its way back to Arrow.
MASKED_DTYPES: dict[pa.DataType, object] = {
    pa.int8(): pd.Int8Dtype(),
    pa.int16(): pd.Int16Dtype(),
    pa.int32(): pd.Int32Dtype(),
    pa.int64(): pd.Int64Dtype(),
    pa.float32(): pd.Float32Dtype(),
    pa.float64(): pd.Float64Dtype(),
    pa.bool_(): pd.BooleanDtype(),
}


def with_decoded_fields(
    records: DataFrame, payload_format: FieldFormat, fields: Mapping[str, str], payload: str = "payload"
) -> DataFrame:
    """``records`` with one column per declared field and ``decode_error``, read from ``payload``."""
    payload_format.reader(fields)  # a field the format cannot fill fails here, not in the first task
    added = [*parse_fields(fields, "payload.fields"), StructField(DECODE_ERROR, StringType(), True)]
    schema = StructType([*records.schema.fields, *added])
    return records.mapInArrow(DecodeBatches(payload_format, dict(fields), payload), schema)


class DecodeBatches:
    """What each Python worker runs: the batches of one task, decoded (pickled to the executors)."""

    def __init__(self, payload_format: FieldFormat, fields: dict[str, str], payload: str) -> None:
        self.payload_format = payload_format
        self.fields = fields
        self.payload = payload

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        reader = self.payload_format.reader(self.fields)
        for batch in batches:
            decoded = decode_payloads(batch.column(self.payload).to_pylist(), reader, self.fields)
            columns = [*batch.columns, *decoded.columns.values(), decoded.errors]
            names = [*batch.schema.names, *decoded.columns, DECODE_ERROR]
            yield pa.RecordBatch.from_arrays(columns, names=names)


def decoded_struct(
    payload: Column, payload_format: FieldFormat, fields: Mapping[str, str], error_field: str = DECODE_ERROR
) -> Column:
    """A struct of the declared fields and ``error_field`` (the reason, null when the payload was read),
    read from the binary column ``payload``: what ``from_json`` with a corrupt-record column gives JSON."""
    payload_format.reader(fields)  # a field the format cannot fill fails here, not in the first task
    schema = StructType(
        [*parse_fields(fields, "payload.fields"), StructField(error_field, StringType(), True)]
    )
    decode_series = DecodeSeries(payload_format, dict(fields), error_field)

    def decode(payloads: pd.Series) -> pd.DataFrame:  # pandas_udf reads the kind of UDF off the hints
        return decode_series(payloads)

    # pyspark's overloads of pandas_udf do not cover a Series -> DataFrame function returning a struct
    return pandas_udf(decode, schema)(payload)  # type: ignore[call-overload]  # see the line above


class DecodeSeries:
    """What each Python worker runs for :func:`decoded_struct`: a batch of payloads to a frame of fields."""

    def __init__(self, payload_format: FieldFormat, fields: dict[str, str], error_field: str) -> None:
        self.payload_format = payload_format
        self.fields = fields
        self.error_field = error_field

    def __call__(self, payloads: pd.Series) -> pd.DataFrame:
        reader = self.payload_format.reader(self.fields)
        values = [None if value is None else bytes(value) for value in payloads]
        decoded = decode_payloads(values, reader, self.fields)
        table = pa.table({**decoded.columns, self.error_field: decoded.errors})
        return table.to_pandas(types_mapper=MASKED_DTYPES.get)  # every value as read
