"""A cluster hub whose member leading a site's topic is out of disk space tells the site so at once, and that
member logs no traceback: where its members' endpoint answered each append with an unhandled error (a
traceback per request), and the member holding the site's link retried it every 50 ms until its timeout.

The leader's data directory is a small tmpfs in its own mount namespace (as ``test_disk_full.py``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from broker_edge.placement import partition_of
from broker_edge.runtime.launcher import free_port
from broker_edge.settings.uplink import site_topic
from tests.e2e.broker_clients import wait_for
from tests.e2e.conftest import RunningBroker
from tests.e2e.refusals.test_disk_full import MOUNT_TMPFS, in_broker_namespace
from tests.e2e.uplink.uplink_harness import hub_section, pki_in, site_section
from tests.harness.local_cluster import (
    EtcdServer,
    EtcdTarget,
    cluster_broker,
    cluster_state,
    settled,
    wait_until,
)

pytestmark = pytest.mark.timeout(120)

PARTITIONS = 4


def test_a_leader_out_of_disk_space_is_said_to_the_site_at_once_without_a_traceback(
    brokers: Callable[..., RunningBroker], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pki = pki_in(tmp_path / "pki")
    etcd = EtcdServer(tmp_path / "etcd").start()
    target = EtcdTarget(etcd, "/timestone")
    cluster = {"lease_ttl_s": 2, "replication_factor": 1, "min_insync_replicas": 1, "partitions": PARTITIONS}
    ports = {node: free_port() for node in ("h1", "h2")}
    members = {
        node: cluster_broker(tmp_path, target, node, cluster, uplink_hub=hub_section(pki, port=port))
        for node, port in ports.items()
    }
    full = members["h2"]
    data = tmp_path / "h2" / "data"
    full.wrapper = ("unshare", "--mount", "--propagation", "private", "sh", "-c", MOUNT_TMPFS, str(data))
    try:
        for member in members.values():
            member.start()
        wait_until(lambda: settled(target, set(members), 1, PARTITIONS), what="the cluster settled")
        wait_until(
            lambda: {state.leader for state in cluster_state(target).partitions.values()} == set(members),
            what="each member leading a partition",
        )
        led = {p: state.leader for p, state in cluster_state(target).partitions.items()}
        topics = [f"t/{n}" for n in range(100)]
        topic = next(t for t in topics if led[partition_of(site_topic("plant-l", t), PARTITIONS)] == "h2")
        in_broker_namespace(full, "dd", "if=/dev/zero", f"of={data / 'filler'}", "bs=64k", "status=none")
        site = brokers("site", uplink=site_section(pki, "plant-l", ports["h1"], compression="none"))
        site.call(lambda: site.broker.publish(topic, b"x" * 20000, qos=1))
        said = "out of disk space"

        def told() -> bool:
            return any(said in r.getMessage() and "the hub refused" in r.getMessage() for r in caplog.records)

        # from the link's opening (its dial and TLS handshake take seconds on a loaded machine)
        assert wait_for(lambda: told() or site.metric("timestone_broker_uplink_connected") == 1, timeout=30)
        started = time.monotonic()
        assert wait_for(told, timeout=30)
        assert time.monotonic() - started < 5  # at once, not after retries until a timeout
        text = full.log_path.read_text()
        assert "Traceback" not in text
    finally:
        for member in members.values():
            member.stop()
        etcd.kill()
