"""The members' endpoint: the one door between brokers of a cluster, apart from the readers' offsets API.

Member-only endpoints live here and nowhere else: the peer link (``/v1/peer``), replica fetches
(``/v1/replica/fetch``), and the offsets API's reads that members make of each other (log ends for an
election, a topic a broker holds no copy of). It listens on its own port (``cluster.listen``), which has
three consequences that a shared port with optional client certificates would not:

- **Only members get in.** With ``cluster.tls`` the TLS handshake requires a certificate from the cluster
  CA; a stranger (or a reader with the best token there is) never gets to send a request, and costs one
  failed handshake. Tokens mean nothing here.
- **Reserved capacity comes by itself.** Readers and strangers fill the offsets API's connections, not
  these; members also have their own share of the HTTP memory budget.
- **Readers' and members' TLS stay apart**: readers may be given a public CA's certificate, members a
  private cluster CA's.

Every request is admitted by ``member_authenticator``: the certificate's node id (``member_identity``) must
be a current member (this node's view of etcd's members) and the node the request claims must be that
one; else 403 and the connection is closed. ``GET /v1/cluster`` alone also admits a node that proves its
node id but is no member now: a member fenced off etcd, whose lease has ended meanwhile, asks it whether
this node is a member before it sends its clients here (``fenced_clients``). Handlers check what the
request claims in its body (a replica fetch's replica) against the admitted node: a member acts only as
itself.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from broker_edge.cluster.cluster_info import CLUSTER_PATH
from broker_edge.cluster.links.member_clients import NODE_HEADER
from broker_edge.cluster.links.member_identity import node_of_certificate
from broker_edge.http.lazy_endpoint import listening_socket
from broker_edge.security.access import Access, member_access

if TYPE_CHECKING:
    from aiohttp import web

    from broker_edge.cluster.links.member_identity import MemberTls
    from broker_edge.cluster.view import ClusterView
    from broker_edge.http.guard import GuardedRunner
    from broker_edge.http.peer_certificates import CertificateCheck
    from broker_edge.security.http_budget import MemoryBudget
    from broker_edge.settings.cluster import MemberListenConfig
    from broker_edge.storage import LogStore

__all__ = ["bind_members_endpoint", "member_authenticator", "serve_members_endpoint"]

MEMBERS_HANG_UP = frozenset({"closed"})
"""Handshakes the members' endpoint says at DEBUG: a member hangs up in the middle of one whenever it cancels
a request still connecting (a replica fetcher replaced as partitions are added, one by one, at a start); a
stranger who hangs up got nothing. Certificate failures stay WARNINGs."""
NOT_A_MEMBER = "not_a_member"


def member_authenticator(view: ClusterView, tls: MemberTls | None) -> Callable[[web.Request], Access]:
    """Admits a request from a current member, as the node its certificate names (without ``tls``, on
    loopback, as the node it claims)."""
    from broker_edge.offsets_api.server import ApiError

    def refuse(message: str) -> ApiError:
        return ApiError(403, NOT_A_MEMBER, message, close=True)

    def authenticate(request: web.Request) -> Access:
        claimed = request.headers.get(NODE_HEADER)
        if tls is not None:
            transport = request.transport
            node = node_of_certificate(transport.get_extra_info("peercert") if transport else None)
            if node is None:
                raise refuse("the client certificate names no member (timestone://node/<node_id>)")
            if claimed is not None and claimed != node:
                raise refuse(f"the certificate names {node}, the request claims {claimed}")
        elif not claimed:
            raise refuse(f"a member names itself in {NODE_HEADER}")
        else:
            node = claimed
        if node != view.node_id and node not in view.members and not _asks_who_is_member(request):
            raise refuse(f"{node} is not a member of the cluster now")
        return member_access(node)

    return authenticate


def _asks_who_is_member(request: web.Request) -> bool:
    """Whether ``request`` only reads this node's picture of the cluster (``GET /v1/cluster``)."""
    return request.method == "GET" and request.path == CLUSTER_PATH


def bind_members_endpoint(host: str, port: int) -> socket.socket:
    """Bind and listen on ``host:port`` now (0: a free one), so the advertised address knows its port
    before the endpoint serves (``serve_members_endpoint``); ``OSError`` if it cannot."""
    family, _, _, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    return listening_socket(family, address)


async def serve_members_endpoint(
    sock: socket.socket,
    store: LogStore,
    view: ClusterView,
    tls: MemberTls | None,
    listen: MemberListenConfig,
    routes: Sequence[Callable[[web.Application], None]],
    budget: MemoryBudget | None,
    refused: Callable[[str], None] | None = None,
) -> GuardedRunner:
    """Serve the members' endpoint on ``sock``: the offsets API's reads and ``routes`` (peer link, replica
    fetch), for members only, within ``budget``. A request on a connection whose member certificate has
    since expired, or whose CA a reload took out of ``cafile``, is refused, told to ``refused(reason)``."""
    from broker_edge.http.guard import start_guarded_site, tls_failure_lines
    from broker_edge.offsets_api.server import ApiLimits, create_app, is_member

    limits = ApiLimits(
        max_connections=listen.max_connections,
        request_timeout_s=listen.request_timeout_s,
        min_read_bytes_per_s=listen.min_read_bytes_per_s,
    )
    app = create_app(store, limits=limits, routes=routes, authenticate=member_authenticator(view, tls))
    return await start_guarded_site(
        app,
        "",
        0,
        tls.server.context if tls is not None else None,
        limits.max_connections,
        limits.request_timeout_s,
        sock=sock,
        budget=budget,
        is_member=is_member,
        min_read_bytes_per_s=limits.min_read_bytes_per_s,
        name="members' endpoint",
        on_tls_failure=tls_failure_lines(
            "members' endpoint",
            quiet=MEMBERS_HANG_UP,
            cafile=("cluster.tls.cafile", tls.config.cafile) if tls is not None else None,
        ),
        certificates=_certificate_check(tls, refused),
    )


def _certificate_check(
    tls: MemberTls | None, refused: Callable[[str], None] | None
) -> CertificateCheck | None:
    """Each request's member certificate checked: its end, and the cluster CAs of the last reload."""
    if tls is None:
        return None
    from broker_edge.http.peer_certificates import CertificateCheck

    return CertificateCheck("members' endpoint", tls.server.trust, refused)
