"""The one codec between a routed ``Message`` and a log record, both ways.

A publish is logged as a record (``record_fields``: payload, QoS, retain, publisher, the MQTT 5 properties it
is forwarded with and what remains of its Message Expiry Interval, which counts from the record's time). A
record becomes a ``Message`` again in one of two ways:

- ``message_of_record``: a logged record read back (a replay, a follower routing what it replicated, a
  shared-group delivery sent again): it carries its offset, and its expiry counts from the record's time;
- ``message_of_frame``: a publish that travels in the log's frame format without being logged here (what
  peers forward or route to each other, a will saved in the cluster's registry): no offset of its own yet,
  and its expiry counts from ``now``, when it arrived.

Brokers exchange publishes in the commitlog's frame format, so this is also the peer link's publish codec.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from broker_edge.engine.message import Message
from broker_edge.protocol.properties import Properties
from broker_edge.storage.record import qos_with_packet_id

if TYPE_CHECKING:
    from broker_edge.storage.record import Record, RecordFields

__all__ = ["message_of_frame", "message_of_record", "record_fields", "record_properties"]


def record_fields(message: Message, packet_id: int | None = None) -> RecordFields:
    """The log record of a publish: payload, QoS, retain, publisher and the properties it is forwarded with
    (what remains of its Message Expiry Interval counts from the record's time); ``packet_id``: the
    publisher's, kept by the record of a QoS 2 publish (``record.qos_with_packet_id``)."""
    props = message.properties
    expiry = None if message.expires_at is None else message.expiry_left()  # a call only when it expires
    qos = message.qos if packet_id is None else qos_with_packet_id(message.qos, packet_id)
    if props is None:
        return (
            message.payload,
            qos,
            message.retain,
            message.origin,
            (),
            None,
            None,
            expiry,
            None,
            None,
        )
    return (
        message.payload,
        qos,
        message.retain,
        message.origin,
        list(props.user_properties),
        props.content_type,
        props.payload_format_indicator,
        expiry,
        props.response_topic,
        props.correlation_data,
    )


def record_properties(record: Record) -> Properties | None:
    """The v5 application properties a logged record is forwarded with (None when it has none)."""
    if (
        record.user_properties
        or record.content_type is not None
        or record.payload_format_indicator is not None
        or record.response_topic is not None
        or record.correlation_data is not None
    ):
        return Properties(
            payload_format_indicator=record.payload_format_indicator,
            content_type=record.content_type,
            response_topic=record.response_topic,
            correlation_data=record.correlation_data,
            user_properties=list(record.user_properties),
        )
    return None


def message_of_record(topic: str, record: Record) -> Message:
    """The routed message of a logged record: its fields, its offset, and what remains of its v5 Message
    Expiry Interval (which counts from the record's time)."""
    props = record_properties(record)
    expires_at = None
    if record.message_expiry_interval is not None:
        expires_in = record.timestamp_ms / 1000 + record.message_expiry_interval - time.time()
        expires_at = time.monotonic() + expires_in
    return Message(
        topic,
        bytes(record.payload),
        record.qos,
        record.retain,
        props,
        record.client_id,
        record.offset,
        expires_at,
    )


def message_of_frame(topic: str, record: Record, now: float) -> Message:
    """The message of a publish received as a record frame (from a peer, or saved in the registry): its
    fields, no offset, and what remains of its Message Expiry Interval counted from ``now`` (the loop's
    clock)."""
    expiry = record.message_expiry_interval
    return Message(
        topic,
        record.payload,
        record.qos,
        record.retain,
        record_properties(record),
        record.client_id,
        None,
        None if expiry is None else now + expiry,
    )
