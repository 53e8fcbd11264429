"""A broker whose ``cluster.partitions`` is not the count its cluster was created with (a configuration
written by hand) refuses to start, exit 2 naming the key and both counts, before it registers: where it
joined with an ERROR about etcd's config key, took partitions and clients, placed topics by its own count
and refused the publishes of topics whose partitions it did not know (0x83)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from broker_edge.runtime.launcher import BrokerProcess
from tests.harness.local_cluster import EtcdTarget, cluster_broker, cluster_state

pytestmark = pytest.mark.timeout(60)


def test_a_broker_with_another_partition_count_than_its_cluster_refuses_to_start(
    cluster_brokers: Callable[..., BrokerProcess], etcd: EtcdTarget, tmp_path: Path
) -> None:
    cluster_brokers("a", partitions=4, replication_factor=1, min_insync_replicas=1)
    deadline = time.monotonic() + 20
    while len(cluster_state(etcd).partitions) < 4:
        assert time.monotonic() < deadline, "the cluster was not created"
        time.sleep(0.1)

    b = cluster_broker(
        tmp_path, etcd, "b", {"partitions": 8, "replication_factor": 1, "min_insync_replicas": 1}
    )
    with pytest.raises(RuntimeError, match="broker did not start"):  # it exits before its API listens
        b.start()
    assert b.process is not None and b.process.wait(timeout=20) == 2
    text = b.log_path.read_text()
    assert (
        "configuration error: cluster.partitions: the cluster under "
        f"{etcd.prefix} was created with 4 partitions, this broker is configured with 8" in text
    )
    assert "Traceback" not in text
    assert set(cluster_state(etcd).members) == {"a"}
