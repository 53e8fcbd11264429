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
"""

from __future__ import annotations

import importlib.util
import logging
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from broker_edge.storage.errors import StorageError
from broker_edge.storage.record import PACKET_ID_VERSION, decode_fields, packet_id_of

if TYPE_CHECKING:
    from broker_edge.engine.routing.router import Router
    from broker_edge.runtime.qos2_journal import JournalState

__all__ = ["hold_logged_ids", "logged_ids"]

log = logging.getLogger(__name__)

READ_RECORDS = 4096
READ_BYTES = 4 * 1024 * 1024
"""Records and bytes read at once while looking through a log's records since the snapshot."""
COLUMNAR = importlib.util.find_spec("numpy") is not None
"""Whether logs are read as runs of frames (numpy, an optional dependency), where only the records that keep
a packet id are decoded; else as records."""


def hold_logged_ids(router: Router, log_store: Any, since: Mapping[str, int], journal: JournalState) -> int:
    """Hold in ``router``'s persistent sessions the ids of QoS 2 records since ``since`` (the snapshot's
    log ends) that ``journal`` does not account for; returns how many."""
    clients = {client_id for client_id, s in router.sessions.items() if s.expiry_interval > 0}
    if not clients:
        return 0
    count = 0
    record = router.qos2_journal
    for (client_id, packet_id), appended in logged_ids(log_store, since, clients).items():
        key = (client_id, packet_id)
        if journal.last.get(key) or appended <= journal.releases[key]:
            continue
        router.sessions[client_id].restore_incoming((packet_id,))
        if record is not None:
            record(client_id, packet_id, True)
        count += 1
    return count


def logged_ids(log_store: Any, since: Mapping[str, int], clients: set[str]) -> Counter[tuple[str, int]]:
    """How many records of ``log_store`` from ``since`` (a topic missing there: from its start) keep each
    (client id, packet id) of ``clients``."""
    found: Counter[tuple[str, int]] = Counter()
    count = _count_in_runs if COLUMNAR else _count_in_records
    for topic, end in log_store.end_offsets().items():
        offset = since.get(topic, 0)
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
