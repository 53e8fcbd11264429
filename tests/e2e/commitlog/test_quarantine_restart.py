"""No entry on disk stops a broker from starting (real broker processes): a log that cannot be opened is
set aside, and the broker starts with every other log.

A broker takes QoS 1 publishes on topics of both storage partitions, and is stopped cleanly or SIGKILLed.
Its data directory then gets every kind of entry no log can hold, each on a topic of its own: a restart
marker at 2**63-1 (what a hub wrote for a site's BATCH at that offset before the ceiling), a truncation
marker at 2**64-1, a record at 2**63-1, the sealed index a store before the ceiling wrote for a mirror's
frames at 2**63-1, a catalog entry filing a topic in partition 60000, and partition 1's files unreadable.
The broker starts; every other log serves what it held and takes publishes; each damaged log is named with
why in ``/health`` and counted in ``/metrics``, answers 404 on the offsets API and is not listed. It starts
again, after a clean stop and after SIGKILL, with the same logs set aside.
"""

from __future__ import annotations

import contextlib
import urllib.request
from pathlib import Path

import pytest

from broker_edge.offsets_api.client import OffsetsClient, UnknownTopicError
from broker_edge.placement import partition_of
from broker_edge.runtime.launcher import BrokerProcess
from broker_edge.storage import LogStore, StorageConfig
from broker_edge.storage.entry import RESTART, TRUNCATE
from tests.e2e.broker_clients import PahoClient
from tests.e2e.commitlog.e2e_helpers import health
from tests.unit.broker_edge.storage.log_helpers import (
    add_catalog_entry,
    append_to_last_segment,
    marker_entry,
    partition_segments,
    record_entry,
    write_past_the_ceiling,
)

pytestmark = pytest.mark.timeout(180)

STORAGE = {"partitions": 2, "segment_bytes": 4096}
"""The broker's storage section (and the store the damage is written with)."""
RECORDS = 40


def in_partition(prefix: str, partition: int, count: int) -> list[str]:
    """``count`` topic names starting with ``prefix`` that storage partition ``partition`` holds (of 2)."""
    names = (f"{prefix}{n}" for n in range(1000))
    return [name for name in names if partition_of(name, 2) == partition][:count]


KEEP = in_partition("keep/", 0, 3)
RESTART_63, TRUNCATE_64, RECORD_63, MIRROR_63 = in_partition("bad/", 0, 4)
IN_PARTITION_1 = in_partition("p1/", 1, 3)
STRAY = "bad/catalog"
CARRIER = in_partition("carrier/", 0, 1)[0]
"""The topic whose append wrote the frame the store before the ceiling left in its buffer (its own record
is damaged by it: that store's doing, served as a damaged record)."""
ORDER = [RESTART_63, TRUNCATE_64, RECORD_63, *KEEP, *IN_PARTITION_1]
"""Created in this order: topic ids 0, 1, 2, ... (the damage below names them by id)."""


def quarantined_metric(broker: BrokerProcess) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.admin_port}/metrics", timeout=10) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith("timestone_broker_storage_quarantined_logs "):
                return float(line.split()[1])
    raise AssertionError("no timestone_broker_storage_quarantined_logs")


def payloads(broker: BrokerProcess, topic: str) -> list[bytes]:
    return [
        record.payload for record in OffsetsClient(broker.offsets_url).fetch_records(topic, 0, 10_000).data
    ]


def damage(data: Path, how: str) -> None:
    """Every kind of entry no log can hold, each on its own topic (the broker is down)."""
    store = LogStore(data, StorageConfig(partitions=2, segment_bytes=4096))
    store.open()
    write_past_the_ceiling(store, MIRROR_63, CARRIER)
    if how == "clean stop":
        with contextlib.suppress(OverflowError):  # the seal a store before the ceiling failed at its close
            store.close()
    append_to_last_segment(
        data,
        [
            marker_entry(0, RESTART, 2**63 - 1),
            record_entry(0, 2**63 - 1),
            marker_entry(1, TRUNCATE, 2**64 - 1),
            record_entry(2, 2**63 - 1),
        ],
    )
    add_catalog_entry(data, STRAY, 60_000)
    unreadable = partition_segments(data, 1)[0]
    unreadable.unlink()
    unreadable.mkdir()


def assert_started_with_every_other_log(broker: BrokerProcess, extra: dict[str, list[bytes]]) -> None:
    expected = {f"record {n}".encode() for n in range(RECORDS)}
    for topic in KEEP:
        assert set(payloads(broker, topic)) >= expected
    for topic, more in extra.items():
        assert payloads(broker, topic)[-len(more) :] == more
    report = health(broker)
    assert report["status"] == "ok"
    aside = {entry["topic"]: entry["reason"] for entry in report["quarantined_logs"]}
    assert set(aside) == {RESTART_63, TRUNCATE_64, RECORD_63, MIRROR_63, STRAY, *IN_PARTITION_1}
    assert "a marker at offset 9223372036854775807, past what a log holds" in aside[RESTART_63]
    assert "a marker at offset 18446744073709551615" in aside[TRUNCATE_64]
    assert "a record ending at offset 9223372036854775808" in aside[RECORD_63]
    assert "past what a log holds" in aside[MIRROR_63]
    assert "partition 60000" in aside[STRAY]
    assert all("partition 1 could not be opened" in aside[topic] for topic in IN_PARTITION_1)
    assert quarantined_metric(broker) == len(aside)
    client = OffsetsClient(broker.offsets_url)
    listed = {info.topic for info in client.list_logs()}
    assert not listed & set(aside) and set(KEEP) <= listed
    for topic in aside:
        with pytest.raises(UnknownTopicError, match="quarantined"):
            client.fetch_records(topic, 0)
    assert "Traceback" not in broker.log_path.read_text()


@pytest.mark.parametrize("how", ["clean stop", "SIGKILL"])
def test_every_kind_of_absurd_entry_is_set_aside_and_the_broker_restarts_with_every_other_log(
    tmp_path: Path, how: str
) -> None:
    broker = BrokerProcess(tmp_path / "broker", storage=STORAGE, limits={"messages_per_second_per_client": 0})
    broker.start()
    try:
        publisher = PahoClient(broker.port, "writer")
        for number in range(RECORDS):
            for topic in [*ORDER, MIRROR_63]:
                publisher.publish(topic, f"record {number}", 1)
        publisher.close()
        broker.stop() if how == "clean stop" else broker.kill()
        damage(broker.directory / "data", how)

        broker.start()
        device = PahoClient(broker.port, "after")
        device.publish(KEEP[1], "after the restart", 1)
        device.publish(RECORD_63, "refused", 1, refusal=0x80)  # not stored: the log is aside
        device.close()
        assert_started_with_every_other_log(broker, {KEEP[1]: [b"after the restart"]})

        broker.stop() if how == "clean stop" else broker.kill()
        broker.start()
        assert_started_with_every_other_log(broker, {KEEP[1]: [b"after the restart"]})
    finally:
        broker.stop()
