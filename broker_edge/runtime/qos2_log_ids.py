"""Incoming QoS 2 ids a crash left in the log only (see docs/broker.md, "After a crash").

A broker alone answers a QoS 2 PUBLISH with PUBREC once its message is in the log, after a line in the
journal (``runtime.qos2_journal``). A process killed between the append and that line left the message in
the log without its id anywhere else: the client, which got no PUBREC, resends it with DUP 1 and it was
appended a second time. The record of such a publish keeps the client's packet id (record version 2), so at
start the records appended since the last snapshot (from its ``log_ends``) tell which ids the journal does
not know: a client id and packet id with more records there than releases in the journal, whose last line
is not "held", is such an id, held again (and written to the journal, as if its PUBREC had left).

An id is reused only after its release, so a pair's records since the snapshot are each followed by one
release, but the last one when the crash came first. Records without an id (version 1, written by brokers
before it) are not counted.

The records are read partition by partition in log order, from each partition's end position when the
snapshot was written (its ``log_positions``): a few thousand records a read, whatever the number of topics. A
log whose next record is not served there (damaged) is read alone from that record, and so is every log when
the snapshot has no positions (a broker before them wrote it) or the store is not read by partition.
"""

from __future__ import annotations

import importlib.util
import logging
import struct
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from broker_edge.storage.errors import StorageError
from broker_edge.storage.record import PACKET_ID_VERSION, PREFIX_SIZE, FrameError, decode_fields, packet_id_of

if TYPE_CHECKING:
    from broker_edge.engine.routing.router import Router
    from broker_edge.runtime.qos2_journal import JournalState

__all__ = ["hold_logged_ids", "logged_ids"]

log = logging.getLogger(__name__)

READ_RECORDS = 4096
READ_BYTES = 4 * 1024 * 1024
"""Records and bytes read at once while looking through a log's records since the snapshot."""
_OFFSET = struct.Struct("<Q")
COLUMNAR = importlib.util.find_spec("numpy") is not None
"""Whether logs are read as runs of frames (numpy, an optional dependency), where only the records that keep
a packet id are decoded; else as records."""


def hold_logged_ids(
    router: Router,
    log_store: Any,
    since: Mapping[str, int],
    journal: JournalState,
    positions: Sequence[int] | None = None,
) -> int:
    """Hold in ``router``'s persistent sessions the ids of QoS 2 records since ``since`` (the snapshot's
    log ends; ``positions``: its partitions' ends, see ``logged_ids``) that ``journal`` does not account
    for; returns how many."""
    clients = {client_id for client_id, s in router.sessions.items() if s.expiry_interval > 0}
    if not clients:
        return 0
    count = 0
    record = router.qos2_journal
    for (client_id, packet_id), appended in logged_ids(log_store, since, clients, positions).items():
        key = (client_id, packet_id)
        if journal.last.get(key) or appended <= journal.releases[key]:
            continue
        router.sessions[client_id].restore_incoming((packet_id,))
        if record is not None:
            record(client_id, packet_id, True)
        count += 1
    return count


def logged_ids(
    log_store: Any,
    since: Mapping[str, int],
    clients: set[str],
    positions: Sequence[int] | None = None,
) -> Counter[tuple[str, int]]:
    """How many records of ``log_store`` from ``since`` (a topic missing there: from its start) keep each
    (client id, packet id) of ``clients``. ``positions``, each partition's end position at the snapshot, lets
    the partitions be read in log order from there (``_count_in_partitions``); else each log is read alone."""
    found: Counter[tuple[str, int]] = Counter()
    ends = log_store.end_offsets()
    offsets = {topic: since.get(topic, 0) for topic in ends}
    if positions is not None:
        offsets = _count_in_partitions(log_store, offsets, ends, positions, clients, found)
    count = _count_in_runs if COLUMNAR else _count_in_records
    for topic, offset in offsets.items():
        end = ends[topic]
        try:
            offset = max(offset, log_store.start_offset(topic))
            while offset < end:
                read = count(log_store, topic, offset, clients, found)
                if read == offset:
                    break
                offset = read
        except StorageError as exc:  # a damaged record: its ids are not known (at least once, as before)
            log.warning("%s: looking for QoS 2 ids after offset %d stopped: %s", topic, offset, exc)
    return found


def _count_in_partitions(
    log_store: Any,
    offsets: dict[str, int],
    ends: Mapping[str, int],
    positions: Sequence[int],
    clients: set[str],
    found: Counter[tuple[str, int]],
) -> dict[str, int]:
    """Count the ids of the records each partition holds from its position in ``positions`` on, read in
    log order (a read per few thousand records, whatever the number of topics); returns the offset each log
    is still to be read from alone: its end when every record of it since ``offsets`` was read here; where
    one was not served here (damaged, or before the position), that record's; a partition that cannot be
    read so (a cluster's store) leaves its logs' offsets as they were."""
    expected = {}
    for topic, offset in offsets.items():
        start = max(offset, log_store.start_offset(topic))
        if start < ends[topic]:
            expected[topic] = start
    left = dict(offsets)
    if not expected:
        return left
    for partition in log_store.partitions():
        number = partition.partition
        position = positions[number] if number < len(positions) else partition.start
        position = max(partition.start, min(position, partition.end))
        try:
            while position < partition.end:
                read = log_store.read_partition(number, position, READ_RECORDS, READ_BYTES)
                _count_frames(read.topics, read.frames, expected, left, clients, found)
                if read.next_position <= position:
                    break
                position = read.next_position
        except StorageError:
            pass  # its logs not read to their ends here are read alone
    left.update(expected)
    return left


def _count_frames(
    topics: list[str],
    frames: list[memoryview],
    expected: dict[str, int],
    left: dict[str, int],
    clients: set[str],
    found: Counter[tuple[str, int]],
) -> None:
    """Count the ids of ``frames`` (checked frames of ``topics``' records, in log order) whose offset is
    their topic's in ``expected``, which moves on. A topic whose frame is past that offset (the record
    there was not served: damaged) or fails the checks of a read by topic goes from ``expected`` to
    ``left``, at that offset."""
    for topic, frame in zip(topics, frames, strict=True):
        offset = expected.get(topic)
        if offset is None:
            continue
        (frame_offset,) = _OFFSET.unpack_from(frame, PREFIX_SIZE + 1)
        if frame_offset < offset:
            continue  # appended before the snapshot
        try:
            if frame_offset > offset:
                raise FrameError("missing")
            client_id = decode_fields(frame, 0, len(frame))[0]
        except FrameError:
            left[topic] = expected.pop(topic)
            continue
        expected[topic] = offset + 1
        if client_id in clients:
            packet_id = packet_id_of(frame, 0)
            if packet_id is not None:
                found[(client_id, packet_id)] += 1


def _count_in_runs(
    log_store: Any, topic: str, offset: int, clients: set[str], found: Counter[tuple[str, int]]
) -> int:
    """Count the ids of records from ``offset`` on, read as runs of frames: only version 2 ones are
    looked at; returns the offset after the last record read."""
    for run in log_store.read_runs(topic, offset, READ_RECORDS, READ_BYTES):
        view = memoryview(run.data)
        for row in (run.headers["version"] == PACKET_ID_VERSION).nonzero()[0].tolist():
            position = int(run.positions[row])
            client_id = decode_fields(view, position, int(run.positions[row + 1]))[0]
            packet_id = packet_id_of(view, position)
            if client_id in clients and packet_id is not None:
                found[(client_id, packet_id)] += 1
        offset = run.end
    return offset


def _count_in_records(
    log_store: Any, topic: str, offset: int, clients: set[str], found: Counter[tuple[str, int]]
) -> int:
    """``_count_in_runs`` through decoded records (a broker installed without numpy)."""
    for record in log_store.read(topic, offset, READ_RECORDS, READ_BYTES):
        if record.packet_id is not None and record.client_id in clients:
            found[(record.client_id, record.packet_id)] += 1
        offset = record.offset + 1
    return offset
