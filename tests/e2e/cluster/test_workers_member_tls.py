"""``timestone broker --workers N`` joining a cluster whose members prove who they are (``cluster.tls``).

A member certificate names one node (``timestone://node/<node_id>``), and the members of ``--workers`` are
nodes ``<node_id>-0``, ``<node_id>-1``, ...: each reads its own certificate, named as the configured one
with ``-<n>`` before the suffix. Every member was refused before (all shared the configured certificate,
naming ``<node_id>``), and ``--check --workers`` said the configuration was OK.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from broker_edge.protocol.packets import PubAck, Publish
from broker_edge.runtime.local_pki import LocalPki
from tests.e2e.broker_clients import RawClient
from tests.e2e.cluster.test_workers import (
    leader_of,
    read_topic,
    settled_layout,
    start_workers,
    stop_workers,
)
from tests.harness.local_cluster import EtcdServer, wait_until

pytestmark = pytest.mark.timeout(180)


def check(config: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pipelines.cli", "broker", "--check", "--config", str(config)]
    return subprocess.run([*command, "--workers", "2"], capture_output=True, text=True, timeout=60)


def test_each_member_proves_itself_with_its_own_certificate_and_check_names_a_missing_one(
    tmp_path: Path,
) -> None:
    pki = LocalPki(tmp_path / "pki", "cluster-ca")
    configured = tmp_path / "pki" / "member-w.pem"  # the node's name: never issued, no member is "w"
    etcd = EtcdServer(tmp_path / "etcd", secure=False).start()
    cluster = (
        f"cluster: {{node_id: w, etcd: [{etcd.url}], replication_factor: 1, min_insync_replicas: 1,\n"
        f"          hand_over_connections: false,\n"
        f"          tls: {{certfile: {configured}, keyfile: {configured.with_suffix('.key')},\n"
        f"                cafile: {pki.ca.cert}}}}}\n"
    )
    config = tmp_path / "broker.yaml"
    config.write_text(
        "listeners: [{name: default, host: 127.0.0.1, port: 1}]\n"
        f"storage: {{directory: {tmp_path / 'data'}}}\n" + cluster
    )
    try:
        missing = check(config)
        assert missing.returncode == 2, missing.stdout + missing.stderr
        assert (
            f"cluster.tls.certfile: member w-0 of --workers: file not found: {tmp_path}/pki/member-w-0.pem"
            in missing.stderr
        ), missing.stderr
        assert f"timestone pki issue member w-0 --ca CA --out {tmp_path}/pki/member-w-0)" in missing.stderr
        assert not (tmp_path / "data").exists()

        pki.member("w-1")
        shutil.copy(pki.member("w-1").cert, tmp_path / "pki" / "member-w-0.pem")  # w-1's, under w-0's name
        shutil.copy(pki.member("w-1").key, tmp_path / "pki" / "member-w-0.key")
        another = check(config)
        assert another.returncode == 2, another.stdout + another.stderr
        assert "member w-0 of --workers: must name this node" in another.stderr, another.stderr
        assert "'timestone://node/w-0', names 'w-1'" in another.stderr, another.stderr

        for suffix in (".pem", ".key"):
            (tmp_path / "pki" / f"member-w-0{suffix}").unlink()
        pki.member("w-0")
        passed = check(config)
        assert passed.returncode == 0, passed.stdout + passed.stderr
        assert "configuration OK" in passed.stdout and "2 members (--workers)" in passed.stdout

        process, _, offsets_api = start_workers(tmp_path, cluster)
        try:
            layout = settled_layout(offsets_api, {"w-0", "w-1"})
            addresses = {member["node_id"]: member["mqtt"] for member in layout["members"]}
            topics = (f"plant/d-{n}/telemetry" for n in range(1000))
            elsewhere = next(t for t in topics if leader_of(layout["partitions"], t) == "w-1")
            # a device on w-0 publishing to a partition w-1 leads: forwarded over the members' TLS link
            device = RawClient(int(addresses["w-0"].rsplit(":", 1)[1]), 4)
            assert device.connect("d-forwarded").reason_code == 0
            for packet_id in (1, 2, 3):
                device.send_packet(Publish(elsewhere, f"m{packet_id}".encode(), 1, packet_id=packet_id))
                assert device.recv() == PubAck(packet_id)
            wait_until(lambda: read_topic(offsets_api, elsewhere) == [b"m1", b"m2", b"m3"], 30)
        finally:
            stop_workers(process)
        log = (tmp_path / "workers.log").read_text()
        assert "must name this node" not in log and "configuration error" not in log, log[-3000:]
    finally:
        etcd.kill()
