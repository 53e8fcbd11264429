"""Connections whose client certificate a listener's new CRLs revoke (``tls.crlfile``, as a SIGHUP read it).

OpenSSL checks a certificate against the CRLs only at the handshake, so a device connected when its
certificate is revoked (a stolen key) would stay connected for as long as it likes. A listener that checks
CRLs notes each client certificate's issuer and serial number at connect (``peer_chain.certificate_id``);
after a reload, ``close_revoked`` closes the connections the CRLs it read list (the listener's
``ClientTrust``; with ``tls.crl_check: chain``, those whose chain holds a CA they list, ``peer_cas``): v5
DISCONNECT 0x87 (Not authorized), their wills dropped (they are the holder's of the stolen key), one WARNING
each.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from broker_edge.protocol.reason_codes import ReasonCode

if TYPE_CHECKING:
    from broker_edge.engine.connection.connection import Connection
    from broker_edge.security.client_trust import ClientTrust

__all__ = ["close_revoked"]


def close_revoked(connections: Iterable[Connection], listener: str, trust: ClientTrust) -> int:
    """Close the connections of ``listener`` whose certificate the CRLs of ``trust``'s last reload revoke;
    how many were."""
    if not trust.revoked:
        return 0
    closing = [
        conn
        for conn in connections
        if conn.terms.listener.name == listener and trust.revokes(conn.peer_certificate, conn.peer_cas)
    ]
    for conn in closing:
        said = trust.revocation_said(conn.peer_certificate, conn.peer_cas, conn.peer_cn)
        conn.log().warning("closing the connection: %s", said)
        conn.will = None
        conn.close(ReasonCode.NOT_AUTHORIZED, "client certificate revoked")
        conn.flush()
    return len(closing)
