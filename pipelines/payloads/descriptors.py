"""Protobuf message classes built from descriptor sets, and where a message that does not parse breaks.

A descriptor set (``protoc --descriptor_set_out=... --include_imports``) describes the messages without any
generated code: loaded into a descriptor pool of its own, it gives message classes through protobuf's
dynamic message factory, the same on every protobuf version the package allows. Sparkplug B's own schema
is loaded this way too (``sparkplug/sparkplug_b.desc``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message


class DescriptorSetError(ValueError):
    """A descriptor set that cannot be read, or that lacks the message asked for."""


def message_class(descriptor_set: bytes, message: str) -> type[Message]:
    """The class of the message named ``message`` (its full name, ``package.Message``) in the set."""
    try:
        files = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set)
    except DecodeError:
        raise DescriptorSetError("not a protobuf FileDescriptorSet (protoc --descriptor_set_out)") from None
    pool = descriptor_pool.DescriptorPool()
    for file in files.file:  # protoc writes each file after the files it imports
        try:
            pool.AddSerializedFile(file.SerializeToString())
        except (TypeError, ValueError) as exc:
            raise DescriptorSetError(f"{file.name}: {exc} (was it written with --include_imports?)") from None
    try:
        descriptor = pool.FindMessageTypeByName(message)
    except KeyError:
        known = sorted(m for f in files.file for m in _message_names(f))
        has = ", ".join(known) or "none"
        raise DescriptorSetError(f"no message {message!r}; the set has {has}") from None
    return message_factory.GetMessageClass(descriptor)


def _message_names(file: descriptor_pb2.FileDescriptorProto) -> list[str]:
    prefix = f"{file.package}." if file.package else ""
    return [prefix + m.name for m in file.message_type]


MOST_NESTED = 100
"""The deepest protobuf's parser reads messages nested in a message (its recursion limit)."""


class _Broken(Exception):
    """Where a walk of a payload's fields ran into bytes that are no field: at byte ``start``, field
    ``number`` (None before its tag was read), ``why``."""

    def __init__(self, start: int, number: int | None, why: str) -> None:
        super().__init__(why)
        self.start, self.number, self.why = start, number, why


def _fields(payload: bytes) -> Iterator[tuple[int, int, bytes | None]]:
    """Each top-level field of ``payload``: the byte its tag starts at, its number, and a length-delimited
    field's bytes (None for the other wire types); ``_Broken`` at the first that is no field."""
    at = 0
    while at < len(payload):
        start = at
        tag, at = _varint(payload, at)
        if tag is None:
            raise _Broken(start, None, "a field's tag is cut off")
        number, wire_type = tag >> 3, tag & 7
        if number == 0:
            raise _Broken(start, None, "field number 0 does not exist")
        if wire_type == 0:
            value, at = _varint(payload, at)
            if value is None:
                raise _Broken(start, number, "its varint is cut off")
            yield start, number, None
        elif wire_type in (1, 5):
            at += 8 if wire_type == 1 else 4
            if at > len(payload):
                raise _Broken(start, number, "its fixed-width value is cut off")
            yield start, number, None
        elif wire_type == 2:
            length, at = _varint(payload, at)
            if length is None or at + length > len(payload):
                raise _Broken(start, number, "its length runs past the end of the payload")
            yield start, number, payload[at : at + length]
            at += length
        else:
            raise _Broken(start, number, f"wire type {wire_type} is not one protobuf has (or is a group)")


def last_varints(payload: bytes, numbers: set[int]) -> dict[int, int]:
    """The value of the last varint among ``payload``'s top-level fields of each number in ``numbers`` (the
    one protobuf keeps for a singular field), as sent: before protobuf cut it to its field's width."""
    found: dict[int, int] = {}
    at = 0
    while at < len(payload):
        tag, at = _varint(payload, at)
        if tag is None:
            break
        wire_type = tag & 7
        if wire_type == 0:
            value, at = _varint(payload, at)
            if value is not None and tag >> 3 in numbers:
                found[tag >> 3] = value
        elif wire_type in (1, 5):
            at += 8 if wire_type == 1 else 4
        elif wire_type == 2:
            length, at = _varint(payload, at)
            at += length or 0
        else:
            break  # a group: protobuf parsed it, nothing declared is in it
    return found


def parse_error(descriptor: Any, payload: bytes) -> str:
    """Why ``payload`` is not a message of ``descriptor``: the byte offset where it breaks, and the field.

    Protobuf's parser only says that a message failed. This walks the payload's top-level fields (tag,
    then a varint, a fixed width or a length) to find the first field that is cut off, has a wire type that
    does not exist, or holds a nested message that does not parse; the values themselves are left to
    protobuf. Messages nested deeper than protobuf reads are said as such.
    """
    if _nesting(descriptor, payload) > MOST_NESTED:
        return f"messages nested more than {MOST_NESTED} deep (protobuf reads none deeper)"
    return _where_it_breaks(descriptor, payload)


def _where_it_breaks(descriptor: Any, payload: bytes) -> str:
    not_utf8 = None  # a string protobuf may have refused (proto3), said when nothing else is found
    try:
        for start, number, value in _fields(payload):
            field = descriptor.fields_by_number.get(number)
            if value is None or field is None:
                continue
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                try:
                    message_factory.GetMessageClass(field.message_type).FromString(value)
                except DecodeError:
                    inner = _where_it_breaks(field.message_type, value)
                    return f"byte {start}: {_field_name(descriptor, number)}: {inner}"
            elif field.type == FieldDescriptor.TYPE_STRING and not_utf8 is None and not _utf8(value):
                not_utf8 = f"byte {start}: {_field_name(descriptor, number)}: not UTF-8"
    except _Broken as broken:
        if broken.number is None:
            return f"byte {broken.start}: {broken.why}"
        return f"byte {broken.start}: {_field_name(descriptor, broken.number)}: {broken.why}"
    return not_utf8 or f"{len(payload)} bytes: a value does not fit its field's type"


def _utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _field_name(descriptor: Any, number: int) -> str:
    field = descriptor.fields_by_number.get(number)
    return f"field {field.name} ({number})" if field else f"unknown field {number}"


def _nesting(descriptor: Any, payload: bytes, level: int = 0) -> int:
    """How deep messages nest in ``payload`` (0: no message field holds one), along whatever its fields
    hold before any that is no field, counted no further than one past ``MOST_NESTED``."""
    deepest = level
    try:
        for _, number, value in _fields(payload):
            field = descriptor.fields_by_number.get(number)
            if value is not None and field is not None and field.type == FieldDescriptor.TYPE_MESSAGE:
                deepest = max(deepest, _nesting(field.message_type, value, level + 1))
                if deepest > MOST_NESTED:
                    break
    except _Broken:
        pass
    return deepest


def _varint(data: bytes, at: int) -> tuple[int | None, int]:
    """The base-128 varint at ``at`` and the offset after it, or (None, end) when it is cut off."""
    value = shift = 0
    while at < len(data) and shift < 70:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7
    return None, at
