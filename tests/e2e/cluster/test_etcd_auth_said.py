"""A member whose etcd password is wrong says which user and which file, and joins once the file holds the
right one (it is read at every authentication), where it said only etcd's "authentication failed, invalid
user ID or password", naming no setting."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.harness.local_cluster import EtcdTarget, cluster_broker, cluster_state

pytestmark = pytest.mark.timeout(60)


def test_a_wrong_etcd_password_is_said_naming_the_user_and_its_file_and_fixing_the_file_is_enough(
    etcd: EtcdTarget, tmp_path: Path
) -> None:
    user = etcd.user
    assert user is not None
    password_file = tmp_path / "etcd.password"
    password_file.write_text("not-the-password\n")
    auth = {"username": user.username, "password_file": str(password_file)}
    broker = cluster_broker(
        tmp_path, etcd, "a", {"etcd_auth": auth, "replication_factor": 1, "min_insync_replicas": 1}
    )
    broker.start()
    try:
        said = f"user {user.username!r} (cluster.etcd_auth), its password the first line of {password_file}"
        deadline = time.monotonic() + 20
        while said not in broker.log_path.read_text():
            assert time.monotonic() < deadline, broker.log_path.read_text()[-2000:]
            time.sleep(0.1)
        password_file.write_text(Path(user.password_file).read_text())
        deadline = time.monotonic() + 20
        while "a" not in cluster_state(etcd).members:
            assert time.monotonic() < deadline, broker.log_path.read_text()[-2000:]
            time.sleep(0.1)
    finally:
        broker.stop()
