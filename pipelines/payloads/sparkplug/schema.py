"""The Sparkplug B payload schema: ``Payload`` built from ``sparkplug_b.desc`` and the datatype names.

``sparkplug_b.desc`` is ``sparkplug_b.proto`` (the specification's schema) compiled by protoc; a test
compiles the ``.proto`` again and compares, so the two cannot drift apart.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from google.protobuf.message import Message

from ..descriptors import message_class

DESCRIPTOR_SET = "sparkplug_b.desc"
PAYLOAD = "org.eclipse.tahu.protobuf.Payload"

#: The Sparkplug B datatypes by number (the specification's ``DataType`` enum).
DATATYPES: dict[int, str] = dict(
    enumerate(
        (
            "Unknown", "Int8", "Int16", "Int32", "Int64", "UInt8", "UInt16", "UInt32", "UInt64", "Float",
            "Double", "Boolean", "String", "DateTime", "Text", "UUID", "DataSet", "Bytes", "File",
            "Template", "PropertySet", "PropertySetList", "Int8Array", "Int16Array", "Int32Array",
            "Int64Array", "UInt8Array", "UInt16Array", "UInt32Array", "UInt64Array", "FloatArray",
            "DoubleArray", "BooleanArray", "StringArray", "DateTimeArray",
        )
    )
)  # fmt: skip
DATATYPE_NUMBERS: dict[str, int] = {name: number for number, name in DATATYPES.items()}


def descriptor_set() -> bytes:
    return resources.files(__package__).joinpath(DESCRIPTOR_SET).read_bytes()


@cache
def payload_class() -> type[Message]:
    """``org.eclipse.tahu.protobuf.Payload``, built once per process."""
    return message_class(descriptor_set(), PAYLOAD)
