"""Protobuf payloads: one message per payload, its fields read by name into the declared columns.

The message comes from a descriptor set the user compiles from their ``.proto`` (``protoc
--include_imports --descriptor_set_out=telemetry.desc telemetry.proto``) and names in the configuration:
no generated code is installed on the cluster. A declared field must be a singular field of the message of
a kind its declared type can hold (checked when the reader is made, so a mismatch is a configuration error
and not a quarantine of every payload).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from importlib import resources
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.unknown_fields import UnknownFieldSet

from . import examples
from .descriptors import last_varints, parse_error
from .fields import PayloadError

_INTEGER = {
    FieldDescriptor.TYPE_INT32,
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT32,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT32,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED32,
    FieldDescriptor.TYPE_FIXED64,
    FieldDescriptor.TYPE_SFIXED32,
    FieldDescriptor.TYPE_SFIXED64,
}
_FLOATING = {FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE}
_NUMBERS = {"tinyint", "byte", "smallint", "short", "int", "integer", "bigint", "long", "float", "double"}
_TIMESTAMP = "google.protobuf.Timestamp"
#: The 32-bit types read from a varint (which protobuf cuts to their width: an int64 read as an int32).
_VARINT_32 = {
    FieldDescriptor.TYPE_INT32: "int32",
    FieldDescriptor.TYPE_ENUM: "enum",
    FieldDescriptor.TYPE_UINT32: "uint32",
    FieldDescriptor.TYPE_SINT32: "sint32",
}
_WIRE_TYPES = {
    0: "a varint",
    1: "8 bytes",
    2: "length-delimited bytes",
    3: "a group",
    4: "a group",
    5: "4 bytes",
}
_TYPE_NAMES = {
    number: name[len("TYPE_") :].lower()
    for name, number in vars(FieldDescriptor).items()
    if name.startswith("TYPE_") and isinstance(number, int)
}


def field_problem(descriptor: Any, name: str, type_name: str) -> str | None:
    """Why the message's field ``name`` cannot fill a column of ``type_name``, or None when it can."""
    field = descriptor.fields_by_name.get(name)
    if field is None:
        return f"{descriptor.full_name} has no field {name!r}; it has {', '.join(descriptor.fields_by_name)}"
    if is_repeated(field):
        return f"{descriptor.full_name}.{name} is repeated; a column holds one value"
    kind = field.type
    if kind == FieldDescriptor.TYPE_MESSAGE:
        if field.message_type.full_name == _TIMESTAMP and type_name == "timestamp":
            return None
        return f"{descriptor.full_name}.{name} is a {field.message_type.full_name} message"
    fits = (
        (kind in _INTEGER and type_name in _NUMBERS)
        or (kind in _FLOATING and type_name in ("float", "double"))
        or (kind == FieldDescriptor.TYPE_BOOL and type_name == "boolean")
        or (kind == FieldDescriptor.TYPE_STRING and type_name in ("string", "date", "timestamp"))
        or (kind == FieldDescriptor.TYPE_ENUM and type_name in ("string", *_NUMBERS))
    )
    if fits:
        return None
    return f"{descriptor.full_name}.{name} cannot be read as {type_name}"


def is_repeated(field: Any) -> bool:
    repeated = getattr(field, "is_repeated", None)  # protobuf >= 6 deprecates label
    if repeated is not None:
        return bool(repeated)
    return bool(getattr(field, "label", None) == FieldDescriptor.LABEL_REPEATED)


class ProtobufReader:
    """Reads payloads of one message type into the values of the declared fields (a ``fields.Reader``).

    A field without presence (a proto3 scalar not marked ``optional``) reads as its default when absent, as
    protobuf defines it, except those of ``unset_is_absent`` (the event time's: 0 would be a reading of
    1970), which read as null at their default; a field with presence that is absent reads as null. An
    empty payload, which sets no field, is refused. Enums read as their value's
    name into a string column, as their number into a numeric one; a value the schema does not name (a
    newer schema's) as its number, of a closed (proto2) enum too. A declared field sent in another wire
    type than its schema's (another schema's field of that number) is refused: protobuf keeps it as an
    unknown field and the field would read as its default, a reading that was never sent.
    """

    def __init__(
        self, message: type[Message], fields: Mapping[str, str], unset_is_absent: Iterable[str] = ()
    ) -> None:
        descriptor = message.DESCRIPTOR
        for name, type_name in fields.items():
            problem = field_problem(descriptor, name, type_name)
            if problem is not None:
                raise ValueError(problem)
        self.message = message
        self.fields: dict[str, tuple[Any, str]] = {
            name: (descriptor.fields_by_name[name], t) for name, t in fields.items()
        }
        self.unset_is_absent = {
            name for name in unset_is_absent if name in self.fields and not self.fields[name][0].has_presence
        }
        """The declared fields without presence whose default reads as null."""
        self.narrow = {f.number: f for f, _ in self.fields.values() if f.type in _VARINT_32}
        """The declared 32-bit varint fields, whose values as sent are checked against their width."""

    def __call__(self, payload: bytes) -> dict[str, Any]:
        if not payload:
            raise PayloadError(
                f"protobuf: an empty payload sets no field of {self.message.DESCRIPTOR.full_name}"
            )
        try:
            message: Any = self.message.FromString(payload)
        except DecodeError:
            raise PayloadError(f"protobuf: {parse_error(self.message.DESCRIPTOR, payload)}") from None
        if not message.IsInitialized():  # proto2: Python's parser, unlike C++'s and Java's, takes it
            missing = ", ".join(message.FindInitializationErrors())
            raise PayloadError(f"protobuf: {message.DESCRIPTOR.full_name} lacks its required field {missing}")
        unnamed = _refuse_misread(message, self.fields.values())
        if self.narrow:
            _refuse_truncated(payload, self.narrow)
        values = {name: _value(message, field, t) for name, (field, t) in self.fields.items()}
        for name in self.unset_is_absent:
            if values[name] == self.fields[name][0].default_value:
                values[name] = None
        for name, (field, t) in self.fields.items():
            if field.number in unnamed:  # a closed enum's value its schema does not name: its number
                number = unnamed[field.number]
                values[name] = str(number) if t == "string" else number
        return values


def _refuse_misread(message: Any, fields: Iterable[tuple[Any, str]], within: str = "") -> dict[int, int]:
    """``PayloadError`` when one of ``fields`` (or a Timestamp's seconds or nanos) came in another wire
    type than its schema's: protobuf kept it among the unknown fields, and its value would be lost.

    Returns the values of the closed (proto2) enums among ``fields`` that their schema does not name (a
    newer schema's), which protobuf keeps among the unknown fields too, by field number."""
    unknown = UnknownFieldSet(message)
    unnamed: dict[int, int] = {}
    if not len(unknown):
        return unnamed
    by_number = {field.number: field for field, _ in fields}
    for sent in (unknown[index] for index in range(len(unknown))):
        field = by_number.get(sent.field_number)
        if field is not None and sent.wire_type == 0 and _closed_enum(field):
            value = int(sent.data)
            unnamed[field.number] = value - 2**64 if value >= 2**63 else value
        elif field is not None:
            wire = _WIRE_TYPES.get(sent.wire_type, f"wire type {sent.wire_type}")
            raise PayloadError(
                f"protobuf: field {within}{field.name} ({field.number}) was sent as {wire}, where the "
                f"schema's type is {_TYPE_NAMES.get(field.type, field.type)}"
            )
    return unnamed


def _closed_enum(field: Any) -> bool:
    """Whether ``field`` is an enum that keeps values its schema does not name out of the field (proto2)."""
    if field.type != FieldDescriptor.TYPE_ENUM:
        return False
    closed = getattr(field.enum_type, "is_closed", None)  # protobuf >= 4.22 (editions)
    return bool(closed) if closed is not None else field.file.syntax == "proto2"


def _refuse_truncated(payload: bytes, narrow: Mapping[int, Any]) -> None:
    """``PayloadError`` when a declared 32-bit field was sent a varint past its width (a newer schema's
    field widened to 64 bits): protobuf keeps its low 32 bits, a value that was never sent."""
    for number, sent in last_varints(payload, set(narrow)).items():
        field = narrow[number]
        kind = _VARINT_32[field.type]
        if kind == "uint32":
            value, fits = sent, sent < 2**32
        elif kind == "sint32":
            value, fits = (sent >> 1) ^ -(sent & 1), sent < 2**32
        else:
            value = sent - 2**64 if sent >= 2**63 else sent
            fits = -(2**31) <= value < 2**31
        if not fits:
            raise PayloadError(
                f"protobuf: field {field.name} ({number}): {value} does not fit its type, {kind}"
            )


def _value(message: Any, field: Any, type_name: str) -> Any:
    if field.has_presence and not message.HasField(field.name):
        return None
    value = getattr(message, field.name)
    if field.type == FieldDescriptor.TYPE_ENUM and type_name == "string":
        number = field.enum_type.values_by_number.get(value)
        return number.name if number is not None else str(value)
    if field.type == FieldDescriptor.TYPE_MESSAGE:  # a google.protobuf.Timestamp
        parts = value.DESCRIPTOR.fields
        _refuse_misread(value, [(part, "") for part in parts], f"{field.name}.")
        return _time(field.name, value.seconds, value.nanos)
    return value


def _time(name: str, seconds: int, nanos: int) -> dt.datetime:
    """A ``google.protobuf.Timestamp`` as a time; ``PayloadError`` when no timestamp column holds it (before
    the year 1 or after 9999: a clock counting in another unit) or its nanos are outside 0..999,999,999."""
    if 0 <= nanos < 1_000_000_000:
        try:
            since = dt.timedelta(seconds=seconds, microseconds=nanos // 1000)
            return dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + since
        except OverflowError:
            pass
    detail = f"{seconds} s, {nanos} ns is not a time a timestamp column holds"
    raise PayloadError(f"protobuf: field {name}: {detail}")


EXAMPLE_MESSAGE = "timestone.example.Telemetry"


def example_descriptor_set() -> bytes:
    """The descriptor set of the simulated fleet's Protobuf reading (``examples/telemetry.proto``)."""
    return resources.files(examples).joinpath("telemetry.desc").read_bytes()
