"""Fixtures of the cluster suite: a real etcd (Debian's ``/usr/bin/etcd``) and real broker processes.

- ``etcd_server`` (session): one etcd on free loopback ports (client and peer), data directory of mode 0700,
  ``--logger=zap``, with TLS, client certificates and user auth on (as production runs it); shared by the
  tests, each of which works under its own key prefix as its own etcd user.
- ``etcd`` → ``EtcdTarget(url, prefix)``: that server and a prefix nobody else uses.
- ``private_etcd``: an etcd of the test's own, for tests that stop or pause it (SIGSTOP).
- ``three_brokers``: brokers ``a``, ``b`` and ``c`` of one settled cluster. A test marked ``shares_cluster``
  (it leaves every broker running and the cluster settled, and its client ids and topics are its own) gets its
  module's one cluster, and ``etcd`` that cluster's target: starting three brokers and settling them costs
  more CPU than most such tests. Before each, a broker not running (not yet, or no longer) is started and the
  cluster settled. A module's ``shares_cluster`` tests run first; its first test that starts brokers of its
  own stops the shared ones.
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
from dataclasses import dataclass
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


SHARES_CLUSTER = "shares_cluster"


def shares_cluster(request: pytest.FixtureRequest) -> bool:
    """Whether the test runs on its module's shared cluster (marked ``shares_cluster``)."""
    return request.node.get_closest_marker(SHARES_CLUSTER) is not None


@pytest.fixture
def etcd(request: pytest.FixtureRequest, etcd_server: EtcdServer) -> EtcdTarget:
    """The shared etcd and a key prefix of this test's own; a ``shares_cluster`` test's module cluster's."""
    if shares_cluster(request):
        shared: SharedCluster = request.getfixturevalue("module_cluster")
        return shared.etcd
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
def cluster_brokers(
    request: pytest.FixtureRequest, tmp_path: Path, etcd: EtcdTarget
) -> Iterator[Callable[..., BrokerProcess]]:
    """``cluster_brokers("b1", replication_factor=3)`` → a started broker joining this test's cluster."""
    if shares_cluster(request):
        raise pytest.UsageError(f"{request.node.nodeid}: a test that starts brokers cannot share its cluster")
    shared = _shared_clusters.get(request.module.__name__)
    if shared is not None:  # its tests have run: not three more brokers on the machine meanwhile
        _stop(shared)
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


NODES = ("a", "b", "c")


@dataclass
class SharedCluster:
    """One module's cluster for its ``shares_cluster`` tests."""

    brokers: dict[str, BrokerProcess]
    etcd: EtcdTarget


_shared_clusters: dict[str, SharedCluster] = {}
"""The module clusters now up, by test module."""


@pytest.fixture(scope="module")
def module_cluster(
    request: pytest.FixtureRequest, etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SharedCluster]:
    """Three brokers under a prefix of their own, for the module's ``shares_cluster`` tests (started by
    ``three_brokers``, so that a start that fails fails one test)."""
    target = EtcdTarget(etcd_server, f"/shared{os.getpid()}-{next(_prefixes)}")
    directory = tmp_path_factory.mktemp("shared-cluster")
    shared = SharedCluster({node: cluster_broker(directory, target, node, {}) for node in NODES}, target)
    _shared_clusters[request.module.__name__] = shared
    yield shared
    del _shared_clusters[request.module.__name__]
    _stop(shared)


def _stop(shared: SharedCluster) -> None:
    for broker in shared.brokers.values():
        broker.stop()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each module's ``shares_cluster`` tests first, in their order, each module where it was: its cluster is
    then up while they run and stopped before the others start theirs."""
    positions: dict[str, list[int]] = {}
    for index, item in enumerate(items):
        positions.setdefault(item.nodeid.split("::", 1)[0], []).append(index)
    reordered = list(items)
    for indices in positions.values():
        ordered = sorted(
            (items[index] for index in indices), key=lambda i: not i.get_closest_marker(SHARES_CLUSTER)
        )
        for index, item in zip(indices, ordered, strict=True):
            reordered[index] = item
    items[:] = reordered


@pytest.fixture
def three_brokers(request: pytest.FixtureRequest, etcd: EtcdTarget) -> Iterator[dict[str, BrokerProcess]]:
    """Brokers ``a``, ``b`` and ``c`` of one cluster, the test's own or its module's for a ``shares_cluster``
    test (a broker not running started again), every partition with three in-sync replicas and leadership
    spread over the three (no leadership move under way when the test starts, so none refuses a publish
    meanwhile); every test client is closed at the end."""
    from tests.e2e.broker_clients import close_all
    from tests.e2e.cluster.proof import leadership_spread, wait_settled, wait_until

    if shares_cluster(request):
        brokers = request.getfixturevalue("module_cluster").brokers
        for broker in brokers.values():
            if broker.process is None or broker.process.poll() is not None:
                broker.start()
    else:
        start = request.getfixturevalue("cluster_brokers")
        brokers = {node: start(node) for node in NODES}
    wait_settled(etcd, set(NODES), 3, processes=brokers)
    wait_until(lambda: leadership_spread(etcd, NODES), what="leadership spread over a, b, c")
    yield brokers
    close_all()
