"""Declared payload fields as Arrow columns: each decoded value checked against the field's declared type.

The CBOR and Protobuf readers turn a payload into a mapping of field values; :func:`decode_payloads` checks
each declared field of each payload and builds one Arrow column per field, plus the reason of every payload
that could not be read (null where it could). A payload with one bad field is an error as a whole, as a JSON
payload whose value has the wrong type is: its fields are all null, so no half-read row reaches silver.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

#: The Arrow type of each Spark SQL type name a payload field may declare (``PayloadConfig.fields``).
ARROW_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "boolean": pa.bool_(),
    "tinyint": pa.int8(),
    "byte": pa.int8(),
    "smallint": pa.int16(),
    "short": pa.int16(),
    "int": pa.int32(),
    "integer": pa.int32(),
    "bigint": pa.int64(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
}

_INT_BITS = {"tinyint": 8, "byte": 8, "smallint": 16, "short": 16, "int": 32, "integer": 32}
_INT_BITS |= {"bigint": 64, "long": 64}
#: The largest finite float (32 bits): a number past it does not fit a ``float`` field.
FLOAT_MAX = 3.4028234663852886e38


#: Integers from this on are said by their number of digits: Python turns no integer of more than 4,300
#: digits into text (ValueError), and a detail of thousands of digits says no more.
_SHOWN_LIMIT = 10**40
_NUMBERS = frozenset({*_INT_BITS, "float", "double"})


@dataclass(frozen=True)
class HugeInteger:
    """An integer a payload wrote with more digits than Python reads (4,300): no column holds it."""

    digits: int

    def __str__(self) -> str:
        return f"an integer of {self.digits} digits"


def shown(value: int | HugeInteger) -> str:
    """An integer as an error says it: its digits, or how many there are when they are too many."""
    if isinstance(value, HugeInteger):
        return str(value)
    if abs(value) < _SHOWN_LIMIT:
        return str(value)
    return str(HugeInteger(_digits(abs(value))))


def _digits(number: int) -> int:
    """How many decimal digits ``number`` (>= 1) has, without turning it into text."""
    digits = max(1, int((number.bit_length() - 1) * 0.30102999566398120) + 1)
    while digits > 1 and 10 ** (digits - 1) > number:
        digits -= 1
    while 10**digits <= number:
        digits += 1
    return digits


class PayloadError(ValueError):
    """A payload that cannot be read; the message says where (a field, a byte offset) and why."""


Reader = Callable[[bytes], Mapping[str, Any]]
"""Reads one payload into its field values by name; raises :class:`PayloadError` when it cannot."""


@dataclass(frozen=True)
class Decoded:
    """Payloads decoded into declared fields: one column per field, and each payload's error or null."""

    columns: dict[str, pa.Array]
    errors: pa.Array

    def table(self) -> pa.Table:
        return pa.table({**self.columns, "decode_error": self.errors})


def checked(value: Any, type_name: str) -> Any:
    """``value`` as a value of the declared Spark type; raises ``TypeError`` saying what it was instead.

    No silent conversion: a string is not a number, a boolean is not an integer (Python's ``bool`` is an
    ``int``), an integer must fit its type's width. A number is a valid float or double (JSON has one kind
    of number, CBOR and Protobuf senders pick a width freely).
    """
    if value is None:
        return None
    if type_name == "string":
        if isinstance(value, str):
            return value
    elif type_name == "boolean":
        if isinstance(value, bool):
            return value
    elif isinstance(value, HugeInteger) and type_name in _NUMBERS:
        raise TypeError(f"{value} does not fit a {type_name}")
    elif type_name in _INT_BITS:
        if isinstance(value, int) and not isinstance(value, bool):
            bits = _INT_BITS[type_name]
            if -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
                return value
            raise TypeError(f"{shown(value)} does not fit a {type_name}")
    elif type_name in ("float", "double"):
        if isinstance(value, int | float) and not isinstance(value, bool):
            try:
                result = float(value)
            except OverflowError:  # an integer past any double's range
                raise TypeError(f"{shown(int(value))} does not fit a {type_name}") from None
            if type_name == "float" and math.isfinite(result) and abs(result) > FLOAT_MAX:
                raise TypeError(f"{shown(value) if isinstance(value, int) else value} does not fit a float")
            return result
    elif type_name == "date":
        if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
            return value
        if isinstance(value, str):
            try:
                return dt.date.fromisoformat(value)
            except ValueError:
                raise TypeError(f"{value!r} is not an ISO-8601 date") from None
    elif type_name == "timestamp":
        if isinstance(value, dt.datetime):
            return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
        if isinstance(value, str):
            try:
                parsed = dt.datetime.fromisoformat(value)
            except ValueError:
                raise TypeError(f"{value!r} is not an ISO-8601 timestamp") from None
            return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)
    else:
        raise ValueError(f"unknown field type {type_name!r}")
    raise TypeError(f"expected {type_name}, got {_kind(value)}")


def _kind(value: Any) -> str:
    if isinstance(value, HugeInteger) or (isinstance(value, int) and abs(value) >= _SHOWN_LIMIT):
        return shown(value)
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def decode_payloads(payloads: Iterable[bytes | None], read: Reader, fields: Mapping[str, str]) -> Decoded:
    """Read every payload with ``read`` and check its ``fields`` (name → Spark type name).

    A null payload is an error too (``no payload``). Fields a payload does not carry are null.
    """
    names = list(fields)
    values: dict[str, list[Any]] = {name: [] for name in names}
    errors: list[str | None] = []
    for payload in payloads:
        row, error = _row(payload, read, fields)
        errors.append(error)
        for name in names:
            values[name].append(row.get(name) if row is not None else None)
    columns = {name: pa.array(values[name], ARROW_TYPES[fields[name]]) for name in names}
    return Decoded(columns, pa.array(errors, pa.string()))


def _row(
    payload: bytes | None, read: Reader, fields: Mapping[str, str]
) -> tuple[dict[str, Any] | None, str | None]:
    if payload is None:
        return None, "no payload"
    try:
        raw = read(payload)
    except PayloadError as exc:
        return None, str(exc)
    except RecursionError:  # a few kilobytes of "[[[[...": the readers recurse once per level
        return None, "nested too deeply to read (more levels than Python's recursion limit)"
    row: dict[str, Any] = {}
    for name, type_name in fields.items():
        try:
            row[name] = checked(raw.get(name), type_name)
        except TypeError as exc:
            return None, f"field {name}: {exc}"
    return row, None
