"""Payloads read into the declared fields on the executors: one ``mapInArrow`` over the records.

Spark hands each task's records to a Python worker as Arrow batches; the worker reads each batch's payloads
with the format's reader (:mod:`.fields`) and hands the batch back with the declared fields and
``decode_error`` (null when the payload was read) added. No row goes through the driver, and the columns
have the Spark types the fields declare.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.types import StringType, StructField, StructType

from sinks.tables import parse_fields

from .fields import decode_payloads
from .formats import FieldFormat

DECODE_ERROR = "decode_error"


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
