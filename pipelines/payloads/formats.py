"""The payload formats a topic template can have, and the reader of each (what the executors run).

A :class:`FieldFormat` travels to the executors pickled (a few bytes of settings and, for Protobuf, the
descriptor set itself, so no file need be reachable from them); each builds its reader there once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from .cbor import cbor_reader
from .descriptors import message_class
from .fields import Reader
from .json_payloads import json_reader
from .protobuf import ProtobufReader

FieldFormatName = Literal["json", "cbor", "protobuf"]
#: Every format a topic template may declare: the three read into the declared fields, and Sparkplug B.
FORMATS = ("json", "cbor", "protobuf", "sparkplug_b")


@dataclass(frozen=True)
class FieldFormat:
    """A format whose payloads are read into the declared fields (``payload.fields``)."""

    name: FieldFormatName
    descriptor_set: bytes | None = None
    """protobuf: the FileDescriptorSet's bytes."""
    message: str | None = None
    """protobuf: the message's full name."""
    unset_is_absent: tuple[str, ...] = ()
    """protobuf: the fields whose default, in a field without presence, is read as not sent (null): the
    event time's (0 is no time: such a reading takes the broker's)."""

    def reader(self, fields: Mapping[str, str]) -> Reader:
        """The reader of this format's payloads into ``fields``; ``ValueError`` when they cannot be read so
        (a Protobuf message lacking a field, or holding it in a type the column cannot take)."""
        if self.name == "cbor":
            return cbor_reader(fields)
        if self.name == "json":
            return json_reader(fields)
        if self.descriptor_set is None or self.message is None:
            raise ValueError("the protobuf format needs a descriptor set and a message name")
        return ProtobufReader(message_class(self.descriptor_set, self.message), fields, self.unset_is_absent)
