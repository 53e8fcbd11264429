"""A hub that is a cluster of three brokers (etcd, replication factor 3) loses the leader of its site's logs
under continuous telemetry: afterwards every surviving replica holds every record the devices had
acknowledged, at the site's offsets, byte for byte with the site's log, none twice."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from broker_edge.cluster.view import partition_of
from broker_edge.runtime.launcher import BrokerProcess, free_port
from broker_edge.runtime.local_cluster import (
    EtcdServer,
    EtcdTarget,
    cluster_broker,
    cluster_state,
    wait_settled,
)
from broker_edge.settings.uplink import site_topic
from broker_edge.storage import LogStore, StorageConfig
from tests.e2e.broker_clients import wait_for
from tests.e2e.uplink.uplink_harness import Telemetry, hub_section, log_frames, pki_in, site_section

pytestmark = pytest.mark.timeout(120)

SITE = "plant-c"
NODES = ("h1", "h2", "h3")
PARTITIONS = 16
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


def payloads(store: LogStore, topics: list[str]) -> list[bytes]:
    return [
        record.payload
        for topic in topics
        if topic in store
        for record in store.read(topic, store.start_offset(topic), 1_000_000, 1 << 30)
    ]


def test_a_cluster_hub_losing_the_leader_of_a_sites_logs_holds_every_acknowledged_record_once(
    tmp_path: Path,
) -> None:
    pki = pki_in(tmp_path)
    etcd = EtcdServer(tmp_path / "etcd").start()
    target = EtcdTarget(etcd, "/timestone")
    ports = {node: free_port() for node in NODES}
    hubs = {
        node: cluster_broker(
            tmp_path,
            target,
            node,
            {"lease_ttl_s": 2, "replication_factor": 3},
            uplink_hub=hub_section(pki, port=ports[node]),
        )
        for node in NODES
    }
    site: BrokerProcess | None = None  # configured once the hub's leaders are known
    try:
        for hub in hubs.values():
            hub.start()
        wait_settled(target, set(NODES), 3)
        victim = NODES[0]
        topics = led_by(target, victim)
        assert len(topics) == TOPIC_COUNT
        others = [node for node in NODES if node != victim]
        uplink = site_section(pki, SITE, ports[victim])  # the leader first: the site is on it when it dies
        uplink["hubs"] = [f"wss://127.0.0.1:{ports[node]}/v1/uplink" for node in (victim, *others)]
        site = running_site = BrokerProcess(tmp_path / "site", uplink=uplink).start()
        telemetry = Telemetry(site.port, topics)
        try:
            acknowledged = telemetry.acknowledged
            assert wait_for(lambda: len(acknowledged) >= 300, timeout=20)
            assert wait_for(lambda: int(site_status(running_site)["sent_records"]) >= 200, timeout=20)
            hubs[victim].kill()
            killed_at = time.monotonic()
            at_kill = len(acknowledged)
            assert wait_for(lambda: len(acknowledged) >= at_kill + 600, timeout=30)
        finally:
            telemetry.stop()
        status: dict[str, Any] = {}

        def caught_up() -> bool:
            status.update(site_status(running_site))
            return bool(status["connected"]) and status["lag_records"] == 0

        assert wait_for(caught_up, timeout=30), status
        recovered_s = time.monotonic() - killed_at
        assert status["hub"] != uplink["hubs"][0]  # it failed over to another member
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
        with LogStore(tmp_path / node / "data", StorageConfig(partitions=PARTITIONS)) as store:
            hub_topics = [site_topic(SITE, topic) for topic in topics]
            assert [log_frames(store, topic) for topic in hub_topics] == site_logs, node
            held = payloads(store, hub_topics)
        assert set(telemetry.acknowledged) <= set(held), node
        assert len(held) == len(set(held)), node
    print(
        f"\n{len(telemetry.acknowledged)} acknowledged, {len(site_payloads)} on the site; "
        f"the site caught up {recovered_s:.1f} s after the leader was killed"
    )
