"""A site that is a cluster of three brokers (etcd, two replicas a partition, so each member holds no copy
of some logs), dialling a hub broker alone.

One member holds the link, the others do not dial. Devices publish QoS 1 continuously to every member; the
test SIGKILLs the member holding the link mid-stream. Another member takes the link, and afterwards the hub
holds every record the devices had acknowledged, at the site's offsets, byte for byte with the site's logs
(every surviving replica), none twice. An action published on the hub reaches a device connected to a
member that does not hold the link."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from broker_edge.placement import partition_of
from broker_edge.runtime.launcher import BrokerProcess, free_port
from broker_edge.settings.uplink import site_topic
from broker_edge.storage import LogStore
from tests.e2e.broker_clients import PahoClient, wait_for
from tests.e2e.uplink.cluster_hub_harness import PARTITIONS, member_store
from tests.e2e.uplink.uplink_harness import Telemetry, hub_section, log_frames, payloads, pki_in, site_section
from tests.harness.local_cluster import (
    EtcdServer,
    EtcdTarget,
    cluster_broker,
    cluster_state,
    wait_settled,
)

pytestmark = pytest.mark.timeout(120)

SITE = "plant-k"
NODES = ("s1", "s2", "s3")
TOPICS_PER_MEMBER = 3


def site_status(member: BrokerProcess) -> dict[str, Any]:
    with urllib.request.urlopen(f"{member.offsets_url}/v1/uplink/sites", timeout=5) as answer:
        status: dict[str, Any] = json.loads(answer.read())["site"]
    return status


def connected(members: dict[str, BrokerProcess]) -> list[str]:
    """The members whose link to the hub is open."""
    return [node for node, member in members.items() if site_status(member)["connected"]]


def without_copy_on(target: EtcdTarget) -> dict[str, list[str]]:
    """For each member, device topics in partitions it holds no copy of."""
    replicas = {number: state.replicas for number, state in cluster_state(target).partitions.items()}
    candidates = [f"telemetry/dev-{n}" for n in range(1000)]
    return {
        node: [t for t in candidates if node not in replicas[partition_of(t, PARTITIONS)]][:TOPICS_PER_MEMBER]
        for node in NODES
    }


def hub_end(hub: BrokerProcess, topic: str) -> int:
    """Where the hub's copy of the site's ``topic`` ends (0: none yet)."""
    name = urllib.parse.quote(site_topic(SITE, topic), safe="")
    try:
        with urllib.request.urlopen(f"{hub.offsets_url}/v1/logs/{name}", timeout=5) as answer:
            return int(json.loads(answer.read())["end_offset"])
    except urllib.error.HTTPError:
        return 0


def test_a_site_cluster_losing_the_member_holding_its_link_sends_every_acknowledged_record_once(
    tmp_path: Path,
) -> None:
    pki = pki_in(tmp_path)
    hub_port = free_port()
    hub = BrokerProcess(tmp_path / "hub", uplink_hub=hub_section(pki, port=hub_port)).start()
    etcd = EtcdServer(tmp_path / "etcd").start()
    target = EtcdTarget(etcd, "/site")
    cluster = {"lease_ttl_s": 2, "replication_factor": 2, "min_insync_replicas": 2}
    members = {
        node: cluster_broker(tmp_path, target, node, cluster, uplink=site_section(pki, SITE, hub_port))
        for node in NODES
    }
    devices: list[Telemetry] = []
    try:
        for member in members.values():
            member.start()
        wait_settled(target, set(NODES), 2, processes=members)
        elsewhere = without_copy_on(target)
        topics = sorted({topic for listed in elsewhere.values() for topic in listed})
        assert wait_for(lambda: len(connected(members)) == 1, timeout=20)
        holder = connected(members)[0]
        time.sleep(1.0)  # the others campaign meanwhile, and do not dial
        assert connected(members) == [holder]

        devices = [Telemetry(members[node].port, topics, f"{node} reading") for node in NODES]
        assert wait_for(lambda: sum(len(d.acknowledged) for d in devices) >= 300, timeout=20)
        # the holder sends the logs it holds no copy of too, read from their leaders
        assert wait_for(lambda: all(hub_end(hub, t) >= 10 for t in elsewhere[holder]), timeout=20)
        members[holder].kill()
        survivors = {node: member for node, member in members.items() if node != holder}
        at_kill = sum(len(d.acknowledged) for d in devices)
        assert wait_for(lambda: len(connected(survivors)) == 1, timeout=20)
        new_holder = connected(survivors)[0]
        assert wait_for(lambda: sum(len(d.acknowledged) for d in devices) >= at_kill + 300, timeout=30)

        # the downlink reaches a device on a member that does not hold the link
        other = next(node for node in survivors if node != new_holder)
        device = PahoClient(survivors[other].port, "device-k")
        device.subscribe("actions/all", qos=1)
        actor = PahoClient(hub.port, "actions-job")
        actor.client.publish("actions/all", b'{"action": "ota-k"}', qos=1).wait_for_publish(5)
        assert [message.payload for message in device.expect(1, timeout=20)] == [b'{"action": "ota-k"}']
        device.expect_none(1.0)  # once
    finally:
        for telemetry in devices:
            telemetry.stop()
    try:
        status: dict[str, Any] = {}

        def caught_up() -> bool:
            status.update(site_status(survivors[new_holder]))
            return bool(status["connected"]) and status["lag_records"] == 0

        wait_settled(target, set(survivors), 2)  # every survivor holds a complete copy of every partition
        assert wait_for(caught_up, timeout=30), status
        hub.stop()
        for member in survivors.values():
            member.stop()
    finally:
        hub.kill()
        for member in members.values():
            member.kill()
        etcd.kill()

    acknowledged = set().union(*(telemetry.acknowledged for telemetry in devices))
    hub_topics = [site_topic(SITE, topic) for topic in topics]
    with LogStore(tmp_path / "hub" / "data") as hub_store:
        hub_logs = [log_frames(hub_store, topic) for topic in hub_topics]
        held = payloads(hub_store, hub_topics)
    assert acknowledged <= set(held)
    assert len(held) == len(set(held))
    for node in survivors:  # every surviving replica: the hub's logs, offset for offset, byte for byte
        with member_store(tmp_path, node) as store:
            assert [log_frames(store, topic) for topic in topics] == hub_logs, node
    print(
        f"\n{len(acknowledged)} acknowledged; {len(held)} on the hub; the link moved {holder} → {new_holder}"
    )
