"""A hub that is a cluster of three brokers (etcd, replication factor 3).

- It loses the leader of its site's logs under continuous telemetry: afterwards every surviving replica
  holds every record the devices had acknowledged, at the site's offsets, byte for byte with the site's
  log, none twice.
- A site's retention gap: every replica holds the same gap at the same offsets, and the records on both
  sides of it byte for byte."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from broker_edge.placement import partition_of
from broker_edge.runtime.launcher import BrokerProcess
from broker_edge.settings.uplink import site_topic
from broker_edge.storage import CorruptRecord, LogStore
from tests.e2e.broker_clients import wait_for
from tests.e2e.conftest import RunningBroker
from tests.e2e.uplink.cluster_hub_harness import NODES, PARTITIONS, hub_cluster, hub_url, member_store
from tests.e2e.uplink.uplink_harness import (
    Telemetry,
    WanRelay,
    log_frames,
    payloads,
    pki_in,
    site_section,
)
from tests.harness.local_cluster import EtcdTarget, cluster_state

pytestmark = pytest.mark.timeout(120)

SITE = "plant-c"
TOPIC_COUNT = 4


def led_by(target: EtcdTarget, node: str) -> list[str]:
    """Device topics whose hub logs (``$site/<SITE>/<topic>``) are in partitions ``node`` leads."""
    leaders = {number: state.leader for number, state in cluster_state(target).partitions.items()}
    candidates = (f"telemetry/dev-{n}" for n in range(1000))
    return [
        topic for topic in candidates if leaders[partition_of(site_topic(SITE, topic), PARTITIONS)] == node
    ][:TOPIC_COUNT]


def site_status(site: BrokerProcess) -> dict[str, Any]:
    with urllib.request.urlopen(f"{site.offsets_url}/v1/uplink/sites", timeout=5) as answer:
        status: dict[str, Any] = json.loads(answer.read())["site"]
    return status


@pytest.mark.parametrize("connected_to", ["leader", "follower"])
def test_a_cluster_hub_losing_the_leader_of_a_sites_logs_holds_every_acknowledged_record_once(
    tmp_path: Path, connected_to: str
) -> None:
    """``leader``: the site is connected to the member it loses (it fails over to another); ``follower``:
    to a member that hands its batches to the leader, and goes on to hand them to the next one."""
    pki = pki_in(tmp_path)
    etcd, target, ports, hubs = hub_cluster(tmp_path, pki)
    site: BrokerProcess | None = None  # configured once the hub's leaders are known
    try:
        victim = NODES[0]
        topics = led_by(target, victim)
        assert len(topics) == TOPIC_COUNT
        others = [node for node in NODES if node != victim]
        order = [victim, *others] if connected_to == "leader" else [others[0], victim, others[1]]
        uplink = site_section(pki, SITE, ports[order[0]])
        uplink["hubs"] = [hub_url(ports[node]) for node in order]
        site = running_site = BrokerProcess(tmp_path / "site", uplink=uplink).start()
        telemetry = Telemetry(site.port, topics)
        try:
            acknowledged = telemetry.acknowledged
            assert wait_for(lambda: len(acknowledged) >= 300, timeout=20)
            assert wait_for(lambda: int(site_status(running_site)["sent_records"]) >= 200, timeout=20)
            hubs[victim].kill()
            killed_at = time.monotonic()
            at_kill = len(acknowledged)
            progress = {"acked": 0.0, "since": killed_at, "stalled": 0.0}

            def hub_moving() -> bool:
                """Track the records the hub acknowledged (the devices' count read first, less the site's
                lag: a lower bound), and the longest time since the kill they did not grow."""
                now = time.monotonic()
                acked = len(acknowledged) - int(site_status(running_site)["lag_records"])
                if acked > progress["acked"]:
                    progress["acked"], progress["since"] = acked, now
                progress["stalled"] = max(progress["stalled"], now - progress["since"])
                return len(acknowledged) >= at_kill + 600

            assert wait_for(hub_moving, timeout=30)
        finally:
            telemetry.stop()
        status: dict[str, Any] = {}

        def caught_up() -> bool:
            status.update(site_status(running_site))
            return bool(status["connected"]) and status["lag_records"] == 0

        assert wait_for(caught_up, timeout=30), status
        assert status["hub"] != hub_url(ports[victim])  # on a survivor now
        site.stop()
        for node in others:
            hubs[node].stop()
    finally:
        if site is not None:
            site.kill()
        for hub in hubs.values():
            hub.kill()
        etcd.kill()

    with LogStore(tmp_path / "site" / "data") as site_store:
        site_logs = [log_frames(site_store, topic) for topic in topics]
        site_payloads = payloads(site_store, topics)
    assert set(telemetry.acknowledged) <= set(site_payloads)
    assert len(site_payloads) == len(set(site_payloads))
    for node in others:  # every surviving replica: the site's logs, offset for offset, byte for byte
        with member_store(tmp_path, node) as store:
            hub_topics = [site_topic(SITE, topic) for topic in topics]
            assert [log_frames(store, topic) for topic in hub_topics] == site_logs, node
            held = payloads(store, hub_topics)
        assert set(telemetry.acknowledged) <= set(held), node
        assert len(held) == len(set(held)), node
    print(
        f"\nconnected to the {connected_to}: {len(telemetry.acknowledged)} acknowledged, "
        f"{len(site_payloads)} on the site; after the kill the hub acknowledged nothing for "
        f"{progress['stalled']:.1f} s at most"
    )


def test_a_sites_retention_gap_is_the_same_gap_on_every_replica_of_a_cluster_hub(
    brokers: Callable[..., RunningBroker], tmp_path: Path
) -> None:
    pki = pki_in(tmp_path)
    etcd, _target, ports, hubs = hub_cluster(tmp_path, pki)
    wan = WanRelay(ports[NODES[1]])
    topic = "telemetry/gap"
    try:
        storage = {"retention_ms": 3000, "retention_interval_s": 0.2, "segment_bytes": 1024}
        uplink = site_section(pki, SITE, wan.port)
        site = brokers("site", storage=storage, uplink=uplink)
        site_store = site.broker.store
        link = site.broker.site_link
        assert site_store is not None and link is not None

        def publish(first: int, count: int) -> None:
            def send() -> None:
                for n in range(first, first + count):
                    site.broker.publish(topic, f"r{n}".encode().ljust(100), qos=1)

            site.call(send)

        def caught_up() -> bool:
            return bool(site.call(lambda: link.connected and link.unsent.lag()[0] == 0))

        publish(0, 10)
        assert wait_for(lambda: site.call(lambda: link.hub_ends.get(topic)) == 10, timeout=30)
        before_gap = b"".join(site.call(lambda: site_store.replicated_log.read_frames(topic, 0, 1 << 20))[0])
        wan.cut(down=True)  # records 10.. wait on the site, and its retention deletes them
        publish(10, 20)
        site.call(lambda: site.broker.publish("telemetry/roll", b"x" * 1024, qos=1))  # rolls 10..29's segment
        assert wait_for(lambda: site.call(lambda: site_store.start_offset(topic)) >= 30, timeout=15)
        lost_end = site.call(lambda: site_store.start_offset(topic))
        publish(30, 10)
        wan.heal()
        assert wait_for(caught_up, timeout=30)
        assert site.call(lambda: link.hub_ends[topic]) == 40
        after_gap = site.call(lambda: site_store.replicated_log.read_frames(topic, lost_end, 1 << 20))
        for hub in hubs.values():
            hub.stop()
    finally:
        wan.close()
        for hub in hubs.values():
            hub.kill()
        etcd.kill()

    hub_topic = site_topic(SITE, topic)
    for node in NODES:  # every replica: the records before the gap, the gap, the records after it
        with member_store(tmp_path, node) as store:
            assert log_frames(store, hub_topic) == (0, 40, before_gap), node
            with pytest.raises(CorruptRecord) as lost:
                store.read(hub_topic, 10)
            assert lost.value.next_offset == lost_end, node
            assert store.replicated_log.read_frames(hub_topic, lost_end, 1 << 20) == after_gap, node
