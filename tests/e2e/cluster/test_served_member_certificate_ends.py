"""On a real cluster (etcd, two brokers whose members prove who they are with TLS): b's member certificate
holds for a few seconds. a dialed the peer link to b (the smaller node id dials) and fetches b's records
over kept-alive connections; OpenSSL checked b's certificate at those handshakes only. Once it has
expired, a closes what it holds to b, says so naming b and counts it, and its next handshakes fail until b
reads a renewed certificate (SIGHUP): then the link is up again."""

from __future__ import annotations

import datetime
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from broker_edge.runtime.launcher import BrokerProcess
from broker_edge.runtime.local_pki import LocalPki
from tests.e2e.cluster.conftest import EtcdTarget
from tests.e2e.cluster.proof import logged, metric, wait_settled, wait_until
from tests.e2e.security.certificate_devices import reissued

pytestmark = pytest.mark.timeout(240)

LIFETIME_S = 40.0
"""How long b's certificate holds: time enough for both brokers to start and settle on a busy machine."""


def closed_for_b(a: BrokerProcess) -> float:
    """What a closed of what it dialed to b, for b's certificate expired (0 before the first)."""
    try:
        return metric(
            a,
            "timestone_broker_https_certificate_refusals_total",
            endpoint="members dialed",
            reason="certificate_expired",
        )
    except AssertionError:
        return 0.0


def test_a_member_closes_what_it_dialed_to_another_once_that_members_certificate_expires(
    cluster_brokers: Callable[..., BrokerProcess], etcd: EtcdTarget, tmp_path: Path
) -> None:
    pki = LocalPki(tmp_path / "cluster-pki", "cluster-ca")  # where the brokers' member certificates are
    pair = pki.member("b")
    now = datetime.datetime.now(datetime.UTC)
    reissued(pair, pki.ca, now - datetime.timedelta(minutes=5), now + datetime.timedelta(seconds=LIFETIME_S))
    a = cluster_brokers("a", replication_factor=2)
    b = cluster_brokers("b", replication_factor=2)
    wait_settled(etcd, {"a", "b"}, 2, processes={"a": a, "b": b})
    wait_until(lambda: closed_for_b(a) >= 1, timeout=LIFETIME_S + 60, what="a closed its link to b")
    assert logged(a, "peer link to b: closing the connection: its server certificate expired at") == 1
    wait_until(lambda: logged(a, "certificate has expired") >= 1, what="a's next handshake with b refused")
    said_up = logged(a, "peer link to b up")
    renewed = datetime.datetime.now(datetime.UTC)
    reissued(pair, pki.ca, renewed - datetime.timedelta(minutes=5), renewed + datetime.timedelta(days=30))
    assert b.process is not None
    b.process.send_signal(signal.SIGHUP)
    wait_until(lambda: logged(a, "peer link to b up") > said_up, what="the link up again")
