"""A QoS 2 PUBLISH appended to the log by a broker killed before its id reached the journal (docs/broker.md,
"After a crash"): the client, which got no PUBREC, resends it with DUP 1 to the restarted broker.

A real broker process is SIGKILLed after the append; the journal's line of the id is then taken out of
``meta/qos2-ids.<n>``, which leaves the data directory as a kill between the append and that line does (the
line is one write after the append: no signal lands between the two reliably). The publisher is a raw
client (it must ignore the PUBREC it got and resend the PUBLISH), the reader a paho client.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from broker_edge.protocol.packets import PubComp, Publish, PubRec, PubRel
from broker_edge.protocol.properties import Properties
from broker_edge.runtime.launcher import BrokerProcess
from broker_edge.storage import AppendRecord, LogStore
from broker_edge.storage.config import StorageConfig
from tests.e2e.broker_clients import PahoClient, RawClient

TOPIC = "in/q2"
PUBLISHER = "q2-publisher"


def _publisher(port: int, version: int) -> tuple[RawClient, Any]:
    client = RawClient(port, version)
    fields: dict[str, Any] = {"properties": Properties(session_expiry_interval=300)} if version == 5 else {}
    return client, client.connect(PUBLISHER, clean_start=False, **fields)


def _reader(port: int, version: int) -> PahoClient:
    extra: dict[str, Any] = {"session_expiry": 300} if version == 5 else {}
    return PahoClient(port, "q2-reader", version=version, clean=False, **extra)


def _sessions_saved(process: BrokerProcess, version: int) -> None:
    """The reader's QoS 2 subscription and the publisher's session, in the snapshot of a clean stop."""
    _reader(process.port, version).subscribe(TOPIC, 2)
    _publisher(process.port, version)[0].close()
    process.stop()


def _drop_journal_lines(process: BrokerProcess, packet_id: int) -> None:
    """Take ``packet_id``'s lines out of the journal: what a kill between the append and them leaves."""
    meta = process.directory / "data" / "meta"
    for journal in meta.glob("qos2-ids.*"):
        lines = journal.read_text().splitlines(keepends=True)
        journal.write_text("".join(line for line in lines if f",{packet_id}," not in line))


def _complete(client: RawClient, packet_id: int) -> None:
    """PUBREC for ``packet_id``, then PUBREL, then PUBCOMP 0."""
    rec = client.recv()
    assert isinstance(rec, PubRec) and rec.packet_id == packet_id, rec
    client.send_packet(PubRel(packet_id))
    comp = client.recv()
    assert isinstance(comp, PubComp) and (comp.packet_id, comp.reason_code) == (packet_id, 0), comp


@pytest.mark.mqtt311("MQTT-4.3.3-2")
@pytest.mark.mqtt5("MQTT-4.3.3-9", "MQTT-4.3.3-10")
@pytest.mark.parametrize("version", [5, 4])
def test_a_qos2_publish_logged_before_its_journal_line_is_not_logged_again_when_resent(tmp_path, version):
    """[MQTT-4.3.3-10] [MQTT-4.3.3-2] A QoS 2 message the broker appended and was killed before answering
    (its id in no journal line) is accepted once: the client's resend with DUP 1 after the restart gets
    PUBREC and PUBCOMP 0 [MQTT-4.3.3-9], and the reader gets the message once, then the next one."""
    process = BrokerProcess(tmp_path, sessions={"persist_interval_s": 3600}, sys_topics={"enabled": False})
    process.start()
    try:
        _sessions_saved(process, version)
        process.start()
        publisher, _ = _publisher(process.port, version)
        publisher.send_packet(Publish(TOPIC, b"exactly once", 2, packet_id=9))
        assert isinstance(publisher.recv(), PubRec)  # in the log: the PUBREC is then taken as never come
        publisher.close()
        process.kill()
        process.process.wait()
        _drop_journal_lines(process, 9)
        process.start()
        again, ack = _publisher(process.port, version)
        assert ack.session_present
        again.send_packet(Publish(TOPIC, b"exactly once", 2, dup=True, packet_id=9))
        _complete(again, 9)
        again.send_packet(Publish(TOPIC, b"after", 2, packet_id=10))
        _complete(again, 10)
        reader = _reader(process.port, version)
        assert [m.payload for m in reader.expect(2)] == [b"exactly once", b"after"]
    finally:
        process.stop()


def test_a_log_whose_qos2_records_keep_no_packet_id_still_starts_and_serves(tmp_path):
    """QoS 2 records written without the publisher's packet id (version 1, as every broker before wrote
    them), appended after the last snapshot, are read at start and served: the broker starts, the reader
    gets them, then a new message; a resend of their ids is a new message (nothing tells it apart)."""
    process = BrokerProcess(tmp_path, sessions={"persist_interval_s": 3600}, sys_topics={"enabled": False})
    process.start()
    try:
        _sessions_saved(process, 5)
        store = LogStore(Path(process.directory / "data"), StorageConfig())
        store.open()
        store.append(TOPIC, AppendRecord(b"old", qos=2, client_id=PUBLISHER))
        store.flush()
        store.close()
        process.start()
        publisher, ack = _publisher(process.port, 5)
        assert ack.session_present
        publisher.send_packet(Publish(TOPIC, b"after", 2, dup=True, packet_id=9))
        _complete(publisher, 9)
        reader = _reader(process.port, 5)
        assert [m.payload for m in reader.expect(2)] == [b"old", b"after"]
    finally:
        process.stop()


@pytest.mark.parametrize(("record_format", "kept"), [(2, 9), (1, None)])
def test_storage_record_format_1_writes_qos2_records_an_earlier_broker_reads(tmp_path, record_format, kept):
    """``storage.record_format: 2`` (the default) keeps a QoS 2 publisher's packet id in its record (version
    2); 1 writes version 1 records only, which brokers before version 2 read (the way back kept open)."""
    process = BrokerProcess(tmp_path, storage={"record_format": record_format}, sys_topics={"enabled": False})
    process.start()
    try:
        publisher, _ = _publisher(process.port, 5)
        publisher.send_packet(Publish(TOPIC, b"kept?", 2, packet_id=9))
        _complete(publisher, 9)
        publisher.close()
    finally:
        process.stop()
    store = LogStore(Path(process.directory / "data"), StorageConfig())
    store.open()
    try:
        [record] = store.read(TOPIC, 0, 10)
    finally:
        store.close()
    assert (record.payload, record.packet_id) == (b"kept?", kept)
