"""A cluster broker that cannot reach etcd retries with backoff and says so once per state change: before,
it logged two WARNING lines a second for as long as etcd was away."""

from __future__ import annotations

import collections
import re
import time

from broker_edge.runtime.launcher import BrokerProcess


def test_an_unreachable_etcd_is_retried_with_backoff_and_said_once(tmp_path):
    cluster = {"node_id": "b1", "etcd": ["http://127.0.0.1:1"], "listen": {"port": 0}}
    broker = BrokerProcess(tmp_path, cluster=cluster).start()
    try:
        time.sleep(5)
        text = broker.log_path.read_text()
    finally:
        broker.stop()
    warnings = [line for line in text.splitlines() if " WARNING broker_edge.cluster" in line]
    assert warnings, text  # the outage is said
    said = collections.Counter(re.sub(r"^\S+ ", "", line)[:80] for line in warnings)
    assert max(said.values()) == 1, said  # each thing once, not once per attempt
    assert len(warnings) <= 6, warnings
