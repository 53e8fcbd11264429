"""A broker's part in its cluster: ``ClusterNode`` wires coordination, replication and forwarding into it.

``Broker.start`` creates the node once its offsets API is bound (so the advertised addresses can default to
bound ports) and starts it; ``Broker.stop`` stops it before anything else closes. The node

- keeps this node's ``ClusterView`` current (membership under an etcd lease, the controller, the
  coordinator's watches) or, in tests, runs on a view it is given;
- makes the PUBLISH path a cluster member's: ``ClusterForwarding`` places topics (append here, forward to
  the leader, refuse) and the peer links (``/v1/peer`` on the offsets API) carry forwarded and unlogged
  publishes;
- fences: while ``view.fenced`` nothing is acknowledged (placement never appends here) and MQTT clients are
  disconnected so they move to a live member (v5: DISCONNECT 0x9C "use another server" with the Server
  Reference of a live member when one is known, else 0x8B).

Only a broker with a ``cluster:`` section imports this module.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from broker_edge.cluster.forwarding import ClusterForwarding
from broker_edge.cluster.peer_link import PeerLinks
from broker_edge.cluster.view import ClusterView
from broker_edge.protocol.codec import encode
from broker_edge.protocol.packets import MQTT_5, Disconnect
from broker_edge.protocol.properties import Properties
from broker_edge.protocol.reason_codes import ReasonCode
from broker_edge.states import CONNECTED

if TYPE_CHECKING:
    from broker_edge.cluster.config import ClusterConfig
    from broker_edge.server import Broker

__all__ = ["ClusterNode"]

log = logging.getLogger("broker_edge.cluster.node")


class ClusterNode:
    """Everything of one broker that is about its cluster (see the module docstring)."""

    def __init__(self, broker: Broker, config: ClusterConfig, view: ClusterView | None = None) -> None:
        self.broker = broker
        self.config = config
        self.view = view if view is not None else ClusterView(config.node_id, config.partitions)
        self._static = view is not None
        token = config.token if config.token is not None else broker.config.offsets_api.token
        self.forwarding = ClusterForwarding(
            self.view,
            broker.publish_path,
            broker.router,
            None,
            broker.loop,
            config.min_insync_replicas,
            config.forward_timeout_ms / 1000,
        )
        self.links = PeerLinks(config.node_id, token, self.forwarding)
        self.forwarding.links = self.links
        broker.api_routes.append(self.links.add_routes)
        self._was_fenced = False
        self._started = False

    async def start(self) -> None:
        """Join: start coordination (unless running on a given view), then serve as a member."""
        self.view.on_change(self._view_changed)
        self.broker.publish_path.attach_forwarding(self.forwarding)
        self._started = True
        self._view_changed()

    async def stop(self) -> None:
        """Leave: stop acknowledging through the cluster, close the peer links, stop coordination."""
        if not self._started:
            return
        self._started = False
        self.forwarding.fail_waiting("the broker is shutting down")
        await self.links.close()

    def _view_changed(self) -> None:
        if not self._started:
            return
        view = self.view
        self.links.update({node: member.offsets_api for node, member in view.members.items()})
        self.forwarding.retry()
        if view.fenced and not self._was_fenced:
            self._move_clients()
        self._was_fenced = view.fenced

    def _move_clients(self) -> None:
        """Fenced: disconnect every MQTT client so it reconnects to a live member."""
        others = [member for node, member in sorted(self.view.members.items()) if node != self.view.node_id]
        reference = others[0].mqtt if others else None
        log.warning(
            "fenced (etcd lease not renewed): disconnecting %d clients%s",
            len(self.broker.connections),
            f", pointing v5 clients at {reference}" if reference else "",
        )
        for conn in list(self.broker.connections):
            if conn.state != CONNECTED:
                conn.abort()
                continue
            if conn.v5 and reference is not None:
                properties = Properties(reason_string="this broker lost its cluster membership")
                properties.server_reference = reference
                conn.write(encode(Disconnect(ReasonCode.USE_ANOTHER_SERVER, properties), MQTT_5))
                self.broker.counters.disconnect("use_another_server")
                conn.close()
            else:
                conn.close(ReasonCode.SERVER_SHUTTING_DOWN, "this broker lost its cluster membership")
