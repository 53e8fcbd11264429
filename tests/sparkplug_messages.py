"""Sparkplug B payloads built field by field through the specification's schema, as an encoder other than
this project's writes them (a proto3 copy of the schema leaves out every field equal to its default)."""

from __future__ import annotations

from typing import Any

from pipelines.payloads.sparkplug.schema import DATATYPE_NUMBERS, payload_class


def payload(timestamp_ms: int, seq: int | None) -> Any:
    """A payload with its timestamp and ``seq``; a ``seq`` of 0 is left out (no presence in proto3)."""
    message: Any = payload_class()()
    message.timestamp = timestamp_ms
    if seq:
        message.seq = seq
    return message


def metric(message: Any, name: str | None, alias: int | None, datatype: str | None = None) -> Any:
    """A metric added to ``message`` with what is given of its name, alias and datatype (by its name)."""
    added = message.metrics.add()
    if name is not None:
        added.name = name
    if alias is not None:
        added.alias = alias
    if datatype is not None:
        added.datatype = DATATYPE_NUMBERS[datatype]
    return added
