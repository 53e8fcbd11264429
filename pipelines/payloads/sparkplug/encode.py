"""Sparkplug B payloads written: what an edge node sends (births, data, deaths) and a host's commands.

The simulated fleet and the tests write their messages with this, through the same schema the decoders
read (``schema.payload_class``): a value goes into the value field its datatype travels in, signed
integers as their two's complement (specification, 6.4.16).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .messages import VALUE_FIELDS
from .schema import DATATYPE_NUMBERS, payload_class

REBIRTH = "Node Control/Rebirth"
"""The NCMD metric a host sets to true to ask an edge node for its births again."""


@dataclass(frozen=True)
class MetricOut:
    """A metric to send: a birth gives its name, datatype and alias; data may give the alias alone.

    ``datatype`` picks the value field the value travels in; ``with_datatype`` False leaves it out of the
    message (data messages may: the birth declared it).
    """

    value: Any
    datatype: str
    name: str | None = None
    alias: int | None = None
    timestamp_ms: int | None = None
    is_null: bool = False
    with_datatype: bool = True


def encode(metrics: Iterable[MetricOut], *, timestamp_ms: int | None, seq: int | None) -> bytes:
    """A Sparkplug B payload of ``metrics``."""
    message: Any = payload_class()()
    if timestamp_ms is not None:
        message.timestamp = timestamp_ms
    if seq is not None:
        message.seq = seq
    for out in metrics:
        metric = message.metrics.add()
        if out.name is not None:
            metric.name = out.name
        if out.alias is not None:
            metric.alias = out.alias
        if out.timestamp_ms is not None:
            metric.timestamp = out.timestamp_ms
        if out.with_datatype:
            metric.datatype = DATATYPE_NUMBERS[out.datatype]
        if out.is_null or out.value is None:
            metric.is_null = True
            continue
        _set_value(metric, out.datatype, out.value)
    return bytes(message.SerializeToString())


def _set_value(metric: Any, datatype: str, value: Any) -> None:
    field = VALUE_FIELDS[datatype]
    if datatype in ("Int8", "Int16", "Int32") and value < 0:
        value += 2**32
    elif datatype == "Int64" and value < 0:
        value += 2**64
    setattr(metric, field, value)


def bdseq_metric(bdseq: int) -> MetricOut:
    """The ``bdSeq`` metric an NBIRTH and its NDEATH carry (the NDEATH being the node's MQTT will)."""
    return MetricOut(bdseq, "Int64", name="bdSeq")


def ndeath(bdseq: int) -> bytes:
    """An edge node's death certificate, registered as its will when it connects (no sequence number)."""
    return encode([bdseq_metric(bdseq)], timestamp_ms=None, seq=None)


def rebirth_request(timestamp_ms: int) -> bytes:
    """An NCMD asking an edge node to publish its births again."""
    return encode([MetricOut(True, "Boolean", name=REBIRTH)], timestamp_ms=timestamp_ms, seq=None)
