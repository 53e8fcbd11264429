"""A broker's part in its cluster: membership, the view of the cluster, and the controller campaign.

``Broker.start`` makes a ``ClusterNode`` when the configuration has a ``cluster:`` section, after its
listeners and offsets API are bound (so the advertised addresses default to the bound ports), and stops it
before the commitlog closes. The node's ``view`` is what the rest of the broker reads.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from broker_edge.cluster.config import ClusterConfig
from broker_edge.cluster.controller import Controller
from broker_edge.cluster.coordinator import Coordinator
from broker_edge.cluster.etcd import ClusterKeys, Etcd
from broker_edge.cluster.membership import Membership
from broker_edge.cluster.view import ClusterView, Member

if TYPE_CHECKING:
    from broker_edge.server import Broker

__all__ = ["ClusterNode", "advertised_member"]

log = logging.getLogger("broker_edge.cluster.node")

ETCD_TIMEOUT_S = 2.0
"""Bound of every etcd call (a lease renewal is bounded by its interval instead)."""


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def advertised_member(broker: Broker, cluster: ClusterConfig) -> Member:
    """This node's ``Member``: the advertised addresses, else the first listener's and the offsets API's
    bound addresses."""
    config = broker.config
    mqtt = cluster.advertise.mqtt
    if mqtt is None:
        listener = config.listeners[0]
        mqtt = f"{_host(listener.host)}:{broker.ports[listener.name]}"
    offsets_api = cluster.advertise.offsets_api
    if offsets_api is None:
        api = config.offsets_api
        scheme = "https" if api.tls is not None else "http"
        offsets_api = f"{scheme}://{_host(api.host)}:{broker.offsets_port}"
    return Member(cluster.node_id, mqtt, offsets_api)


class ClusterNode:
    """Runs this broker's membership, coordinator and controller."""

    def __init__(self, broker: Broker, cluster: ClusterConfig) -> None:
        self.broker = broker
        self.cluster = cluster
        self.view = ClusterView(cluster.node_id, cluster.partitions)
        self.keys = ClusterKeys(cluster.key_prefix)
        self.token = cluster.token or broker.config.offsets_api.token
        self.etcd = Etcd(cluster.etcd, ETCD_TIMEOUT_S)
        self.member = advertised_member(broker, cluster)
        self.membership = Membership(self.etcd, self.keys, self.member, self.view, cluster.lease_ttl_s)
        self.coordinator = Coordinator(self.etcd, self.keys, self.view, self.membership)
        self.membership.before_unfence = self.coordinator.resync
        self.controller = Controller(
            self.etcd, self.keys, self.view, self.coordinator, self.membership, cluster, token=self.token
        )

    async def start(self) -> None:
        """Follow the cluster's state, register, campaign for controller. A node that cannot reach etcd
        starts fenced and keeps trying."""
        await self.coordinator.start()
        await self.membership.start()
        await self.controller.start()
        log.info(
            "cluster node %s (mqtt %s, offsets API %s) on etcd %s under %s",
            self.member.node_id,
            self.member.mqtt,
            self.member.offsets_api,
            ",".join(self.cluster.etcd),
            self.cluster.key_prefix,
        )

    async def stop(self) -> None:
        """Leave the cluster now (the lease is revoked, so the others need not wait for it to expire)."""
        await self.controller.stop()
        await self.membership.stop()
        await self.coordinator.stop()
        await self.etcd.close()
