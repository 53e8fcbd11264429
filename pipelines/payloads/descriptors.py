"""Protobuf message classes built from descriptor sets, and where a message that does not parse breaks.

A descriptor set (``protoc --descriptor_set_out=... --include_imports``) describes the messages without any
generated code: loaded into a descriptor pool of its own, it gives message classes through protobuf's
dynamic message factory, the same on every protobuf version the package allows. Sparkplug B's own schema
is loaded this way too (``sparkplug/sparkplug_b.desc``).
"""

from __future__ import annotations

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


def parse_error(descriptor: Any, payload: bytes) -> str:
    """Why ``payload`` is not a message of ``descriptor``: the byte offset where it breaks, and the field.

    Protobuf's parser only says that a message failed. This walks the payload's top-level fields (tag,
    then a varint, a fixed width or a length) to find the first field that is cut off, has a wire type that
    does not exist, or holds a nested message that does not parse; the values themselves are left to
    protobuf.
    """
    at = 0
    while at < len(payload):
        start = at
        tag, at = _varint(payload, at)
        if tag is None:
            return f"byte {start}: a field's tag is cut off"
        number, wire_type = tag >> 3, tag & 7
        field = descriptor.fields_by_number.get(number)
        name = f"field {field.name} ({number})" if field else f"unknown field {number}"
        if number == 0:
            return f"byte {start}: field number 0 does not exist"
        if wire_type == 0:
            value, at = _varint(payload, at)
            if value is None:
                return f"byte {start}: {name}: its varint is cut off"
        elif wire_type in (1, 5):
            at += 8 if wire_type == 1 else 4
            if at > len(payload):
                return f"byte {start}: {name}: its fixed-width value is cut off"
        elif wire_type == 2:
            length, at = _varint(payload, at)
            if length is None or at + length > len(payload):
                return f"byte {start}: {name}: its length runs past the end of the payload"
            if field is not None and field.type == FieldDescriptor.TYPE_MESSAGE:
                inner = payload[at : at + length]
                nested = message_factory.GetMessageClass(field.message_type)
                try:
                    nested.FromString(inner)
                except DecodeError:
                    return f"byte {start}: {name}: {parse_error(field.message_type, inner)}"
            at += length
        else:
            return f"byte {start}: {name}: wire type {wire_type} is not one protobuf has (or is a group)"
    return f"{len(payload)} bytes: a value does not fit its field's type"


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
