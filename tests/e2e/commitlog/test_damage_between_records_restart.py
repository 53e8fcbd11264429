"""Damage in the middle of the active segment of a real broker killed with SIGKILL, a topic per device: a
zeroed page (what a disk or a filesystem gives back for a block it lost) and an entry whose topic id lost
a bit. After the restart every record outside the damage is served with its offset and payload, the damaged
offsets answer `corrupt_record`, the broker says what it stepped over, and no offset is given twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from broker_edge.offsets_api.client import CorruptRecordError, OffsetsClient
from broker_edge.runtime.launcher import BrokerProcess
from tests.e2e.broker_clients import PahoClient
from tests.unit.broker_edge.storage.log_helpers import entry_positions, flip_byte, partition_segments

DEVICES = 100
ROUNDS = 4
PAGE = 4096


def _topic(device: int) -> str:
    return f"fleet/dev-{device:03d}/telemetry"


def _served(client: OffsetsClient, topic: str, end: int) -> tuple[dict[int, bytes], list[int]]:
    """Every record the API serves from 0 to `end`, and the offsets it answers as damaged."""
    served: dict[int, bytes] = {}
    damaged: list[int] = []
    offset = 0
    while offset < end:
        try:
            fetched = client.fetch(topic, offset, max_records=1000)
        except CorruptRecordError as error:
            damaged += range(error.offset, error.next_offset)
            offset = error.next_offset
            continue
        served.update((row["offset"], row["payload"]) for row in fetched.data.to_pylist())
        offset = fetched.next_offset
    return served, damaged


@pytest.fixture(scope="module")
def restarted(tmp_path_factory) -> Iterator[dict[str, Any]]:
    broker = BrokerProcess(
        tmp_path_factory.mktemp("mid-damage"),
        storage={"index_checkpoint_bytes": 1 << 30},  # the whole active segment is scanned at open
        limits={"messages_per_second_per_client": 0},
    ).start()
    publisher = PahoClient(broker.port, "gateway")
    for number in range(ROUNDS):
        for device in range(DEVICES):
            publisher.publish(_topic(device), f"{device}:{number}", 1)  # each acknowledged
    publisher.close()
    broker.kill()

    active = partition_segments(broker.directory / "data")[-1]
    entries = entry_positions(active)  # devices' records in publish order: entry n is round n // DEVICES
    size = active.stat().st_size
    page = (size // 3) // PAGE * PAGE
    ends = [*entries[1:], size]
    zeroed = {n for n, at in enumerate(entries) if at < page + PAGE and ends[n] > page}
    flipped = 3 * len(entries) // 4 - DEVICES // 2  # round 2: not a log's last record
    with open(active, "r+b") as file:
        file.seek(page)
        file.write(bytes(PAGE))
    flip_byte(active, entries[flipped])  # the topic id of a later entry
    lost = {(_topic(n % DEVICES), n // DEVICES) for n in zeroed | {flipped}}

    broker.start()
    try:
        yield {"broker": broker, "lost": lost, "size": size, "active": active}
    finally:
        broker.stop()


def _end(gone: list[int]) -> int:
    """A log's end after the damage: records lost at its end leave no trace of their offsets."""
    end = ROUNDS
    while end - 1 in gone:
        end -= 1
    return end


def test_every_acknowledged_record_outside_the_damage_is_served_and_the_damaged_ones_are_answered(restarted):
    lost = restarted["lost"]
    with OffsetsClient(restarted["broker"].offsets_url) as client:
        for device in range(DEVICES):
            topic = _topic(device)
            gone = sorted(number for name, number in lost if name == topic)
            end = _end(gone)
            assert client.log_info(topic).end_offset == end  # nothing valid was cut away
            served, damaged = _served(client, topic, end)
            assert damaged == [number for number in gone if number < end]
            assert served == {n: f"{device}:{n}".encode() for n in range(end) if n not in gone}
    assert restarted["active"].stat().st_size >= restarted["size"]  # the damage kept for inspection


def test_the_broker_says_what_it_stepped_over(restarted):
    text = restarted["broker"].log_path.read_text()

    assert "are damaged (checksum); stepped over to the valid entries after them" in text
    assert "fails its topic id check; skipped" in text
    assert "bytes dropped" in text and "after an unclean shutdown" in text


def test_a_device_publishing_after_the_restart_gets_a_new_offset(restarted):
    broker = restarted["broker"]
    topic = next(topic for topic, number in sorted(restarted["lost"]) if number < ROUNDS - 1)
    PahoClient(broker.port, "after").publish(topic, "after restart", 1)
    with OffsetsClient(broker.offsets_url) as client:
        rows = client.fetch(topic, ROUNDS).data.to_pylist()
    assert [(row["offset"], row["payload"]) for row in rows] == [(ROUNDS, b"after restart")]
