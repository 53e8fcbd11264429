"""One Sparkplug B message read: its payload's timestamp, sequence number and metrics with typed values.

A metric's value is read by its datatype, the birth's when a data message leaves it out (which is allowed:
births declare datatypes, data messages may carry only an alias and a value). Signed integers travel as
their two's complement in unsigned fields (specification, 6.4.16); they are read back as signed, an Int8
or Int16 from its own width's complement (-1 as 255) as well as from one sign-extended to 32 or 64 bits;
an integer past its datatype's width otherwise is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError

from pipelines.timestamps import last_tick

from ..descriptors import parse_error
from ..fields import PayloadError
from ..protobuf import is_repeated
from .schema import DATATYPES, payload_class

_SIGNED_32 = {"Int8", "Int16", "Int32"}
_UNSIGNED_32 = {"UInt8", "UInt16", "UInt32"}
_STRINGS = {"String", "Text", "UUID"}
#: The datatypes whose value travels in ``bytes_value`` (the arrays are packed little-endian there).
_BYTES = {"Bytes", "File", *(name for name in DATATYPES.values() if name.endswith("Array"))}
#: The width of each integer datatype. Integers are read from ``int_value`` or ``long_value`` whichever the
#: datatype's field is: Ignition and Eclipse Tahu send a UInt32 in ``long_value``.
_INTEGER_BITS = {"Int8": 8, "Int16": 16, "Int32": 32, "UInt8": 8, "UInt16": 16, "UInt32": 32}
_INTEGER_BITS |= {"Int64": 64, "UInt64": 64, "DateTime": 64}
_INTEGER_FIELDS = ("int_value", "long_value")
#: The value field each datatype travels in (as this project writes it).
VALUE_FIELDS: dict[str, str] = {
    **dict.fromkeys(_SIGNED_32 | _UNSIGNED_32, "int_value"),
    **dict.fromkeys(("Int64", "UInt64", "DateTime"), "long_value"),
    "Float": "float_value",
    "Double": "double_value",
    "Boolean": "boolean_value",
    **dict.fromkeys(_STRINGS, "string_value"),
    **dict.fromkeys(_BYTES, "bytes_value"),
    "DataSet": "dataset_value",
    "Template": "template_value",
}


@dataclass(frozen=True)
class MetricValue:
    """A value in the columns silver keeps: every number in ``double``, integers also exact in ``long``."""

    long: int | None = None
    double: float | None = None
    boolean: bool | None = None
    string: str | None = None
    raw: bytes | None = None


@dataclass(frozen=True)
class Metric:
    """A metric as sent: ``name`` and ``datatype`` may be missing from a data message (the birth has them)."""

    index: int
    name: str | None
    alias: int | None
    datatype: str | None
    timestamp: int | None
    is_null: bool
    is_historical: bool
    is_transient: bool
    value_field: str | None
    message: Any  # the protobuf Metric, read again once the datatype is known

    def where(self) -> str:
        label = repr(self.name) if self.name is not None else f"alias {self.alias}"
        return f"metric {self.index} ({label})"


@dataclass(frozen=True)
class Payload:
    timestamp: int | None
    seq: int | None
    metrics: list[Metric]


def read_payload(payload: bytes) -> Payload:
    """A Sparkplug B payload's metrics; ``PayloadError`` naming the byte offset when it does not parse."""
    cls = payload_class()
    try:
        message: Any = cls.FromString(payload)
    except DecodeError:
        raise PayloadError(f"sparkplug_b: {parse_error(cls.DESCRIPTOR, payload)}") from None
    metrics = []
    for index, metric in enumerate(message.metrics):
        datatype = None
        if metric.HasField("datatype"):
            datatype = DATATYPES.get(metric.datatype)
            if datatype is None or datatype == "Unknown":
                number = metric.datatype
                raise PayloadError(f"sparkplug_b: metric {index}: datatype {number} is not one of 1..34")
        name = metric.name if metric.HasField("name") else None
        if isinstance(name, bytes):  # protobuf's way of handing over a string that is not UTF-8
            raise PayloadError(f"sparkplug_b: metric {index}: its name is not UTF-8")
        alias = metric.alias if metric.HasField("alias") else None
        if alias is not None and alias > _LAST_LONG:
            raise PayloadError(
                f"sparkplug_b: metric {index} ({metric.name!r}): alias {alias} does not fit a bigint"
            )
        metrics.append(
            Metric(
                index=index,
                name=name,
                alias=alias,
                datatype=datatype,
                timestamp=_time(metric.timestamp, f"metric {index}")
                if metric.HasField("timestamp")
                else None,
                is_null=metric.is_null,
                is_historical=metric.is_historical,
                is_transient=metric.is_transient,
                value_field=metric.WhichOneof("value"),
                message=metric,
            )
        )
    seq = message.seq if message.HasField("seq") else None
    if seq is not None and seq >= 256:
        raise PayloadError(f"sparkplug_b: seq: {seq} is not a sequence number (0 to 255)")
    return Payload(
        timestamp=_time(message.timestamp, "timestamp") if message.HasField("timestamp") else None,
        seq=seq,
        metrics=metrics,
    )


_LAST_MS = last_tick(1_000)
_LAST_LONG = 2**63 - 1
"""The largest alias a ``bigint`` column holds (aliases travel as uint64)."""


def _time(milliseconds: int, where: str) -> int:
    """A Sparkplug time (epoch milliseconds, a uint64); ``PayloadError`` past the year 9999, which no
    timestamp column holds (a clock counting microseconds or nanoseconds): converting it fails the batch."""
    if milliseconds > _LAST_MS:
        raise PayloadError(f"sparkplug_b: {where}: {milliseconds} ms is not a time (after the year 9999)")
    return milliseconds


def metric_value(metric: Metric, datatype: str) -> MetricValue:
    """The metric's value read as ``datatype``; ``PayloadError`` when it travels in another value field.

    A metric that is not ``is_null`` and carries no value field is read as its datatype's default (0,
    false, an empty string), as Eclipse Tahu's decoder reads it: an encoder whose schema has no ``oneof``
    around the values (a proto3 copy) leaves a value equal to its default out."""
    expected = VALUE_FIELDS.get(datatype)
    if expected is None:  # PropertySet, PropertySetList
        raise PayloadError(
            f"sparkplug_b: {metric.where()}: a {datatype} is a property's datatype, no metric's"
        )
    sent = metric.value_field or expected
    if metric.is_null:
        return MetricValue()
    integer = datatype in _INTEGER_BITS and sent in _INTEGER_FIELDS
    if sent != expected and not integer:
        raise PayloadError(f"sparkplug_b: {metric.where()}: a {datatype} in {sent}, not in {expected}")
    value = getattr(metric.message, sent)
    if datatype in _SIGNED_32 or datatype in _UNSIGNED_32:
        _within_width(metric, datatype, value)
    if datatype in _SIGNED:
        number = _signed(datatype, value)
        return MetricValue(long=number, double=float(number))
    if datatype in _UNSIGNED_32 or datatype in ("UInt64", "DateTime"):
        if value > _LAST_LONG:  # no bigint holds it: exact in decimal
            return MetricValue(double=float(value), string=str(value))
        return MetricValue(long=value, double=float(value))
    if datatype in ("Float", "Double"):
        return MetricValue(double=float(value))
    if datatype == "Boolean":
        return MetricValue(boolean=bool(value))
    if datatype in _STRINGS:
        if isinstance(value, bytes):
            raise PayloadError(f"sparkplug_b: {metric.where()}: a {datatype} that is not UTF-8")
        return MetricValue(string=value)
    if datatype in _BYTES:
        problem = _array_problem(datatype, value) if datatype.endswith("Array") else None
        if problem is not None:
            raise PayloadError(f"sparkplug_b: {metric.where()}: {problem}")
        return MetricValue(raw=bytes(value))
    where = _not_utf8(value)  # DataSet, Template
    if where is not None:
        raise PayloadError(f"sparkplug_b: {metric.where()}: a {datatype} that is not UTF-8 at {where}")
    try:
        return MetricValue(string=json.dumps(_structured(value, datatype)))
    except _Unfit as unfit:
        raise PayloadError(f"sparkplug_b: {metric.where()}: {unfit}") from None


class _Unfit(Exception):
    """Why a DataSet's rows do not fit its columns, or a Template's metric or parameter its datatype."""


_SIGNED = {*_SIGNED_32, "Int64"}
#: The width of each value of a packed array (specification, 6.4.17), little-endian.
_ARRAY_WIDTHS = {"Int8Array": 1, "UInt8Array": 1, "Int16Array": 2, "UInt16Array": 2, "Int32Array": 4}
_ARRAY_WIDTHS |= {"UInt32Array": 4, "FloatArray": 4, "Int64Array": 8, "UInt64Array": 8, "DoubleArray": 8}
_ARRAY_WIDTHS |= {"DateTimeArray": 8}


def _array_problem(datatype: str, packed: bytes) -> str | None:
    """Why ``packed`` is no array of ``datatype`` as the specification packs one, or None: a length that is
    no number of its values, a BooleanArray's count (4 bytes, then its bits) its bytes do not match, a
    StringArray (UTF-8 strings, each ended by a 0 byte) without its last 0 byte or not UTF-8."""
    size = f"{'an' if datatype[0] in 'IU' else 'a'} {datatype} of {len(packed)} bytes"
    if datatype == "BooleanArray":
        if len(packed) < 4:
            return f"{size} has no 4-byte count"
        count = int.from_bytes(packed[:4], "little")
        needed = 4 + (count + 7) // 8
        return (
            None
            if len(packed) == needed
            else f"a BooleanArray of {count} values takes {needed} bytes, not {len(packed)}"
        )
    if datatype == "StringArray":
        if packed and not packed.endswith(b"\x00"):
            return "a StringArray whose last string has no terminating 0 byte"
        try:
            packed.decode("utf-8")
        except UnicodeDecodeError:
            return "a StringArray that is not UTF-8"
        return None
    width = _ARRAY_WIDTHS[datatype]
    return None if len(packed) % width == 0 else f"{size} is no number of {width}-byte values"


def _signed(datatype: str, value: int) -> int:
    """A signed integer from its two's complement: an Int8, Int16 or Int32 from its own width's or one
    sign-extended to 32 or 64 bits, an Int64 from 64 bits."""
    bits = _INTEGER_BITS[datatype]
    value &= (1 << bits) - 1
    return value - 2**bits if value >= 2 ** (bits - 1) else value


def _structured(value: Any, datatype: str) -> dict[str, Any]:
    """A DataSet or a Template as protobuf's JSON mapping gives it, with the signed integers within it
    (a DataSet's cells by their column's type, a Template's metrics and parameters by their own) signed."""
    data = json_format.MessageToDict(value)
    if datatype == "DataSet":
        _check_dataset(value)
        types = [DATATYPES.get(number, "") for number in value.types]
        for row, row_data in zip(value.rows, data.get("rows", []), strict=True):
            for cell, cell_data, cell_type in zip(
                row.elements, row_data.get("elements", []), types, strict=False
            ):
                _sign(cell, cell_data, cell_type)
        return data
    for inner, inner_data in zip(value.metrics, data.get("metrics", []), strict=True):
        inner_type = _template_member(inner, inner_data, "datatype", "metric")
        if inner_type in ("DataSet", "Template") and inner.WhichOneof("value") in _NESTED:
            key = _NESTED[inner.WhichOneof("value")]
            inner_data[key] = _structured(getattr(inner, inner.WhichOneof("value")), inner_type)
    for parameter, parameter_data in zip(value.parameters, data.get("parameters", []), strict=True):
        _template_member(parameter, parameter_data, "type", "parameter")
    return data


def _template_member(member: Any, data: dict[str, Any], type_field: str, kind: str) -> str:
    """A Template's metric or parameter checked against the datatype its ``type_field`` gives (``_Unfit``
    naming it when its value cannot be one) and its signed integer signed; returns the datatype ("" when
    none is given: kept as sent)."""
    datatype = DATATYPES.get(getattr(member, type_field), "") if member.HasField(type_field) else ""
    problem = _cell_problem(datatype, member)
    if problem is not None:
        raise _Unfit(f"a Template's {kind} {member.name!r}: {problem}")
    _sign(member, data, datatype)
    return datatype


_NESTED = {"dataset_value": "datasetValue", "template_value": "templateValue"}


def _sign(message: Any, data: dict[str, Any], datatype: str) -> None:
    """``data`` (``message``'s JSON mapping) with its integer value signed when ``datatype`` is signed."""
    field = message.WhichOneof("value")
    if datatype not in _SIGNED or field not in _INTEGER_FIELDS:
        return
    number = _signed(datatype, getattr(message, field))
    key = "intValue" if field == "int_value" else "longValue"
    data[key] = number if field == "int_value" else str(number)  # protobuf's JSON writes 64 bits as text


def _check_dataset(value: Any) -> None:
    """``_Unfit`` when a DataSet's column names, types and ``num_of_columns`` do not agree, a row has
    another number of values, or a value is not of its column's type (Eclipse Tahu's decoder fails on it)."""
    columns = len(value.columns)
    if len(value.types) != columns:
        raise _Unfit(f"a DataSet's {columns} columns have {len(value.types)} types")
    if value.HasField("num_of_columns") and value.num_of_columns != columns:
        raise _Unfit(f"a DataSet's num_of_columns is {value.num_of_columns}, for {columns} columns")
    types = [DATATYPES.get(number, "Unknown") for number in value.types]
    for number, row in enumerate(value.rows):
        if len(row.elements) != columns:
            raise _Unfit(f"a DataSet's row {number} has {len(row.elements)} values for its {columns} columns")
        for name, datatype, cell in zip(value.columns, types, row.elements, strict=True):
            problem = _cell_problem(datatype, cell)
            if problem is not None:
                raise _Unfit(f"a DataSet's row {number}, column {name!r}: {problem}")


def _cell_problem(datatype: str, cell: Any) -> str | None:
    """Why a DataSet's value or a Template's metric or parameter is not one of ``datatype`` (None: it is, it
    is left out, or ``datatype`` is none this project reads)."""
    sent = cell.WhichOneof("value")
    expected = VALUE_FIELDS.get(datatype)
    if sent is None or sent == "extension_value" or expected is None:
        return None
    if datatype in _INTEGER_BITS and sent in _INTEGER_FIELDS:
        value = getattr(cell, sent)
        if _fits(datatype, value):
            return None
        return f"{'an' if datatype.startswith('I') else 'a'} {datatype} of {value} is past its width"
    return None if sent == expected else f"{_article(datatype)} {datatype} in {sent}, not in {expected}"


def _article(datatype: str) -> str:
    return "an" if datatype[0] in "AEIOU" else "a"


def _fits(datatype: str, value: int) -> bool:
    """Whether an integer is one of ``datatype``: within its width, or a signed one sign-extended to 32 or
    64 bits (-1 as an Int8: 255, 2**32 - 1 or 2**64 - 1)."""
    bits = _INTEGER_BITS[datatype]
    if value < 1 << bits:
        return True
    return datatype in _SIGNED_32 and any((1 << w) - (1 << (bits - 1)) <= value < 1 << w for w in (32, 64))


def _within_width(metric: Metric, datatype: str, value: int) -> None:
    """``PayloadError`` for an integer its datatype does not hold (:func:`_fits`)."""
    if _fits(datatype, value):
        return
    sent = f"{'an' if datatype.startswith('I') else 'a'} {datatype} of {value} in {metric.value_field}"
    raise PayloadError(f"sparkplug_b: {metric.where()}: {sent} is past its width")


def _not_utf8(message: Any, path: str = "") -> str | None:
    """The first string field in ``message`` that is not UTF-8 (protobuf hands it over as bytes), or None."""
    for field, value in message.ListFields():
        values = value if is_repeated(field) else [value]
        if field.type == FieldDescriptor.TYPE_STRING and any(isinstance(v, bytes) for v in values):
            return path + field.name
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            for inner in values:
                where = _not_utf8(inner, f"{path}{field.name}.")
                if where is not None:
                    return where
    return None


def bdseq(payload: Payload) -> int | None:
    """The ``bdSeq`` metric of an NBIRTH or NDEATH: what ties an edge node's death to its birth (0 when its
    value is left out, as a proto3 encoder leaves a 0 out)."""
    for metric in payload.metrics:
        if metric.name == "bdSeq" and not metric.is_null and metric.value_field in _BDSEQ_FIELDS:
            return int(getattr(metric.message, metric.value_field or "long_value"))
    return None


_BDSEQ_FIELDS = ("long_value", "int_value", None)
