"""A cluster's layout from any of its members (``GET /v1/cluster``), for readers given only a few of them.

The Spark source and the OTA jobs are configured with some members of a cluster (a bootstrap list, like
Kafka's ``bootstrap.servers``), not with its layout, which changes with every failover. ``ClusterDiscovery``
asks the members it knows, in turn, and keeps the last answer: ``ClusterLayout`` says which members are
alive (with their MQTT and offsets API addresses), which partition a topic belongs to, and which members hold
a topic's partition, best first (``readers_of``). Any replica serves a topic's committed records at the
same offsets, so a reader whose member died asks another one for the same range.

Blocking and thread-confined like ``OffsetsClient``: no event loop needed.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from broker_edge.offsets_api.client import OffsetsClient
from broker_edge.offsets_api.errors import AuthError, BrokerUnavailable, OffsetsApiError, TlsRefused
from broker_edge.placement import Member, PartitionState, partition_of
from broker_edge.security.client_tls import ClientTls, context_for

__all__ = ["ClusterDiscovery", "ClusterLayout", "ClusterUnreachableError", "parse_layout"]


class ClusterUnreachableError(RuntimeError):
    """No member given (nor any member known from an earlier answer) described the cluster."""

    def __init__(self, failures: Sequence[tuple[str, BaseException]]) -> None:
        tried = "; ".join(f"{url}: {error}" for url, error in failures) or "no member to ask"
        super().__init__(f"no member of the cluster answered GET /v1/cluster ({tried})")
        self.failures = list(failures)


@dataclass(frozen=True)
class ClusterLayout:
    """One member's picture of its cluster: live members, and each partition's leader and replicas."""

    answered_by: str
    """node_id of the member that answered."""
    fenced: bool
    """The answering member could not prove its membership: its picture may be stale."""
    partition_count: int
    members: Mapping[str, Member] = field(default_factory=dict)
    partitions: Mapping[int, PartitionState] = field(default_factory=dict)

    def partition_of(self, topic: str) -> int:
        """The partition ``topic`` belongs to (the brokers' own hash)."""
        return partition_of(topic, self.partition_count)

    def leader_of(self, topic: str) -> Member | None:
        """The live member leading ``topic``'s partition (None while it has no leader)."""
        state = self.partitions.get(self.partition_of(topic))
        if state is None or state.leader is None:
            return None
        return self.members.get(state.leader)

    def readers_of(self, topic: str) -> tuple[str, ...]:
        """Live members holding ``topic``'s partition, best first: the leader (the highest committed end),
        the other in-sync replicas, then the remaining replicas (behind, but what they serve is committed).

        Empty for a partition no live member holds (or before the cluster assigned it)."""
        state = self.partitions.get(self.partition_of(topic))
        if state is None:
            return ()
        ordered = [state.leader] if state.leader is not None else []
        ordered += [node for node in state.isr if node not in ordered]
        ordered += [node for node in state.replicas if node not in ordered]
        return tuple(node for node in ordered if node in self.members)

    def offsets_api(self, node_id: str) -> str:
        """The offsets API base URL of a live member (KeyError for one that is not)."""
        return self.members[node_id].offsets_api


def parse_layout(document: Mapping[str, Any]) -> ClusterLayout:
    """The layout in a ``GET /v1/cluster`` answer; ValueError when it is not one."""
    try:
        members = [
            Member(str(m["node_id"]), str(m["mqtt"]), str(m["offsets_api"])) for m in document["members"]
        ]
        states = [_partition_state(item) for item in document["partitions"]]
        count = int(document["partition_count"])
        return ClusterLayout(
            str(document["node_id"]),
            bool(document["fenced"]),
            count,
            {member.node_id: member for member in members},
            {state.partition: state for state in states},
        )
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"not a cluster layout: {error!r}") from None


def _partition_state(item: Mapping[str, Any]) -> PartitionState:
    leader = item["leader"]
    return PartitionState(
        int(item["partition"]),
        None if leader is None else str(leader),
        int(item["epoch"]),
        tuple(str(node) for node in item["replicas"]),
        tuple(str(node) for node in item["isr"]),
    )


class ClusterDiscovery:
    """Asks members for the layout: the live members of the last answer first, then the bootstrap list.

    A member that does not answer within ``timeout_s`` (or refuses the connection) is skipped at once: the
    next one is asked. An answer from a fenced member is used only when no unfenced member answers. A
    refused token is raised at once (every member shares the cluster's token, so asking on is pointless);
    so is a TLS failure no retry mends (``TlsRefused``: a member refusing this client's certificate, or one
    whose certificate is not trusted) when no member answered, rather than a cluster that seems down.
    """

    def __init__(
        self,
        bootstrap: Sequence[str],
        token: str | None = None,
        timeout_s: float = 10.0,
        tls: ClientTls | None = None,
    ) -> None:
        if not bootstrap:
            raise ValueError("at least one member's offsets API URL is needed")
        self.bootstrap = tuple(url.rstrip("/") for url in bootstrap)
        self.token = token
        self.timeout_s = timeout_s
        self.tls = tls
        """The CAs (and client certificate) members' ``https://`` addresses are checked with."""
        self.layout: ClusterLayout | None = None

    def candidates(self, avoid: Collection[str] = ()) -> list[str]:
        """Offsets API URLs to ask, in order, leaving out ``avoid`` (URLs just found dead)."""
        known = (
            [member.offsets_api for _, member in sorted(self.layout.members.items())] if self.layout else []
        )
        ordered: list[str] = []
        for url in [*known, *self.bootstrap]:
            url = url.rstrip("/")
            if url not in ordered and url not in avoid:
                ordered.append(url)
        return ordered

    def discover(self, avoid: Collection[str] = ()) -> ClusterLayout:
        """The current layout from the first member that answers (see the class docstring)."""
        failures: list[tuple[str, BaseException]] = []
        stale: ClusterLayout | None = None
        for url in self.candidates(avoid):
            context = context_for(url, self.tls)  # files that do not load: ConfigError, not a dead member
            try:
                with OffsetsClient(url, self.token, self.timeout_s, context, retries=0) as client:
                    layout = parse_layout(client.cluster())
            except AuthError:
                raise
            except OffsetsApiError as error:
                if error.status == 404:
                    error = OffsetsApiError(404, error.code, "not a cluster member (a standalone broker?)")
                failures.append((url, error))
                continue
            except (BrokerUnavailable, ValueError) as error:
                failures.append((url, error))
                continue
            if layout.fenced or not layout.members:
                stale = stale or layout
                continue
            self.layout = layout
            return layout
        if stale is not None:
            self.layout = stale
            return stale
        refused = next((error for _url, error in failures if isinstance(error, TlsRefused)), None)
        if refused is not None:
            raise refused
        raise ClusterUnreachableError(failures)
