"""What a TLS listener notes of a client's certificate as its connection opens, on every transport: the name
it logs in with (CN, Timestone URI), its issuer and serial number for the CRLs (``revoked_peers``), and the
end and the CAs of its chain, watched (``certificate_ends``, ``untrusted_peers``)."""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING

from broker_edge.security.peer_chain import certificate_id
from broker_edge.security.tls import peer_common_name, peer_timestone_uri

if TYPE_CHECKING:
    from broker_edge.engine.connection.certificate_ends import CallLater
    from broker_edge.engine.connection.connection import Connection
    from broker_edge.engine.connection.terms import ListenerRuntime

__all__ = ["note_peer_certificate"]


def note_peer_certificate(
    conn: Connection,
    listener: ListenerRuntime,
    ssl_object: ssl.SSLObject | ssl.SSLSocket | None,
    call_later: CallLater,
) -> None:
    """Note on ``conn`` what its listener needs of the client certificate of ``ssl_object``."""
    conn.peer_cn = peer_common_name(ssl_object)
    if conn.peer_cn is not None:
        conn.peer_uri = peer_timestone_uri(ssl_object)
    if listener.checks_crl:
        conn.peer_certificate = certificate_id(ssl_object)
    if listener.certificate_ends is not None:
        conn.peer_trust = listener.certificate_ends.watch_chain(conn, ssl_object, call_later)
