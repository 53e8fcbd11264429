"""A site's batch into the hub's store: at the site's offsets, verbatim, each record once, gaps explicit."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from broker_edge.settings.uplink import site_topic
from broker_edge.storage import CorruptRecord, LogStore, StorageConfig
from broker_edge.uplink.mirror import Applied, Gap, LocalMirrorLogs, apply_batch, mirrored_ends
from broker_edge.uplink.site_identity import site_of_certificate, site_uri
from broker_edge.uplink.wire import Batch, BatchTopic, WireError
from tests.unit.broker_edge.storage.log_helpers import make_record

HUB_NAME = partial(site_topic, "p1")


@pytest.fixture
def site_store(tmp_path: Path) -> Iterator[LogStore]:
    with LogStore(tmp_path / "site", StorageConfig(durability="none")) as store:
        for n in range(20):
            store.append("telemetry/a", make_record(n))
        store.flush()
        yield store


@pytest.fixture
def hub_store(tmp_path: Path) -> Iterator[LogStore]:
    with LogStore(tmp_path / "hub", StorageConfig(durability="none")) as store:
        yield store


def apply(hub_store: LogStore, batch: Batch, gaps: list[Gap]) -> Applied:
    """As the hub does: apply, then wait until it is durable before the next batch."""
    applied = apply_batch(hub_store, batch, gaps, HUB_NAME)
    hub_store.flush()
    return applied


def part(store: LogStore, topic: str, first: int, stop: int) -> Batch:
    frames, count = store.replicated_log.read_frames(topic, first, 1 << 20, stop)
    data = b"".join(frames)
    return Batch(0, [BatchTopic(topic, first, count, len(data))], data)


def hub_bytes(store: LogStore, topic: str) -> bytes:
    store.flush()
    frames, _ = store.replicated_log.read_frames(topic, store.start_offset(topic), 1 << 20)
    return b"".join(frames)


def test_records_land_at_the_sites_offsets_and_a_resend_is_skipped(
    site_store: LogStore, hub_store: LogStore
) -> None:
    gaps: list[Gap] = []
    assert apply(hub_store, part(site_store, "telemetry/a", 0, 12), gaps).records == 12
    again = apply(hub_store, part(site_store, "telemetry/a", 5, 20), gaps)  # overlaps 7 held
    assert (again.records, again.duplicates) == (8, 7)
    assert gaps == []
    assert hub_bytes(hub_store, "$site/p1/telemetry/a") == hub_bytes(site_store, "telemetry/a")
    logs = LocalMirrorLogs(hub_store)
    assert asyncio.run(mirrored_ends(logs, site_topic("p1", ""))) == {"telemetry/a": 20}
    assert asyncio.run(mirrored_ends(logs, site_topic("p2", ""))) == {}


def test_a_batch_past_the_hubs_end_is_a_recorded_gap_and_the_hub_keeps_what_it_held(
    site_store: LogStore, hub_store: LogStore
) -> None:
    gaps: list[Gap] = []
    apply(hub_store, part(site_store, "telemetry/a", 0, 5), gaps)
    apply(hub_store, part(site_store, "telemetry/a", 9, 20), gaps)
    assert gaps == [Gap("telemetry/a", 5, 9)]
    topic = "$site/p1/telemetry/a"
    assert (hub_store.start_offset(topic), hub_store.durable_end(topic)) == (0, 20)
    assert hub_store.replicated_log.read_frames(topic, 0, 1 << 20) == site_store.replicated_log.read_frames(
        "telemetry/a", 0, 1 << 20, 5
    )
    with pytest.raises(CorruptRecord) as lost:  # the gap: no record, the next one named
        hub_store.read(topic, 5)
    assert lost.value.next_offset == 9
    assert hub_store.replicated_log.read_frames(topic, 9, 1 << 20) == site_store.replicated_log.read_frames(
        "telemetry/a", 9, 1 << 20
    )
    again = apply(hub_store, part(site_store, "telemetry/a", 9, 20), gaps)  # the ACK was lost: no new gap
    assert (again.records, again.duplicates, len(gaps)) == (0, 11, 1)


def test_a_new_topic_starting_late_is_a_gap_from_zero(site_store: LogStore, hub_store: LogStore) -> None:
    gaps: list[Gap] = []
    apply(hub_store, part(site_store, "telemetry/a", 3, 20), gaps)
    assert gaps == [Gap("telemetry/a", 0, 3)]
    assert hub_store.start_offset("$site/p1/telemetry/a") == 3  # it held nothing: its log starts there


@pytest.mark.parametrize("topic", ["$SYS/x", "a/+/b", "a/#", ""])
def test_a_site_cannot_name_topics_outside_its_namespace(
    site_store: LogStore, hub_store: LogStore, topic: str
) -> None:
    batch = part(site_store, "telemetry/a", 0, 2)
    batch.topics[0].topic = topic
    with pytest.raises(WireError):
        apply_batch(hub_store, batch, [], HUB_NAME)
    assert hub_store.logs("$site/#") == []


def test_damaged_frames_append_nothing(site_store: LogStore, hub_store: LogStore) -> None:
    batch = part(site_store, "telemetry/a", 0, 4)
    batch.frames = batch.frames[:-1] + bytes([batch.frames[-1] ^ 1])
    with pytest.raises(WireError, match="refused at offset 3"):
        apply_batch(hub_store, batch, [], HUB_NAME)
    hub_store.flush()
    assert hub_store.durable_end("$site/p1/telemetry/a") == 0


def test_a_certificate_names_one_site_or_none() -> None:
    assert site_of_certificate({"subjectAltName": (("URI", site_uri("plant-1")),)}) == "plant-1"
    assert site_of_certificate({"subjectAltName": (("URI", site_uri("a")), ("URI", site_uri("b")))}) is None
    assert site_of_certificate({"subjectAltName": (("URI", "timestone://node/b1"),)}) is None
    assert site_of_certificate({"subjectAltName": (("URI", site_uri("a/b")),)}) is None
    assert site_of_certificate(None) is None
