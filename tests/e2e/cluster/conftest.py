"""Fixtures of the cluster suite: a real etcd (Debian's ``/usr/bin/etcd``) and real broker processes.

- ``etcd_server`` (session): one etcd on free loopback ports (client and peer), data directory of mode 0700,
  ``--logger=zap``, with TLS, client certificates and user auth on (as production runs it); shared by the
  tests, each of which works under its own key prefix as its own etcd user.
- ``etcd`` → ``EtcdTarget(url, prefix)``: that server and a prefix nobody else uses.
- ``private_etcd``: an etcd of the test's own, for tests that stop or pause it (SIGSTOP).
- ``cluster_brokers(node_id, **cluster)`` → a started ``BrokerProcess`` (``timestone broker --config``)
  whose YAML has a ``cluster:`` section pointing at ``etcd`` (free ports for MQTT, offsets API, admin and
  the members' endpoint; members prove who they are with certificates of one cluster CA, kept in
  ``tmp_path/cluster-pki``); ``sections={...}`` adds other sections (e.g. the offsets API's tokens);
  stopped at the end of the test. ``.stop()`` is SIGTERM, ``.kill()`` SIGKILL.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker_edge.runtime.launcher import BrokerProcess
from tests.harness.local_cluster import EtcdServer, EtcdTarget, cluster_broker

_prefixes = itertools.count(1)


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    server = EtcdServer(tmp_path_factory.mktemp("etcd")).start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def etcd(etcd_server: EtcdServer) -> EtcdTarget:
    """The shared etcd and a key prefix of this test's own."""
    return EtcdTarget(etcd_server, f"/test{os.getpid()}-{next(_prefixes)}")


@pytest.fixture
def private_etcd(tmp_path: Path) -> Iterator[EtcdTarget]:
    """An etcd of this test's own (it may pause or kill it)."""
    server = EtcdServer(tmp_path / "etcd").start()
    try:
        yield EtcdTarget(server, "/timestone")
    finally:
        server.kill()


@pytest.fixture
def cluster_brokers(tmp_path: Path, etcd: EtcdTarget) -> Iterator[Callable[..., BrokerProcess]]:
    """``cluster_brokers("b1", replication_factor=3)`` → a started broker joining this test's cluster."""
    started: list[BrokerProcess] = []

    def start(
        node_id: str, target: EtcdTarget | None = None, sections: dict[str, Any] | None = None, **cluster: Any
    ) -> BrokerProcess:
        broker = cluster_broker(tmp_path, target or etcd, node_id, cluster, **(sections or {}))
        started.append(broker)
        return broker.start()

    yield start
    for broker in started:
        broker.stop()


@pytest.fixture
def three_brokers(
    cluster_brokers: Callable[..., BrokerProcess], etcd: EtcdTarget
) -> Iterator[dict[str, BrokerProcess]]:
    """Brokers ``a``, ``b`` and ``c`` of one cluster, every partition with three in-sync replicas and
    leadership spread over the three (no leadership move under way when the test starts, so none refuses a
    publish meanwhile); every test client is closed at the end."""
    from tests.e2e.broker_clients import close_all
    from tests.e2e.cluster.proof import leadership_spread, wait_settled, wait_until

    nodes = ("a", "b", "c")
    brokers = {node: cluster_brokers(node) for node in nodes}
    wait_settled(etcd, set(nodes), 3, processes=brokers)
    wait_until(lambda: leadership_spread(etcd, nodes), what="leadership spread over a, b, c")
    yield brokers
    close_all()
