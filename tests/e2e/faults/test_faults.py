"""The fault suite's short set: etcd and three brokers (TLS and auth as in production), six QoS 1
publishers (MQTT 5 and 3.1.1, each on its own topic, several publishes in flight, never resending) spread
over the brokers, a subscriber on each broker, and one nemesis per run; the checker
(``tests.e2e.faults.checker``) finds no anomaly: every acknowledged publish once in the log, no payload at
two offsets, replicas identical, each publisher's order kept, every delivery at the offset the log holds,
no acknowledgement from a broker that was dead, paused or cut off; and an etcd restart moves no leader.
The partition runs in a network namespace of its own, its iptables rule there (as root: ``.ci/system-deps``
installs iptables).
``bench/cluster_faults_bench.py`` runs many seeds per nemesis."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.faults.harness import run_case

pytestmark = pytest.mark.timeout(240)


@pytest.mark.parametrize(
    ("nemesis", "seed"), [("kill", 1), ("pause", 2), ("etcd-restart", 3), ("partition", 4)]
)
def test_no_anomaly_under_a_fault(nemesis: str, seed: int, tmp_path: Path) -> None:
    result = run_case(nemesis, seed, tmp_path)
    assert result.acknowledged > 100, result
    assert result.deliveries > 0, result
    assert result.anomalies == [], "\n".join(result.anomalies[:20])
    if nemesis == "etcd-restart":  # every member keeps its lease: nobody is taken for dead
        assert result.leader_moves == 0, result
