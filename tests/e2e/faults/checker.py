"""The fault suite's checker: what a run's history must satisfy, as plain data in, anomalies out.

A history is what the publishers were told (each acknowledged sequence number, with the broker that
acknowledged it and when), what the subscribers received (topic, payload and the offset the broker gave
it), each broker's copy of every publisher's log after the run, and the windows in which a broker must not
acknowledge anything (killed, paused, cut off). Each rule below names what it found; no anomaly, no
finding. Payloads are ``<publisher>:<sequence>``, unique, never resent.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["Ack", "Delivery", "History", "Silence", "anomalies", "payload", "sequence_of"]


def payload(publisher: str, sequence: int) -> bytes:
    return f"{publisher}:{sequence}".encode()


def sequence_of(data: bytes) -> int:
    return int(data.rsplit(b":", 1)[1])


@dataclass(frozen=True, slots=True)
class Ack:
    """One acknowledged publish: its sequence number, the broker that acknowledged it, and when."""

    sequence: int
    broker: str
    at: float


@dataclass(frozen=True, slots=True)
class Delivery:
    subscriber: str
    topic: str
    payload: bytes
    offset: int | None


@dataclass(frozen=True, slots=True)
class Silence:
    """``broker`` must acknowledge nothing from ``start`` to ``end`` (it was dead, paused or cut off)."""

    broker: str
    start: float
    end: float
    why: str


@dataclass
class History:
    acks: dict[str, list[Ack]] = field(default_factory=dict)
    """topic → its publisher's acknowledged publishes, in the order the acknowledgements came."""
    logs: dict[str, dict[str, list[tuple[int, bytes]]]] = field(default_factory=dict)
    """broker → topic → ``(offset, payload)`` of every record it holds (only the topic's replicas)."""
    deliveries: list[Delivery] = field(default_factory=list)
    silences: list[Silence] = field(default_factory=list)


def anomalies(history: History) -> list[str]:
    """Every rule the history breaks, one line each (empty: the run is correct)."""
    found: list[str] = []
    topics = sorted(history.acks)
    reference = _reference_logs(history, topics, found)
    for topic in topics:
        log = reference.get(topic, [])
        found += _exactly_once(topic, log, history.acks[topic])
        found += _in_order(topic, log, history.acks[topic])
    found += _deliveries_at_their_offsets(history.deliveries, reference)
    found += _silences_kept(history)
    return found


def _reference_logs(
    history: History, topics: Iterable[str], found: list[str]
) -> dict[str, list[tuple[int, bytes]]]:
    """Each topic's log as the replicas hold it; a replica that differs is an anomaly."""
    reference: dict[str, list[tuple[int, bytes]]] = {}
    brokers = sorted(history.logs)
    for topic in topics:
        holders = [broker for broker in brokers if topic in history.logs[broker]]  # its replicas
        if not holders:
            continue
        copies = {broker: history.logs[broker][topic] for broker in holders}
        first = holders[0]
        reference[topic] = copies[first]
        for broker in holders[1:]:
            if copies[broker] != copies[first]:
                found.append(f"{topic}: the replicas on {first} and {broker} differ")
    return reference


def _exactly_once(topic: str, log: list[tuple[int, bytes]], acks: list[Ack]) -> list[str]:
    found: list[str] = []
    offsets: dict[bytes, list[int]] = {}
    for offset, data in log:
        offsets.setdefault(data, []).append(offset)
    for data, at in offsets.items():
        if len(at) > 1:
            found.append(f"{topic}: {data.decode(errors='replace')} at {len(at)} offsets {at[:4]}")
    publisher = topic.rsplit("/", 1)[-1]
    for ack in acks:
        if payload(publisher, ack.sequence) not in offsets:
            found.append(f"{topic}: acknowledged {ack.sequence} (by {ack.broker}) is not in the log")
    return found


def _in_order(topic: str, log: list[tuple[int, bytes]], acks: list[Ack]) -> list[str]:
    """The log holds the publisher's publishes in the order it sent them; acknowledgements came in order."""
    found: list[str] = []
    sequences = [sequence_of(data) for _, data in log]
    for (offset, _), before, after in zip(log[1:], sequences, sequences[1:], strict=False):
        if after <= before:
            found.append(f"{topic}: {after} at offset {offset} after {before}: out of the publisher's order")
    acked = [ack.sequence for ack in acks]
    for before, after in itertools.pairwise(acked):
        if after <= before:
            found.append(f"{topic}: {after} acknowledged after {before}")
    return found


def _deliveries_at_their_offsets(
    deliveries: list[Delivery], reference: dict[str, list[tuple[int, bytes]]]
) -> list[str]:
    found: list[str] = []
    by_offset = {topic: dict(log) for topic, log in reference.items()}
    for delivery in deliveries:
        held = by_offset.get(delivery.topic, {})
        if delivery.offset is None:
            found.append(f"{delivery.subscriber}: {delivery.payload!r} delivered without an offset")
        elif held.get(delivery.offset) != delivery.payload:
            found.append(
                f"{delivery.subscriber}: {delivery.payload!r} delivered at offset {delivery.offset} of "
                f"{delivery.topic}, where the log holds {held.get(delivery.offset)!r}"
            )
    return found


def _silences_kept(history: History) -> list[str]:
    found: list[str] = []
    for topic, acks in history.acks.items():
        for ack in acks:
            for silence in history.silences:
                if ack.broker == silence.broker and silence.start <= ack.at <= silence.end:
                    found.append(f"{topic}: {ack.sequence} acknowledged by {ack.broker} while {silence.why}")
    return found
