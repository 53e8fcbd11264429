"""Starting a cluster member with the launcher when a port chosen for it was taken by another listener."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

from tests.harness.local_cluster import EtcdTarget, cluster_broker, cluster_state, wait_until


def test_a_port_another_listener_took_is_not_taken_for_the_members_own(
    tmp_path: Path, etcd: EtcdTarget
) -> None:
    """Another test's broker listens on the offsets API's port, taken after the probe. A member binds that
    port only after it has registered in etcd, so for a while the port answers (the other's listener) while
    the member is alive; then it fails to bind and leaves the cluster. The start must not return on the
    other's answer: the member is started again on new ports, serves on both and stays a member."""
    member = cluster_broker(tmp_path, etcd, "m1")
    taken = member.offsets_port
    squatter = socket.create_server(("127.0.0.1", taken))
    try:
        with member:
            assert member.offsets_port != taken
            assert member.process is not None and member.process.poll() is None
            with urllib.request.urlopen(f"{member.offsets_url}/v1/logs", timeout=5) as answer:
                assert answer.status == 200
            wait_until(lambda: "m1" in cluster_state(etcd).members, what="m1 registered")
            assert "Address already in use" in member.log_path.read_text()
    finally:
        squatter.close()
