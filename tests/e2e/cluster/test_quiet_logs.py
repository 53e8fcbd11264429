"""A healthy cluster says nothing alarming: three members with member TLS on an etcd with TLS and auth start,
one is restarted, and no log holds a WARNING or ERROR about a refused member (403, ``not_a_member``), which
a member that has just registered used to get from members whose view of etcd had not caught up yet, nor
uvloop's traceback for a TLS write on a connection a member had just closed."""

from __future__ import annotations

import re
from collections.abc import Callable

from broker_edge.runtime.launcher import BrokerProcess
from tests.harness.local_cluster import EtcdTarget, wait_settled

ALARM = re.compile(r" (WARNING|ERROR) ")
REFUSED = re.compile(r"\b403\b|not_a_member|not a member|Fatal error on SSL protocol")  # not a port 44030


def refusal_alarms(broker: BrokerProcess) -> list[str]:
    lines = broker.log_path.read_text().splitlines()
    return [line for line in lines if ALARM.search(line) and REFUSED.search(line)]


def test_a_healthy_cluster_starts_and_restarts_a_member_without_refusal_warnings(
    cluster_brokers: Callable[..., BrokerProcess], etcd: EtcdTarget
) -> None:
    nodes = ("a", "b", "c")
    brokers = {node: cluster_brokers(node) for node in nodes}
    wait_settled(etcd, set(nodes), 3)
    brokers["b"].stop()
    brokers["b"].start()
    wait_settled(etcd, set(nodes), 3)
    assert {node: refusal_alarms(broker) for node, broker in brokers.items()} == {node: [] for node in nodes}
    joined = "".join(broker.log_path.read_text() for broker in brokers.values())
    assert "peer link to" in joined and " up" in joined  # the links these lines would be about did come up
